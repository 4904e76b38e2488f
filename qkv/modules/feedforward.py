"""The pieces every Transformer layer shares: the feed-forward block and the residual step.

A layer is a residual stack of sub-layers ``x + Sublayer(x)``, normalised after the sum
(post-LN) or before the sub-layer (pre-LN); :func:`residual` is that one step, and
:class:`FeedForward` the position-wise sub-layer. :func:`layer_from_torch` reads
``torch.nn.Transformer*Layer`` modules for ``from_torch``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qkv.kernels.cpu.dropout import Dropout
from qkv.modules.attention import MultiHeadAttention
from qkv.modules.linear import Linear

__all__ = ["FeedForward", "SwiGLU", "layer_from_torch", "layer_norm", "residual"]

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


def residual(x: Tensor, block, norm: nn.Module, norm_first: bool):
    """One residual sub-layer: ``x + f(LN(x))`` (pre-LN) or ``LN(x + f(x))`` (post-LN).

    Args:
        x: the layer's input ``(B, T, E)``.
        block: the sub-layer ``f``; returns ``(output, extra)``, ``extra`` (attention
            weights or None) is passed on.
        norm: the layer norm ``LN``.
        norm_first: pre-LN when True, post-LN when False.

    Returns:
        ``(x', extra)``, ``x'`` of the shape of ``x``.
    """
    if norm_first:
        h, extra = block(norm(x))
        return x + h, extra
    h, extra = block(x)
    return norm(x + h), extra


def _torch_activation(layer: nn.Module) -> str:
    act = layer.activation
    if act is F.relu or isinstance(act, nn.ReLU):
        return "relu"
    if act is F.gelu or (isinstance(act, nn.GELU) and act.approximate == "none"):
        return "gelu"
    if isinstance(act, nn.GELU) and act.approximate == "tanh":
        return "gelu_tanh"
    if act is F.silu or isinstance(act, nn.SiLU):
        return "silu"
    raise ValueError(f"unsupported activation {act!r} (relu, gelu, gelu tanh and silu are)")


def _copy_ff_norms(new: nn.Module, layer: nn.Module, norms: list[str]) -> None:
    """Copy the feed-forward weights and the named layer norms of a torch layer."""
    new.ff.linear1.load_state_dict(layer.linear1.state_dict())
    new.ff.linear2.load_state_dict(layer.linear2.state_dict())
    for name in norms:
        getattr(new, name).load_state_dict(getattr(layer, name).state_dict())


def layer_from_torch(cls: type, layer: nn.Module, norms: list[str], **extra):
    """``cls`` with a torch layer's options, self-attention, feed-forward and norms (copied
    in the layer's dtype: no rounding); ``extra`` goes to ``cls`` as it is.

    Args:
        cls: a qkv layer class (``EncoderLayer``, ``DecoderLayer``).
        layer: a ``torch.nn.TransformerEncoderLayer`` or ``TransformerDecoderLayer``.
        norms: the names of the layer norms to copy (``"norm1"``, ...).
        **extra: more keyword arguments for ``cls``.

    Returns:
        the new layer, on the torch layer's device and in its dtype and training mode.

    Raises:
        ValueError: an activation other than relu, gelu (exact or tanh) and silu.
    """
    attn = layer.self_attn
    new = cls(
        attn.embed_dim,
        attn.num_heads,
        layer.linear1.out_features,
        dropout=layer.dropout.p,
        activation=_torch_activation(layer),
        norm_first=layer.norm_first,
        layer_norm_eps=layer.norm1.eps,
        bias=layer.linear1.bias is not None,
        **extra,
    ).to(layer.linear1.weight.device, layer.linear1.weight.dtype)
    new.self_attn = MultiHeadAttention.from_torch(attn)
    _copy_ff_norms(new, layer, norms)
    return new.train(layer.training)  # an eval-mode layer must not come back dropping
