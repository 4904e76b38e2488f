"""A guard against a PyTorch/oneMKL race that silently lowers the precision of ``exp``.

On the CPU, PyTorch sends contiguous float32/float64 unary functions (``exp``, ``log``,
``sqrt``, ``tanh``, ``erf``, ``sin``, ...) to MKL's vector math library, one chunk per
intra-op thread. oneMKL picks each function's kernel the first time it is called; when that
first call runs on several threads at once, one thread can run a low-accuracy kernel for
its chunk (pytorch/pytorch#188792, fix proposed in #188791). Seen here: in a fresh process
with 2 threads, the first float64 ``torch.exp`` of 4,352 values was off by 3e-9 (relative)
in 7 of 40 processes, where float64 should be exact to 2e-16; the online softmax of the
``chunked`` backend then missed its float64 tolerance now and then.

:func:`warm_up` calls each function once on a single element (so on one thread) for both
dtypes before anything else does, which settles the choice; it costs microseconds and
changes no result (measured: 0 of 40 processes off afterwards). The attention dispatch
runs it once, on first use (:func:`qkv.kernels.dispatch.get_backend`).
"""

from __future__ import annotations

import torch

__all__ = ["warm_up"]

_FUNCTIONS = ("exp", "expm1", "log", "log1p", "sqrt", "rsqrt", "tanh", "erf", "sin", "cos")


def warm_up() -> None:
    """Call each vectorised unary function once, single-threaded, in float32 and float64."""
    with torch.no_grad():
        for dtype in (torch.float32, torch.float64):
            one = torch.full((1,), 0.5, dtype=dtype)
            for name in _FUNCTIONS:
                getattr(torch, name)(one)
