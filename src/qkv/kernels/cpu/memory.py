"""Keeping freed memory for reuse while training or generating, where the default costs time.

On a virtual machine a page fault is expensive: filling fresh memory takes several times as
long as the same write into memory already faulted in. glibc hands out every allocation
above its mmap threshold (at most 32 MiB) with ``mmap`` and returns it with ``munmap`` when
freed, so a training step whose logits and their gradients are tens of MiB faults them in
afresh at every step, and a large share of a training run's time goes to the kernel.
:func:`reuse_freed_memory` keeps them in the heap instead: training is faster, at about the
same peak memory.

``qkv train`` enters it after data preparation and model building, around the loop only,
a causal LM's ``generate`` around its decoding and ``qkv generate`` around the prompt (a
long prompt's activations). In
a separate test script that entered it before the tokenizer training, the training steps
faulted *more* pages than with glibc's defaults (not explained yet): the benefit depends on
the heap's layout and has been measured only for the loop as ``qkv train`` runs it and for
a 1,024-token prompt of ``generate`` (BENCHMARKS.md, 'LLaMA-family decoding').

The attention weights beside a fused kernel are the other large, repeated allocation (512
MiB at ``B=4, H=8, T=2048``): :data:`kept_results` hands their storage out again once the
caller has let go of every tensor that refers to it, so a loop that asks for weights call
after call faults them in once. Tried before it and not adopted: transparent huge pages
(``madvise(MADV_HUGEPAGE)``) made repeated fills faster, but the first one, and any after
other work had fragmented memory, took far longer while the kernel gathered 2 MiB pages;
``MADV_POPULATE_WRITE`` before the writes costs more than the faults it replaces.

Linux/glibc only, and only a policy: anywhere else, or if the call fails, it does nothing,
and results are the same to the bit either way.

:func:`bound_onednn_caches` is for bf16 autocast on a CPU, where every matrix product runs
through oneDNN, which keeps each shape's prepared kernel (and its buffers) in caches of 1,024
entries by default. Token-bucketed batches bring new shapes at every step, so the caches
grew without end. Bounded to 32 entries they hold memory down, at the price of preparing
kernels again more often; 128 entries were no better than the default.

(measured: BENCHMARKS.md, 'CPU memory')
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import math
import os
import sys
import threading
from collections.abc import Iterator

import torch
from torch import Tensor

__all__ = ["KeptResults", "bound_onednn_caches", "kept_results", "reuse_freed_memory"]

_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4  # mallopt parameters (glibc's malloc.h)
_GLIBC_DEFAULTS = {_M_TRIM_THRESHOLD: 128 * 1024, _M_MMAP_MAX: 65536}


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """The C library with ``mallopt`` typed, or ``None`` off Linux/glibc."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    except (OSError, AttributeError):
        return None
    return libc


_reusing = 0  # blocks of reuse_freed_memory entered and not left, in all threads
_reusing_lock = threading.Lock()


@contextlib.contextmanager
def reuse_freed_memory() -> Iterator[None]:
    """Within the block, glibc serves every allocation from its heap and keeps freed memory.

    Sets ``M_MMAP_MAX = 0`` (no ``mmap`` per large allocation) and a trim threshold of
    ``2**31 - 1`` bytes, so the activations of one training step (or of a long prompt,
    layer after layer) reuse the pages of the previous one instead of faulting in fresh
    zeroed pages. Memory freed inside the block is kept by the process rather than returned
    to the system; the glibc defaults are restored when the last block open is left (a
    block may open inside another: ``generate`` within a training loop).
    """
    global _reusing
    libc = _libc()
    if libc is None:
        yield
        return
    with _reusing_lock:
        _reusing += 1
        if _reusing == 1:
            libc.mallopt(_M_MMAP_MAX, 0)
            libc.mallopt(_M_TRIM_THRESHOLD, 2**31 - 1)
    try:
        yield
    finally:
        with _reusing_lock:
            _reusing -= 1
            if _reusing == 0:
                for param, value in _GLIBC_DEFAULTS.items():
                    libc.mallopt(param, value)


def bound_onednn_caches(capacity: int = 32) -> None:
    """Bound oneDNN's kernel caches (``ONEDNN_PRIMITIVE_CACHE_CAPACITY``, and ideep's
    ``LRU_CACHE_CAPACITY``) to ``capacity`` entries, unless the user has set them.

    oneDNN reads them when it first builds a kernel, so this must run before the process's
    first bf16 (oneDNN) matrix product; later calls change nothing.
    """
    for name in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY"):
        os.environ.setdefault(name, str(capacity))


class KeptResults:
    """Large CPU result buffers, handed out again once nobody refers to them.

    :meth:`empty` returns a tensor like ``torch.empty``; for a CPU tensor of at least
    ``min_bytes`` it keeps the storage, and a later request of the same size and dtype gets
    that storage back if no tensor (the caller's, or any view of it) still uses it, which
    the storage's reference count says exactly, and if it was made in the same mode: an
    inference tensor (made under ``torch.inference_mode``) only goes to a call in that
    mode, where it is what ``torch.empty`` would give, and a normal one only outside it.
    Its content is then stale, so callers must write every element, as the attention
    weights do. At most ``limit_bytes`` are kept (the oldest are let go first;
    ``limit_bytes = 0`` keeps nothing); :meth:`clear` lets go of all of them. Set
    ``QKV_KEPT_RESULTS_MIB`` to change the default limit (1024 MiB).
    """

    def __init__(self, limit_bytes: int, min_bytes: int = 32 << 20) -> None:
        self.limit_bytes, self.min_bytes = limit_bytes, min_bytes
        self._kept: list[Tensor] = []  # flat tensors, oldest first
        self._lock = threading.Lock()

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
        numel = math.prod(shape)
        nbytes = numel * dtype.itemsize
        if torch.device(device).type != "cpu" or not self.min_bytes <= nbytes <= self.limit_bytes:
            return torch.empty(shape, dtype=dtype, device=device)
        inference = torch.is_inference_mode_enabled()  # kept tensors keep their mode
        with self._lock:
            for i, flat in enumerate(self._kept):
                if (
                    flat.dtype == dtype
                    and flat.numel() == numel
                    and flat.is_inference() == inference
                    and _unused(flat)
                ):
                    self._kept.append(self._kept.pop(i))  # the newest now
                    return flat.view(shape)
            flat = torch.empty(numel, dtype=dtype)
            self._kept.append(flat)
            while sum(t.nbytes for t in self._kept) > self.limit_bytes:
                self._kept.pop(0)  # a caller still holding it keeps it alive, not us
            return flat.view(shape)

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()


def _unused(flat: Tensor) -> bool:
    """Whether only ``flat`` itself refers to its storage (the 2nd reference is the handle
    that asking for the storage creates)."""
    return torch._C._storage_Use_Count(flat.untyped_storage()._cdata) <= 2


kept_results = KeptResults(int(os.environ.get("QKV_KEPT_RESULTS_MIB", "1024")) << 20)
