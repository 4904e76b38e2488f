"""GPT: a decoder-only Transformer language model (GPT-2 layout).

Radford et al. 2019, "Language Models are Unsupervised Multitask Learners". Token and
learned position embeddings feed pre-LN causal decoder blocks (GELU-tanh feed-forward); a
final layer norm and the transposed token embedding (tied weights) give the logits:

.. math::
    h_0 = E_{tok}[x] + E_{pos}[p],\\quad h_l = \\mathrm{Block}_l(h_{l-1}),\\quad
    \\mathrm{logits} = \\mathrm{LN}(h_L)\\, E_{tok}^\\top

``GPT.generate`` (from :class:`~qkv.models.pretrained.causal_lm.CausalLM`) decodes
greedily or by sampling, with a key/value cache (each step feeds only the new token) or by
recomputing the whole prefix, up to end tokens if any.
:meth:`GPT.from_pretrained` reads a Hugging Face GPT-2 folder (and its default end tokens).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from qkv.models.pretrained.causal_lm import CausalLM
from qkv.models.pretrained.gen_defaults import read_generation_defaults
from qkv.models.pretrained.gpt_hf import gpt2_config_values, gpt2_weights
from qkv.models.pretrained.hf import check_values, config_errors, load_checked, read_config
from qkv.modules.decoder import CausalLMOutput, CausalSelfAttention, DecoderBlock
from qkv.modules.feedforward import FeedForward, layer_norm
from qkv.modules.linear import Linear
from qkv.modules.positional import LearnedPositionalEncoding

__all__ = ["GPT", "GPTConfig", "GPTOutput"]


@dataclass(frozen=True)
class GPTConfig:
    """Sizes and options of a :class:`GPT`.

    Args:
        vocab_size: V. max_len: longest sequence (learned positions).
        num_layers: decoder layers. num_heads: H. dim: model width E.
        ff_dim: feed-forward inner width (default 4E).
        activation: ``"gelu_tanh"`` (GPT-2), ``"gelu"``, ``"relu"``, ``"silu"`` or
            ``"quick_gelu"``.
        dropout: on embeddings, attention weights and residual branches while training.
        layer_norm_eps: epsilon of every layer norm.
        tie_embeddings: the output projection is the token embedding (transposed).
        scale_by_head_dim: scores are divided by ``sqrt(D)`` (GPT-2's
            ``scale_attn_weights``; ``False`` leaves them unscaled).
        scale_by_layer: scores of layer ``l`` (from 0) are also divided by ``l + 1``
            (``scale_attn_by_inverse_layer_idx``, used by Stanford's Mistral GPT-2 runs).
        bias: biases in the projections, the feed-forward block and the layer norms
            (GPT-2 has them; nanoGPT's recipes train without).
    """

    vocab_size: int = 50257
    max_len: int = 1024
    num_layers: int = 12
    num_heads: int = 12
    dim: int = 768
    ff_dim: int | None = None
    activation: str = "gelu_tanh"
    dropout: float = 0.0
    layer_norm_eps: float = 1e-5
    tie_embeddings: bool = True
    scale_by_head_dim: bool = True
    scale_by_layer: bool = False
    bias: bool = True

    def __post_init__(self) -> None:
        kinds = dict.fromkeys(("vocab_size", "max_len", "num_layers", "num_heads", "dim"), "count")
        kinds.update(
            ff_dim="count?",
            activation="name",
            dropout="probability",
            layer_norm_eps="positive",
            tie_embeddings="flag",
            scale_by_head_dim="flag",
            scale_by_layer="flag",
            bias="flag",
        )
        try:
            check_values(vars(self), kinds)
        except ValueError as err:
            raise ValueError(f"GPTConfig.{err}") from None
        if self.dim % self.num_heads:
            raise ValueError(f"dim {self.dim} is not divisible by num_heads {self.num_heads}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")

    def attention_scale(self, layer: int) -> float:
        """The factor on ``QK^T`` in layer ``layer`` (0-based)."""
        scale = (self.dim // self.num_heads) ** -0.5 if self.scale_by_head_dim else 1.0
        return scale / (layer + 1) if self.scale_by_layer else scale

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GPTConfig:
        """A config from a plain dict (a recipe's model section, a checkpoint's header);
        an unknown key is a ``ValueError`` naming it (``from_dict(c.to_dict()) == c``)."""
        unknown = sorted(set(d) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"GPTConfig: unknown field(s) {', '.join(map(repr, unknown))}")
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        """The fields as a plain dict (what a qkv checkpoint stores)."""
        return asdict(self)

    @classmethod
    def from_hf(cls, config: dict[str, Any]) -> GPTConfig:
        """Build from a Hugging Face GPT-2 ``config.json`` dict (dropout: ``resid_pdrop``).

        Raises ``ValueError`` for another ``model_type``, a missing size, and GPT-2 options
        that change the computation and that qkv does not implement (cross-attention).
        ``reorder_and_upcast_attn`` is accepted: it changes how half-precision scores are
        rounded (Hugging Face then computes them in float32), not what is computed.
        """
        return cls(**gpt2_config_values(config))


GPTOutput = CausalLMOutput  # logits, attentions, cache: as every causal LM here


class GPT(CausalLM):
    """Decoder-only language model (GPT-2): learned positions, LayerNorm, GELU feed-forward,
    tied embeddings: the :class:`~qkv.models.pretrained.causal_lm.CausalLM` stack with
    these parts.

    Args:
        config: a :class:`GPTConfig`.

    ``forward``, ``generate`` and ``generation_defaults`` come from :class:`CausalLM`.

    Shape:
        input_ids ``(B, T)``; attention_mask ``(B, Tk)`` with ``Tk = cache.length + T``,
        1/True for real tokens. Returns :class:`GPTOutput`.
    """

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = c = config

        def norm() -> nn.LayerNorm:
            return layer_norm(c.dim, c.layer_norm_eps, c.bias)

        def block(i: int) -> DecoderBlock:
            attention = CausalSelfAttention(
                c.dim,
                c.num_heads,
                qkv_bias=c.bias,
                out_bias=c.bias,
                scale=c.attention_scale(i),
                dropout=c.dropout,
            )
            # GPT-2 drops out the residual branches, not inside the feed-forward block
            ff = FeedForward(c.dim, c.ff_dim or 4 * c.dim, c.activation, 0.0, c.bias)
            return DecoderBlock(norm(), attention, norm(), ff, dropout=c.dropout)

        self.tok_emb = nn.Embedding(c.vocab_size, c.dim)
        self.pos_emb = LearnedPositionalEncoding(c.max_len, c.dim)
        self.drop = nn.Dropout(c.dropout)
        self.layers = nn.ModuleList(block(i) for i in range(c.num_layers))
        self.final_norm = norm()
        self.lm_head = Linear(c.dim, c.vocab_size, bias=False)
        self.apply(self._init_weights)
        if c.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight

    def _init_weights(self, module: nn.Module) -> None:
        """GPT-2 initialisation: N(0, 0.02) weights, zero biases."""
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    @classmethod
    def from_pretrained(cls, path: str | Path, dtype: torch.dtype | str | None = None) -> GPT:
        """Load a Hugging Face GPT-2 folder: ``config.json``, the weights, and the end and
        pad tokens that :meth:`generate` takes by default
        (:mod:`~qkv.models.pretrained.gen_defaults`).

        GPT-2 stores its linear layers transposed (``Conv1D``: ``(in, out)``) and packs the
        query, key and value projections in one ``c_attn``; both are converted
        (:mod:`qkv.models.pretrained.gpt_hf`). Names may
        carry the ``transformer.`` prefix, and then other heads than ``lm_head``
        (``score.*`` of ``GPT2ForSequenceClassification``) are ignored; the causal-mask
        buffers of old checkpoints (``attn.bias``, ``attn.masked_bias``) are ignored, and so
        is a tied ``lm_head``. Missing or unknown names are an error that lists them.
        ``dtype``: float32 (``None``), the checkpoint's own type (``"auto"``) or a floating
        ``torch.dtype``. Returns the model in eval mode.
        """
        raw = read_config(path)
        with config_errors(path):
            config = GPTConfig.from_hf(raw)
        model = load_checked(
            path,
            raw,
            lambda n: cls(config if n is None else replace(config, num_layers=n)),
            lambda state: gpt2_weights(state, config.tie_embeddings),
            layers_key="n_layer",
            dtype=dtype,
        )
        model.generation_defaults = read_generation_defaults(path, config.vocab_size)
        return model.eval()
