"""Transformer blocks (Vaswani et al. 2017, section 3.1): layers, stacks and a decoder cache.

Each layer is a residual stack of sub-layers ``x + Sublayer(x)``, normalised either after
the residual sum (post-LN, the original paper and BERT) or before the sub-layer (pre-LN,
GPT-2; Xiong et al. 2020):

.. math::
    \\text{post-LN: } x \\leftarrow \\mathrm{LN}(x + \\mathrm{Sublayer}(x)) \\qquad
    \\text{pre-LN: } x \\leftarrow x + \\mathrm{Sublayer}(\\mathrm{LN}(x))

An :class:`EncoderLayer` has self-attention and a feed-forward block; a :class:`DecoderLayer`
adds causal masking and (optionally) cross-attention over an encoder's output ("memory").
:class:`Encoder` and :class:`Decoder` stack them and return the attention maps of every
layer and head from the same forward pass, never stored on the modules.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from torch import Tensor, nn

from qkv.kernels.cpu.dropout import Dropout
from qkv.modules.attention import MultiHeadAttention
from qkv.modules.cache import DecoderCache, LayerCache, LayerKV
from qkv.modules.feedforward import FeedForward, layer_norm
from qkv.modules.positional import AttentionPositional
from qkv.modules.torch_compat import TorchMultiheadAttention, layer_from_torch

__all__ = [
    "Decoder",
    "DecoderCache",
    "DecoderLayer",
    "DecoderOutput",
    "Encoder",
    "EncoderLayer",
    "EncoderOutput",
    "FeedForward",
    "LayerCache",
]


class EncoderLayer(nn.Module):
    """Self-attention and feed-forward, each in a residual branch with layer norm.

    Args:
        dim: model width E.
        num_heads: attention heads H.
        ff_dim: feed-forward inner width.
        dropout: dropout on attention weights, after the activation and on each branch.
        activation: feed-forward activation (see :class:`FeedForward`).
        norm_first: pre-LN when True, post-LN (the paper, BERT) when False.
        layer_norm_eps: epsilon of the layer norms.
        num_kv_heads: key/value heads for grouped-query attention (default H).
        positional: RoPE / ALiBi applied inside self-attention.
        bias: biases in the projections, the feed-forward block and the layer norms.
        backend: attention backend.

    Shape:
        x ``(B, T, E)``; key_mask ``(B, T)`` (``True`` = real token); mask as
        :class:`MultiHeadAttention`. Returns ``x`` ``(B, T, E)`` and weights
        ``(B, H, T, T)`` or ``None``.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        ff_dim: int,
        *,
        dropout: float = 0.0,
        activation: str = "relu",
        norm_first: bool = False,
        layer_norm_eps: float = 1e-5,
        num_kv_heads: int | None = None,
        positional: AttentionPositional | None = None,
        bias: bool = True,
        backend: str = "auto",
    ):
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(
            dim,
            num_heads,
            num_kv_heads=num_kv_heads,
            bias=bias,
            dropout=dropout,
            positional=positional,
            backend=backend,
        )
        self.ff = FeedForward(dim, ff_dim, activation, dropout, bias)
        self.norm1 = layer_norm(dim, layer_norm_eps, bias)
        self.norm2 = layer_norm(dim, layer_norm_eps, bias)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)

    def forward(
        self,
        x: Tensor,
        *,
        key_mask: Tensor | None = None,
        mask: Tensor | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """One encoder layer; returns ``(x, self-attention weights | None)``."""
        # 1) self-attention, 2) feed-forward, each in a residual branch
        if self.norm_first:  # pre-LN: x + Sublayer(LN(x))
            h, weights = self._self_block(self.norm1(x), mask, key_mask, need_weights)
            x = x + h
            x = x + self._ff_block(self.norm2(x))
        else:  # post-LN: LN(x + Sublayer(x))
            h, weights = self._self_block(x, mask, key_mask, need_weights)
            x = self.norm1(x + h)
            x = self.norm2(x + self._ff_block(x))
        return x, weights

    def _self_block(
        self, h: Tensor, mask: Tensor | None, key_mask: Tensor | None, need_weights: bool
    ) -> tuple[Tensor, Tensor | None]:
        """Self-attention and its dropout: ``(B, T, E)`` and the weights or ``None``."""
        out, weights = self.self_attn(h, mask=mask, key_mask=key_mask, need_weights=need_weights)
        return self.dropout1(out), weights

    def _ff_block(self, h: Tensor) -> Tensor:
        """The feed-forward block and its dropout: ``(B, T, E)`` -> ``(B, T, E)``."""
        return self.dropout2(self.ff(h))

    @classmethod
    def from_torch(cls, layer: nn.TransformerEncoderLayer) -> EncoderLayer:
        """A qkv layer with the weights and options of ``torch.nn.TransformerEncoderLayer``."""
        return layer_from_torch(cls, layer, ["norm1", "norm2"])


class DecoderLayer(nn.Module):
    """Causal self-attention, cross-attention over a memory, and feed-forward.

    ``cross=False`` drops the cross-attention sub-layer: a decoder-only (GPT-style) layer.

    Args:
        dim, num_heads, ff_dim, dropout, activation, norm_first, layer_norm_eps,
            num_kv_heads, positional, bias, backend: as :class:`EncoderLayer`
            (``positional`` acts in self-attention only).
        cross: include cross-attention.
        memory_dim: width of the memory (default E).

    Shape:
        x ``(B, T, E)``; memory ``(B, S, memory_dim)``; key_mask ``(B, Tk)`` over the
        self-attention keys (with a cache: every cached position plus the new ones);
        memory_key_mask ``(B, S)``; self_mask ``(T, Tk)``, ``(B, T, Tk)`` or
        ``(B, H, T, Tk)``, combined with the causal mask. Returns ``x`` ``(B, T, E)``,
        self weights ``(B, H, T, Tk)`` and cross weights ``(B, H, T, S)`` (or ``None``).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        ff_dim: int,
        *,
        dropout: float = 0.0,
        activation: str = "relu",
        norm_first: bool = False,
        layer_norm_eps: float = 1e-5,
        num_kv_heads: int | None = None,
        positional: AttentionPositional | None = None,
        bias: bool = True,
        backend: str = "auto",
        cross: bool = True,
        memory_dim: int | None = None,
    ):
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(
            dim,
            num_heads,
            num_kv_heads=num_kv_heads,
            bias=bias,
            dropout=dropout,
            positional=positional,
            backend=backend,
        )
        self.cross_attn = None
        if cross:
            self.cross_attn = MultiHeadAttention(
                dim,
                num_heads,
                num_kv_heads=num_kv_heads,
                kdim=memory_dim,
                vdim=memory_dim,
                bias=bias,
                dropout=dropout,
                backend=backend,
            )
        self.ff = FeedForward(dim, ff_dim, activation, dropout, bias)
        self.norm1 = layer_norm(dim, layer_norm_eps, bias)
        self.norm2 = layer_norm(dim, layer_norm_eps, bias) if cross else None
        self.norm3 = layer_norm(dim, layer_norm_eps, bias)
        self.dropout1, self.dropout2, self.dropout3 = (Dropout(dropout) for _ in range(3))

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        *,
        memory_key_mask: Tensor | None = None,
        self_mask: Tensor | None = None,
        key_mask: Tensor | None = None,
        need_weights: bool = False,
        cache: LayerCache | DecoderCache | None = None,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """One decoder layer; returns ``(x, self weights | None, cross weights | None)``."""
        if (memory is None) != (self.cross_attn is None):
            raise ValueError(
                "memory is required by a decoder layer with cross-attention and "
                "not accepted without it (cross=False)"
            )
        layer_cache = _layer_cache(cache)
        self_kv = layer_cache.self_kv if layer_cache is not None else None
        cross_kv = layer_cache.cross_kv if layer_cache is not None else None

        # 1) causal self-attention, 2) cross-attention over the memory (if any),
        # 3) feed-forward, each in a residual branch
        cross_w = None
        if self.norm_first:  # pre-LN: x + Sublayer(LN(x))
            h, self_w = self._self_block(self.norm1(x), self_mask, key_mask, need_weights, self_kv)
            x = x + h
            if self.cross_attn is not None:
                h, cross_w = self._cross_block(
                    self.norm2(x), memory, memory_key_mask, need_weights, cross_kv
                )
                x = x + h
            x = x + self._ff_block(self.norm3(x))
        else:  # post-LN: LN(x + Sublayer(x))
            h, self_w = self._self_block(x, self_mask, key_mask, need_weights, self_kv)
            x = self.norm1(x + h)
            if self.cross_attn is not None:
                h, cross_w = self._cross_block(x, memory, memory_key_mask, need_weights, cross_kv)
                x = self.norm2(x + h)
            x = self.norm3(x + self._ff_block(x))
        return x, self_w, cross_w

    def _self_block(
        self,
        h: Tensor,
        mask: Tensor | None,
        key_mask: Tensor | None,
        need_weights: bool,
        cache: LayerKV | None,
    ) -> tuple[Tensor, Tensor | None]:
        """Causal self-attention and its dropout: ``(B, T, E)`` and the weights or ``None``."""
        out, weights = self.self_attn(
            h, mask=mask, key_mask=key_mask, causal=True, need_weights=need_weights, cache=cache
        )
        return self.dropout1(out), weights

    def _cross_block(
        self,
        h: Tensor,
        memory: Tensor,
        memory_key_mask: Tensor | None,
        need_weights: bool,
        cache: LayerKV | None,
    ) -> tuple[Tensor, Tensor | None]:
        """Cross-attention over the memory and its dropout: ``(B, T, E)`` and the weights."""
        out, weights = self.cross_attn(
            h, memory, key_mask=memory_key_mask, need_weights=need_weights, cache=cache
        )
        return self.dropout2(out), weights

    def _ff_block(self, h: Tensor) -> Tensor:
        """The feed-forward block and its dropout: ``(B, T, E)`` -> ``(B, T, E)``."""
        return self.dropout3(self.ff(h))

    @classmethod
    def from_torch(cls, layer: nn.TransformerDecoderLayer) -> DecoderLayer:
        """A qkv layer with the weights and options of ``torch.nn.TransformerDecoderLayer``."""
        cross = layer.multihead_attn
        new = layer_from_torch(cls, layer, ["norm1", "norm2", "norm3"], memory_dim=cross.kdim)
        new.cross_attn = TorchMultiheadAttention.from_torch(cross)
        return new


@dataclass
class EncoderOutput:
    """What an :class:`Encoder` returns.

    Attributes:
        hidden: ``(B, T, E)`` after the last layer (and the final norm, if any).
        attentions: one ``(B, H, T, T)`` per layer when ``need_weights``, else empty.
    """

    hidden: Tensor
    attentions: list[Tensor] = field(default_factory=list)


@dataclass
class DecoderOutput:
    """What a :class:`Decoder` returns.

    Attributes:
        hidden: ``(B, T, E)`` after the last layer (and the final norm, if any).
        self_attentions: one ``(B, H, T, Tk)`` per layer when ``need_weights``.
        cross_attentions: one ``(B, H, T, S)`` per layer when ``need_weights`` and the
            layers have cross-attention.
        cache: the (updated) cache that was passed in, or ``None``.
    """

    hidden: Tensor
    self_attentions: list[Tensor] = field(default_factory=list)
    cross_attentions: list[Tensor] = field(default_factory=list)
    cache: DecoderCache | None = None


def _make_layers(
    layers: Iterable[nn.Module] | Callable[[], nn.Module] | tuple,
    num_layers: int | None,
) -> nn.ModuleList:
    """Layers given as modules, as ``(factory, n)``, or as ``factory`` with ``num_layers``."""
    if (
        isinstance(layers, tuple)
        and len(layers) == 2
        and not isinstance(layers[0], nn.Module)
        and isinstance(layers[1], int)
    ):
        layers, num_layers = layers
    if num_layers is not None:
        if not callable(layers) or isinstance(layers, nn.Module):
            raise ValueError("with num_layers, pass a layer factory (a callable returning a layer)")
        layers = [layers() for _ in range(num_layers)]
    result = nn.ModuleList(layers)
    if len(result) == 0:
        raise ValueError("a stack needs at least one layer")
    return result


class Encoder(nn.Module):
    """A stack of :class:`EncoderLayer` s with an optional final layer norm (pre-LN needs one).

    Args:
        layers: the layers, or a factory ``() -> layer`` together with ``num_layers``
            (``Encoder((factory, n))`` works too).
        num_layers: how many layers the factory builds.
        final_norm: applied to the last layer's output (e.g. ``nn.LayerNorm(E)``), or None.

    Shape:
        x ``(B, T, E)``, key_mask ``(B, T)``; returns :class:`EncoderOutput`.
    """

    def __init__(
        self,
        layers: Iterable[nn.Module] | Callable[[], nn.Module] | tuple,
        num_layers: int | None = None,
        final_norm: nn.Module | None = None,
    ):
        super().__init__()
        self.layers = _make_layers(layers, num_layers)
        self.final_norm = final_norm

    def forward(
        self,
        x: Tensor,
        *,
        key_mask: Tensor | None = None,
        mask: Tensor | None = None,
        need_weights: bool = False,
    ) -> EncoderOutput:
        """Run every layer; collect the attention maps when ``need_weights``."""
        attentions = []
        for layer in self.layers:
            x, w = layer(x, key_mask=key_mask, mask=mask, need_weights=need_weights)
            if need_weights:
                attentions.append(w)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return EncoderOutput(hidden=x, attentions=attentions)


class Decoder(nn.Module):
    """A stack of :class:`DecoderLayer` s with an optional final norm, decoding incrementally.

    Teacher forcing runs all target positions in one causal pass; incremental decoding
    passes ``cache=decoder.new_cache()`` and then only the new tokens each step (the
    positions of the tokens are the caller's business, e.g. ``start=cache.length``).

    Args:
        layers, num_layers, final_norm: as :class:`Encoder`.

    Shape:
        x ``(B, T, E)``; memory ``(B, S, Em)``; key_mask ``(B, Tk)`` with
        ``Tk = cache.length + T``; memory_key_mask ``(B, S)``. Returns :class:`DecoderOutput`.
    """

    def __init__(
        self,
        layers: Iterable[nn.Module] | Callable[[], nn.Module] | tuple,
        num_layers: int | None = None,
        final_norm: nn.Module | None = None,
    ):
        super().__init__()
        self.layers = _make_layers(layers, num_layers)
        self.final_norm = final_norm

    def new_cache(self) -> DecoderCache:
        """An empty cache with one entry per layer."""
        return DecoderCache(len(self.layers))

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        *,
        memory_key_mask: Tensor | None = None,
        self_mask: Tensor | None = None,
        key_mask: Tensor | None = None,
        need_weights: bool = False,
        cache: DecoderCache | None = None,
    ) -> DecoderOutput:
        """Run every layer (updating ``cache``); collect attention maps when asked."""
        if cache is not None and len(cache) != len(self.layers):
            raise ValueError(f"cache has {len(cache)} layers, the decoder {len(self.layers)}")
        out = DecoderOutput(hidden=x, cache=cache)
        for i, layer in enumerate(self.layers):
            x, self_w, cross_w = layer(
                x,
                memory,
                memory_key_mask=memory_key_mask,
                self_mask=self_mask,
                key_mask=key_mask,
                need_weights=need_weights,
                cache=cache[i] if cache is not None else None,
            )
            if need_weights:
                out.self_attentions.append(self_w)
                if cross_w is not None:
                    out.cross_attentions.append(cross_w)
        out.hidden = self.final_norm(x) if self.final_norm is not None else x
        return out


def _layer_cache(cache: LayerCache | DecoderCache | None) -> LayerCache | None:
    if cache is None or isinstance(cache, LayerCache):
        return cache
    if isinstance(cache, DecoderCache):
        if len(cache) != 1:
            raise ValueError(f"pass one layer of a {len(cache)}-layer DecoderCache: cache[i]")
        return cache[0]
    raise ValueError(f"cache must be a LayerCache or DecoderCache, got {type(cache).__name__}")
