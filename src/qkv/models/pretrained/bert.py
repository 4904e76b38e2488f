"""BERT: a post-LN Transformer encoder over word, position and segment embeddings.

Devlin et al. 2019, "BERT: Pre-training of Deep Bidirectional Transformers for Language
Understanding" (https://arxiv.org/abs/1810.04805). Every token attends to every real
token in both directions:

.. math::
    h_0 = \\mathrm{LN}(E_{word}[x] + E_{pos}[t] + E_{type}[s]),\\quad
    h_l = \\mathrm{EncoderLayer}(h_{l-1}),\\quad
    \\mathrm{pooler} = \\tanh(W h_L[\\mathrm{CLS}] + b)

:meth:`BertModel.from_pretrained` reads any Hugging Face BERT-family folder (BERT, MiniLM,
RoBERTa, XLM-RoBERTa, CamemBERT, ELECTRA, ALBERT, MPNet, DistilBERT, sentence-transformers
encoders; see :mod:`~qkv.models.pretrained.bert_hf`);
:func:`~qkv.models.pretrained.sentence.encode` (also :func:`qkv.models.encode`) turns texts
into sentence embeddings by pooling the last hidden state.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from qkv.files import quoted
from qkv.functional import causal_mask, combine_masks
from qkv.models.inputs import check_token_ids
from qkv.models.pretrained.bert_hf import config_values, encoder_weights, layer_groups
from qkv.models.pretrained.hf import (
    HF_ACTIVATIONS,
    check_values,
    config_errors,
    load_checked,
    open_weights,
    read_config,
)
from qkv.modules.transformer import Encoder, EncoderLayer

__all__ = ["BertConfig", "BertModel", "BertOutput", "relative_buckets"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BertConfig:
    """Sizes and options of a BERT encoder (the Hugging Face ``config.json`` names).

    Args:
        vocab_size: V. hidden_size: E. num_hidden_layers: layers. num_attention_heads: H.
        intermediate_size: feed-forward inner width.
        hidden_act: a key of :data:`~qkv.models.pretrained.hf.HF_ACTIVATIONS` (``"gelu"``,
            ``"gelu_new"``, ...).
        max_position_embeddings: position embeddings. type_vocab_size: segment types (0:
            none, as in DistilBERT).
        position_style: ``"bert"`` numbers tokens ``0 .. T-1``; ``"roberta"`` numbers the
            real tokens from ``pad_token_id + 1`` and gives padding ``pad_token_id``.
        embedding_size: width of the embeddings, then projected to ``hidden_size`` by a
            linear layer (ELECTRA, ALBERT). ``None``: ``hidden_size``, no projection.
        num_hidden_groups: ``None`` (every layer has its own weights), or the number of
            weight sets that consecutive layers share (ALBERT).
        relative_attention_num_buckets: 0, or the buckets of a learned relative-position
            bias added to every layer's scores (MPNet; see :func:`relative_buckets`).
        layer_norm_eps: epsilon of every layer norm (1e-12 in BERT).
        hidden_dropout_prob, attention_probs_dropout_prob: dropout while training.
        pad_token_id: the padding id. add_pooler: build the ``[CLS]`` pooler.
        is_decoder: attend causally, each token to itself and the tokens before it
            (``BertLMHeadModel``, ``RobertaForCausalLM``).
    """

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    pad_token_id: int = 0
    add_pooler: bool = True
    position_style: str = "bert"
    embedding_size: int | None = None
    relative_attention_num_buckets: int = 0
    num_hidden_groups: int | None = None
    is_decoder: bool = False

    def __post_init__(self) -> None:
        check_values(vars(self), _KINDS)
        if self.pad_token_id is not None and self.pad_token_id >= self.vocab_size:
            raise ValueError(
                f"pad_token_id {self.pad_token_id} is outside the vocabulary "
                f"(0..{self.vocab_size - 1})"
            )
        if self.position_style == "roberta" and self.pad_token_id is None:
            raise ValueError("pad_token_id is needed: positions start after it (RoBERTa)")
        if self.hidden_act not in HF_ACTIVATIONS:
            raise ValueError(
                f"hidden_act {quoted(self.hidden_act)} not supported: {list(HF_ACTIVATIONS)}"
            )
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not divisible by "
                f"num_attention_heads {self.num_attention_heads}"
            )
        if self.position_style not in ("bert", "roberta"):
            raise ValueError(
                f"position_style must be 'bert' or 'roberta', got {quoted(self.position_style)}"
            )

    @property
    def max_length(self) -> int:
        """The longest input the position embeddings cover."""
        first = self.pad_token_id + 1 if self.position_style == "roberta" else 0
        return self.max_position_embeddings - first

    @classmethod
    def from_hf(cls, config: dict[str, Any], **overrides: Any) -> BertConfig:
        """Build from a Hugging Face ``config.json`` dict (other keys are ignored).

        The ``model_type`` must be one of
        :data:`~qkv.models.pretrained.bert_hf.SUPPORTED_TYPES`; only
        absolute position embeddings are supported.
        """
        known = _check_overrides(overrides)
        return cls(**{**config_values(config, known), **overrides})


_KINDS = {  # BertConfig field -> kind of value (see qkv.models.pretrained.hf.check_values)
    **dict.fromkeys(
        [
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "max_position_embeddings",
        ],
        "count",
    ),
    "type_vocab_size": "index",
    "layer_norm_eps": "positive",
    "pad_token_id": "index?",
    "hidden_dropout_prob": "probability",
    "attention_probs_dropout_prob": "probability",
    "add_pooler": "flag",
    "position_style": "name",
    "embedding_size": "count?",
    "relative_attention_num_buckets": "index",
    "num_hidden_groups": "count?",
    "is_decoder": "flag",
    "hidden_act": "name",
}


def _check_overrides(overrides: dict[str, Any]) -> set[str]:
    """The names of BertConfig's fields; ``ValueError`` when ``overrides`` has another."""
    known = {f.name for f in fields(BertConfig)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f"unknown BertConfig field(s): {', '.join(unknown)}")
    return known


@dataclass
class BertOutput:
    """What :class:`BertModel` returns.

    Attributes:
        last_hidden_state: ``(B, T, E)``.
        pooler_output: ``(B, E)`` or ``None`` without a pooler.
        attentions: one ``(B, H, T, T)`` per layer when ``need_weights``, else empty.
    """

    last_hidden_state: Tensor
    pooler_output: Tensor | None = None
    attentions: list[Tensor] = field(default_factory=list)


class BertEmbeddings(nn.Module):
    """Word + position (+ token-type) embeddings, layer norm, dropout (+ projection)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        e = config.embedding_size or config.hidden_size
        self.word = nn.Embedding(config.vocab_size, e, padding_idx=config.pad_token_id)
        self.position = nn.Embedding(config.max_position_embeddings, e)
        self.token_type = (
            nn.Embedding(config.type_vocab_size, e) if config.type_vocab_size else None
        )
        self.norm = nn.LayerNorm(e, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.project = None if config.embedding_size is None else nn.Linear(e, config.hidden_size)

    def forward(
        self, input_ids: Tensor, token_type_ids: Tensor, position_ids: Tensor | None = None
    ) -> Tensor:
        if position_ids is None:
            t = input_ids.shape[1]
            if t > self.config.max_length:
                raise ValueError(f"input length {t} exceeds the {self.config.max_length} positions")
            position_ids = self.position_ids(input_ids)
        else:
            check_token_ids(position_ids, self.config.max_position_embeddings, "position id")
        check_token_ids(input_ids, self.config.vocab_size)
        x = self.word(input_ids)
        if self.token_type is not None:
            x = x + self.token_type(token_type_ids)
        # (word + type) + position: Hugging Face's order, so that fp32 results agree bitwise
        x = self.dropout(self.norm(x + self.position(position_ids)))
        return x if self.project is None else self.project(x)  # (B, T, E)

    def position_ids(self, input_ids: Tensor) -> Tensor:
        """``(T,)`` for BERT; ``(B, T)`` for RoBERTa, counting the real tokens only."""
        if self.config.position_style == "bert":
            return torch.arange(input_ids.shape[1], device=input_ids.device)
        pad = self.config.pad_token_id
        real = (input_ids != pad).long()
        return real.cumsum(1) * real + pad


class BertModel(nn.Module):
    """A BERT encoder (Devlin et al. 2019): embeddings, post-LN layers, optional pooler.

    Args:
        config: a :class:`BertConfig`.

    Shape:
        input_ids, attention_mask, token_type_ids ``(B, T)``; see :class:`BertOutput`.
    """

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config

        def layer() -> EncoderLayer:
            new = EncoderLayer(
                config.hidden_size,
                config.num_attention_heads,
                config.intermediate_size,
                dropout=config.hidden_dropout_prob,
                activation=HF_ACTIVATIONS[config.hidden_act],
                norm_first=False,
                layer_norm_eps=config.layer_norm_eps,
            )
            new.self_attn.dropout = config.attention_probs_dropout_prob
            new.ff.dropout.p = 0.0  # BERT has no dropout inside the feed-forward block
            return new

        self.embeddings = BertEmbeddings(config)
        groups = layer_groups(config.num_hidden_layers, config.num_hidden_groups)
        weights = [layer() for _ in range(max(groups) + 1)]  # ALBERT: fewer than the layers
        self.encoder = Encoder([weights[g] for g in groups])
        self.relative_bias = None  # (buckets, H): one bias per head and distance bucket
        if config.relative_attention_num_buckets:
            heads = config.num_attention_heads
            self.relative_bias = nn.Embedding(config.relative_attention_num_buckets, heads)
        self.pooler = None
        if config.add_pooler:
            self.pooler = nn.Sequential()
            self.pooler.add_module("dense", nn.Linear(config.hidden_size, config.hidden_size))
            self.pooler.add_module("activation", nn.Tanh())

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        need_weights: bool = False,
        position_ids: Tensor | None = None,
    ) -> BertOutput:
        """Encode a batch of token ids.

        Args:
            input_ids: token ids ``(B, T)``.
            attention_mask: ``(B, T)``, 1/True for real tokens, 0/False for padding.
            token_type_ids: segment ids ``(B, T)`` (default all 0).
            need_weights: also return every layer's attention probabilities.
            position_ids: ``(B, T)`` or ``(1, T)``, the position of each token, as in
                transformers (default: ``0 .. T-1``, or RoBERTa's count of real tokens).
                MPNet's relative bias still uses ``0 .. T-1``, as transformers' does.
        """
        _check_inputs(input_ids, attention_mask, token_type_ids, position_ids)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        elif self.config.type_vocab_size:
            check_token_ids(token_type_ids, self.config.type_vocab_size, "token type id")
        key_mask = None if attention_mask is None else attention_mask.bool()  # (B, T)
        x = self.embeddings(input_ids, token_type_ids, position_ids)
        bias = None
        if self.relative_bias is not None:  # the same (1, H, T, T) bias in every layer
            buckets = relative_buckets(input_ids.shape[1], device=input_ids.device)
            bias = self.relative_bias(buckets).permute(2, 0, 1).unsqueeze(0).to(x.dtype)
        if self.config.is_decoder:
            t = input_ids.shape[1]
            bias = combine_masks(bias, causal_mask(t, t, device=input_ids.device))
        out = self.encoder(x, key_mask=key_mask, mask=bias, need_weights=need_weights)
        hidden = out.hidden  # (B, T, E)
        pooled = self.pooler(hidden[:, 0]) if self.pooler is not None else None  # (B, E)
        return BertOutput(last_hidden_state=hidden, pooler_output=pooled, attentions=out.attentions)

    @classmethod
    def from_pretrained(
        cls, path: str | Path, dtype: torch.dtype | str | None = None, **overrides: Any
    ) -> BertModel:
        """Load a Hugging Face BERT-family folder (``config.json`` and the weights).

        The architectures and their weight names are in :mod:`qkv.models.pretrained.bert_hf`. Weight
        names may carry the encoder's prefix (``bert.``, ``roberta.``: checkpoints with a
        task head, whose head is ignored), and the old ``gamma``/``beta`` layer-norm names
        are accepted. Any other unknown or missing name is an error that lists them. A
        checkpoint without pooler weights gives a model without pooler. ``dtype``: float32
        (``None``), the checkpoint's own type (``"auto"``) or a floating ``torch.dtype``.
        ``overrides`` replace config values. Returns the model in eval mode.
        """
        _check_overrides(overrides)
        raw, weights = read_config(path), open_weights(path)
        with config_errors(path):
            names = encoder_weights(weights.tensors, raw)  # meta tensors: nothing is read
            has_pooler = any(n.startswith("pooler.") for n in names)
            overrides.setdefault("add_pooler", has_pooler)
            config = BertConfig.from_hf(raw, **overrides)
        layers = "n_layers" if raw.get("model_type") == "distilbert" else "num_hidden_layers"
        named = raw if raw.get("model_type") == "distilbert" else {**vars(config), **raw}
        model = load_checked(
            path,
            named,  # keys the config omits are named with the value they take
            lambda n: cls(config if n is None else replace(config, num_hidden_layers=n)),
            lambda state: encoder_weights(state, raw),
            layers_key=None if config.num_hidden_groups is not None else layers,
            weights=weights,
            dtype=dtype,
        )
        return model.eval()


def _check_inputs(input_ids: Tensor, *others: Tensor | None) -> None:
    """``input_ids`` is ``(B, T)``; attention mask, token types and positions have its shape."""
    if input_ids.ndim != 2:
        raise ValueError(f"input_ids must be (B, T), got {tuple(input_ids.shape)}")
    names = ("attention_mask", "token_type_ids", "position_ids")
    for name, given in zip(names, others, strict=True):
        shapes = [input_ids.shape] + ([(1, input_ids.shape[1])] if name == "position_ids" else [])
        if given is not None and given.shape not in shapes:
            raise ValueError(
                f"{name} must have input_ids' shape {tuple(input_ids.shape)}, "
                f"got {tuple(given.shape)}"
            )


def relative_buckets(
    t: int, num_buckets: int = 32, max_distance: int = 128, device: torch.device | None = None
) -> Tensor:
    """The distance bucket of every (query, key) pair, ``(T, T)`` long (MPNet, from T5).

    Half the buckets are for keys before the query, half for keys after it. Within a half,
    distances below a quarter of ``num_buckets`` get a bucket each; longer ones share
    buckets on a log scale up to ``max_distance``, and everything beyond shares the last.
    MPNet always uses 32 buckets and 128 as the distance, whatever its config says.
    """
    pos = torch.arange(t, device=device)
    distance = pos[:, None] - pos[None, :]  # query - key: > 0 for keys before the query
    half = num_buckets // 2
    exact = half // 2
    side = (distance < 0).long() * half  # keys after the query use the upper half
    n = distance.abs()
    scaled = torch.log(n.clamp(min=1).float() / exact) / math.log(max_distance / exact)
    far = (exact + (scaled * (half - exact)).long()).clamp(max=half - 1)
    return side + torch.where(n < exact, n, far)
