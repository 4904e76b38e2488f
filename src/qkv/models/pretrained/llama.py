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

from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from qkv.errors import ConfigError
from qkv.models.pretrained.causal_lm import CausalLM
from qkv.models.pretrained.gen_defaults import GenerationDefaults, read_generation_defaults
from qkv.models.pretrained.gguf import read_gguf
from qkv.models.pretrained.hf import check_values, load_checked, load_into
from qkv.models.pretrained.llama_hf import llama_config_values, llama_weights, read_llama_config
from qkv.modules.decoder import CausalLMOutput, CausalSelfAttention, DecoderBlock
from qkv.modules.feedforward import SwiGLU
from qkv.modules.linear import Linear
from qkv.modules.norms import RMSNorm
from qkv.modules.positional import RopeScaling, RotaryPositionalEncoding

__all__ = ["Llama", "LlamaConfig", "LlamaOutput"]


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


class Llama(CausalLM):
    """Decoder-only language model of the LLaMA family (LLaMA, Mistral, Qwen2): the
    :class:`~qkv.models.pretrained.causal_lm.CausalLM` stack with rotary positions,
    RMSNorm, SwiGLU and grouped-query attention.

    Args:
        config: a :class:`LlamaConfig`.

    ``forward``, ``generate`` (the options of GPT's, with no limit on the positions) and
    ``generation_defaults`` come from :class:`CausalLM`.

    Shape:
        input_ids ``(B, T)``; attention_mask ``(B, Tk)`` with ``Tk = cache.length + T``,
        1/True for real tokens. Returns :class:`LlamaOutput`.
    """

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.config = c = config

        def block(i: int) -> DecoderBlock:
            attention = CausalSelfAttention(
                c.dim,
                c.num_heads,
                num_kv_heads=c.kv_heads,
                head_dim=c.head_size,
                qkv_bias=c.qkv_bias,
                out_bias=c.out_bias,
                window=c.window(i),
                dropout=c.attention_dropout,
            )
            ff = SwiGLU(c.dim, c.inner_dim, c.activation, bias=c.mlp_bias)
            return DecoderBlock(
                RMSNorm(c.dim, c.norm_eps), attention, RMSNorm(c.dim, c.norm_eps), ff
            )

        self.tok_emb = nn.Embedding(c.vocab_size, c.dim)
        self.rope = RotaryPositionalEncoding(c.head_size, c.rope_base, c.rope_scaling)
        self.drop = nn.Identity()  # no dropout on the embeddings
        self.layers = nn.ModuleList(block(i) for i in range(c.num_layers))
        self.final_norm = RMSNorm(c.dim, c.norm_eps)
        self.lm_head = Linear(c.dim, c.vocab_size, bias=False)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        if c.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight

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
