"""Attention for RNN encoder–decoders: Bahdanau (additive) and Luong (global and local).

Both compare a decoder state (the query) with every encoder state (the keys, which are
also the values), turn the scores into weights with a softmax over the real source
tokens, and return the weighted sum, the *context*:

.. math::
    \\alpha_{ts} = \\frac{\\exp \\mathrm{score}(h_t, \\bar h_s)}{\\sum_{s'} \\exp
    \\mathrm{score}(h_t, \\bar h_{s'})}, \\qquad c_t = \\sum_s \\alpha_{ts} \\bar h_s

Bahdanau et al. (2015) use the previous decoder state ``s_{t-1}`` as the query and feed the
context into the recurrence; Luong et al. (2015) attend from the current state ``h_t``
after the recurrence, and add *local* attention over a window ``[p_t - D, p_t + D]``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from qkv.modules.scores import AdditiveScore, DotScore, GeneralScore, Score, check_widths

__all__ = ["BahdanauAttention", "LocationScore", "LuongAttention", "masked_softmax"]


def masked_softmax(scores: Tensor, mask: Tensor | None) -> Tensor:
    """Softmax over the last axis that gives exactly zero weight where ``mask`` is False.

    A row with no allowed position gets all-zero weights, never NaN.

    Shape:
        scores ``(..., Tk)``; mask broadcastable to it, ``True`` = may attend.
    """
    if mask is None:
        return torch.softmax(scores, dim=-1)
    filled = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    return torch.softmax(filled, dim=-1) * mask  # an all-masked row was uniform: now zeros


def _as_sequence(query: Tensor) -> tuple[Tensor, bool]:
    """Queries ``(B, Dq)`` (one step) become ``(B, 1, Dq)``; remember to squeeze back."""
    if query.ndim == 2:
        return query.unsqueeze(1), True
    if query.ndim == 3:
        return query, False
    raise ValueError(f"query must be (B, Dq) or (B, Tq, Dq), got {tuple(query.shape)}")


def _check_keys(query: Tensor, keys: Tensor, key_mask: Tensor | None) -> None:
    if keys.ndim != 3 or keys.shape[0] != query.shape[0]:
        raise ValueError(
            f"keys must be (B, Tk, Dk) with B={query.shape[0]}, got {tuple(keys.shape)}"
        )
    if key_mask is not None and (key_mask.dtype != torch.bool or key_mask.shape != keys.shape[:2]):
        raise ValueError(
            f"key_mask must be boolean (B, Tk) = {tuple(keys.shape[:2])} (True = real token), "
            f"got {key_mask.dtype} {tuple(key_mask.shape)}"
        )


def _check_prefix(key_mask: Tensor) -> None:
    """Local windows count source positions from 0: real tokens must come first."""
    lengths = key_mask.sum(-1, keepdim=True)  # (B, 1)
    prefix = torch.arange(key_mask.shape[-1], device=key_mask.device) < lengths
    if not torch.equal(key_mask, prefix):
        raise ValueError(
            "local attention needs key_mask to mark a prefix of each row (real tokens "
            "first, then padding): its windows count source positions from 0"
        )


class BahdanauAttention(nn.Module):
    """Additive attention (Bahdanau, Cho & Bengio 2015, "align and translate").

    .. math::
        e_{tj} = v^\\top \\tanh(W s_{t-1} + U h_j), \\quad \\alpha_t = \\mathrm{softmax}(e_t),
        \\quad c_t = \\sum_j \\alpha_{tj} h_j

    ``U h_j`` does not depend on the step: :meth:`project_keys` computes it once per
    source and ``forward(..., projected_keys=...)`` reuses it.

    Args:
        query_dim: decoder state width.
        key_dim: encoder output width (default ``query_dim``).
        hidden_dim: width of the tanh layer (default ``query_dim``).

    Shape:
        query ``(B, Dq)`` (one step) or ``(B, Tq, Dq)``; keys ``(B, Tk, Dk)``;
        key_mask ``(B, Tk)``, ``True`` for real tokens.

    Returns:
        ``(context, weights)``: ``(B, Dk)`` and ``(B, Tk)`` for one step, or
        ``(B, Tq, Dk)`` and ``(B, Tq, Tk)``.
    """

    def __init__(self, query_dim: int, key_dim: int | None = None, hidden_dim: int | None = None):
        super().__init__()
        self.score = AdditiveScore(query_dim, key_dim, hidden_dim)

    def project_keys(self, keys: Tensor) -> Tensor:
        """``U h_j`` for every source position: ``(B, Tk, Dk) -> (B, Tk, A)``."""
        return self.score.key_proj(keys)

    def forward(
        self,
        query: Tensor,
        keys: Tensor,
        key_mask: Tensor | None = None,
        *,
        projected_keys: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        q, single = _as_sequence(query)  # (B, Tq, Dq)
        _check_keys(q, keys, key_mask)
        score = self.score
        check_widths(q, keys, score.query_proj.in_features, score.key_proj.in_features)
        projected = self.project_keys(keys) if projected_keys is None else projected_keys
        want = (*keys.shape[:2], score.key_proj.out_features)
        if projected.shape != want:  # a (1, Tk, A) broadcast silently over the batch
            raise ValueError(
                f"projected_keys must be (B, Tk, A) = {want} (project_keys(keys)), "
                f"got {tuple(projected.shape)}"
            )
        scores = self.score.score_projected(q, projected)  # (B, Tq, Tk)
        mask = None if key_mask is None else key_mask[:, None, :]  # (B, 1, Tk)
        weights = masked_softmax(scores, mask)  # (B, Tq, Tk)
        context = torch.bmm(weights, keys)  # (B, Tq, Dk)
        return (context[:, 0], weights[:, 0]) if single else (context, weights)


class LocationScore(Score):
    """Luong's "location" score: the weights come from the query alone, ``W_a h_t``.

    The score of source position ``s`` is row ``s`` of ``W_a h_t``, so the sources it can
    address are at most ``max_len`` long.

    Shape:
        query ``(B, Tq, Dq)``, keys ``(B, Tk, Dk)`` (only ``Tk`` is used) -> ``(B, Tq, Tk)``.
    """

    def __init__(self, query_dim: int, max_len: int):
        super().__init__()
        self.proj = nn.Linear(query_dim, max_len)

    def forward(self, query: Tensor, keys: Tensor) -> Tensor:
        check_widths(query, keys, self.proj.in_features, keys.shape[-1])
        tk = keys.shape[1]
        if tk > self.proj.out_features:
            raise ValueError(
                f"the location score handles sources up to "
                f"{self.proj.out_features} tokens, got {tk}"
            )
        return self.proj(query)[..., :tk]


def _make_score(score: str, query_dim: int, key_dim: int, max_len: int) -> Score:
    if score == "dot":
        if query_dim != key_dim:
            raise ValueError(
                f"the dot score needs query_dim == key_dim, got {query_dim}, {key_dim}"
            )
        return DotScore()
    if score == "general":
        return GeneralScore(query_dim, key_dim)
    if score == "concat":
        return AdditiveScore(query_dim, key_dim)
    if score == "location":
        return LocationScore(query_dim, max_len)
    raise ValueError(f"unknown score {score!r}; known: 'dot', 'general', 'concat', 'location'")


class LuongAttention(nn.Module):
    """Global or local attention after the recurrence (Luong, Pham & Manning 2015).

    Scores: ``dot`` :math:`h_t^\\top \\bar h_s`, ``general`` :math:`h_t^\\top W_a \\bar h_s`,
    ``concat`` :math:`v_a^\\top \\tanh(W_a [h_t; \\bar h_s])`, ``location``
    :math:`(W_a h_t)_s`.

    Local attention keeps the positions ``s`` with :math:`|s - p_t| \\le D` (and inside the
    real source), softmax-normalised over that window:

    * ``window="monotonic"`` (local-m): :math:`p_t = t`, the decoding step;
    * ``window="predictive"`` (local-p): :math:`p_t = S \\cdot \\sigma(v_p^\\top \\tanh(W_p h_t))`
      with ``S`` the real source length, and the weights are multiplied by
      :math:`\\exp(-(s - p_t)^2 / (2\\sigma^2))`, :math:`\\sigma = D/2`; they then sum to
      less than one, as in the paper.

    A step whose window holds no real source token gets zero weights and a zero context.

    Args:
        query_dim: decoder state width.
        key_dim: encoder output width (default ``query_dim``).
        score: ``"dot"``, ``"general"``, ``"concat"`` or ``"location"``.
        window: ``None`` (global), ``"monotonic"`` or ``"predictive"``.
        window_size: half-width D.
        max_len: longest source for the ``"location"`` score.

    Shape:
        query ``(B, Dq)`` (one step) or ``(B, Tq, Dq)``; keys ``(B, Tk, Dk)``;
        key_mask ``(B, Tk)``, real tokens first (local windows refuse other masks);
        ``step`` is the target position of the first query (local-m).

    Returns:
        ``(context, weights)``: ``(B, Dk)`` and ``(B, Tk)`` for one step, or
        ``(B, Tq, Dk)`` and ``(B, Tq, Tk)``.
    """

    def __init__(
        self,
        query_dim: int,
        key_dim: int | None = None,
        *,
        score: str = "general",
        window: str | None = None,
        window_size: int = 10,
        max_len: int = 256,
    ):
        super().__init__()
        key_dim = key_dim or query_dim
        if window not in (None, "monotonic", "predictive"):
            raise ValueError(f"window must be None, 'monotonic' or 'predictive', got {window!r}")
        if window is not None and window_size < (1 if window == "predictive" else 0):
            raise ValueError(f"window_size (D) is too small for {window!r}: {window_size}")
        self.score_name, self.window, self.window_size = score, window, window_size
        self.score = _make_score(score, query_dim, key_dim, max_len)
        if window == "predictive":
            self.position = nn.Sequential(
                nn.Linear(query_dim, query_dim, bias=False),
                nn.Tanh(),
                nn.Linear(query_dim, 1, bias=False),
            )

    def forward(
        self,
        query: Tensor,
        keys: Tensor,
        key_mask: Tensor | None = None,
        *,
        step: int = 0,
    ) -> tuple[Tensor, Tensor]:
        q, single = _as_sequence(query)  # (B, Tq, Dq)
        _check_keys(q, keys, key_mask)
        b, tk = q.shape[0], keys.shape[1]
        real = torch.ones(b, tk, dtype=torch.bool, device=keys.device)
        real = real if key_mask is None else key_mask
        scores = self.score(q, keys)  # (B, Tq, Tk)
        mask = real[:, None, :]  # (B, 1, Tk)
        gauss = None
        if self.window is not None:
            _check_prefix(real)
            centre = self.centre(q, real, step)  # (B, Tq), float32 or float64
            pos = torch.arange(tk, device=q.device, dtype=centre.dtype)
            dist = pos.view(1, 1, tk) - centre.unsqueeze(-1)  # (B, Tq, Tk)
            mask = mask & (dist.abs() <= self.window_size)
            if self.window == "predictive":
                sigma = self.window_size / 2
                gauss = torch.exp(-(dist**2) / (2 * sigma**2)).to(scores.dtype)
        weights = masked_softmax(scores, mask)  # (B, Tq, Tk)
        if gauss is not None:
            weights = weights * gauss
        context = torch.bmm(weights, keys)  # (B, Tq, Dk)
        return (context[:, 0], weights[:, 0]) if single else (context, weights)

    def centre(self, query: Tensor, key_mask: Tensor, step: int = 0) -> Tensor:
        """The window centre ``p_t`` of each query ``(B, Tq, Dq) -> (B, Tq)``, in float32
        for half queries: bfloat16 counts integers exactly only up to 256."""
        b, tq = query.shape[:2]
        work = torch.promote_types(query.dtype, torch.float32)
        if self.window == "monotonic":
            t = torch.arange(step, step + tq, device=query.device, dtype=work)
            return t.expand(b, tq)
        length = key_mask.sum(-1, keepdim=True).to(work)  # (B, 1): real source S
        return length * torch.sigmoid(self.position(query).squeeze(-1).to(work))  # (B, Tq)
