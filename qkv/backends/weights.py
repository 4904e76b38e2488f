"""Attention weights beside a fused kernel, for only the heads and query rows asked for.

Fused kernels (torch SDPA, qkv's Triton kernel) never store the ``(Tq, Tk)`` probabilities,
which is what makes them fast. When a caller also wants the weights (to look at them),
qkv lets the fused kernel compute the output and then recomputes the probabilities of the
selected heads and rows, one block of query rows at a time:

.. math::
    P_{ij} = \\exp(q_i \\cdot k_j \\cdot s + M_{ij} - \\mathrm{lse}_i)

when the kernel returned the log-sum-exp (one pass over the scores), or an ordinary
softmax over the block's complete key row when it did not (each row is whole, so this is
exact too). Either way the cost is one ``QK^T`` and one pass of ``exp`` per weight that is
returned, never a second copy of the attention itself. When *every* weight is wanted, the
output is instead taken from them block by block (``out = P V``), so the scores are
computed once.

Writing the weights is the expensive part at long lengths: at ``B=4, H=8, T=2048`` they
are 512 MiB, and touching that much fresh memory costs about as much as the arithmetic
(measured on the project's machine, one thread: 0.43 s to fault in 512 MiB, 0.72 s for the
scores, softmax and ``P V`` written into memory already touched, 0.60 s for SDPA's output
alone). Each block of rows is therefore written once, straight from the matrix product, and
turned into probabilities while it is still in cache.
"""

from __future__ import annotations

import torch
from torch import Tensor

from qkv.backends.base import AttentionRequest
from qkv.backends.tiles import masked_scores, weighted_values

__all__ = ["attention_weights"]

# Scores per block of rows (8 MiB in float32). Measured, all weights at T=2048, 1 thread,
# quiet, median of 5: 1.18 s with 1 << 21, 1.25 s with 1 << 19, 1.35 s with 1 << 18.
ROW_BLOCK_ELEMENTS = 1 << 21
SMALL_ELEMENTS = 1 << 22  # below this many weights, one batched pass beats a loop


def attention_weights(
    req: AttentionRequest,
    lse: Tensor | None = None,
    heads: list[int] | None = None,
    rows: tuple[int, int] | None = None,
    *,
    with_output: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """The attention probabilities of ``heads`` (all: ``None``) for query ``rows``.

    Args:
        req: the request the output was computed for.
        lse: ``(B, H, Tq)`` log-sum-exp from the kernel, or ``None`` (then a row softmax).
        heads: query head indices; rows: ``(start, stop)`` query rows.
        with_output: also return ``out = P V`` for those heads and rows, computed from
            each block of probabilities while it is still in cache. When every weight is
            wanted this is cheaper than a fused kernel beside them: the scores and their
            exponentials are computed once instead of twice.

    Returns:
        weights ``(B, len(heads), stop - start, Tk)`` in the dtype of the inputs (a row
        that sees no key is all zeros), and with ``with_output`` also ``out``
        ``(B, len(heads), stop - start, Dv)``.
    """
    b, h, tq, _ = req.q.shape
    tk = req.k.shape[-2]
    heads = list(range(h)) if heads is None else list(heads)
    r0, r1 = rows if rows is not None else (0, tq)
    q, k, v, mask, lse = _select_heads(req, heads, lse)  # 5-d (B, Hs, 1, T, D), no GQA left
    compute = torch.float64 if q.dtype == torch.float64 else torch.float32
    weights = torch.empty((b, len(heads), r1 - r0, tk), dtype=req.q.dtype, device=req.q.device)
    out = torch.empty(weights.shape[:-1] + v.shape[-1:], dtype=v.dtype, device=v.device)
    grad = req.requires_grad  # then no `out=` products and no in-place arithmetic
    direct = weights.dtype == compute and not grad  # scores written straight into the result
    may_hide_rows = req.mask is not None or (req.causal and tq > tk)  # rows with no key
    whole = weights.numel() <= SMALL_ELEMENTS
    units = [(slice(None), slice(None))] if whole else _pairs(b, len(heads))
    step = (r1 - r0) if whole else max(1, ROW_BLOCK_ELEMENTS // max(tk, 1))
    for bs, hs in units:
        mb = None if mask is None else mask[_sel(mask, 0, bs), _sel(mask, 1, hs)]
        for qs in range(r0, r1, step):
            qe = min(qs + step, r1)
            dest = weights[bs, hs, qs - r0 : qe - r0]
            s = masked_scores(req, q[bs, hs, :, qs:qe], k[bs, hs], mb, qs, qe, 0, tk, tk - tq,
                              compute, out=dest.unsqueeze(2) if direct else None)  # fmt: skip
            p = _probabilities(s, None if lse is None else lse[bs, hs, :, qs:qe], not grad,
                               may_hide_rows)  # fmt: skip
            if not direct:
                dest.copy_(p.squeeze(2))
            if with_output:
                pv = weighted_values(p, v[bs, hs].to(compute)).squeeze(2)
                out[bs, hs, qs - r0 : qe - r0] = pv
    return (weights, out) if with_output else weights


def _probabilities(s: Tensor, lse: Tensor | None, inplace: bool, may_hide_rows: bool) -> Tensor:
    """Scores -> probabilities (in place unless autograd records); hidden rows get zeros.

    Without an lse this is ``torch.softmax`` itself, so the weights equal the reference
    backend's (and Hugging Face's eager attention) to the last bit.
    """
    if lse is not None:
        lse = lse.unsqueeze(-1).to(s.dtype)
        lse = torch.where(torch.isinf(lse), float("inf"), lse)  # exp(-inf) = 0
        return s.sub_(lse).exp_() if inplace else torch.exp(s - lse)
    p = torch.softmax(s, dim=-1, out=s) if inplace else torch.softmax(s, dim=-1)
    if not may_hide_rows:
        return p
    empty = torch.isnan(p[..., :1])  # a row whose every key is hidden: -inf - -inf = NaN
    if bool(empty.any()):
        p = p.masked_fill_(empty, 0.0) if inplace else p.masked_fill(empty, 0.0)
    return p


def _select_heads(req: AttentionRequest, heads: list[int], lse: Tensor | None):
    """q, k, v, mask and lse of the chosen query heads, each with its key/value head.

    A run of consecutive heads without GQA (all heads, or one) is taken as a view: no copy
    of the keys and values, which matters when decoding step by step with a long cache.
    """
    n = len(heads)
    if req.groups == 1 and heads == list(range(heads[0], heads[0] + n)):
        by_query = by_key = slice(heads[0], heads[0] + n)
    else:
        by_query = torch.tensor(heads, device=req.q.device)
        by_key = by_query // req.groups
    q = _take(req.q, by_query).unsqueeze(2)
    k, v = _take(req.k, by_key).unsqueeze(2), _take(req.v, by_key).unsqueeze(2)
    mask = req.mask
    if mask is not None:
        mask = (_take(mask, by_query) if mask.shape[1] > 1 else mask).unsqueeze(2)
    if lse is not None:
        lse = _take(lse, by_query).unsqueeze(2)
    return q, k, v, mask, lse


def _take(t: Tensor, heads: slice | Tensor) -> Tensor:
    """Heads (dim 1) of ``t``: a view for a slice, a copy for an index tensor."""
    return t[:, heads] if isinstance(heads, slice) else t.index_select(1, heads)


def _pairs(b: int, h: int) -> list[tuple[slice, slice]]:
    return [(slice(i, i + 1), slice(j, j + 1)) for i in range(b) for j in range(h)]


def _sel(mask: Tensor, dim: int, want: slice) -> slice:
    """A mask index for batch/head ``want``: itself, or 0 where the mask broadcasts."""
    return want if mask.shape[dim] > 1 else slice(None)
