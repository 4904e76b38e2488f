"""The pieces every Transformer layer shares: the feed-forward block and the layer norm.

A layer is a residual stack of sub-layers ``x + Sublayer(x)``, normalised after the sum
(post-LN) or before the sub-layer (pre-LN) with :func:`layer_norm`; :class:`FeedForward`
is the position-wise sub-layer, :class:`SwiGLU` its gated variant.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from qkv.kernels.cpu.dropout import Dropout
from qkv.modules.linear import Linear

__all__ = ["FeedForward", "SwiGLU", "layer_norm"]

_ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "relu": nn.ReLU,
    "gelu": nn.GELU,  # exact, with erf (BERT, torch's "gelu")
    "gelu_tanh": lambda: nn.GELU(approximate="tanh"),  # GPT-2's "gelu_new"
    "silu": nn.SiLU,  # x * sigmoid(x), also called swish
    "quick_gelu": lambda: _QuickGELU(),  # x * sigmoid(1.702 x) (CLIP, some BERT variants)
}


class _QuickGELU(nn.Module):
    """The sigmoid approximation of GELU (Hendrycks and Gimpel 2016): x * sigmoid(1.702 x)."""

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.sigmoid(1.702 * x)


class FeedForward(nn.Module):
    """Position-wise feed-forward block (Vaswani et al. 2017, eq. 2).

    .. math::
        \\mathrm{FFN}(x) = W_2\\, \\mathrm{dropout}(f(W_1 x + b_1)) + b_2

    Args:
        dim: model width E.
        hidden_dim: inner width (4E in most models).
        activation: ``"relu"``, ``"gelu"`` (exact), ``"gelu_tanh"`` (tanh approximation),
            ``"silu"`` or ``"quick_gelu"``.
        dropout: dropout after the activation while training.
        bias: biases on both linear maps.

    Shape:
        ``(..., E)`` -> ``(..., E)``.
    """

    def __init__(
        self,
        dim: int,
        hidden_dim: int,
        activation: str = "relu",
        dropout: float = 0.0,
        bias: bool = True,
    ):
        super().__init__()
        if activation not in _ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; known: {sorted(_ACTIVATIONS)}")
        self.linear1 = nn.Linear(dim, hidden_dim, bias=bias)
        self.activation = _ACTIVATIONS[activation]()
        self.dropout = Dropout(dropout)
        self.linear2 = nn.Linear(hidden_dim, dim, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear2(self.dropout(self.activation(self.linear1(x))))


class SwiGLU(nn.Module):
    """Gated feed-forward block (Shazeer 2020, "GLU Variants Improve Transformer"), as in
    LLaMA: the activated gate multiplies a second projection, element by element.

    .. math::
        \\mathrm{SwiGLU}(x) = W_d \\left(\\mathrm{SiLU}(W_g x) \\odot W_u x\\right)

    Args:
        dim: model width E.
        hidden_dim: inner width (about 8E/3 in LLaMA).
        activation: of the gate (``"silu"``: SwiGLU; ``"gelu"``: GeGLU; see
            :class:`FeedForward`).
        bias: biases on the three linear maps.

    Shape:
        ``(..., E)`` -> ``(..., E)``.
    """

    def __init__(self, dim: int, hidden_dim: int, activation: str = "silu", bias: bool = False):
        super().__init__()
        if activation not in _ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; known: {sorted(_ACTIVATIONS)}")
        self.gate_proj = Linear(dim, hidden_dim, bias=bias)
        self.up_proj = Linear(dim, hidden_dim, bias=bias)
        self.down_proj = Linear(hidden_dim, dim, bias=bias)
        self.activation = _ACTIVATIONS[activation]()

    def forward(self, x: Tensor) -> Tensor:
        gate = self.activation(self.gate_proj(x))  # (..., hidden)
        return self.down_proj(gate * self.up_proj(x))  # (..., E)


def layer_norm(dim: int, eps: float, bias: bool) -> nn.LayerNorm:
    """The layer norm of a Transformer layer (Ba et al. 2016) over the model width.

    Args:
        dim: model width E.
        eps: added to the variance.
        bias: a learned bias beside the learned scale.

    Shape:
        ``(..., E)`` -> ``(..., E)``.
    """
    return nn.LayerNorm(dim, eps=eps, bias=bias)
