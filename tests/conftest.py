"""Shared test helpers: a float64 attention written independently of qkv."""

from __future__ import annotations

import math
import os
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from qkv.lab.common import num_threads

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def half_ulp(values: torch.Tensor, dtype: torch.dtype) -> float:
    """Half an ulp, in ``dtype``, of the largest magnitude in ``values`` (0 if all are 0):
    what one rounding to ``dtype`` may cost at most."""
    top = values.abs().max().item() if values.numel() else 0.0
    if top == 0:
        return 0.0
    return 0.5 * torch.finfo(dtype).eps * 2.0 ** math.floor(math.log2(top))


@contextmanager
def uninitialised_is_nan():
    """Within: ``torch.empty`` and its kin return memory filled with NaN (torch's
    deterministic mode), so an output element that code forgets to write shows up."""
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before)


def naive_scores(q, k, mask=None, causal=False, scale=None):
    """float64 scores ``(B, H, Tq, Tk)``, the float mask added and hidden keys at -inf."""
    q, k = q.double(), k.double()
    k = torch.repeat_interleave(k, q.shape[1] // k.shape[1], dim=1)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    s = q @ k.transpose(-1, -2) * scale
    tq, tk = s.shape[-2:]
    allowed = torch.ones(tq, tk, dtype=torch.bool)
    if causal:
        allowed = torch.tensor([[j <= i + tk - tq for j in range(tk)] for i in range(tq)])
    bias = torch.zeros_like(s)
    if mask is not None:
        if mask.dtype == torch.bool:
            allowed = allowed & mask
        else:
            bias = bias + mask.double()
    s = (s + bias).masked_fill(~allowed, float("-inf"))
    return torch.broadcast_to(s, torch.broadcast_shapes(s.shape, allowed.shape))


def naive_attention(q, k, v, mask=None, causal=False, scale=None):
    """Attention in float64 with Python-level clarity; returns (out, weights)."""
    s = naive_scores(q, k, mask, causal, scale)
    v = torch.repeat_interleave(v.double(), q.shape[1] // v.shape[1], dim=1)
    empty = torch.isinf(s).all(-1, keepdim=True)
    w = torch.softmax(s.masked_fill(empty, 0.0), -1).masked_fill(empty, 0.0)
    return w @ v, w


@pytest.fixture
def one_thread():
    """Tiny tensors: more intra-op threads only add overhead, and contention on busy CPUs."""
    with num_threads(1):
        yield


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared corpora not found at {SHARED_DATA}")
    return SHARED_DATA
