"""Linear layers for decoding one token at a time on the CPU: a few rows of activations
times float32 or bfloat16 weights.

Decoding a token multiplies a few rows of activations by every weight matrix of the
model once, so reading the weights is the whole cost: the product should run at the
machine's memory bandwidth, and bfloat16 weights, half the bytes, in half the time.
torch's products do not get there on a row or two (on one thread float32 read 11 GB/s
and bfloat16 7 GB/s where a sum reads 25: BENCHMARKS.md, 'LLaMA-family decoding').
:func:`linear` sends those products to a small C kernel (``matvec.c`` beside this file)
that reads the weights once, row after row, widens a bfloat16 weight to float32 exactly
and sums in float32; everything else goes to ``F.linear``. The readable definition is
:func:`linear_reference`; the kernel is built and loaded as the softmax kernel is
(:mod:`qkv.kernels.native`: compiled on first use, AVX-512F, ``QKV_NATIVE=0`` turns it
off).
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from qkv.kernels.native import load_library, threads_for

__all__ = ["MAX_ROWS", "library", "linear", "linear_reference", "supports", "why_unavailable"]

SOURCE = Path(__file__).with_name("matvec.c")
MAX_ROWS = 4  # rows per kernel call (matvec.c); more rows are a matrix product
_KERNELS = {torch.float32: "qkv_matvec_f32", torch.bfloat16: "qkv_matvec_bf16"}


def linear_reference(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """What :func:`linear` computes: ``x @ weight.T + bias`` in float32 from the
    activations and weights (bfloat16 ones widened exactly), in the activations' type."""
    b = None if bias is None else bias.float()
    return F.linear(x.float(), weight.float(), b).to(x.dtype)


def supports(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> bool:
    """Whether the kernel serves this product: float32 or bfloat16 CPU weights
    ``(out, in)``, contiguous; at most :data:`MAX_ROWS` rows of activations of the same
    type; a bias of that type and the weights' length, or none; no gradient wanted; and
    the kernel built here."""
    return (
        weight.dtype in _KERNELS
        and weight.device.type == "cpu"
        and weight.dim() == 2
        and weight.is_contiguous()
        and x.device.type == "cpu"
        and x.dtype == weight.dtype
        and x.shape[-1] == weight.shape[1]
        and 0 < x.numel() // max(x.shape[-1], 1) <= MAX_ROWS
        and (bias is None or (bias.shape == weight.shape[:1] and bias.dtype == weight.dtype))
        and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
        and why_unavailable() is None
    )


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear(x, weight, bias)``, through the kernel when it :func:`supports` the
    product (the result then equals :func:`linear_reference`, up to the order of the
    sums), else through torch."""
    if not supports(x, weight, bias):
        return F.linear(x, weight, bias)
    rows = x.reshape(-1, x.shape[-1]).float().contiguous()  # (R, in), R <= MAX_ROWS
    out = torch.empty(rows.shape[0], weight.shape[0])  # (R, out)
    b = None if bias is None else bias.float().contiguous()
    getattr(library(), _KERNELS[weight.dtype])(
        rows.data_ptr(),
        rows.stride(0),
        weight.data_ptr(),
        None if b is None else b.data_ptr(),
        out.data_ptr(),
        out.stride(0),
        rows.shape[0],
        weight.shape[0],
        weight.shape[1],
        threads_for(weight.shape[0]),
    )
    return out.to(x.dtype).view(*x.shape[:-1], weight.shape[0])


def why_unavailable() -> str | None:
    """``None`` when the kernel is built and runs on this CPU; else the reason."""
    return _load()[1]


def library() -> ctypes.CDLL:
    """The built ``matvec.c`` (also :mod:`~qkv.kernels.decode_layer`'s); raises when
    :func:`why_unavailable` gives a reason."""
    lib, reason = _load()
    if lib is None:
        raise RuntimeError(f"qkv matvec kernel unavailable: {reason}")
    return lib


@functools.cache
def _load() -> tuple[ctypes.CDLL | None, str | None]:
    lib, reason = load_library(SOURCE)
    if lib is None:
        return None, reason
    address, count = ctypes.c_void_p, ctypes.c_long
    for name in _KERNELS.values():
        kernel = getattr(lib, name)
        kernel.restype = None
        kernel.argtypes = [
            address,  # x
            count,  # x's row stride
            address,  # weights
            address,  # bias or NULL
            address,  # y
            count,  # y's row stride
            count,  # rows
            count,  # out
            count,  # in
            ctypes.c_int,  # threads
        ]
    return lib, None
