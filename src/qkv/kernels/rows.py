"""Masked attention over whole key rows: ``S = Q Kᵀ``, one C softmax pass, ``out = P V``.

For the ``chunked`` backend's masked runs in float32 on a CPU (no autograd): a block of
query rows takes its whole visible key range at once, so no online rescaling and no merge
is needed. The scores come from torch's matrix product into a reused scratch block;
:func:`qkv.kernels.native.softmax_rows` then scales them, reads the boolean mask as bytes
(or adds a float bias such as ALiBi), applies the causal limit and normalises, all in one
pass over the block while it is in cache; torch's product gives the output.

The alternative, torch's CPU flash kernel on pieces of the range with a float bias each,
pays for making every piece's bias from the mask and for merging the pieces by their
log-sum-exp (:func:`qkv.kernels.chunked._split_calls`), and a second thread helps those
serial steps little. The reference is :func:`qkv.kernels.chunked._query_block` (and the
``reference`` backend): the same function of the same scores.
"""

from __future__ import annotations

import torch
from torch import Tensor

from qkv.kernels import native
from qkv.kernels.base import AttentionRequest, Scratch

__all__ = ["masked_rows", "serves"]

# Scores per call (768 KiB in float32: 96 rows of 2,048 keys). Larger blocks are faster,
# since the products repack the keys less often, but the masks benchmark asks for a quarter
# of SDPA's peak memory (its output and one mask-sized bias), which this size keeps. One
# head per product: two heads of 64 rows each were slower on two threads (measured:
# BENCHMARKS.md, 'Chunked backend').
SCORES = 3 << 16


def serves(req: AttentionRequest) -> bool:
    """Whether :func:`masked_rows` can take this request's masked runs."""
    mask = req.mask
    return (
        req.q.dtype == torch.float32
        and req.q.device.type == "cpu"
        and not req.requires_grad
        and (mask is None or mask.dtype in (torch.bool, torch.float32))
        and native.why_unavailable() is None
    )


def masked_rows(req: AttentionRequest, sel: slice, run: tuple, out: Tensor, scratch: Scratch):
    """Write ``out[sel, :, qs:qe]`` for the run ``(qs, qe, lo, hi, dense)``: queries
    ``[qs, qe)`` over keys ``[lo, hi)``, the user mask applied unless ``dense``.

    Every block of a (sequence, head) has the layout of the first, which
    :func:`native.softmax_rows` checks; the others go to the C function directly, their
    mask rows found by address (the checks cost more than the kernel on two threads)."""
    qs, qe, lo, hi, dense = run
    b, h = req.q[sel].shape[:2]
    n = hi - lo
    step = min(max(1, SCORES // n), qe - qs)
    shift = req.k.shape[-2] - req.q.shape[-2]  # causal: query i sees keys up to i + shift
    kernel, threads = native.kernel(), native.threads_for(step)
    first = sel.start or 0
    for bi in range(first, first + b):
        for head in range(h):
            q, o = req.q[bi, head], out[bi, head]
            k, v = (t[bi, head // req.groups, lo:hi] for t in (req.k, req.v))
            mask, bias = _mask_rows(req, None if dense else (bi, head, qs, qe, lo, hi))
            s = scratch.take((step, n), k.dtype, k.device)
            for a in range(qs, qe, step):
                e = min(a + step, qe)
                torch.mm(q[a:e], k.t(), out=s[: e - a])
                seen0 = a + shift - lo + 1 if req.causal else n
                if a == qs:  # checks the layout that the blocks below share
                    native.softmax_rows(
                        s,
                        mask=_head(mask, step),
                        bias=_head(bias, step),
                        scale=req.scale,
                        seen0=seen0,
                    )
                else:
                    kernel(
                        s.data_ptr(),
                        0,
                        n,
                        None,
                        0,
                        0,
                        *_at(mask, a - qs),
                        *_at(bias, a - qs),
                        1,
                        e - a,
                        n,
                        req.scale,
                        min(seen0, n),
                        threads,
                    )
                torch.mm(s[: e - a], v, out=o[a:e])


def _head(t: Tensor | None, rows: int) -> Tensor | None:
    """The first ``rows`` rows of a run's mask (all of them when it broadcasts)."""
    return t if t is None or t.shape[0] == 1 else t[:rows]


def _at(t: Tensor | None, row: int) -> tuple[int | None, int, int]:
    """Address, grid stride and row stride of ``t`` from ``row`` on, for the C function."""
    if t is None:
        return None, 0, 0
    stride = t.stride(0) if t.shape[0] > 1 else 0
    return t.data_ptr() + row * stride * t.element_size(), 0, stride


def _mask_rows(req: AttentionRequest, where) -> tuple[Tensor | None, Tensor | None]:
    """The user mask of sequence ``bi``, head ``h``, queries ``[a, e)`` and keys
    ``[lo, hi)`` (2-d, broadcastable, keys contiguous) as a boolean mask or a float bias
    for :func:`native.softmax_rows`."""
    if where is None or req.mask is None:
        return None, None
    bi, h, a, e, lo, hi = where
    m = req.mask
    m = m[bi if m.shape[0] > 1 else 0, h if m.shape[1] > 1 else 0]
    m = m[a:e] if m.shape[0] > 1 else m
    m = m[:, lo:hi] if m.shape[1] > 1 else m.expand(m.shape[0], hi - lo)
    m = m if m.stride(-1) == 1 else m.contiguous()
    return (m, None) if m.dtype == torch.bool else (None, m)
