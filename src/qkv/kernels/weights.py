"""Attention weights beside a fused kernel, for only the heads and query rows asked for.

Fused kernels (torch SDPA, qkv's Triton kernel) never store the ``(Tq, Tk)`` probabilities,
which is what makes them fast. When a caller also wants the weights (to look at them),
qkv lets the fused kernel compute the output and then recomputes the probabilities of the
selected heads and rows, one block of query rows at a time:

.. math::
    P_{ij} = \\exp(q_i \\cdot k_j \\cdot s + M_{ij} - \\mathrm{lse}_i)

when the kernel returned the log-sum-exp (one pass over the scores), or an ordinary
softmax over the block's complete key row when it did not (each row is whole, so this is
exact too) or when some lse is too large in magnitude for its float32 rounding to leave
the weights their precision (rows at ``torch.finfo(float32).min``:
:func:`qkv.kernels.tiles.lse_limit`). Either way the cost is one ``QK^T`` and one pass of
``exp`` per weight that is returned, never a second copy of the attention itself. When
*every* weight is wanted, the output is instead taken from them block by block
(``out = P V``), so the scores are computed once.

Writing the weights is the expensive part at long lengths: at ``B=4, H=8, T=2048`` they
are 512 MiB, and faulting in that much fresh memory costs about as much as the score and
value products, several times a fill of memory already touched (measured: BENCHMARKS.md,
'Weights beside a fused kernel'). So each block of scores lands in a reused scratch buffer,
the softmax writes the probabilities once into the result, ``P V`` reads them back while
they are still cached, and the result's storage comes from
:data:`qkv.kernels.cpu.memory.kept_results`, which hands it out again once the caller has
dropped the previous weights (no fresh pages call after call). In float32 on a CPU with
AVX-512 the softmax is :func:`qkv.kernels.native.softmax_rows`, which leaves the
probabilities in the scratch block for ``P V`` and streams them into the result without
reading its cache lines first, which is faster than torch's softmax.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import Tensor

from qkv.kernels import native
from qkv.kernels.base import AttentionRequest, Scratch
from qkv.kernels.cpu.memory import kept_results
from qkv.kernels.tiles import lse_limit, mask_tile, masked_scores, scores, weighted_values

__all__ = ["attention_weights"]

# Scores per block of rows (16 MiB in float32: a whole head at T=2048): the products repack
# the keys or values for every block, so fewer, taller blocks win although they outgrow the
# L2 cache (measured: BENCHMARKS.md, 'Weights beside a fused kernel').
ROW_BLOCK_ELEMENTS = 1 << 22
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
    if lse is not None and _beyond_limit(lse[..., r0:r1], req.q.dtype):
        lse = None  # whole rows here: the softmax needs no lse
    compute = torch.float64 if q.dtype == torch.float64 else torch.float32
    shape = (b, len(heads), r1 - r0, tk)
    if req.requires_grad:
        weights = torch.empty(shape, dtype=req.q.dtype, device=req.q.device)
    else:  # every element is written below, so a kept buffer's old content never shows
        weights = kept_results.empty(shape, req.q.dtype, req.q.device)
    out = None
    if with_output:
        out = torch.empty(shape[:-1] + v.shape[-1:], dtype=v.dtype, device=v.device)
    _fill(req, (q, k, v, mask, lse), weights, out, r0, compute)
    return (weights, out) if with_output else weights


def _fill(req: AttentionRequest, qkvml, weights: Tensor, out, r0: int, compute) -> None:
    """Write ``weights`` (and ``out`` unless ``None``) for query rows from ``r0``, one
    block of rows of a sequence's few heads (:func:`_units`) at a time (all at once when
    they are few)."""
    q, k, v, mask, lse = qkvml
    tq, tk = req.q.shape[-2], weights.shape[-1]
    direct = weights.dtype == compute and not req.requires_grad  # no copies, no temporaries
    may_hide_rows = req.mask is not None or (req.causal and tq > tk)  # rows with no key
    whole = weights.numel() <= SMALL_ELEMENTS
    units = [(slice(None), slice(None))] if whole else _units(*weights.shape[:2])
    n_rows = weights.shape[2]
    step = max(1, n_rows if whole else ROW_BLOCK_ELEMENTS // max(tk, 1))
    scratch = Scratch()  # one block of scores, reused: no fresh pages per block
    # A unit's keys and values, contiguous: a projection's views are strided, and the
    # matrix products would gather them again for every block of rows, which is slower
    # (measured: BENCHMARKS.md, 'Weights beside a fused kernel'). Without autograd each
    # unit's copies reuse the last unit's memory (no fresh pages per head).
    heads_k, heads_v = (Scratch(), Scratch()) if direct else (None, None)
    for bs, hs in units:
        mb = None if mask is None else mask[_sel(mask, 0, bs), _sel(mask, 1, hs)]
        kh, vh = _gathered(k[bs, hs], k.dtype, heads_k), _gathered(v[bs, hs], compute, heads_v)
        for i in range(0, n_rows, step):
            rs = slice(i, min(i + step, n_rows))  # rows of the result; queries r0 + rs
            dest = weights[bs, hs, rs].unsqueeze(2)
            target = None
            if direct:
                target = dest if whole else scratch.take(dest.shape, dest.dtype, dest.device)
            qs, qe = r0 + rs.start, r0 + rs.stop
            qb, lb = q[bs, hs, :, qs:qe], None if lse is None else lse[bs, hs, :, qs:qe]
            p = None
            if direct and lb is None and not whole:  # the scores go to a scratch block
                p = _streamed(req, qb, kh, mb, (qs, qe, tk - tq), target, dest)
            if p is None:
                s = masked_scores(req, qb, kh, mb, qs, qe, 0, tk, tk - tq, compute, out=target)
                hidden = functools.partial(_hidden_rows, req, mb, qs, qe)  # rarely called
                p = _probabilities(s, lb, dest if direct else None, may_hide_rows, hidden)
            if not direct:
                dest.copy_(p)
            if out is not None:
                rows_out = out[bs, hs, rs].unsqueeze(2)
                if direct:
                    weighted_values(p, vh, out=rows_out)
                else:
                    rows_out.copy_(weighted_values(p, vh))


def _probabilities(
    s: Tensor,
    lse: Tensor | None,
    out: Tensor | None,
    may_hide_rows: bool,
    hidden: Callable[[], Tensor] | None = None,
):
    """Scores -> probabilities, written into ``out`` (``None``: a new tensor, as autograd
    needs); rows that see no key get zeros (those ``hidden()`` names, where NaN came out:
    a NaN score makes a NaN row too, and that stays NaN).

    Without an lse this is ``torch.softmax`` itself, so the weights equal the reference
    backend's (and Hugging Face's eager attention) to the last bit.
    """
    if lse is not None:
        lse = lse.unsqueeze(-1).to(s.dtype)
        lse = torch.where(torch.isinf(lse), float("inf"), lse)  # exp(-inf) = 0
        # a row that sees no key has lse -inf, made +inf: zeros, and NaN only from NaN
        return torch.exp(s.sub_(lse), out=out) if out is not None else torch.exp(s - lse)
    if may_hide_rows and s.requires_grad:  # see _softmax_of_rows_seen
        return _softmax_of_rows_seen(s)
    p = torch.softmax(s, dim=-1, out=out) if out is not None else torch.softmax(s, dim=-1)
    if not may_hide_rows:
        return p
    empty = torch.isnan(p[..., :1])  # a row whose every key is hidden: -inf - -inf = NaN
    if bool(empty.any()):
        if hidden is not None:
            empty &= hidden()
        p = p.masked_fill_(empty, 0.0) if out is not None else p.masked_fill(empty, 0.0)
    return p


def _beyond_limit(lse: Tensor, dtype: torch.dtype) -> bool:
    """Whether some row's lse is too large in magnitude for ``exp(s - lse)`` to give
    weights in ``dtype`` that sum to 1 (:func:`~qkv.kernels.tiles.lse_limit`): at
    ``torch.finfo(float32).min`` the lse has rounded ``log Tk`` away and every weight
    would be 1."""
    finite = torch.where(torch.isinf(lse), 0.0, lse)  # -inf: a row that sees no key
    return bool(finite.abs().amax() > lse_limit(dtype)) if lse.numel() else False


def _hidden_rows(req: AttentionRequest, mask: Tensor | None, qs: int, qe: int) -> Tensor:
    """Which of the query rows ``[qs, qe)`` see no key (user mask and causal limit),
    broadcastable to ``(..., rows, 1)``."""
    tq, tk = req.q.shape[-2], req.k.shape[-2]
    tile = mask_tile(mask, qs, qe, 0, tk)
    seen = torch.ones(qe - qs, tk, dtype=torch.bool, device=req.q.device)
    if tile is not None:
        seen = seen & (tile if tile.dtype == torch.bool else tile > float("-inf"))
    if req.causal:
        rows = torch.arange(qs, qe, device=seen.device).unsqueeze(-1) + (tk - tq)
        seen = seen & (torch.arange(tk, device=seen.device) <= rows)
    return ~seen.any(dim=-1, keepdim=True)


def _softmax_of_rows_seen(s: Tensor) -> Tensor:
    """``softmax(s)`` with zeros for rows whose every score is ``-inf``, and zero gradients
    there: softmax's backward turns such a row's NaN into NaN gradients even where its
    output is filled with zeros afterwards, so the row is made finite before the softmax
    (as the reference backend does)."""
    empty = s.amax(dim=-1, keepdim=True) == float("-inf")
    if not bool(empty.any()):
        return torch.softmax(s, dim=-1)
    return torch.softmax(s.masked_fill(empty, 0.0), dim=-1).masked_fill(empty, 0.0)


def _streamed(req: AttentionRequest, qb: Tensor, kh: Tensor, mask, rows, s: Tensor, dest):
    """Probabilities of queries ``[qs, qe)`` from :func:`native.softmax_rows`, which
    applies the scale, the user mask or bias and the causal limit in the same pass, leaves
    them in the scratch block ``s`` (returned, for ``P V``) and streams them into ``dest``;
    ``None`` where it cannot take these tensors (then torch's operations do it).

    Its exp is its own (about 1 ulp), so the weights differ from ``torch.softmax``'s in the
    last bits; the scale multiplies the scores, which for a power of two (D = 64) gives the
    bits of scaling the queries."""
    qs, qe, shift = rows
    tile = mask_tile(mask, qs, qe, 0, s.shape[-1])
    user, bias = (tile, None) if tile is None or tile.dtype == torch.bool else (None, tile)
    if not native.supports(s, dest, user, bias):
        return None
    scores(qb, kh, out=s)
    seen0 = qs + shift + 1 if req.causal else None  # row qs + r sees keys up to qs + r + shift
    return native.softmax_rows(s, dest, user, bias, req.scale, seen0)


def _gathered(x: Tensor, dtype: torch.dtype, scratch: Scratch | None) -> Tensor:
    """``x`` in ``dtype`` and contiguous; a copy goes into ``scratch`` when given."""
    if scratch is None or (x.dtype == dtype and x.is_contiguous()):
        return x.to(dtype).contiguous()
    return scratch.take(x.shape, dtype, x.device).copy_(x)


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


def _units(b: int, h: int) -> list[tuple[slice, slice]]:
    """(batch, heads) slices that the loop serves one at a time: a sequence and as many
    heads as torch has threads, so each batched product gives every thread a whole head:
    faster than one head at a time or than more heads (measured: BENCHMARKS.md, 'Weights
    beside a fused kernel')."""
    group = max(1, min(h, torch.get_num_threads()))
    return [(slice(i, i + 1), slice(j, j + group)) for i in range(b) for j in range(0, h, group)]


def _sel(mask: Tensor, dim: int, want: slice) -> slice:
    """A mask index for batch/head ``want``: itself, or 0 where the mask broadcasts."""
    return want if mask.shape[dim] > 1 else slice(None)
