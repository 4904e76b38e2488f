"""Score tiles shared by the blocked backends (``chunked``) and the weights beside fused ones.

A tile is the block of scaled scores of query rows ``[qs, qe)`` against keys ``[ks, ke)``
with the user's mask and the causal mask already applied. Tensors here are 5-d,
``(B, Hkv, G, T, D)``: the ``G`` query heads that share one key/value head sit in their
own dimension, so grouped-query attention never copies a key or value head.

:class:`RunningMerge` folds outputs over disjoint key sets (with their log-sum-exp) into
one, for backends that call a kernel on a few keys at a time.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from qkv.kernels.base import AttentionRequest

__all__ = [
    "RunningMerge",
    "exact_scale",
    "grouped",
    "grouped_mask",
    "lse_limit",
    "mask_tile",
    "masked_scores",
    "prescaled",
    "scores",
    "weighted_values",
]


def grouped(x: Tensor, hkv: int) -> Tensor:
    """(B, H, T, D) -> (B, Hkv, G, T, D): the query heads that share one key/value head."""
    b, h, t, d = x.shape
    return x.view(b, hkv, h // hkv, t, d)


def grouped_mask(mask: Tensor | None, hkv: int) -> Tensor | None:
    """A 4-d broadcastable mask (B?, H?, Tq?, Tk?) -> 5-d (B?, Hkv?, G?, Tq?, Tk?)."""
    if mask is None:
        return None
    b, h, tq, tk = mask.shape
    if h == 1:
        return mask.unsqueeze(2)
    return mask.view(b, hkv, h // hkv, tq, tk)


def mask_tile(mask: Tensor | None, qs: int, qe: int, ks: int, ke: int) -> Tensor | None:
    """The part of a broadcastable mask for queries [qs, qe) and keys [ks, ke)."""
    if mask is None:
        return None
    if mask.shape[-2] != 1:
        mask = mask[..., qs:qe, :]
    if mask.shape[-1] != 1:
        mask = mask[..., ks:ke]
    return mask


def scores(q: Tensor, k: Tensor, out: Tensor | None = None) -> Tensor:
    """``q @ k^T`` for 5-d ``q (B, Hkv, G, rows, D)`` and ``k (B, Hkv, 1, keys, D)``.

    The ``G`` heads that share a key head become extra rows of one product; a single
    matrix goes through ``mm``, which MKL serves much faster than a batch of one. ``out``
    (contiguous, the result's shape) receives the product without a temporary.
    """
    b, hkv, g, rows, d = q.shape
    keys = k.shape[-2]
    if b * hkv == 1:
        dest = None if out is None else out.view(g * rows, keys)
        s = torch.mm(q.reshape(g * rows, d), k.reshape(keys, d).t(), out=dest)
    else:
        dest = None if out is None else out.view(b * hkv, g * rows, keys)
        q3, k3 = q.reshape(b * hkv, g * rows, d), k.reshape(b * hkv, keys, d)
        s = torch.bmm(q3, k3.transpose(1, 2), out=dest)
    return s.view(b, hkv, g, rows, keys)


def weighted_values(p: Tensor, v: Tensor, out: Tensor | None = None) -> Tensor:
    """``p @ v`` for 5-d ``p (B, Hkv, G, rows, keys)`` and ``v (B, Hkv, 1, keys, Dv)``;
    ``out`` (contiguous, the result's shape) receives it without a temporary."""
    b, hkv, g, rows, keys = p.shape
    dv = v.shape[-1]  # named, not -1: a view of no elements cannot infer it
    if b * hkv == 1:
        dest = None if out is None else out.view(g * rows, dv)
        pv = torch.mm(p.reshape(g * rows, keys), v.reshape(keys, dv), out=dest)
        return pv.view(b, hkv, g, rows, dv)
    dest = None if out is None else out.view(b * hkv, g * rows, dv)
    pv = torch.bmm(p.reshape(b * hkv, g * rows, keys), v.reshape(b * hkv, keys, dv), out=dest)
    return pv.view(b, hkv, g, rows, dv)


def exact_scale(scale: float) -> bool:
    """Whether multiplying by ``scale`` is exact in binary floating point (a power of two)."""
    return scale > 0 and math.frexp(scale)[0] == 0.5


def prescaled(q: Tensor, scale: float) -> tuple[Tensor, float | None]:
    """``(queries, scale still to apply to the scores)``.

    Scores are scaled after the product (Hugging Face's order: pretrained models stay
    bit-exact), except for a power of two (1/8 for D = 64), which scales every product and
    partial sum exactly: then the few queries are scaled instead of the many scores, with
    the same bits, one pass fewer, and none in the backward.
    """
    return (q * scale, None) if exact_scale(scale) else (q, scale)


def masked_scores(
    req: AttentionRequest, qb, kb, user, qs, qe, ks, ke, shift, compute, dense=False, out=None
) -> Tensor:
    """Scaled scores of one tile (B, Hkv, G, rows, keys) with the user and causal masks.

    Args:
        qb: queries ``[qs, qe)`` ``(B, Hkv, G, rows, D)``; kb: keys ``[ks, ke)``
            ``(B, Hkv, 1, keys, D)``; user: the 5-d user mask or ``None``; shift: ``Tk - Tq``
            (causal alignment); compute: float dtype of the arithmetic; dense: the user
            mask hides nothing in this tile (skip it); out: where to write the tile.

    The fills are in place even under autograd: a product's backward needs its inputs only.
    """
    qb, post = prescaled(qb.to(compute), req.scale)
    s = scores(qb, kb.to(compute), out)
    if post is not None:
        s.mul_(post)
    tile = None if dense else mask_tile(user, qs, qe, ks, ke)
    if tile is not None:  # adding a 0/-inf bias is much faster than a broadcast masked_fill
        bias = torch.where(tile, 0.0, float("-inf")) if tile.dtype == torch.bool else tile
        s.add_(bias.to(compute))
    first_hidden = qs + shift + 1  # the first key that some row of this tile may not see
    if req.causal and ke > first_hidden:
        c0 = max(first_hidden, ks)
        rows = torch.arange(qs, qe, device=s.device).unsqueeze(1)
        cols = torch.arange(c0, ke, device=s.device).unsqueeze(0)
        future = torch.where(cols > rows + shift, float("-inf"), 0.0).to(compute)
        s[..., c0 - ks :].add_(future)
    return s


def lse_limit(dtype: torch.dtype) -> float:
    """The largest ``|lse|`` precise enough to weigh results in ``dtype`` by ``e^{lse}``.

    A kernel returns ``lse = m + log l`` rounded to float32 (float64 for float64 inputs),
    off by up to ``|lse| u`` (``u``: that type's unit roundoff); merging by the lse weighs
    each part by ``e^{lse}``, and weights ``e^{s - lse}`` are scaled by the same error. Where
    ``|lse|`` is huge the rounding swallows ``log l`` itself (scores all at
    ``torch.finfo(float32).min``: every part weighs the same however many keys it holds,
    every weight is 1). Below this limit that error stays within a quarter of the unit
    roundoff of ``dtype`` (2048 for float16, 16384 for bfloat16), and at least 32, where
    rows of ordinary scores lie (the largest score plus ``log Tk``; in float32 the error is
    then at most about 2e-6).
    """
    wide = torch.float64 if dtype == torch.float64 else torch.float32
    return max(32.0, torch.finfo(dtype).eps / (4 * torch.finfo(wide).eps))


class RunningMerge:
    """Outputs over disjoint key sets folded into ``acc`` one by one, normalised once.

    The same sum as :func:`qkv.functional.merge_attention` applied pairwise, in fewer
    passes: ``acc`` holds ``sum_i exp(lse_i - ref) out_i`` for a per-row reference ``ref``
    (the row's first finite lse), and ``w`` the sum of those weights; :meth:`finish`
    divides. ``ref`` moves up only when a later lse exceeds it by more than
    :data:`RESCALE_ABOVE`, so the weights stay far from overflow; a row that the parts so
    far hid (``w = 0``) takes its reference from the first part that reaches it, however
    low its lse (a fixed reference would let ``exp`` of such a part underflow to 0). Rows
    no key reaches end as zeros. A lone part costs only its copy: the first part's weights
    are made when a second one arrives.

    The parts' lse must be precise enough for their weights: rows beyond
    :func:`lse_limit` need another way (:meth:`lse` tells which).
    """

    RESCALE_ABOVE = 40.0  # exp(40) ~ 2e17: sums of such weights stay finite in float32

    def __init__(self, acc: Tensor):
        self.acc, self.ref, self.w, self.parts = acc, None, None, 0
        self.first_lse: Tensor | None = None

    def add(self, out: Tensor, lse: Tensor) -> None:
        lse = lse.to(torch.promote_types(lse.dtype, torch.float32))
        self.parts += 1
        if self.parts == 1:  # copied as it is; its weights wait for a second part
            self.acc.copy_(out)
            self.first_lse = lse
            return
        if self.parts == 2:  # the first part's weight: 1 (0 for rows it hides)
            first = self.first_lse
            self.ref = torch.where(torch.isinf(first), 0.0, first)
            self.w = (first - self.ref).exp_()
        # every row the parts so far reach has w >= 1: the part at its reference weighs 1
        fresh = (self.w == 0) & (lse > float("-inf"))  # reached for the first time
        rise = (lse > self.ref + self.RESCALE_ABOVE) | fresh  # false for NaN and -inf
        if bool(rise.any()):
            top = torch.where(rise, lse, self.ref)
            shrink = torch.where(fresh, 0.0, (self.ref - top).exp_())  # fresh rows hold 0
            self.acc.mul_(shrink.unsqueeze(-1))
            self.w.mul_(shrink)
            self.ref = top
        weight = (lse - self.ref).exp_()  # 0 for rows this part hides
        self.acc.addcmul_(out, weight.unsqueeze(-1))
        self.w.add_(weight)

    def finish(self) -> None:
        """Divide by the total weight; one part alone is already normalised (kept as is)."""
        if self.parts > 1:  # rows of total weight 0 saw no key: they stay 0, not NaN
            self.acc.div_(torch.where(self.w > 0, self.w, 1.0).unsqueeze(-1))

    def lse(self) -> Tensor:
        """The log-sum-exp of the parts added so far (``-inf`` for rows none reaches)."""
        if self.parts < 2:
            return self.first_lse
        return self.ref + self.w.log()
