"""Helpers shared by the peer ports: the CPU backends, layouts, masks and error measures.

Each peer's own reference (PyTorch's math SDPA, FlashAttention's ``attention_ref``,
xFormers' ``ref_attention``) is written in the test file that ports that peer; what is
here only moves tensors between conventions.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import torch
from torch import Tensor

import qkv
from qkv.modules import MultiHeadAttention

# every backend that runs on a CPU and serves any request (masks, gradients, every dtype):
# the ports run each case on each of them. cpu_flash serves float32 inference without a
# mask only: test_torch_sdpa.py ports torch's cases of that kind to it.
CPU_BACKENDS = [b for b in qkv.available_backends() if b not in ("triton", "cpu_flash")]

DTYPE_IDS = {
    torch.float64: "fp64",
    torch.float32: "fp32",
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
}


def dtype_id(dtype: torch.dtype) -> str:
    return DTYPE_IDS[dtype]


def sample(cases: Sequence, k: int, salt: str) -> list:
    """A fixed subset of ``k`` of ``cases``, the same in every run (collection must not
    depend on the test's seed): for the long tails of the peers' parameter grids."""
    return random.Random(salt).sample(list(cases), k)


def causal_bool(tq: int, tk: int, align: str) -> Tensor:
    """``(Tq, Tk)`` boolean causal mask, ``True`` = may attend. ``"top_left"``: row i sees
    keys ``j <= i`` (torch's ``is_causal``, xFormers' ``LowerTriangularMask``);
    ``"bottom_right"``: ``j <= i + Tk - Tq`` (qkv's ``causal=True``, FlashAttention's)."""
    shift = 0 if align == "top_left" else tk - tq
    rows = torch.arange(tq)[:, None]
    cols = torch.arange(tk)[None, :]
    return cols <= rows + shift


def sees_no_key(mask: Tensor) -> Tensor:
    """Where a boolean (``True`` = may attend) or float mask leaves a query row no key:
    ``(..., Tq, 1)``, True for those rows."""
    if mask.dtype == torch.bool:
        return ~mask.any(-1, keepdim=True)
    return torch.isneginf(mask).all(-1, keepdim=True)


def max_error(got: Tensor, want: Tensor) -> float:
    """Largest absolute difference, in float64."""
    return (got.double() - want.double()).abs().max().item() if got.numel() else 0.0


def set_backend(model: torch.nn.Module, backend: str) -> torch.nn.Module:
    """Every qkv ``MultiHeadAttention`` inside ``model`` runs ``backend``."""
    for module in model.modules():
        if isinstance(module, MultiHeadAttention):
            module.backend = backend
    return model
