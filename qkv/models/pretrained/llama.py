"""LLaMA: the decoder-only layout that today's open language models share.

Touvron et al. 2023, "LLaMA: Open and Efficient Foundation Language Models". GPT-2's
decoder with four changes: RMSNorm instead of LayerNorm, rotary positions (RoPE) inside
attention instead of learned ones added to the embeddings, grouped-query attention
(``Hkv < H`` key/value heads), and a gated feed-forward block (SwiGLU):

.. math::
    h_0 = E[x],\\quad
    a_l = h_{l-1} + \\mathrm{Attn}(\\mathrm{RMSNorm}(h_{l-1}), \\mathrm{RoPE}(p)),\\quad
    h_l = a_l + \\mathrm{SwiGLU}(\\mathrm{RMSNorm}(a_l)),\\quad
    \\mathrm{logits} = \\mathrm{RMSNorm}(h_L)\\, W_{out}^\\top

Mistral adds a sliding window (each token sees the ``W`` latest tokens only) and Qwen2
biases on the query, key and value projections; :class:`LlamaConfig` holds these options
and :mod:`~qkv.models.pretrained.llama_hf` reads them from a Hugging Face folder.
:meth:`Llama.generate` is :meth:`GPT.generate`'s decoding (greedy, sampling, beam search).
"""

from __future__ import annotations

import weakref
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from qkv.distributed import ring_attention
from qkv.errors import ConfigError
from qkv.functional import combine_masks, scaled_dot_product_attention
from qkv.kernels import decode_layer, layer_steps
from qkv.models.inputs import check_position_ids, check_token_ids
from qkv.models.pretrained.causal_lm import CausalLM, real_token_positions
from qkv.models.pretrained.gen_defaults import GenerationDefaults, read_generation_defaults
from qkv.models.pretrained.generation import CausalLMOutput
from qkv.models.pretrained.gguf import read_gguf
from qkv.models.pretrained.hf import check_values, load_checked, load_into
from qkv.models.pretrained.llama_hf import llama_config_values, llama_weights, read_llama_config
from qkv.modules.cache import KVCache, LayerKV
from qkv.modules.feedforward import SwiGLU
from qkv.modules.linear import Linear
from qkv.modules.norms import RMSNorm
from qkv.modules.positional import (
    DynamicRopeScaling,
    RopeScaling,
    RotaryPositionalEncoding,
    apply_rotary,
)

__all__ = ["Llama", "LlamaAttention", "LlamaConfig", "LlamaLayer", "LlamaOutput"]

_NO_LIMIT = 2**62  # rotary positions have no table to run off


@dataclass(frozen=True)
class LlamaConfig:
    """Sizes and options of a :class:`Llama`.

    Args:
        vocab_size: V. max_len: the context the model was trained for (rotary positions
            go beyond it; dynamic scaling starts there). num_layers: decoder layers.
        num_heads: query heads H. num_kv_heads: key/value heads Hkv (default H).
        dim: model width E. ff_dim: SwiGLU inner width (default ``8E/3`` rounded up to 256).
        head_dim: D (default ``E / H``).
        activation: of the SwiGLU gate (``"silu"``).
        norm_eps: epsilon of every RMSNorm.
        rope_base: the rotary base ``θ`` (``rope_theta``). rope_scaling: a
            :class:`~qkv.modules.positional.RopeScaling` or ``None``.
        qkv_bias: biases on the query, key and value projections (Qwen2).
        out_bias: a bias on the output projection (LLaMA's ``attention_bias`` sets both).
        mlp_bias: biases in the SwiGLU block.
        tie_embeddings: the output projection is the token embedding.
        sliding_window: each token sees the latest ``W`` tokens only (Mistral); ``None``:
            all earlier tokens.
        full_layers: layers that see all earlier tokens despite ``sliding_window`` (Qwen2's
            first ``max_window_layers``).
        attention_dropout: on the attention weights while training.
    """

    vocab_size: int = 32000
    max_len: int = 2048
    num_layers: int = 32
    num_heads: int = 32
    num_kv_heads: int | None = None
    dim: int = 4096
    ff_dim: int | None = None
    head_dim: int | None = None
    activation: str = "silu"
    norm_eps: float = 1e-6
    rope_base: float = 10000.0
    rope_scaling: RopeScaling | None = None
    qkv_bias: bool = False
    out_bias: bool = False
    mlp_bias: bool = False
    tie_embeddings: bool = False
    sliding_window: int | None = None
    full_layers: tuple[int, ...] = ()
    attention_dropout: float = 0.0

    def __post_init__(self) -> None:
        kinds = dict.fromkeys(("vocab_size", "max_len", "num_layers", "num_heads", "dim"), "count")
        kinds.update(
            dict.fromkeys(("num_kv_heads", "ff_dim", "head_dim", "sliding_window"), "count?"),
            activation="name",
            norm_eps="positive",
            rope_base="positive",
            attention_dropout="probability",
            **dict.fromkeys(("qkv_bias", "out_bias", "mlp_bias", "tie_embeddings"), "flag"),
        )
        try:
            check_values(vars(self), kinds)
        except ValueError as err:
            raise ConfigError(f"LlamaConfig.{err}") from None
        if self.num_heads % self.kv_heads:
            raise ConfigError(
                f"num_kv_heads {self.kv_heads} must divide num_heads {self.num_heads}"
            )
        if self.head_dim is None and self.dim % self.num_heads:
            raise ConfigError(
                f"dim {self.dim} is not divisible by num_heads {self.num_heads} (give head_dim)"
            )
        if self.head_size % 2:
            raise ConfigError(f"rotary positions need an even head size, got {self.head_size}")
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, RopeScaling):
            raise ConfigError(f"rope_scaling must be a RopeScaling, got {self.rope_scaling!r}")
        if not 0.0 <= self.attention_dropout < 1.0:
            raise ConfigError(f"attention_dropout must be in [0, 1), got {self.attention_dropout}")

    @property
    def kv_heads(self) -> int:
        """Hkv."""
        return self.num_kv_heads or self.num_heads

    @property
    def head_size(self) -> int:
        """D."""
        return self.head_dim or self.dim // self.num_heads

    @property
    def inner_dim(self) -> int:
        """The SwiGLU inner width."""
        return self.ff_dim or 256 * -(-(8 * self.dim // 3) // 256)

    def window(self, layer: int) -> int | None:
        """The sliding window of layer ``layer`` (0-based), ``None`` for none."""
        return None if layer in self.full_layers else self.sliding_window

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LlamaConfig:
        """A config from a plain dict (a recipe's model section, a checkpoint's header);
        an unknown key is a ``ValueError`` naming it. ``full_layers`` may be a list;
        ``rope_scaling`` must be ``None`` (a scaled model is read from its own files)."""
        unknown = sorted(set(d) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"LlamaConfig: unknown field(s) {', '.join(map(repr, unknown))}")
        if d.get("rope_scaling") is not None:
            raise ValueError("LlamaConfig: rope_scaling is read from a model's own files only")
        values = dict(d)
        if isinstance(values.get("full_layers"), list):
            values["full_layers"] = tuple(values["full_layers"])
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """The fields as a plain dict (what a qkv checkpoint stores; no rope scaling)."""
        if self.rope_scaling is not None:
            raise ValueError("a LlamaConfig with rope_scaling has no plain-dict form")
        return asdict(self)

    @classmethod
    def from_hf(cls, config: dict[str, Any]) -> LlamaConfig:
        """Build from a Hugging Face ``config.json`` dict of ``model_type`` ``llama``,
        ``mistral`` or ``qwen2`` (:mod:`~qkv.models.pretrained.llama_hf`); a dict without
        ``model_type`` is read as ``llama``.

        Raises:
            ConfigError: another model type (named), a missing size, a wrong value.
        """
        return cls(**llama_config_values(config))


LlamaOutput = CausalLMOutput  # logits, attentions, cache: as every causal LM here


class LlamaAttention(nn.Module):
    """Causal self-attention with rotary positions and grouped-query heads.

    Args:
        config: the model's :class:`LlamaConfig`.
        layer: this layer's index (it decides the sliding window).
        sequence_group: sequence parallelism: a ``torch.distributed`` process group whose
            processes each hold the zig-zag part of the sequence
            (:func:`qkv.distributed.sequence_shard`; the model rotates each token by its
            global position, ``position_ids``) and attend through
            :func:`qkv.distributed.ring_attention`. ``None`` (the default) is off; a
            settable attribute too (:func:`qkv.distributed.set_sequence_group`). It takes
            no padding mask, cache, weights, dropout or sliding window.

    Shape:
        x ``(B, T, E)``; cos and sin ``(B, 1, T, D)`` (:meth:`RotaryPositionalEncoding.cos_sin`);
        key_mask ``(B, Tk)``, ``True`` for real tokens, ``Tk = cache.length + T``.
        Returns ``(B, T, E)`` and the weights ``(B, H, T, Tk)`` or ``None``.
    """

    def __init__(
        self, config: LlamaConfig, layer: int, sequence_group: dist.ProcessGroup | None = None
    ):
        super().__init__()
        c = config
        self.sequence_group = sequence_group
        self.num_heads, self.num_kv_heads, self.head_dim = c.num_heads, c.kv_heads, c.head_size
        self.window = c.window(layer)
        self.dropout = c.attention_dropout
        self.q_proj = Linear(c.dim, c.num_heads * c.head_size, bias=c.qkv_bias)
        self.k_proj = Linear(c.dim, c.kv_heads * c.head_size, bias=c.qkv_bias)
        self.v_proj = Linear(c.dim, c.kv_heads * c.head_size, bias=c.qkv_bias)
        self.out_proj = Linear(c.num_heads * c.head_size, c.dim, bias=c.out_bias)

    def forward(
        self,
        x: Tensor,
        cos: Tensor,
        sin: Tensor,
        *,
        key_mask: Tensor | None = None,
        cache: LayerKV | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        b, t, _ = x.shape
        h, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim

        # 1) project and split heads: (B, T, E) -> (B, H, T, D) and (B, Hkv, T, D)
        q = self.q_proj(x).view(b, t, h, d).transpose(1, 2)
        k = self.k_proj(x).view(b, t, hkv, d).transpose(1, 2)
        v = self.v_proj(x).view(b, t, hkv, d).transpose(1, 2)

        # 2) rotate queries and keys by their positions; 3) append to the cache
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if cache is not None:
            k, v = cache.append(k, v)  # (B, Hkv, Tk, D): every position so far

        # 4) attend: causal, minus padding, within the window; K/V heads shared (GQA);
        # across the processes of a split sequence, the ring
        dropout_p = self.dropout if self.training else 0.0
        if self.sequence_group is not None:
            self._check_ring(key_mask, cache, need_weights, dropout_p)
            out = ring_attention(q, k, v, causal=True, group=self.sequence_group)
            return self.out_proj(out.transpose(1, 2).reshape(b, t, h * d)), None
        tk = k.shape[-2]
        mask = None if key_mask is None else key_mask[:, None, None, :]  # (B, 1, 1, Tk)
        if self.window is not None and tk > self.window:
            mask = combine_masks(mask, _band(t, tk, self.window, x.device))
        result = scaled_dot_product_attention(
            q, k, v, mask, causal=True, dropout_p=dropout_p, need_weights=need_weights
        )
        out, weights = result if need_weights else (result, None)

        # 5) concatenate heads and project: (B, H, T, D) -> (B, T, E)
        return self.out_proj(out.transpose(1, 2).reshape(b, t, h * d)), weights

    def _check_ring(self, key_mask, cache, need_weights, dropout_p: float) -> None:
        """``ValueError`` naming what ring attention (``sequence_group``) cannot take."""
        refused = [
            (key_mask is not None, "an attention_mask"),
            (cache is not None, "a KV cache"),
            (bool(need_weights), "need_weights"),
            (dropout_p > 0, f"attention dropout {dropout_p}"),
            (self.window is not None, f"a sliding window of {self.window}"),
        ]
        named = [what for bad, what in refused if bad]
        if named:
            raise ValueError(
                "LlamaAttention with a sequence_group (ring attention over a split sequence) "
                f"takes causal self-attention only, without {', '.join(named)}"
            )


def _band(tq: int, tk: int, window: int, device: torch.device) -> Tensor:
    """``(Tq, Tk)``: the last ``Tq`` queries see the keys less than ``window`` behind them."""
    queries = torch.arange(tk - tq, tk, device=device)[:, None]
    keys = torch.arange(tk, device=device)[None, :]
    return keys > queries - window


class LlamaLayer(nn.Module):
    """One pre-norm decoder layer: ``x + Attn(RMSNorm(x))``, then ``x + SwiGLU(RMSNorm(x))``."""

    def __init__(self, config: LlamaConfig, layer: int):
        super().__init__()
        c = config
        self.attn_norm = RMSNorm(c.dim, c.norm_eps)
        self.self_attn = LlamaAttention(c, layer)
        self.ff_norm = RMSNorm(c.dim, c.norm_eps)
        self.ff = SwiGLU(c.dim, c.inner_dim, c.activation, bias=c.mlp_bias)

    def tensors(self) -> decode_layer.LayerWeights:
        """The layer's weights as :class:`qkv.kernels.decode_layer.FusedLayer` takes them."""
        a, ff = self.self_attn, self.ff
        return decode_layer.LayerWeights(
            *(self.attn_norm.weight, a.q_proj.weight, a.q_proj.bias, a.k_proj.weight),
            *(a.k_proj.bias, a.v_proj.weight, a.v_proj.bias, a.out_proj.weight, a.out_proj.bias),
            *(self.ff_norm.weight, ff.gate_proj.weight, ff.gate_proj.bias, ff.up_proj.weight),
            *(ff.up_proj.bias, ff.down_proj.weight, ff.down_proj.bias),
        )

    def forward(self, x, cos, sin, *, key_mask=None, cache=None, need_weights=False):
        h, weights = self.self_attn(
            self.attn_norm(x), cos, sin, key_mask=key_mask, cache=cache, need_weights=need_weights
        )
        x = x + h  # (B, T, E)
        return x + self.ff(self.ff_norm(x)), weights

    def forward_prompt(
        self, x: Tensor, cos: Tensor, sin: Tensor, cache: LayerKV | None, keep: int | None = None
    ) -> Tensor:
        """:meth:`forward` at inference on float32 CPU tokens without padding, faster: the
        same products and attention, the norms, rotations and gate in C
        (:mod:`qkv.kernels.layer_steps`, one pass each), and each residual sum inside its
        product (``addmm_``). ``x`` is updated in place and returned; tested against
        :meth:`forward`. :meth:`Llama.forward` decides when it serves (``_fused_prompt``).

        With ``keep``, only the last ``keep`` positions come out (the last layer, when
        only their logits are wanted): the keys and values of every position are still
        made (and cached), but the queries, attention, output product and feed-forward
        only of those positions, the others' outputs being used nowhere.

        Shape:
            x ``(B, T, E)``, contiguous; cos and sin ``(B or 1, T, D)``. Returns
            ``(B, T, E)`` (``x``), or ``(B, keep, E)`` with ``keep``.
        """
        a, ff = self.self_attn, self.ff
        b, t, e = x.shape
        h, hkv, d = a.num_heads, a.num_kv_heads, a.head_dim

        def product(inputs: Tensor, linear: Linear) -> Tensor:  # (rows, in) -> (rows, out)
            return F.linear(inputs, linear.weight, linear.bias)

        def add_product(rows: Tensor, inputs: Tensor, linear: Linear) -> None:
            rows.addmm_(inputs, linear.weight.t())  # rows += inputs W^T + b
            if linear.bias is not None:
                rows.add_(linear.bias)

        n = layer_steps.rms_norm_rows(
            x.view(b * t, e), self.attn_norm.weight, self.attn_norm.eps, x.new_empty(b * t, e)
        )
        k = layer_steps.rotate_rows(product(n, a.k_proj).view(b, t, hkv, d), cos, sin)
        v = product(n, a.v_proj).view(b, t, hkv, d)
        if keep is not None and keep < t:  # from here on, the last `keep` positions only
            x, t = x[:, -keep:].contiguous(), keep
            n = n.view(b, -1, e)[:, -keep:].contiguous().view(b * t, e)
            cos, sin = (c[:, -keep:].contiguous() for c in (cos, sin))
        rows = x.view(b * t, e)  # the residual stream, updated in place
        q = layer_steps.rotate_rows(product(n, a.q_proj).view(b, t, h, d), cos, sin)
        k, v = k.transpose(1, 2), v.transpose(1, 2)
        if cache is not None:
            k, v = cache.append(k, v)
        out = scaled_dot_product_attention(q.transpose(1, 2), k, v, causal=True)  # (B, H, T, D)
        add_product(rows, out.transpose(1, 2).reshape(b * t, h * d), a.out_proj)
        n = layer_steps.rms_norm_rows(rows, self.ff_norm.weight, self.ff_norm.eps, n)
        gate = layer_steps.silu_times(product(n, ff.gate_proj), product(n, ff.up_proj))
        add_product(rows, gate, ff.down_proj)
        return x


class Llama(CausalLM):
    """Decoder-only language model of the LLaMA family (LLaMA, Mistral, Qwen2).

    Args:
        config: a :class:`LlamaConfig`.

    ``generate`` (the options of GPT's, with no limit on the positions) and
    ``generation_defaults`` come from :class:`CausalLM`.

    Shape:
        input_ids ``(B, T)``; attention_mask ``(B, Tk)`` with ``Tk = cache.length + T``,
        1/True for real tokens. Returns :class:`LlamaOutput`.
    """

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.config = config
        c = config
        self.tok_emb = nn.Embedding(c.vocab_size, c.dim)
        self.rope = RotaryPositionalEncoding(c.head_size, c.rope_base, c.rope_scaling)
        self.layers = nn.ModuleList(LlamaLayer(c, i) for i in range(c.num_layers))
        self.final_norm = RMSNorm(c.dim, c.norm_eps)
        self.lm_head = Linear(c.dim, c.vocab_size, bias=False)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        if c.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight

    def new_cache(self) -> KVCache:
        """An empty key/value cache for incremental decoding (one entry per layer)."""
        return KVCache(self.config.num_layers)

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        cache: KVCache | None = None,
        need_weights: bool = False,
        position_ids: Tensor | None = None,
        logits_to_keep: int = 0,
    ) -> LlamaOutput:
        """Next-token logits for every position (as :meth:`GPT.forward`).

        Positions, unless ``position_ids`` gives them, count real tokens only: with
        ``attention_mask``, a left-padded prompt starts at position 0 (as Hugging Face
        ``generate`` does); without it, positions are ``cache.length + arange(T)``.

        Args:
            input_ids: token ids ``(B, T)`` (only the new ones when ``cache`` is given).
            attention_mask: ``(B, cache.length + T)``, 1/True for real tokens.
            cache: from :meth:`new_cache`; updated in place and returned.
            need_weights: also return every layer's attention weights.
            position_ids: ``(B, T)`` or ``(1, T)``, each token's position (>= 0). With
                sequence parallelism (the attention's ``sequence_group``), the global
                positions of this process's part: :func:`qkv.distributed.sequence_shard`
                gives both.
            logits_to_keep: the logits of the last this many positions only (0: all), as
                in transformers; generation needs the last one.
        """
        b, t = input_ids.shape
        past = cache.length if cache is not None else 0
        key_mask = None
        if attention_mask is not None:
            if attention_mask.shape != (b, past + t):
                raise ValueError(
                    f"attention_mask must be (B, cache length + T) = {(b, past + t)}, "
                    f"got {tuple(attention_mask.shape)}"
                )
            key_mask = attention_mask.bool()  # (B, Tk)
        if position_ids is None:
            position_ids = real_token_positions(key_mask, past, b, t, input_ids.device)
        else:
            check_position_ids(position_ids, b, t, _NO_LIMIT)
        check_token_ids(input_ids, self.config.vocab_size)
        split = any(layer.self_attn.sequence_group is not None for layer in self.layers)
        if split and isinstance(self.config.rope_scaling, DynamicRopeScaling):
            raise ValueError(
                "dynamic RoPE scaling chooses its base from the last position a call holds, "
                "which differs between the parts of a split sequence (sequence_group): "
                "train without it, or in one process"
            )

        fused = self._fused_step(input_ids, key_mask, cache, need_weights)
        if fused is not None:  # one token of one sequence on the CPU: the same layers in C
            return self._decode_fused(input_ids, position_ids, cache, fused)
        if self._fused_prompt(input_ids, key_mask, cache, need_weights):
            return self._prompt_fused(input_ids, position_ids, cache, logits_to_keep)

        x = self.tok_emb(input_ids)  # (B, T, E)
        rotary = x.dtype  # under autocast, that of the projected q and k (else the rotated
        # q and k come out float32 beside a bfloat16 v)
        if torch.is_autocast_enabled(x.device.type):
            rotary = torch.get_autocast_dtype(x.device.type)
        cos, sin = self.rope.cos_sin(position_ids, rotary)  # (B, 1, T, D): shared by the layers
        attentions = []
        for i, layer in enumerate(self.layers):
            x, weights = layer(
                x,
                cos,
                sin,
                key_mask=key_mask,
                cache=None if cache is None else cache[i],
                need_weights=need_weights,
            )
            if need_weights:
                attentions.append(weights)
        x = x[:, -logits_to_keep:] if logits_to_keep else x  # (B, T or logits_to_keep, E)
        logits = self.lm_head(self.final_norm(x))  # (B, T, V)
        return LlamaOutput(logits=logits, attentions=attentions, cache=cache)

    def _fused_step(self, input_ids, key_mask, cache, need_weights):
        """The layers as :class:`~qkv.kernels.decode_layer.FusedLayer` when
        :meth:`_decode_fused` serves this call, else ``None``: one new token of one
        sequence after cached ones, nothing masked, no weights wanted, no gradient, SiLU,
        no sequence parallelism, no autocast, CPU weights and caches all float32 or all
        bfloat16.

        They are prepared at a cache's first fused step and kept for that cache (one
        decoding run), where reading the layers' tensors at every token took longer than
        the step's own small operations."""
        if (
            input_ids.shape != (1, 1)
            or cache is None
            or not all(kv.in_place for kv in cache.layers)
            or need_weights
            or torch.is_grad_enabled()
            or self.config.activation != "silu"
            or (key_mask is not None and not bool(key_mask.all()))
            or torch.is_autocast_enabled(input_ids.device.type)
        ):
            return None
        prepared = self.__dict__.setdefault("_fused_layers", weakref.WeakKeyDictionary())
        if cache not in prepared:  # cache -> FusedLayers
            if any(layer.self_attn.sequence_group is not None for layer in self.layers):
                return None
            tensors = [layer.tensors() for layer in self.layers]
            if not all(map(decode_layer.supports, tensors)):
                return None
            c = self.config
            prepared[cache] = [
                decode_layer.FusedLayer(w, c.norm_eps, c.window(i), c.num_heads)
                for i, w in enumerate(tensors)
            ]
        layers = prepared[cache]
        if any(kv.reserve(0)[0].dtype != f.dtype for kv, f in zip(cache.layers, layers)):
            return None  # a cache of another type than the weights
        return layers

    def _fused_prompt(self, input_ids, key_mask, cache, need_weights) -> bool:
        """Whether :meth:`_prompt_fused` serves this call: inference (eval mode, no
        gradient, no autocast) of float32 CPU weights, SiLU, nothing masked, no weights
        wanted, no sequence parallelism, every key within the sliding windows, and the
        kernel built here."""
        tk = input_ids.shape[1] + (cache.length if cache is not None else 0)
        return (
            not self.training
            and not need_weights
            and not torch.is_grad_enabled()
            and not torch.is_autocast_enabled(input_ids.device.type)
            and self.config.activation == "silu"
            and (key_mask is None or bool(key_mask.all()))
            and all(
                layer.self_attn.sequence_group is None
                and (layer.self_attn.window is None or tk <= layer.self_attn.window)
                and decode_layer.supports(layer.tensors())
                and layer.self_attn.q_proj.weight.dtype == torch.float32
                for layer in self.layers
            )
            and layer_steps.supports(self.tok_emb.weight)
        )

    def _prompt_fused(self, input_ids, position_ids, cache, logits_to_keep) -> LlamaOutput:
        """:meth:`forward` through :meth:`LlamaLayer.forward_prompt`."""
        x = self.tok_emb(input_ids)  # (B, T, E): a new tensor, updated in place
        cos, sin = (c.squeeze(1).contiguous() for c in self.rope.cos_sin(position_ids, x.dtype))
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            keep = logits_to_keep if i == last and logits_to_keep else None
            x = layer.forward_prompt(x, cos, sin, None if cache is None else cache[i], keep)
        x = x[:, -logits_to_keep:] if logits_to_keep else x  # (B, T or logits_to_keep, E)
        logits = self.lm_head(self.final_norm(x))  # (B, T, V)
        return LlamaOutput(logits=logits, attentions=[], cache=cache)

    def __getstate__(self) -> dict[str, Any]:
        """A copy (``copy.deepcopy``, pickle) starts without the fused layers of
        :meth:`_fused_step`: they hold the addresses of this model's weights."""
        state = super().__getstate__()
        state.pop("_fused_layers", None)
        return state

    def _decode_fused(self, input_ids, position_ids, cache, layers) -> LlamaOutput:
        """:meth:`forward` for one token of one sequence, each layer one C call
        (:class:`~qkv.kernels.decode_layer.FusedLayer`, tested against the layers' forward).
        The residual stream between the layers is float32, of bfloat16 weights too."""
        x = self.tok_emb(input_ids).view(-1).float()  # (E,): a new tensor, updated in place
        cos, sin = (t.view(-1) for t in self.rope.cos_sin(position_ids, torch.float32))  # (D,)
        for layer, kv in zip(layers, cache.layers):
            layer(x, cos, sin, *kv.reserve(1), kv.length)  # caches (1, Hkv, capacity, D)
            kv.advance(1)
        x = x.to(self.tok_emb.weight.dtype).view(1, 1, -1)
        logits = self.lm_head(self.final_norm(x))  # (1, 1, V)
        return LlamaOutput(logits=logits, attentions=[], cache=cache)

    @classmethod
    def from_weights(
        cls,
        config: LlamaConfig,
        tensors: dict[str, Tensor],
        dtype: torch.dtype | str | None = None,
        *,
        source: str = "the weights",
    ) -> Llama:
        """A model of ``config`` holding ``tensors``, named as Hugging Face names them
        (``model.layers.0.self_attn.q_proj.weight``, with or without ``model.``).

        ``dtype``: float32 (``None``), the tensors' own type (``"auto"``) or a floating
        ``torch.dtype``. Missing, unknown or misshapen weights are an error that names
        them (``source`` names the weights there). The tensors become the model's weights
        (a model built on the meta device takes them), so that they are held once.
        Returns the model in eval mode.
        """
        with torch.device("meta"):
            model = cls(config)
        state = llama_weights(tensors, config.tie_embeddings)
        load_into(model, state, what=source, dtype=dtype, assign=True)
        if config.tie_embeddings:
            model.lm_head.weight = model.tok_emb.weight
        return model.eval()

    @classmethod
    def from_pretrained(cls, path: str | Path, dtype: torch.dtype | str | None = None) -> Llama:
        """Load a Hugging Face folder of ``model_type`` ``llama``, ``mistral`` or ``qwen2``, or
        a GGUF file (``.gguf``, architecture ``llama``), with its default end and pad tokens.

        A folder holds ``config.json`` and the weights (``model.safetensors``, or shards
        named by ``model.safetensors.index.json``). A GGUF file is read by
        :func:`~qkv.models.pretrained.gguf.read_gguf` (dequantised, Q/K rows in Hugging
        Face's order). ``dtype``: float32 (``None``), the checkpoint's own type
        (``"auto"``; float32 for a GGUF file) or a floating ``torch.dtype``. Returns the
        model in eval mode.

        Raises:
            ConfigError: ``config.json`` names another model type or a wrong value (the
                message starts with the file).
            ModelFileError: a GGUF file that cannot be read (see ``read_gguf``).
        """
        if Path(path).suffix == ".gguf":
            return cls._from_gguf(Path(path), dtype)
        raw = read_llama_config(path)
        try:
            config = LlamaConfig.from_hf(raw)
        except ConfigError as err:
            raise ConfigError(f"{Path(path) / 'config.json'}: {err}") from None
        model = load_checked(  # sizes checked against the weights before anything is built
            path,
            raw,
            lambda n: cls(config if n is None else replace(config, num_layers=n)),
            lambda state: llama_weights(state, config.tie_embeddings),
            layers_key="num_hidden_layers",
            dtype=dtype,
        )
        model.generation_defaults = read_generation_defaults(path, config.vocab_size)
        return model.eval()

    @classmethod
    def _from_gguf(cls, path: Path, dtype: torch.dtype | str | None) -> Llama:
        """A GGUF file's model; its bos/eos/pad metadata gives the generation defaults."""
        file = read_gguf(path, torch.bfloat16 if dtype == torch.bfloat16 else torch.float32)
        try:
            config = LlamaConfig.from_hf(file.config)
        except ConfigError as err:
            raise ConfigError(f"{path}: {err}") from None
        model = cls.from_weights(
            config, file.tensors, None if dtype == "auto" else dtype, source=str(path)
        )
        known = [file.config.get(k) for k in ("eos_token_id", "pad_token_id")]
        eos, pad = (i if i is not None and 0 <= i < config.vocab_size else None for i in known)
        model.generation_defaults = GenerationDefaults(
            () if eos is None else (eos,), pad, str(path)
        )
        return model
