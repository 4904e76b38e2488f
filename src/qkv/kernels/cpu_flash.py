"""The ``cpu_flash`` backend: attention in float32 on the CPU in one C kernel.

The formula is :func:`qkv.attention.attention`'s, ``softmax(q k^T * scale) v``, computed
the flash way (Dao et al., 2022): each query row walks over blocks of keys with a running
maximum and sum, so the score matrix is never stored. ``cpu_flash.c`` beside this file
says how it is laid out so that both products run at the core's arithmetic rate: the
query rows of the heads that share a key/value head (grouped-query attention) are taken
together, six at a time, and the keys are copied once into panels that those six rows
read as vectors. Exactly causal: keys past a row's limit are skipped or set to ``-inf``,
where torch's CPU flash kernel computes whole blocks of them (at 1,024 tokens, blocks of
256 rows, about a quarter more scores than the causal half).

What it serves: float32 CPU inference, with or without the causal mask and with the
log-sum-exp when asked for; no other mask, dropout, weights or gradient (``why_not``
says which). It is built on first use like :mod:`qkv.kernels.native`'s softmax (the
system C compiler, AVX-512F, ``QKV_NATIVE=0`` turns it off). ``auto`` prefers it to SDPA
where it is faster (measured: BENCHMARKS.md, 'CPU flash attention').
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from qkv.kernels.base import AttentionRequest, AttentionResult, Backend
from qkv.kernels.native import load_library, threads_for

__all__ = [
    "AUTO_MAX_HEAD_SIZE",
    "CPUFlashBackend",
    "MAX_HEAD_SIZE",
    "MIN_ROWS_PER_KV_HEAD",
    "why_unavailable",
]

SOURCE = Path(__file__).with_name("cpu_flash.c")
MAX_HEAD_SIZE = 512  # MAX_D in cpu_flash.c: one tile's rows live on the stack
# `auto` takes the kernel where it was faster than SDPA's CPU kernel in every measured case:
# at least this many query rows per key/value head (Tq times the query heads sharing it),
# which repay the copy of the keys into panels and read each block of keys and values for
# many rows, and head sizes up to AUTO_MAX_HEAD_SIZE (at D = 128 the outputs of six rows
# do not fit the registers, and it was as fast or slower). Measured: BENCHMARKS.md, 'CPU
# flash attention'.
MIN_ROWS_PER_KV_HEAD = 64
AUTO_MAX_HEAD_SIZE = 64


class CPUFlashBackend(Backend):
    """Flash attention in C for float32 CPU inference; returns the lse when asked."""

    name = "cpu_flash"

    def why_not(self, req: AttentionRequest) -> list[str]:
        q, k, v = req.q, req.k, req.v
        reasons = []
        if q.device.type != "cpu":
            reasons.append("runs on the CPU only")
        if any(t.dtype != torch.float32 for t in (q, k, v)):
            reasons.append("float32 only")
        if req.mask is not None:
            reasons.append("takes no mask other than the causal one")
        if req.dropout_p > 0:
            reasons.append("has no dropout")
        if req.need_weights:
            reasons.append("does not return the weights")
        if req.requires_grad:
            reasons.append("has no backward pass (inference only)")
        if max(q.shape[-1], v.shape[-1]) > MAX_HEAD_SIZE:
            reasons.append(f"head sizes up to {MAX_HEAD_SIZE}")
        if torch.compiler.is_compiling():  # (and would trace the first build's checks)
            return reasons + ["torch.compile cannot trace a ctypes call"]
        why = why_unavailable()
        if why is not None:
            reasons.append(why)
        return reasons

    def why_not_auto(self, req: AttentionRequest) -> list[str]:
        reasons = self.why_not(req)
        if req.q.shape[-2] * req.groups < MIN_ROWS_PER_KV_HEAD:
            reasons.append(
                f"fewer than {MIN_ROWS_PER_KV_HEAD} query rows per key/value head: "
                "SDPA is as fast or faster"
            )
        if max(req.q.shape[-1], req.v.shape[-1]) > AUTO_MAX_HEAD_SIZE:
            reasons.append(f"head sizes over {AUTO_MAX_HEAD_SIZE}: SDPA is as fast or faster")
        return reasons

    def __call__(self, req: AttentionRequest) -> AttentionResult:
        q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (req.q, req.k, req.v))
        if k.stride(2) * 16 > 2**31 - 1:  # the kernel gathers 16 keys at int offsets
            k = k.contiguous()
        b, h, tq, d = q.shape
        hkv, tk, dv = k.shape[1], k.shape[2], v.shape[3]
        # written position-major, (B, Tq, H, Dv) seen as (B, H, Tq, Dv): the layout in
        # which the heads' outputs are concatenated for the output projection (a view then)
        out = torch.empty(b, tq, h, dv).transpose(1, 2)
        lse = torch.empty(b, h, tq) if req.need_lse else None
        if b * h * tq == 0:
            return AttentionResult(out=out, lse=lse)
        args = []
        for t in (q, k, v, out):
            args += [t.data_ptr(), t.stride(0), t.stride(1), t.stride(2)]
        _library().qkv_flash_attention(
            *args,
            None if lse is None else lse.data_ptr(),
            b,
            h,
            hkv,
            tq,
            tk,
            d,
            dv,
            req.scale,
            int(req.causal),
            threads_for(b * h * tq),
        )
        return AttentionResult(out=out, lse=lse)


def why_unavailable() -> str | None:
    """``None`` when the kernel is built and runs on this CPU; else the reason."""
    return _load()[1]


def _library() -> ctypes.CDLL:
    lib, reason = _load()
    if lib is None:
        raise RuntimeError(f"cpu_flash kernel unavailable: {reason}")
    return lib


@functools.cache
def _load() -> tuple[ctypes.CDLL | None, str | None]:
    lib, reason = load_library(SOURCE)
    if lib is None:
        return None, reason
    grid = [ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_long]
    lib.qkv_flash_attention.restype = None
    lib.qkv_flash_attention.argtypes = (
        grid * 4
        + [ctypes.c_void_p]
        + [ctypes.c_long] * 7
        + [ctypes.c_float, ctypes.c_int, ctypes.c_int]
    )
    return lib, None
