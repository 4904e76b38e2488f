"""The steps between a LLaMA layer's matrix products, over many rows, in C.

Over a prompt, the products of a layer of :class:`qkv.models.Llama` are matrix products
(torch's, at the core's arithmetic rate), and what lies between them is a few small
steps: two RMSNorms, the rotation of queries and keys, the gate of SwiGLU. torch spends
several passes over the rows on each (the rotation: a negation, a concatenation, two
products and a sum), about a ninth of a float32 prompt of 1,024 tokens on one thread
(BENCHMARKS.md, 'LLaMA-family decoding'). Here each step is one pass over its rows in
``matvec.c`` (the same functions as the one-token layer of
:mod:`~qkv.kernels.decode_layer`), split among torch's threads. They are float32 only
and work in place; what each computes is the model's own step, which the tests hold it
against in float64:
:class:`~qkv.modules.RMSNorm`, :func:`~qkv.modules.apply_rotary` and SwiGLU's
``SiLU(gate) * up`` (:class:`~qkv.modules.SwiGLU`).
"""

from __future__ import annotations

import ctypes
import functools

import torch
from torch import Tensor

from qkv.kernels import matvec
from qkv.kernels.native import threads_for

__all__ = ["rms_norm_rows", "rotate_rows", "silu_times", "supports"]


def supports(*tensors: Tensor) -> bool:
    """Whether the steps take these tensors: float32, contiguous, on the CPU, and the
    kernel built here."""
    return (
        all(
            t.dtype == torch.float32 and t.device.type == "cpu" and t.is_contiguous()
            for t in tensors
        )
        and matvec.why_unavailable() is None
    )


def rms_norm_rows(x: Tensor, gain: Tensor, eps: float, out: Tensor) -> Tensor:
    """RMSNorm of ``x``'s rows, ``gain * x / sqrt(mean(x^2) + eps)``, into ``out`` (which may
    be ``x``); returns ``out``.

    Shape:
        x and out ``(..., E)``, gain ``(E,)``.
    """
    n = x.shape[-1]
    _check(x, gain, out, shapes_ok=out.shape == x.shape and gain.shape == (n,))
    rows = x.numel() // max(n, 1)
    _kernel("qkv_rms_norm_rows")(
        x.data_ptr(), gain.data_ptr(), eps, out.data_ptr(), rows, n, threads_for(rows)
    )
    return out


def rotate_rows(v: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary positions in place, ``v cos + rotate_half(v) sin`` with
    ``rotate_half(v1, v2) = (-v2, v1)``, each token's cos and sin over all its heads;
    returns ``v``.

    Shape:
        v ``(B, T, heads, D)``, D even; cos and sin ``(B or 1, T, D)``.
    """
    b, t, heads, d = v.shape
    _check(
        v,
        cos,
        sin,
        shapes_ok=d % 2 == 0 and cos.shape == sin.shape and cos.shape in ((b, t, d), (1, t, d)),
    )
    cos_batch = t if cos.shape[0] == b and b > 1 else 0  # rows between sequences' rotations
    _kernel("qkv_rotate_rows")(
        v.data_ptr(),
        cos.data_ptr(),
        sin.data_ptr(),
        b,
        t,
        heads,
        d,
        cos_batch,
        threads_for(b * t),
    )
    return v


def silu_times(gate: Tensor, up: Tensor) -> Tensor:
    """SwiGLU's gate, ``SiLU(gate) * up``, in place of ``gate``; returns ``gate``."""
    _check(gate, up, shapes_ok=gate.shape == up.shape)
    n = gate.numel()
    _kernel("qkv_silu_times")(gate.data_ptr(), up.data_ptr(), n, threads_for(n // 256))
    return gate


def _check(*tensors: Tensor, shapes_ok: bool) -> None:
    if not shapes_ok or not supports(*tensors):
        got = ", ".join(f"{t.dtype} {tuple(t.shape)} on {t.device}" for t in tensors)
        raise ValueError(
            f"layer_steps: needs contiguous float32 CPU tensors of matching shapes, got {got}"
        )


@functools.cache
def _kernel(name: str):
    kernel = getattr(matvec.library(), name)
    kernel.restype = None
    address, count, threads = ctypes.c_void_p, ctypes.c_long, ctypes.c_int
    kernel.argtypes = {
        "qkv_rms_norm_rows": [address, address, ctypes.c_float, address, count, count, threads],
        "qkv_rotate_rows": [address, address, address, count, count, count, count, count, threads],
        "qkv_silu_times": [address, address, count, threads],
    }[name]
    return kernel
