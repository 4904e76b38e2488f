"""Attention maps as the viewers take them: validation, token checks and a text summary.

Every viewer in :mod:`qkv.viz` accepts the same inputs and turns them into one float64
array of shape ``(L, H, Tq, Tk)`` (layers x heads x queries x keys) and two token lists,
queries and keys. Self-attention gives one list (``tokens``, Tq == Tk); cross-attention
gives the keys as ``src_tokens`` and the queries as ``tgt_tokens``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from qkv.data.text import utf8_problem

__all__ = [
    "AttentionMaps",
    "as_maps",
    "head_entropy",
    "prepare",
    "summarize",
    "summarize_map",
    "summary",
    "to_numpy",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AttentionMaps:
    """Validated attention maps with the tokens on both axes.

    Attributes:
        weights: float64 array, shape ``(L, H, Tq, Tk)``.
        query_tokens: the ``Tq`` tokens that attend (rows).
        key_tokens: the ``Tk`` tokens attended to (columns).
        kind: ``"self"`` or ``"cross"``.
    """

    weights: np.ndarray
    query_tokens: tuple[str, ...]
    key_tokens: tuple[str, ...]
    kind: str


def to_numpy(x: Any) -> np.ndarray:
    """Return ``x`` (tensor, array or nested list) as a float64 numpy array.

    A tensor is detached and copied to the CPU; a sparse one is made dense.

    Args:
        x: a ``torch.Tensor``, a numpy array or nested lists of numbers.

    Returns:
        float64 array of the same shape.

    Raises:
        ValueError: complex values, or a tensor on the meta device (it holds no values).
    """
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # torch.Tensor, without importing torch
        x = x.detach()
        if x.is_complex():
            raise ValueError("attention maps: complex values; give real weights")
        if x.is_meta:
            raise ValueError("attention maps: a tensor on the meta device holds no values")
        if str(x.layout) != "torch.strided":  # sparse (COO, CSR, ...): densify
            x = x.to_dense()
        x = x.cpu().double().numpy()
    elif np.iscomplexobj(x):
        raise ValueError("attention maps: complex values; give real weights")
    return np.asarray(x, dtype=np.float64)


def _drop_batch(arr: np.ndarray) -> np.ndarray:
    """``(L, 1, H, Tq, Tk)`` (per-layer maps stacked) or ``(1, L, H, Tq, Tk)`` (stacked
    along ``dim=1``, batch first) as ``(L, H, Tq, Tk)``."""
    if arr.shape[1] == 1:
        return arr[:, 0]
    if arr.shape[0] == 1:
        return arr[0]
    raise ValueError(
        f"attention maps: shape {arr.shape} is (L, B, H, Tq, Tk) with a batch of "
        f"{arr.shape[1]}, or (B, L, H, Tq, Tk) with a batch of {arr.shape[0]}; "
        "select one batch element first"
    )


def as_maps(maps: Any) -> np.ndarray:
    """Turn attention maps in any accepted layout into one ``(L, H, Tq, Tk)`` array.

    Args:
        maps: a tensor or array of shape ``(L, H, Tq, Tk)``, ``(H, Tq, Tk)`` (one layer) or
            ``(Tq, Tk)`` (one head), nested lists of numbers included; or a list of ``L``
            per-layer arrays or tensors ``(H, Tq, Tk)``, each possibly with a leading batch
            axis of size 1. A batch axis of size 1 on a 5-D
            input, ``(L, 1, H, Tq, Tk)`` or ``(1, L, H, Tq, Tk)``, is dropped too.

    Returns:
        float64 array of shape ``(L, H, Tq, Tk)``.

    Raises:
        ValueError: wrong number of dimensions, layers of different shapes, a batch axis
            larger than 1, an empty map, or non-finite weights.
    """
    if isinstance(maps, list | tuple) and maps and not any(hasattr(m, "shape") for m in maps):
        try:  # nested lists of numbers: an array, read as one below
            maps = to_numpy(maps)
        except ValueError:
            raise ValueError("attention maps: nested lists of different lengths") from None
    if isinstance(maps, list | tuple):
        if not maps:
            raise ValueError("attention maps: got an empty list of layers")
        layers = [to_numpy(m) for m in maps]
        layers = [m[0] if m.ndim == 4 and m.shape[0] == 1 else m for m in layers]
        bad = [(i, m.shape) for i, m in enumerate(layers) if m.ndim != 3]
        if bad:
            k, shape = bad[0]
            batch = f" (a batch of {shape[0]}; select one batch element first)"
            raise ValueError(
                f"attention maps: layer {k} has shape {shape}, expected (H, Tq, Tk)"
                + (batch if len(shape) == 4 else "")
            )
        if len({m.shape for m in layers}) > 1:
            shapes = [m.shape for m in layers]
            raise ValueError(f"attention maps: layers differ in shape: {shapes}")
        arr = np.stack(layers)
    else:
        arr = to_numpy(maps)
        if arr.ndim == 5:
            arr = _drop_batch(arr)
        arr = arr.reshape((1,) * (4 - arr.ndim) + arr.shape) if 2 <= arr.ndim < 4 else arr
    if arr.ndim != 4:
        raise ValueError(f"attention maps: shape {arr.shape}, expected (L, H, Tq, Tk)")
    if arr.size == 0:
        raise ValueError(f"attention maps: shape {arr.shape} is empty")
    if not np.isfinite(arr).all():
        raise ValueError("attention maps: weights contain NaN or infinity")
    return arr


def _texts(name: str, tokens: Sequence[Any]) -> tuple[str, ...]:
    """The tokens as strings; each must be UTF-8 text (the page and fonts need it)."""
    out = tuple(str(t) for t in tokens)
    for k, tok in enumerate(out):
        problem = utf8_problem(tok)
        if problem is not None:
            raise ValueError(
                f"{name}: token {k} {tok!r} is not valid UTF-8 text "
                f"({tok[problem[1]]!r} is a lone surrogate)"
            )
    return out


def _resolve_tokens(
    tokens: Sequence[Any] | None,
    src_tokens: Sequence[Any] | None,
    tgt_tokens: Sequence[Any] | None,
    tq: int,
    tk: int,
) -> tuple[tuple[str, ...], tuple[str, ...], str]:
    """Check the token lists against the map shape; return (queries, keys, kind)."""
    if tokens is not None:
        if src_tokens is not None or tgt_tokens is not None:
            raise ValueError(
                "give either tokens (self-attention) or src_tokens and "
                "tgt_tokens (cross-attention), not both"
            )
        toks = _texts("tokens", tokens)
        if not len(toks) == tq == tk:
            raise ValueError(
                f"self-attention: {len(toks)} tokens for maps of {tq} queries x {tk} keys"
            )
        return toks, toks, "self"
    if src_tokens is None and tgt_tokens is None:
        raise ValueError(
            f"no tokens for maps of {tq} queries x {tk} keys: give tokens (self-attention) "
            "or src_tokens and tgt_tokens (cross-attention)"
        )
    if src_tokens is None or tgt_tokens is None:
        raise ValueError("cross-attention needs both src_tokens (keys) and tgt_tokens (queries)")
    src = _texts("src_tokens", src_tokens)
    tgt = _texts("tgt_tokens", tgt_tokens)
    if len(tgt) != tq or len(src) != tk:
        raise ValueError(
            f"cross-attention: {len(tgt)} target and {len(src)} source tokens "
            f"for maps of {tq} queries x {tk} keys"
        )
    return tgt, src, "cross"


def prepare(
    maps: Any,
    tokens: Sequence[Any] | None = None,
    *,
    src_tokens: Sequence[Any] | None = None,
    tgt_tokens: Sequence[Any] | None = None,
) -> AttentionMaps:
    """Validate maps and tokens together.

    Args:
        maps: attention maps in any layout :func:`as_maps` accepts.
        tokens: self-attention tokens (queries and keys).
        src_tokens: cross-attention keys (the source sentence).
        tgt_tokens: cross-attention queries (the target sentence).

    Returns:
        An :class:`AttentionMaps`.
    """
    arr = as_maps(maps)
    queries, keys, kind = _resolve_tokens(tokens, src_tokens, tgt_tokens, *arr.shape[2:])
    return AttentionMaps(arr, queries, keys, kind)


def head_entropy(weights: np.ndarray) -> np.ndarray:
    """Mean entropy (nats) of the attention rows of every head.

    .. math:: \\bar{H}_{l,h} = \\frac{1}{T_q} \\sum_i -\\sum_j p_{ij} \\log p_{ij}

    Rows whose weights sum to zero (fully masked queries) are left out.

    Args:
        weights: array ``(L, H, Tq, Tk)``.

    Returns:
        array ``(L, H)``; low values mean focused heads.
    """
    w = np.clip(weights, 0.0, None)
    total = w.sum(-1, keepdims=True)  # (L, H, Tq, 1)
    p = np.divide(w, total, out=np.zeros_like(w), where=total > 0)
    ent = -(p * np.log(np.where(p > 0, p, 1.0))).sum(-1)  # (L, H, Tq)
    valid = total[..., 0] > 0
    count = valid.sum(-1)
    return np.where(count > 0, (ent * valid).sum(-1) / np.maximum(count, 1), np.inf)


def _describe_head(w: np.ndarray, queries: Sequence[str], keys: Sequence[str], kind: str) -> str:
    """Say where one head ``(Tq, Tk)`` looks most, in words."""
    tq, tk = w.shape
    valid = w.sum(-1) > 0
    n = max(int(valid.sum()), 1)
    top = w.argmax(-1)  # (Tq,)
    rows = np.arange(tq)
    patterns: list[tuple[float, str]] = []
    if kind == "self":
        patterns += [
            (float(((top == rows - 1) & valid).sum()) / n, "the previous token"),
            (float(((top == rows) & valid).sum()) / n, "itself"),
            (float(((top == rows + 1) & valid).sum()) / n, "the next token"),
        ]
    patterns += [
        (float(((top == 0) & valid).sum()) / n, f"the first token {keys[0]!r}"),
        (float(((top == tk - 1) & valid).sum()) / n, f"the last token {keys[-1]!r}"),
    ]
    share, where = max(patterns, key=lambda p: p[0])
    if share >= 0.5:
        return f"looks at {where} ({share:.0%} of queries)"
    received = w[valid].sum(0) / n  # mean weight each key receives
    j = int(received.argmax())
    return f"looks most at {keys[j]!r} (key {j}, {received[j]:.0%} of the attention)"


_NOTHING = "no attention: every weight is zero or negative (all queries masked?)"


def summary(
    maps: Any,
    tokens: Sequence[Any] | None = None,
    *,
    src_tokens: Sequence[Any] | None = None,
    tgt_tokens: Sequence[Any] | None = None,
) -> list[str]:
    """One line per layer: its most focused head and where that head looks.

    The most focused head is the one with the lowest mean row entropy
    (:func:`head_entropy`). Where it looks is the pattern followed by at least half of
    the queries' strongest weight (previous token, itself, next token, first or last
    token), else the key that receives the most attention. Layers and heads count from 0.

    Args:
        maps: attention maps in any layout :func:`as_maps` accepts.
        tokens: self-attention tokens.
        src_tokens: cross-attention keys.
        tgt_tokens: cross-attention queries.

    Returns:
        list of ``L`` strings, e.g. ``"layer 0: head 3 (entropy 0.21 nats) looks at the
        previous token (92% of queries)"``.
    """
    return summarize(prepare(maps, tokens, src_tokens=src_tokens, tgt_tokens=tgt_tokens))


def summarize(am: AttentionMaps) -> list[str]:
    """:func:`summary` for maps already validated by :func:`prepare`."""
    ent = head_entropy(am.weights)  # (L, H)
    lines = []
    for layer, row in enumerate(ent):
        h = int(row.argmin())
        if not np.isfinite(row[h]):  # head_entropy's mark of a head without a weight
            lines.append(f"layer {layer}: {_NOTHING}")
            continue
        what = _describe_head(am.weights[layer, h], am.query_tokens, am.key_tokens, am.kind)
        lines.append(f"layer {layer}: head {h} (entropy {row[h]:.2f} nats) {what}")
    return lines


def summarize_map(am: AttentionMaps) -> str:
    """One line for maps that are a single map ``(1, 1, Tq, Tk)``: its entropy and where it looks.

    For a map that is no particular layer and head (a translator's alignment, the mean of
    a layer's heads), where "layer 0: head 0" would name something that does not exist.

    Returns:
        e.g. ``"entropy 0.21 nats; looks at the first token '[CLS]' (92% of queries)"``.
    """
    if am.weights.shape[:2] != (1, 1):
        raise ValueError(f"summarize_map: maps of shape {am.weights.shape} are not one map")
    ent = float(head_entropy(am.weights)[0, 0])
    if not np.isfinite(ent):
        return _NOTHING
    what = _describe_head(am.weights[0, 0], am.query_tokens, am.key_tokens, am.kind)
    return f"entropy {ent:.2f} nats; {what}"
