"""Cheap attention weights: qkv's weights beside a fused kernel against every alternative.

Inference, forward only, CPU fp32, B=4, E=512, 8 heads (the setting of issue 8). Every
variant is called in turns in one loop, so each ratio compares figures from the same
moments of a shared machine:

- qkv ``MultiHeadAttention`` without weights (fused SDPA) and with weights (SDPA output,
  weights recomputed beside it), with the weights of one head only, and with the reference
  backend (explicit softmax);
- ``torch.nn.MultiheadAttention`` with ``need_weights=True, average_attn_weights=False``
  and without weights;
- both with causal weights (qkv's ``causal=True``, torch's boolean ``attn_mask``).

Run: ``python benchmarks/weights.py [--quick] [--out DIR] [--threads N]`` or
``qkv bench weights``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import qkv  # noqa: E402
from benchmarks.common import cli, measure_turns, report, result  # noqa: E402

B, E, H = 4, 512, 8


def variants(t: int) -> dict:
    """The functions to time at sequence length ``t``: name -> zero-argument call."""
    peer = nn.MultiheadAttention(E, H, batch_first=True).eval()
    ours = qkv.TorchMultiheadAttention.from_torch(peer).eval()
    reference = qkv.TorchMultiheadAttention.from_torch(peer).eval()
    reference.backend = "reference"
    x = torch.randn(B, t, E)
    future = torch.ones(t, t, dtype=torch.bool).triu(1)  # torch's polarity: True = hidden
    return {
        "qkv": lambda: ours(x),
        "qkv weights": lambda: ours(x, need_weights=True),
        "qkv weights, 1 head": lambda: ours(x, need_weights=[0]),
        "qkv reference weights": lambda: reference(x, need_weights=True),
        "torch weights": lambda: peer(x, x, x, need_weights=True, average_attn_weights=False),
        "torch": lambda: peer(x, x, x, need_weights=False),
        "qkv causal weights": lambda: ours(x, causal=True, need_weights=True),
        "torch causal weights": lambda: peer(
            x, x, x, attn_mask=future, need_weights=True, average_attn_weights=False
        ),
    }


def rows_for(t: int) -> list[dict]:
    with torch.no_grad():
        s = measure_turns(variants(t), repeat=5)
    case = f"T={t} fwd"
    at_2048 = t >= 2048
    return [
        result(
            f"qkv weights vs qkv without, {case}",
            s["qkv weights"],
            "qkv no weights",
            s["qkv"],
            target="≤ 1.3×",
            met=s["qkv weights"] <= 1.3 * s["qkv"],
        ),
        result(
            f"qkv weights vs torch weights, {case}",
            s["qkv weights"],
            "nn.MultiheadAttention weights",
            s["torch weights"],
            target="≥ 1.5× faster" if at_2048 else None,
            met=s["qkv weights"] * 1.5 <= s["torch weights"] if at_2048 else None,
        ),
        result(
            f"qkv weights vs qkv reference backend, {case}",
            s["qkv weights"],
            "qkv reference weights",
            s["qkv reference weights"],
        ),
        result(
            f"qkv weights of 1 head vs qkv without, {case}",
            s["qkv weights, 1 head"],
            "qkv no weights",
            s["qkv"],
        ),
        result(
            f"torch weights vs torch without, {case}",
            s["torch weights"],
            "nn.MultiheadAttention no weights",
            s["torch"],
        ),
        result(
            f"qkv without weights vs torch without, {case}",
            s["qkv"],
            "nn.MultiheadAttention no weights",
            s["torch"],
        ),
        result(
            f"qkv causal weights vs torch causal weights, {case}",
            s["qkv causal weights"],
            "nn.MultiheadAttention causal weights",
            s["torch causal weights"],
        ),
    ]


def run(out_dir: Path = Path("benchmarks/results"), quick: bool = False) -> dict:
    """Run every length; write ``out_dir/weights.json``; return the rows."""
    torch.manual_seed(0)
    rows = [row for t in ([256] if quick else [512, 2048]) for row in rows_for(t)]
    notes = (
        f"CPU fp32, inference (no grad), forward only, B={B}, E={E}, H={H}; all eight "
        "variants called in turns, median of 5 calls each."
    )
    return report(out_dir, "weights", rows, notes=notes)


if __name__ == "__main__":
    cli(run, __doc__)
