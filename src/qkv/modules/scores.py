"""Score functions: how much a query and a key match, ``score(query, keys) -> (B, Tq, Tk)``.

The dot-product family is what Transformers use; the bilinear and additive scores are
the ones of the RNN attention papers (Luong et al. 2015; Bahdanau et al. 2015). All share
one interface so that attention modules can take any of them.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

__all__ = ["AdditiveScore", "DotScore", "GeneralScore", "Score", "ScaledDotScore"]


class Score(nn.Module):
    """Interface: ``forward(query (B, Tq, Dq), keys (B, Tk, Dk)) -> scores (B, Tq, Tk)``."""

    def forward(self, query: Tensor, keys: Tensor) -> Tensor:
        raise NotImplementedError


def check_widths(query: Tensor, keys: Tensor, dq: int | None, dk: int | None) -> None:
    """Raise ``ValueError`` unless query is ``(B, Tq, dq)`` and keys ``(B, Tk, dk)``.

    ``None`` for a width accepts any (``dk=None`` with the dot scores: ``Dk = Dq``).
    """
    shapes = f"got query {tuple(query.shape)} and keys {tuple(keys.shape)}"
    if query.ndim != 3 or keys.ndim != 3 or query.shape[0] != keys.shape[0]:
        raise ValueError(f"scores need query (B, Tq, Dq) and keys (B, Tk, Dk); {shapes}")
    dq = query.shape[-1] if dq is None else dq
    dk = query.shape[-1] if dk is None else dk
    if query.shape[-1] != dq or keys.shape[-1] != dk:
        raise ValueError(f"scores need query width Dq={dq} and key width Dk={dk}; {shapes}")


class DotScore(Score):
    """:math:`\\mathrm{score}(q, k) = q^\\top k` (Luong "dot"). Needs ``Dq == Dk``."""

    def forward(self, query: Tensor, keys: Tensor) -> Tensor:
        check_widths(query, keys, None, None)
        return torch.bmm(query, keys.transpose(1, 2))


class ScaledDotScore(Score):
    """:math:`\\mathrm{score}(q, k) = q^\\top k / \\sqrt{d}` (Vaswani et al. 2017)."""

    def forward(self, query: Tensor, keys: Tensor) -> Tensor:
        check_widths(query, keys, None, None)
        return torch.bmm(query, keys.transpose(1, 2)) / math.sqrt(query.shape[-1])


class GeneralScore(Score):
    """:math:`\\mathrm{score}(q, k) = q^\\top W k` (Luong "general", bilinear).

    Args:
        query_dim: Dq. key_dim: Dk (default Dq).
    """

    def __init__(self, query_dim: int, key_dim: int | None = None):
        super().__init__()
        self.proj = nn.Linear(key_dim or query_dim, query_dim, bias=False)

    def forward(self, query: Tensor, keys: Tensor) -> Tensor:
        check_widths(query, keys, self.proj.out_features, self.proj.in_features)
        return torch.bmm(query, self.proj(keys).transpose(1, 2))


class AdditiveScore(Score):
    """:math:`\\mathrm{score}(q, k) = v^\\top \\tanh(W q + U k)` (Bahdanau; Luong "concat").

    Args:
        query_dim: Dq. key_dim: Dk. hidden_dim: size of the tanh layer (default Dq).
    """

    def __init__(self, query_dim: int, key_dim: int | None = None, hidden_dim: int | None = None):
        super().__init__()
        hidden_dim = hidden_dim or query_dim
        self.query_proj = nn.Linear(query_dim, hidden_dim, bias=False)
        self.key_proj = nn.Linear(key_dim or query_dim, hidden_dim, bias=True)
        self.v = nn.Linear(hidden_dim, 1, bias=False)

    def forward(self, query: Tensor, keys: Tensor) -> Tensor:
        check_widths(query, keys, self.query_proj.in_features, self.key_proj.in_features)
        return self.score_projected(query, self.key_proj(keys))

    def score_projected(self, query: Tensor, projected_keys: Tensor) -> Tensor:
        """Scores when ``U k`` was computed once for all decoding steps."""
        q = self.query_proj(query).unsqueeze(2)  # (B, Tq, 1, A)
        k = projected_keys.unsqueeze(1)  # (B, 1, Tk, A)
        return self.v(torch.tanh(q + k)).squeeze(-1)  # (B, Tq, Tk)
