"""The parts of a decoder-only language model: causal self-attention and the pre-norm block.

GPT-2 (Radford et al. 2019) and the LLaMA family (Touvron et al. 2023; Mistral, Qwen2) are
one architecture. Each block is two residual sub-layers, each normalised before it:

.. math::
    a = x + \\mathrm{Attn}(\\mathrm{Norm}_1(x)),\\qquad
    x' = a + \\mathrm{FF}(\\mathrm{Norm}_2(a))

and the families differ only in the parts:

============  =================================  ===========================================
part          GPT-2                              LLaMA family
============  =================================  ===========================================
positions     learned, added to the embeddings   rotary, turning queries and keys (RoPE)
Norm          LayerNorm                          RMSNorm
FF            GELU feed-forward                  SwiGLU (gated)
K/V heads     as many as query heads             fewer, shared (grouped-query attention)
biases        everywhere                         none (Qwen2: on queries, keys, values)
window        none                               Mistral: the latest ``W`` tokens only
============  =================================  ===========================================

so :class:`CausalSelfAttention` and :class:`DecoderBlock` take these as arguments and
modules, and :class:`~qkv.models.GPT` and :class:`~qkv.models.Llama` are two ways of
filling them in (:class:`~qkv.models.pretrained.causal_lm.CausalLM` is the stack).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from qkv.distributed import ring_attention
from qkv.functional import combine_masks, scaled_dot_product_attention
from qkv.kernels.cpu.dropout import Dropout
from qkv.modules.cache import LayerKV
from qkv.modules.linear import Linear
from qkv.modules.positional import apply_rotary

__all__ = [
    "CausalLMOutput",
    "CausalSelfAttention",
    "DecoderBlock",
    "Rotary",
    "sliding_window_mask",
]

Rotary = tuple[Tensor, Tensor]  # (cos, sin), each (B, 1, T, D): the angles of the positions


class CausalSelfAttention(nn.Module):
    """Masked self-attention: each token attends to itself and the tokens before it.

    .. math::
        \\mathrm{Attn}(x) = \\mathrm{softmax}\\big(s\\, Q K^\\top + M_{causal}\\big) V\\, W^O,
        \\quad Q = x W^Q,\\ K = x W^K,\\ V = x W^V

    with ``Q`` and ``K`` turned by their positions first when the model is rotary.

    Args:
        dim: model width E.
        num_heads: query heads H.
        num_kv_heads: key/value heads Hkv (default H), each shared by ``H / Hkv`` query
            heads (grouped-query attention).
        head_dim: D (default ``E / H``).
        qkv_bias: biases on the query, key and value projections.
        out_bias: a bias on the output projection.
        window: each token sees the latest ``window`` tokens only (itself included);
            ``None``: all earlier tokens.
        scale: the factor on ``QK^T`` (default ``1/sqrt(D)``).
        dropout: on the attention weights while training.

    Attributes:
        sequence_group: sequence parallelism: a ``torch.distributed`` process group whose
            processes each hold the zig-zag part of the sequence
            (:func:`qkv.distributed.sequence_shard`; the model gives each token its global
            position) and attend through :func:`qkv.distributed.ring_attention`.
            ``None`` (the default) is off (:func:`qkv.distributed.set_sequence_group`
            sets it). The ring takes no padding, cache, weights, dropout or window.

    Shape:
        x ``(B, T, E)``; rotary ``(cos, sin)``, each ``(B, 1, T, D)``
        (:meth:`~qkv.modules.RotaryPositionalEncoding.cos_sin`), or ``None``; key_mask
        ``(B, Tk)``, ``True`` for real tokens, ``Tk = cache.length + T``. Returns
        ``(B, T, E)`` and the weights ``(B, H, T, Tk)`` or ``None``.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        qkv_bias: bool = False,
        out_bias: bool = False,
        window: int | None = None,
        scale: float | None = None,
        dropout: float = 0.0,
    ):
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads or num_heads
        self.head_dim = head_dim or dim // num_heads
        if num_heads % self.num_kv_heads:
            raise ValueError(f"num_kv_heads {self.num_kv_heads} must divide num_heads {num_heads}")
        h, hkv, d = num_heads, self.num_kv_heads, self.head_dim
        self.q_proj = Linear(dim, h * d, bias=qkv_bias)
        self.k_proj = Linear(dim, hkv * d, bias=qkv_bias)
        self.v_proj = Linear(dim, hkv * d, bias=qkv_bias)
        self.out_proj = Linear(h * d, dim, bias=out_bias)
        self.window, self.scale, self.dropout = window, scale, dropout
        self.sequence_group: dist.ProcessGroup | None = None

    def forward(
        self,
        x: Tensor,
        rotary: Rotary | None = None,
        *,
        key_mask: Tensor | None = None,
        cache: LayerKV | None = None,
        need_weights: bool | Sequence[int] = False,
    ) -> tuple[Tensor, Tensor | None]:
        b, t, _ = x.shape
        h, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim

        # 1) project and split heads: (B, T, E) -> (B, H, T, D) and (B, Hkv, T, D)
        q = self.q_proj(x).view(b, t, h, d).transpose(1, 2)
        k = self.k_proj(x).view(b, t, hkv, d).transpose(1, 2)
        v = self.v_proj(x).view(b, t, hkv, d).transpose(1, 2)

        # 2) turn queries and keys by their positions; 3) append to the cache
        if rotary is not None:
            q, k = apply_rotary(q, *rotary), apply_rotary(k, *rotary)
        if cache is not None:
            k, v = cache.append(k, v)  # (B, Hkv, Tk, D): every position so far

        # 4) attend: causal, minus padding, within the window; K/V heads shared (GQA)
        dropout_p = self.dropout if self.training else 0.0
        if self.sequence_group is not None:  # the processes of a split sequence: the ring
            self._check_ring(key_mask, cache, need_weights, dropout_p)
            out = ring_attention(q, k, v, True, self.sequence_group, scale=self.scale)
            weights = None
        else:
            mask = None if key_mask is None else key_mask[:, None, None, :]  # (B, 1, 1, Tk)
            if self.window is not None and k.shape[-2] > self.window:
                mask = combine_masks(mask, sliding_window_mask(t, k.shape[-2], self.window, x))
            result = scaled_dot_product_attention(
                q,
                k,
                v,
                mask,
                causal=True,
                scale=self.scale,
                dropout_p=dropout_p,
                need_weights=need_weights,
            )
            out, weights = result if isinstance(result, tuple) else (result, None)

        # 5) concatenate heads and project: (B, H, T, D) -> (B, T, E)
        return self.out_proj(out.transpose(1, 2).reshape(b, t, h * d)), weights

    def _check_ring(self, key_mask, cache, need_weights, dropout_p: float) -> None:
        """``ValueError`` naming what ring attention (``sequence_group``) cannot take."""
        refused = [
            (key_mask is not None, "a mask or key_mask (padding)"),
            (cache is not None, "a KV cache"),
            (bool(need_weights), "need_weights"),
            (dropout_p > 0, f"attention dropout {dropout_p}"),
            (self.window is not None, f"a sliding window of {self.window}"),
        ]
        named = [what for bad, what in refused if bad]
        if named:
            raise ValueError(
                "attention with a sequence_group (ring attention over a split sequence) "
                f"takes causal self-attention only, without {', '.join(named)}"
            )


def sliding_window_mask(tq: int, tk: int, window: int, like: Tensor) -> Tensor:
    """``(Tq, Tk)``, ``True`` where the last ``Tq`` of ``Tk`` positions may see a key: the
    keys less than ``window`` positions behind them (on ``like``'s device)."""
    queries = torch.arange(tk - tq, tk, device=like.device)[:, None]
    keys = torch.arange(tk, device=like.device)[None, :]
    return keys > queries - window


class DecoderBlock(nn.Module):
    """One pre-norm decoder layer: ``x + Attn(Norm(x))``, then ``x + FF(Norm(x))``.

    Args:
        attn_norm: the norm before attention (``nn.LayerNorm`` or
            :class:`~qkv.modules.RMSNorm`).
        self_attn: a :class:`CausalSelfAttention`.
        ff_norm: the norm before the feed-forward block.
        ff: the feed-forward block (:class:`~qkv.modules.FeedForward` or
            :class:`~qkv.modules.SwiGLU`).
        dropout: on each residual branch while training (GPT-2's ``resid_pdrop``).

    Shape:
        x ``(B, T, E)``; rotary and the attention's options as
        :class:`CausalSelfAttention`. Returns ``(B, T, E)`` and the attention weights or
        ``None``.
    """

    def __init__(
        self,
        attn_norm: nn.Module,
        self_attn: CausalSelfAttention,
        ff_norm: nn.Module,
        ff: nn.Module,
        dropout: float = 0.0,
    ):
        super().__init__()
        self.attn_norm, self.self_attn = attn_norm, self_attn
        self.ff_norm, self.ff = ff_norm, ff
        self.drop = Dropout(dropout)

    def forward(
        self, x: Tensor, rotary: Rotary | None = None, **attention: Any
    ) -> tuple[Tensor, Tensor | None]:
        """``attention``: ``key_mask``, ``cache`` and ``need_weights`` of the attention."""
        h, weights = self.self_attn(self.attn_norm(x), rotary, **attention)
        x = x + self.drop(h)  # (B, T, E)
        return x + self.drop(self.ff(self.ff_norm(x))), weights


@dataclass
class CausalLMOutput:
    """What a decoder-only language model (:class:`~qkv.models.GPT`,
    :class:`~qkv.models.Llama`) returns from ``forward``.

    Attributes:
        logits: ``(B, T, V)``.
        attentions: one ``(B, H, T, Tk)`` per layer when ``need_weights``, else empty.
        cache: the updated cache that was passed in (the model's ``new_cache()``), or
            ``None``.
    """

    logits: Tensor
    attentions: list[Tensor] = field(default_factory=list)
    cache: Any = None
