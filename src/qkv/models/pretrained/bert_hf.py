"""The BERT family in Hugging Face folders: which architectures, their configs and weight names.

Every architecture here is the same post-LN encoder as BERT; they differ in small ways
that change the output if ignored:

- **BERT** (``model_type`` ``"bert"``): positions ``0 .. T-1``, segment embeddings, pooler.
- **RoBERTa**, **XLM-RoBERTa**, **CamemBERT**: positions start at ``pad_token_id + 1`` and
  count real tokens only; padding gets position ``pad_token_id`` (Liu et al. 2019, from
  fairseq). One segment type.
- **ELECTRA** (Clark et al. 2020): embeddings may be narrower than the encoder
  (``embedding_size``), followed by a linear projection to ``hidden_size``.
- **DistilBERT** (Sanh et al. 2019): no segment embeddings, other config keys and weight
  names (``q_lin``, ``sa_layer_norm``, ``ffn.lin1``, ...).
- **MPNet** (Song et al. 2020; all-mpnet-base-v2): RoBERTa positions (padding id 1), no
  segment embeddings, and a learned relative-position bias shared by all layers.
- **ALBERT** (Lan et al. 2020): narrow embeddings with a projection (as ELECTRA), and
  layers that share weights: ``num_hidden_groups`` sets of layer weights, each used by
  consecutive layers (one set for all of them in the released models).

A checkpoint with a task head (``BertForMaskedLM``, ``RobertaForSequenceClassification``)
stores the encoder under a prefix (``bert.``, ``roberta.``, ...); only those weights are
read, as ``transformers`` does when it loads the bare encoder from such a checkpoint.
"""

from __future__ import annotations

import re
from typing import Any

from torch import Tensor

from qkv.files import quoted
from qkv.models.pretrained.hf import PADDED_POSITIONS, base_weights

__all__ = ["SUPPORTED_TYPES", "config_values", "encoder_weights", "layer_groups"]

SUPPORTED_TYPES = ("bert", "electra", "distilbert", "albert", *PADDED_POSITIONS)
_PREFIX = {
    "bert": "bert",
    "electra": "electra",
    "distilbert": "distilbert",
    "mpnet": "mpnet",
    "albert": "albert",
}

_DISTILBERT_CONFIG = {  # DistilBERT config.json key -> BertConfig field
    "dim": "hidden_size",
    "n_layers": "num_hidden_layers",
    "n_heads": "num_attention_heads",
    "hidden_dim": "intermediate_size",
    "activation": "hidden_act",
    "dropout": "hidden_dropout_prob",
    "attention_dropout": "attention_probs_dropout_prob",
}

_DEFAULTS = {  # transformers' defaults that differ from BertConfig's, for keys a config omits
    "roberta": {"vocab_size": 50265, "pad_token_id": 1},
    "xlm-roberta": {"pad_token_id": 1},
    "camembert": {"pad_token_id": 1},
    "mpnet": {"vocab_size": 30527},
    "electra": {
        "hidden_size": 256,
        "num_attention_heads": 4,
        "intermediate_size": 1024,
        "embedding_size": 128,
    },
    "albert": {
        "vocab_size": 30000,
        "hidden_size": 4096,
        "num_attention_heads": 64,
        "intermediate_size": 16384,
        "hidden_act": "gelu_new",
        "embedding_size": 128,
        "num_hidden_groups": 1,
    },
    "distilbert": {"n_layers": 6},
}

_EMBEDDINGS = [  # Hugging Face name (prefix removed) -> qkv name, in every family
    (r"^embeddings\.word_embeddings\.", "embeddings.word."),
    (r"^embeddings\.position_embeddings\.", "embeddings.position."),
    (r"^embeddings\.token_type_embeddings\.", "embeddings.token_type."),
    (r"^embeddings\.LayerNorm\.", "embeddings.norm."),
    (r"^embeddings_project\.", "embeddings.project."),  # ELECTRA
    (r"^encoder\.relative_attention_bias\.", "relative_bias."),  # MPNet
]
# The modules of one qkv encoder layer, and what each family calls them, in the same order.
_QKV_LAYER = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.out_proj",
    "norm1",
    "ff.linear1",
    "ff.linear2",
    "norm2",
)
_BERT_LAYER = (
    "attention.self.query",
    "attention.self.key",
    "attention.self.value",
    "attention.output.dense",
    "attention.output.LayerNorm",
    "intermediate.dense",
    "output.dense",
    "output.LayerNorm",
)
_MPNET_LAYER = (
    "attention.attn.q",
    "attention.attn.k",
    "attention.attn.v",
    "attention.attn.o",
    "attention.LayerNorm",
    "intermediate.dense",
    "output.dense",
    "output.LayerNorm",
)
_ALBERT_LAYER = (
    "attention.query",
    "attention.key",
    "attention.value",
    "attention.dense",
    "attention.LayerNorm",
    "ffn",
    "ffn_output",
    "full_layer_layer_norm",
)
_DISTILBERT_LAYER = (
    "attention.q_lin",
    "attention.k_lin",
    "attention.v_lin",
    "attention.out_lin",
    "sa_layer_norm",
    "ffn.lin1",
    "ffn.lin2",
    "output_layer_norm",
)


def _names(layers: str, parts: tuple[str, ...]) -> list[tuple[str, str]]:
    """(pattern, replacement) pairs: the embeddings, then layer ``i``'s ``parts``."""
    return _EMBEDDINGS + [
        (rf"^{re.escape(layers)}\.(\d+)\.{re.escape(theirs)}\.", rf"encoder.layers.\1.{ours}.")
        for theirs, ours in zip(parts, _QKV_LAYER, strict=True)
    ]


_RENAMES = {
    "distilbert": _names("transformer.layer", _DISTILBERT_LAYER),
    "mpnet": _names("encoder.layer", _MPNET_LAYER),
    # ALBERT numbers weight groups, not layers (see encoder_weights), one layer per group
    "albert": _names(
        "encoder.albert_layer_groups", tuple(f"albert_layers.0.{name}" for name in _ALBERT_LAYER)
    )
    + [
        (r"^encoder\.embedding_hidden_mapping_in\.", "embeddings.project."),
        (r"^pooler\.(weight|bias)$", r"pooler.dense.\1"),
    ],
}
_BERT_NAMES = _names("encoder.layer", _BERT_LAYER)  # BERT, RoBERTa's family, ELECTRA
_BUFFERS = re.compile(r"^embeddings\.(position_ids|token_type_ids)$")  # index buffers, not weights


def model_type(config: dict[str, Any]) -> str:
    """The folder's architecture; ``"bert"`` for old configs without ``model_type``."""
    kind = config.get("model_type", "bert")
    if kind not in SUPPORTED_TYPES:
        raise ValueError(
            f"model_type {quoted(kind)} is not a BERT-family encoder that qkv reads "
            f"(supported: {', '.join(SUPPORTED_TYPES)})"
        )
    return kind


def config_values(config: dict[str, Any], fields: set[str]) -> dict[str, Any]:
    """``BertConfig`` keyword arguments from a Hugging Face ``config.json`` dict."""
    kind = model_type(config)
    config = {**_DEFAULTS.get(kind, {}), **config}
    position = config.get("position_embedding_type", "absolute")
    if position != "absolute":
        raise ValueError(
            f"position_embedding_type {quoted(position)} is not supported (absolute is)"
        )
    if kind == "distilbert":
        config = {_DISTILBERT_CONFIG.get(k, k): v for k, v in config.items()}
        config.update(type_vocab_size=0, layer_norm_eps=1e-12, add_pooler=False)
    if kind == "mpnet":  # Hugging Face's MPNet fixes the padding id at 1
        config = {**config, "type_vocab_size": 0, "pad_token_id": 1}
    values = {k: v for k, v in config.items() if k in fields}
    if kind != "mpnet":
        values.pop("relative_attention_num_buckets", None)
    if kind in PADDED_POSITIONS:
        values["position_style"] = "roberta"
    if config.get("add_cross_attention"):
        raise ValueError("add_cross_attention=true (cross-attention layers) is not supported")
    if kind == "albert" and config.get("inner_group_num", 1) != 1:
        raise ValueError(
            f"ALBERT inner_group_num={config['inner_group_num']} is not supported (1 is)"
        )
    if kind != "albert":
        values.pop("num_hidden_groups", None)
    if kind not in ("electra", "albert") or (
        kind == "electra" and values.get("embedding_size") == values.get("hidden_size")
    ):  # ELECTRA projects only narrower embeddings, ALBERT always
        values.pop("embedding_size", None)
    return values


def layer_groups(num_layers: int, num_groups: int | None) -> list[int]:
    """The weight group of each layer: its own (``None``) or ALBERT's consecutive groups."""
    if num_groups is None:
        return list(range(num_layers))
    if not 1 <= num_groups <= num_layers:
        raise ValueError(f"num_hidden_groups must be in 1..{num_layers}, got {num_groups}")
    return [int(i / (num_layers / num_groups)) for i in range(num_layers)]  # as transformers


def encoder_weights(state: dict[str, Tensor], config: dict[str, Any]) -> dict[str, Tensor]:
    """The encoder's weights of a checkpoint, renamed to qkv's names.

    Head weights beside a prefixed encoder (``cls.*``, ``lm_head.*``, ``classifier.*``)
    and the index buffers ``position_ids``/``token_type_ids`` are dropped; any other
    unknown name is kept, so that the name check reports it.
    """
    kind = model_type(config)
    state = base_weights(state, _PREFIX.get(kind, "roberta") + ".")  # RoBERTa's family: roberta.
    renames = _RENAMES.get(kind, _BERT_NAMES)
    renamed = {
        _rename(name, renames): tensor for name, tensor in state.items() if not _BUFFERS.match(name)
    }
    if kind == "albert":  # group g's weights belong to the first layer that uses them
        groups = layer_groups(
            config.get("num_hidden_layers", 12), config.get("num_hidden_groups", 1)
        )
        first = {g: groups.index(g) for g in set(groups)}
        renamed = {_renumber(name, first): tensor for name, tensor in renamed.items()}
    return renamed


def _renumber(name: str, first: dict[int, int]) -> str:
    match = re.match(r"^encoder\.layers\.(\d+)\.", name)
    if match is None or int(match[1]) not in first:
        return name
    return f"encoder.layers.{first[int(match[1])]}.{name[match.end() :]}"


def _rename(name: str, renames: list[tuple[str, str]]) -> str:
    name = re.sub(r"\.gamma$", ".weight", re.sub(r"\.beta$", ".bias", name))  # old LN names
    for pattern, replacement in renames:
        new, count = re.subn(pattern, replacement, name)
        if count:
            return new
    return name  # pooler.dense.* keeps its name; anything else is reported as unexpected
