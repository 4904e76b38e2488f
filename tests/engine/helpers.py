"""Small models and call counters shared by the engine's tests."""

from __future__ import annotations

import torch

from qkv.models import Llama, LlamaConfig


def varied_llama(**options) -> Llama:
    """A small float32 Llama whose gains and biases are random too (not ones and zeros)."""
    torch.manual_seed(1)
    config = LlamaConfig(
        vocab_size=101, dim=64, num_layers=2, num_heads=4, num_kv_heads=2, ff_dim=96, **options
    )
    model = Llama(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.normal_(0.0, 0.5)
    return model


def counted(monkeypatch, owner, name: str) -> list[int]:
    """Counts the calls of ``owner.name`` (a function or method), which still runs."""
    calls = []
    original = getattr(owner, name)

    def count(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, count)
    return calls
