r"""The formula, alone: scaled dot-product attention written out in plain torch.

.. math::
    \mathrm{Attention}(Q, K, V) = \mathrm{softmax}\left(\frac{Q K^\top}{\sqrt{D}} + M\right) V

(Vaswani et al. 2017, eq. 1). Each query is compared with every key by a dot product, each
row of scores becomes a probability distribution over the keys (softmax), and the output
is the values summed with those weights. Everything fast in qkv (:mod:`qkv.kernels`)
computes this same thing and is tested against it; ``backend="reference"`` runs
:func:`attention` itself.

Shapes: B batch, H query heads, Hkv key/value heads, Tq/Tk query/key length, D head size.
One mask polarity: ``True`` = may attend; a float mask is added to the scores.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["attention", "causal_mask", "padding_mask", "restrict"]


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    causal: bool = False,
    scale: float | None = None,
    *,
    dropout_p: float = 0.0,
    need_weights: bool = False,
    need_lse: bool = False,
):
    """Scaled dot-product attention, step by step: ``softmax(Q Kᵀ · scale + M) V``.

    Args:
        q, k, v: queries, keys and values; ``Hkv`` divides ``H`` (grouped-query attention).
        mask: ``None``; boolean (``True`` = may attend); or float, added to the scores.
            Broadcastable to ``(B, H, Tq, Tk)``.
        causal: hide future keys, aligned bottom-right (see :func:`causal_mask`).
        scale: score scale, default ``1 / sqrt(D)``.
        dropout_p: dropout on the weights, as in the Transformer paper.
        need_weights, need_lse: also return the weights and the log-sum-exp of each row.

    Shape:
        q ``(B, H, Tq, D)``, k ``(B, Hkv, Tk, D)``, v ``(B, Hkv, Tk, Dv)``.

    Returns:
        ``out`` ``(B, H, Tq, Dv)``; with ``need_weights`` or ``need_lse`` the tuple
        ``(out, weights, lse)``: weights ``(B, H, Tq, Tk)``, lse ``(B, H, Tq)``, each
        ``None`` unless asked for. A query row that sees no key gets zeros, never NaN.
    """
    b, h, tq, d = q.shape
    tk = k.shape[-2]
    scale = 1.0 / math.sqrt(max(d, 1)) if scale is None else scale

    # 0) grouped-query attention: each key/value head serves H / Hkv consecutive query heads
    groups = h // k.shape[1]
    if groups > 1:
        k = k.repeat_interleave(groups, dim=1)  # (B, H, Tk, D)
        v = v.repeat_interleave(groups, dim=1)  # (B, H, Tk, Dv)

    # 1) compare every query with every key. Half precision scores in float32, as torch's
    #    fused kernels do (a product past 65504 stays finite; so does finfo(float32).min).
    compute = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
    scores = (q.to(compute) @ k.to(compute).transpose(-2, -1)).to(compute)  # (B, H, Tq, Tk)
    scores = scores.mul_(scale)  # in place: a product's backward needs only its inputs

    # 2) hide what may not be seen: -inf for a hidden key, a float mask added as it is
    if causal:
        mask = restrict(mask, causal_mask(tq, tk, device=q.device))
    sees_a_key = None  # (B?, H?, Tq, 1): rows that see some key; None when all do
    if mask is not None:
        bias = torch.where(mask, 0.0, float("-inf")) if mask.dtype == torch.bool else mask
        scores = scores + bias.to(compute)
        sees_a_key = _rows_that_see_a_key(mask)
    if sees_a_key is not None:  # finite scores there, so that no gradient becomes NaN
        scores = torch.where(sees_a_key, scores, 0.0)

    # 3) each row of scores becomes a probability distribution over the keys
    weights = torch.softmax(scores, dim=-1)  # (B, H, Tq, Tk)
    lse = torch.logsumexp(scores, dim=-1) if need_lse else None  # (B, H, Tq)
    if sees_a_key is not None:  # a row that sees nothing: zero weights, lse -inf
        weights = torch.where(sees_a_key, weights, 0.0)
        lse = None if lse is None else lse.masked_fill(~sees_a_key.squeeze(-1), float("-inf"))
    weights = weights.to(q.dtype)

    # 4) dropout acts on the weights
    dropped = F.dropout(weights, p=dropout_p) if dropout_p > 0 else weights

    # 5) the output is the weighted sum of the values
    out = dropped @ v  # (B, H, Tq, Tk) @ (B, H, Tk, Dv) -> (B, H, Tq, Dv)
    if need_weights or need_lse:
        return out, (weights if need_weights else None), lse
    return out


def causal_mask(tq: int, tk: int, device: torch.device | str | None = None) -> Tensor:
    """Boolean ``(Tq, Tk)`` mask, ``True`` where query ``i`` may see key ``j``.

    Aligned bottom-right: query ``i`` sees keys ``j <= i + (Tk - Tq)``, so the last query
    sees every key. With ``Tq == Tk`` this is the usual lower triangle; with a KV cache
    (``Tq`` new queries after ``Tk - Tq`` cached keys) it is what incremental decoding needs.
    """
    if tq < 0 or tk < 0:
        raise ValueError(f"causal_mask needs lengths >= 0, got tq={tq}, tk={tk}")
    rows = torch.arange(tq, device=device).unsqueeze(1)
    cols = torch.arange(tk, device=device).unsqueeze(0)
    return cols <= rows + (tk - tq)


def padding_mask(lengths: Tensor, max_len: int | None = None) -> Tensor:
    """Boolean ``(B, T)`` key mask, ``True`` for the first ``lengths[b]`` (real) tokens;
    ``T`` is ``max_len``, which no length may exceed, or else the longest length."""
    lengths = torch.as_tensor(lengths)
    if lengths.ndim != 1:
        raise ValueError(f"lengths must be 1-d (B,), got shape {tuple(lengths.shape)}")
    if not lengths.numel():  # an empty batch (torch.as_tensor([]) is float32)
        return torch.zeros(0, max_len or 0, dtype=torch.bool, device=lengths.device)
    if lengths.is_floating_point() or lengths.is_complex() or lengths.dtype == torch.bool:
        raise ValueError(f"lengths must be integers, got {lengths.dtype}")  # 1.5 read as 2
    if int(lengths.min()) < 0:
        raise ValueError(f"lengths must be >= 0, got {int(lengths.min())}")
    t = int(lengths.max()) if max_len is None else max_len
    if int(lengths.max()) > t:  # its tokens past max_len would be cut off unsaid
        raise ValueError(f"lengths: {int(lengths.max())} is longer than max_len {max_len}")
    return torch.arange(t, device=lengths.device).unsqueeze(0) < lengths.unsqueeze(1)


def restrict(mask: Tensor | None, allowed: Tensor) -> Tensor:
    """``mask`` (``None``, boolean or float) further limited to the ``allowed`` positions."""
    if mask is None:
        return allowed
    if mask.dtype == torch.bool:
        return mask & allowed
    return mask.masked_fill(~allowed, float("-inf"))


def _rows_that_see_a_key(mask: Tensor) -> Tensor | None:
    """``(..., Tq, 1)``: ``True`` for the query rows that see at least one key; ``None``
    when every row does (then nothing needs guarding)."""
    visible = mask if mask.dtype == torch.bool else mask > float("-inf")
    rows = visible.any(dim=-1, keepdim=True)
    if torch.compiler.is_compiling():
        return rows  # a traced graph has no data-dependent branch
    return None if bool(rows.all()) else rows
