"""Splitting the keys across programs when the queries alone cannot fill the GPU.

The forward kernel runs one program per (block of queries, batch, head). Decoding with a
KV cache has one query row (or a few) per sequence, so ``B * H`` programs, fewer than an
H100/H200 has multiprocessors (132), each walking the whole cache alone. As in
Flash-Decoding (Dao, Haziza, Massa, Sizov 2023), the keys are then cut into ``S`` splits of
``split_len`` keys, one program per (query block, batch, head, split); each writes its
split's output and log-sum-exp in float32, and :func:`merge_splits` combines them exactly:

.. math::
    lse = \\log \\sum_s e^{lse_s},\\qquad out = \\sum_s e^{lse_s - lse}\\, out_s

The merged ``out`` and ``lse`` are those of one pass over all keys (up to rounding), so the
backward kernels use them unchanged.

:func:`split_len` decides. The thresholds are first guesses, not yet timed on a GPU: split
only where the programs would fill less than one wave of the multiprocessors, into enough
splits for about two waves, each of at least :data:`MIN_SPLIT_KEYS` keys.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

__all__ = ["MAX_SPLITS", "MIN_SPLIT_KEYS", "launch_split_len", "merge_splits", "split_len"]

MIN_SPLIT_KEYS = 512  # fewer keys per split and the merge costs more than the split saves
MAX_SPLITS = 64
ALIGN = 128  # split_len is a multiple of every BLOCK_N: a split starts on a key block


def split_len(
    programs: int, tk: int, multiprocessors: int, splits: int | None = None, align: int = ALIGN
) -> int:
    """Keys per split for a launch of ``programs`` programs over ``tk`` keys: ``tk`` itself
    (one split) unless splitting helps; a multiple of ``align`` (every BLOCK_N) otherwise.

    ``splits`` asks for that many splits (as near as the alignment allows) instead of the
    rule: ``programs * splits`` programs should reach about two waves of the
    ``multiprocessors``, each split of at least :data:`MIN_SPLIT_KEYS` keys.
    """
    if splits is None:
        if programs >= multiprocessors or tk < 2 * MIN_SPLIT_KEYS:
            return max(tk, 1)
        splits = min(-(-2 * multiprocessors // programs), tk // MIN_SPLIT_KEYS, MAX_SPLITS)
    if splits <= 1:
        return max(tk, 1)
    per = -(-tk // splits)
    return -(-per // align) * align


@functools.cache
def multiprocessors(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (0 elsewhere: never split)."""
    if device.type != "cuda":
        return 0
    return torch.cuda.get_device_properties(device).multi_processor_count


def launch_split_len(q: Tensor, tk: int, blocks: tuple[int, int] | None, splits: int | None) -> int:
    """:func:`split_len` for a forward launch on ``q`` ``(B, H, Tq, D)`` over ``tk`` keys,
    with fixed ``blocks`` or autotuned ones (64-row query blocks up to 64 queries)."""
    block_m, block_n = blocks or (64 if q.shape[2] <= 64 else 128, ALIGN)
    programs = -(-q.shape[2] // block_m) * q.shape[0] * q.shape[1]
    return split_len(programs, tk, multiprocessors(q.device), splits, block_n)


def merge_splits(out: Tensor, lse: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """Combine per-split results: out ``(S, B, H, Tq, Dv)`` and lse ``(S, B, H, Tq)``, both
    float32 (a split a row sees no key of: zeros and ``-inf``), into ``(out, lse)`` of all
    keys, out in ``dtype``. Rows that see no key at all: zeros and ``-inf``."""
    total = torch.logsumexp(lse, dim=0)
    safe = torch.where(torch.isinf(total), 0.0, total)  # all -inf: weights 0, not NaN
    weights = (lse - safe).exp_().unsqueeze(-1)
    return (weights * out).sum(0).to(dtype), total
