"""Compatibility with ``torch.nn``: an adapter beside the core modules, not branches in them.

:class:`TorchMultiheadAttention` is a :class:`~qkv.modules.attention.MultiHeadAttention`
with what only ``torch.nn.MultiheadAttention`` has: the extra keys of ``add_bias_kv`` and
``add_zero_attn``, and ``from_torch`` to copy a torch module's weights. Every query may
attend to the extra keys whatever the masks say, so they join the keys after the one mask
is built (the core's overridable step ``_extra_keys``, the identity there):

.. math::
    K' = [K; b_k; 0], \\quad V' = [V; b_v; 0], \\quad
    M' = [M, \\text{visible}, \\text{visible}]

:func:`layer_from_torch` reads ``torch.nn.TransformerEncoderLayer`` and
``TransformerDecoderLayer`` for the ``from_torch`` of the qkv layers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qkv.functional import causal_mask, combine_masks
from qkv.modules.attention import MultiHeadAttention

__all__ = ["TorchMultiheadAttention", "layer_from_torch"]


class TorchMultiheadAttention(MultiHeadAttention):
    """:class:`~qkv.modules.attention.MultiHeadAttention` with the options of
    ``torch.nn.MultiheadAttention`` that append keys, and :meth:`from_torch`.

    Args:
        embed_dim, num_heads: as :class:`~qkv.modules.attention.MultiHeadAttention`.
        add_bias_kv: append one learned key and value to every sequence of keys.
        add_zero_attn: append one all-zero key and value (after the learned one).
            Both as in ``torch.nn.MultiheadAttention``: every query may attend to these
            extra keys whatever the masks say (causal attention limits the real keys
            only), and the weights have a column for each. A cache holds the real keys
            only; the extra ones join them at every call.
        **options: the other options of
            :class:`~qkv.modules.attention.MultiHeadAttention` (``num_kv_heads``, ``kdim``,
            ``vdim``, ``bias``, ``dropout``, ``positional``, ``scale``, ``backend``).

    Shape:
        as :class:`~qkv.modules.attention.MultiHeadAttention`, except the weights:
        ``(B, H, Tq, Tk + n)`` for ``n`` extra keys (0, 1 or 2), the extra ones last.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        add_bias_kv: bool = False,
        add_zero_attn: bool = False,
        **options,
    ):
        super().__init__(embed_dim, num_heads, **options)
        kv_width = self.num_kv_heads * self.head_dim
        # torch draws them with xavier_normal_ on (1, 1, width): a std of width ** -0.5
        self.bias_k = nn.Parameter(torch.randn(kv_width) * kv_width**-0.5) if add_bias_kv else None
        self.bias_v = nn.Parameter(torch.randn(kv_width) * kv_width**-0.5) if add_bias_kv else None
        self.add_zero_attn = add_zero_attn

    def _extra_keys(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool
    ) -> tuple[Tensor, Tensor, Tensor | None, bool]:
        """2) Append the learned and then the zero key/value, and widen the mask by a
        visible column for each (a causal limit then becomes part of the mask, over the
        real keys only)."""
        extra = int(self.bias_k is not None) + int(self.add_zero_attn)
        if not extra:
            return k, v, mask, causal
        b, hkv, tk, d = k.shape
        if causal:  # causal over the real keys only; the extra ones stay visible
            mask = combine_masks(mask, causal_mask(q.shape[-2], tk, device=q.device))
            causal = False
        mask = _visible(mask, tk, extra)
        if self.bias_k is not None:
            k = torch.cat([k, self.bias_k.view(1, hkv, 1, d).expand(b, -1, -1, -1)], dim=2)
            v = torch.cat([v, self.bias_v.view(1, hkv, 1, d).expand(b, -1, -1, -1)], dim=2)
        if self.add_zero_attn:
            k = torch.cat([k, k.new_zeros(b, hkv, 1, d)], dim=2)
            v = torch.cat([v, v.new_zeros(b, hkv, 1, d)], dim=2)
        return k, v, mask, causal  # (B, Hkv, Tk + extra, D)

    @classmethod
    def from_torch(cls, m: nn.MultiheadAttention) -> TorchMultiheadAttention:
        """A qkv module with the weights of ``torch.nn.MultiheadAttention`` ``m``.

        Packed (``in_proj_weight``) and separate (``q/k/v_proj_weight``, when kdim/vdim
        differ) layouts are both copied, and so are ``add_bias_kv``'s key and value and
        the train/eval mode. Feed batch-first inputs, and translate masks with
        :func:`qkv.functional.from_torch_masks`.
        """
        w = m.out_proj.weight
        new = cls(
            m.embed_dim,
            m.num_heads,
            kdim=m.kdim,
            vdim=m.vdim,
            bias=m.in_proj_bias is not None,
            dropout=m.dropout,
            add_bias_kv=m.bias_k is not None,
            add_zero_attn=m.add_zero_attn,
        ).to(device=w.device, dtype=w.dtype)
        new.train(m.training)  # an eval-mode module must not come back dropping weights
        if m._qkv_same_embed_dim:
            wq, wk, wv = m.in_proj_weight.detach().chunk(3)
        else:
            wq, wk, wv = (p.detach() for p in (m.q_proj_weight, m.k_proj_weight, m.v_proj_weight))
        with torch.no_grad():
            for proj, weight in zip((new.q_proj, new.k_proj, new.v_proj), (wq, wk, wv)):
                proj.weight.copy_(weight)
            if m.in_proj_bias is not None:
                for proj, b in zip((new.q_proj, new.k_proj, new.v_proj), m.in_proj_bias.chunk(3)):
                    proj.bias.copy_(b)
                new.out_proj.bias.copy_(m.out_proj.bias)
            new.out_proj.weight.copy_(m.out_proj.weight)
            if m.bias_k is not None:
                new.bias_k.copy_(m.bias_k.flatten())
                new.bias_v.copy_(m.bias_v.flatten())
        return new


def _visible(mask: Tensor | None, tk: int, extra: int) -> Tensor | None:
    """Widen a mask over ``tk`` keys by ``extra`` key columns that every query may see."""
    if mask is None:
        return None
    allow = True if mask.dtype == torch.bool else 0.0
    return F.pad(mask.expand(*mask.shape[:-1], tk), (0, extra), value=allow)


def layer_from_torch(cls: type, layer: nn.Module, norms: list[str], **extra):
    """``cls`` with a torch layer's options, self-attention, feed-forward and norms (copied
    in the layer's dtype: no rounding); ``extra`` goes to ``cls`` as it is.

    Args:
        cls: a qkv layer class (``EncoderLayer``, ``DecoderLayer``).
        layer: a ``torch.nn.TransformerEncoderLayer`` or ``TransformerDecoderLayer``.
        norms: the names of the layer norms to copy (``"norm1"``, ...).
        **extra: more keyword arguments for ``cls``.

    Returns:
        the new layer, on the torch layer's device and in its dtype and training mode; its
        self-attention a :class:`TorchMultiheadAttention`.

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
    new.self_attn = TorchMultiheadAttention.from_torch(attn)
    _copy_ff_norms(new, layer, norms)
    return new.train(layer.training)  # an eval-mode layer must not come back dropping


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
