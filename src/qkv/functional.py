"""Attention as pure functions: scaled dot-product attention, masks, and the LSE merge.

Shapes use ``(B, H, T, D)``: B batch, H query heads, Hkv key/value heads, Tq/Tk query/key
length, D head size. One mask polarity everywhere: a boolean mask is ``True`` where a
query may attend to a key; a float mask is added to the scores.
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Iterable, Sequence

import torch
from torch import Tensor

from qkv.attention import causal_mask, padding_mask
from qkv.kernels.base import shape_problem
from qkv.kernels.dispatch import (
    AttentionRequest,
    Dispatch,
    available_backends,
    choose,
    explain,
    get_backend,
)

__all__ = [
    "attention_lse",
    "available_backends",
    "causal_mask",
    "combine_masks",
    "explain_dispatch",
    "from_torch_masks",
    "merge_attention",
    "padding_mask",
    "scaled_dot_product_attention",
]


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
    need_weights: bool | Sequence[int] = False,
    weight_rows: slice | None = None,
    backend: str = "auto",
) -> Tensor | tuple[Tensor, Tensor]:
    """Scaled dot-product attention (Vaswani et al. 2017, eq. 1).

    .. math::
        \\mathrm{Attention}(Q, K, V) = \\mathrm{softmax}(Q K^\\top \\cdot s + M) V,
        \\quad s = 1/\\sqrt{D}

    Args:
        q, k, v: queries, keys and values. ``Hkv`` must divide ``H`` (GQA/MQA: each key/value
            head serves ``H / Hkv`` consecutive query heads).
        mask: ``None``; boolean, ``True`` = may attend; or float, added to the scores.
            Broadcastable to ``(B, H, Tq, Tk)``.
        causal: hide future keys, aligned bottom-right when ``Tq != Tk``.
        scale: score scale, default ``1 / sqrt(D)``.
        dropout_p: dropout on the weights (pass 0 at evaluation time).
        need_weights: also return the attention weights: ``True`` for every head, or a
            sequence of query-head indices for just those. Fused backends compute the
            output as usual and recompute only the weights asked for.
        weight_rows: with ``need_weights``, only these query rows (a ``slice`` with step 1).
        backend: ``"auto"`` or one of :func:`available_backends`.

    Shape:
        q ``(B, H, Tq, D)``, k ``(B, Hkv, Tk, D)``, v ``(B, Hkv, Tk, Dv)``.

    Returns:
        ``out`` ``(B, H, Tq, Dv)``, or ``(out, weights)`` with weights ``(B, H, Tq, Tk)``
        when ``need_weights`` (``(B, len(heads), rows, Tk)`` for a selection). A query row
        that sees no key gets zeros in both. NaN inputs are not cleaned: a NaN in a key
        or value makes every row that sees it NaN, and may reach rows that hide it (a
        hidden score is added -inf, a hidden weight multiplies its value by 0), depending
        on the backend; a NaN in a query gives a NaN row, except that torch's fused CPU
        kernel (``sdpa`` or ``chunked`` without a mask) gives zeros, as
        ``torch.nn.functional.scaled_dot_product_attention`` does there.
    """
    req = _request(q, k, v, mask, causal, scale, dropout_p, need_weights, need_lse=False)
    if weight_rows is not None and not req.need_weights:
        raise ValueError("weight_rows selects query rows of the weights: pass need_weights too")
    req.weight_rows = _rows(weight_rows, q.shape[2]) if req.need_weights else None
    result = _run(req, backend)
    return (result.out, result.weights) if req.need_weights else result.out


def attention_lse(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    causal: bool = False,
    scale: float | None = None,
    backend: str = "auto",
) -> tuple[Tensor, Tensor]:
    """Attention that also returns the log-sum-exp of each query row's scores.

    ``lse = log sum_j exp(s_j)`` over visible keys (``-inf`` for a row that sees none), in
    float32 (float64 for float64 inputs). With it, results over disjoint key sets merge
    exactly (:func:`merge_attention`).

    Shape:
        as :func:`scaled_dot_product_attention`; returns ``out`` ``(B, H, Tq, Dv)`` and
        ``lse`` ``(B, H, Tq)``.
    """
    req = _request(q, k, v, mask, causal, scale, 0.0, False, need_lse=True)
    result = _run(req, backend)
    return result.out, result.lse


def merge_attention(
    out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor, *, inplace: bool = False
) -> tuple:
    """Merge attention over two disjoint key sets into attention over their union.

    .. math::
        m = \\max(lse_a, lse_b),\\quad w_a = e^{lse_a - m},\\quad w_b = e^{lse_b - m},

        out = \\frac{w_a\\, out_a + w_b\\, out_b}{w_a + w_b},\\quad lse = m + \\log(w_a + w_b)

    The maximum and the sum of the weights are kept apart: the weights are divided by their
    own sum, never by ``e^{lse}``. Where ``lse`` is so large in magnitude that adding
    ``log 2`` does not change it (a row whose scores all sit near
    ``torch.finfo(float32).min``), ``e^{lse_a - lse}`` would be 1 on both sides and the
    merge a sum instead of an average.

    Shape:
        out ``(..., Tq, Dv)``, lse ``(..., Tq)``. Returns ``(out, lse)``. Rows that see no
        key on either side stay zero with ``lse = -inf``. ``inplace`` writes the merged
        output into ``out_a``: no temporaries of their size.
    """
    _check_merge(out_a, lse_a, out_b, lse_b)
    compute = torch.promote_types(torch.promote_types(lse_a.dtype, lse_b.dtype), torch.float32)
    lse_a, lse_b = lse_a.to(compute), lse_b.to(compute)
    top = torch.maximum(lse_a, lse_b)
    top = torch.where(torch.isinf(top), 0.0, top)  # both sides empty: weights 0, not NaN
    w_a, w_b = (lse_a - top).exp_(), (lse_b - top).exp_()
    total = w_a + w_b
    lse = top + total.log()  # -inf where both sides are empty
    total = torch.where(total > 0, total, 1.0)  # those rows stay 0
    w_a, w_b = (w_a / total).unsqueeze(-1), (w_b / total).unsqueeze(-1)
    if inplace:  # one pass over each output
        return out_a.mul_(w_a).addcmul_(out_b, w_b), lse
    out = w_a * out_a.to(compute) + w_b * out_b.to(compute)
    return out.to(out_a.dtype), lse


def _check_merge(out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor) -> None:
    shapes = [tuple(t.shape) for t in (out_a, lse_a, out_b, lse_b)]
    if not (out_a.shape == out_b.shape and lse_a.shape == lse_b.shape == out_a.shape[:-1]):
        raise ValueError(
            "merge_attention needs out_a, out_b of one shape (..., Tq, Dv) and lse_a, lse_b "
            "of shape (..., Tq); got out_a {}, lse_a {}, out_b {}, lse_b {}".format(*shapes)
        )
    parts = {"out_a": out_a, "lse_a": lse_a, "out_b": out_b, "lse_b": lse_b}
    for name, t in parts.items():
        if not t.is_floating_point():
            raise ValueError(f"merge_attention: {name} must be floating point, got {t.dtype}")
        if t.device != out_a.device:
            raise ValueError(
                f"merge_attention: {name} is on {t.device}, out_a on {out_a.device}: "
                "all four must be on one device"
            )


def from_torch_masks(
    attn_mask: Tensor | None = None,
    key_padding_mask: Tensor | None = None,
    *,
    num_heads: int | None = None,
    dtype: torch.dtype = torch.float32,
) -> Tensor | None:
    """Translate ``torch.nn.MultiheadAttention`` masks to one qkv mask.

    torch uses the opposite boolean polarity (``True`` = do not attend); float masks are
    added in both libraries.

    Args:
        attn_mask: ``(Tq, Tk)`` or ``(B * num_heads, Tq, Tk)``, bool (``True`` = ignore) or float.
        key_padding_mask: ``(B, Tk)``, bool (``True`` = padding) or float.
        num_heads: needed for a 3-d ``attn_mask``.
        dtype: the float dtype used when a float mask is involved.

    Returns:
        ``None`` or a mask broadcastable to ``(B, H, Tq, Tk)`` in qkv's polarity: boolean
        when both inputs are boolean, float otherwise.
    """
    parts = []
    if attn_mask is not None:
        if attn_mask.ndim == 3:
            if num_heads is None:
                raise ValueError("a 3-d attn_mask (B*H, Tq, Tk) needs num_heads")
            if num_heads < 1 or attn_mask.shape[0] % num_heads:
                raise ValueError(
                    f"a 3-d attn_mask is (B*H, Tq, Tk): its {attn_mask.shape[0]} rows are "
                    f"not a multiple of num_heads={num_heads}"
                )
            attn_mask = attn_mask.reshape(-1, num_heads, *attn_mask.shape[-2:])
        parts.append(attn_mask)
    if key_padding_mask is not None:
        parts.append(key_padding_mask[:, None, None, :])  # (B, 1, 1, Tk)
    # torch: True = ignore, float = added. qkv: True = may attend, float = added.
    flipped = [~p if p.dtype == torch.bool else p.to(dtype) for p in parts]
    return combine_masks(*flipped)


def combine_masks(*masks: Tensor | None) -> Tensor | None:
    """Combine masks (``None`` entries skipped) so that a key is seen only if all allow it.

    Boolean masks (``True`` = may attend) are and-ed; when any mask is float, boolean ones
    become ``0 / -inf`` and all are added. Shapes broadcast.
    """
    present = [m for m in masks if m is not None]
    if not present:
        return None
    if all(m.dtype == torch.bool for m in present):
        out = present[0]
        for m in present[1:]:
            out = out & m
        return out
    dtype = next(m.dtype for m in present if m.dtype != torch.bool)
    out = None
    for m in present:
        if m.dtype == torch.bool:
            m = torch.zeros(m.shape, dtype=dtype, device=m.device).masked_fill(~m, float("-inf"))
        out = m if out is None else out + m
    return out


def explain_dispatch(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    causal: bool = False,
    dropout_p: float = 0.0,
    need_weights: bool = False,
    need_lse: bool = False,
) -> Dispatch:
    """Which backend ``auto`` runs for these inputs, and why each other one is not used.

    ``str()`` of the result is a short report, one line per backend.
    """
    return explain(_request(q, k, v, mask, causal, None, dropout_p, need_weights, need_lse))


# --- validation and dispatch -------------------------------------------------------------


def _run(req: AttentionRequest, backend: str):
    if backend == "auto":  # the choice fits by construction: no second check
        return get_backend(choose(req))(req)
    impl = get_backend(backend)
    why = impl.why_not(req)
    if why:
        raise ValueError(f"attention backend {backend!r} cannot run this call: " + "; ".join(why))
    return impl(req)


def _request(q, k, v, mask, causal, scale, dropout_p, need_weights, need_lse) -> AttentionRequest:
    _check_qkv(q, k, v)
    if not isinstance(dropout_p, numbers.Real) or not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be a number in [0, 1), got {dropout_p!r}")
    if not isinstance(causal, bool):  # "no" or None would be taken as truthy or falsy
        raise ValueError(f"causal must be True or False, got {causal!r}")
    target = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    mask = _check_mask(mask, target, q.device)
    # D = 0: every score is an empty sum, 0, whatever the scale; torch's SDPA then averages
    scale = 1.0 / math.sqrt(max(q.shape[-1], 1)) if scale is None else _scale(scale)
    heads = _heads(need_weights, q.shape[1])
    wanted = need_weights if isinstance(need_weights, bool) else need_weights is not None
    return AttentionRequest(q, k, v, mask, causal, scale, dropout_p, wanted, need_lse, heads)


def _heads(need_weights, h: int) -> tuple[int, ...] | None:
    """``need_weights`` as a head selection: ``None`` for all heads (or none wanted)."""
    if isinstance(need_weights, bool) or need_weights is None:
        return None
    if not isinstance(need_weights, Iterable) or isinstance(need_weights, (str, bytes)):
        raise TypeError(
            f"need_weights must be True, False or a sequence of head indices, got {need_weights!r}"
        )
    try:
        heads = tuple(operator.index(i) for i in need_weights)
    except TypeError:
        raise TypeError(f"need_weights heads must be integers, got {need_weights!r}") from None
    if not heads or any(not 0 <= i < h for i in heads):
        raise ValueError(f"need_weights heads must be indices in [0, {h}), got {list(heads)}")
    return heads


def _rows(rows: slice | None, tq: int) -> tuple[int, int] | None:
    """A query-row slice as ``(start, stop)`` within ``[0, Tq)``."""
    if rows is None:
        return None
    if not isinstance(rows, slice) or rows.step not in (None, 1):
        raise ValueError(f"weight_rows must be a slice with step 1, got {rows!r}")
    start, stop, _ = rows.indices(tq)
    if stop <= start:
        raise ValueError(f"weight_rows {rows!r} selects no query row of {tq}")
    return start, stop


def _scale(scale) -> float:
    if not isinstance(scale, numbers.Real):
        raise ValueError(f"scale must be a number or None, got {scale!r}")
    value = float(scale)
    if not math.isfinite(value):
        raise ValueError(f"scale must be a finite number, got {value}")
    return value


def _check_qkv(q: Tensor, k: Tensor, v: Tensor) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise ValueError(f"{name} must be a tensor, got {type(t).__name__}")
    if not q.device == k.device == v.device:
        raise ValueError(
            f"q, k, v must be on one device: q on {q.device}, k on {k.device}, v on {v.device}"
        )
    problem = shape_problem(q.shape, k.shape, v.shape)
    if problem:
        shapes = f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        raise ValueError(f"{problem}: {shapes}")
    if not (q.dtype == k.dtype == v.dtype) or not q.is_floating_point():
        raise ValueError(f"q, k, v must share one floating dtype: {q.dtype}, {k.dtype}, {v.dtype}")


def _check_mask(
    mask: Tensor | None, target: tuple[int, int, int, int], device: torch.device
) -> Tensor | None:
    """Validate a mask against ``(B, H, Tq, Tk)`` on ``device`` and return it as a 4-d
    broadcastable view."""
    if mask is None:
        return None
    if not isinstance(mask, Tensor):
        raise ValueError(f"mask must be a tensor or None, got {type(mask).__name__}")
    if mask.device != device:
        raise ValueError(f"mask is on {mask.device}, q, k, v on {device}: move it there")
    if mask.dtype != torch.bool and not mask.is_floating_point():
        raise ValueError(f"mask must be boolean (True = may attend) or float, got {mask.dtype}")
    ok = mask.ndim <= 4 and all(
        m in (1, t) for m, t in zip(mask.shape[::-1], target[::-1], strict=False)
    )
    if not ok:
        raise ValueError(
            f"mask of shape {tuple(mask.shape)} does not broadcast to (B, H, Tq, Tk) = {target}"
        )
    while mask.ndim < 4:
        mask = mask.unsqueeze(0)
    return mask
