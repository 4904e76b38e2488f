"""GPT-2 in Hugging Face folders: ``config.json`` keys and weight names, read for :class:`GPT`.

Hugging Face's GPT-2 stores its linear layers transposed (``Conv1D``: ``(in, out)``) and
packs the query, key and value projections in one ``c_attn``; both are converted to the
``nn.Linear`` layout of :class:`~qkv.modules.transformer.DecoderLayer`.
"""

from __future__ import annotations

import logging
from typing import Any

from torch import Tensor

from qkv.files import quoted
from qkv.models.pretrained.hf import HF_ACTIVATIONS, base_weights, check_values

__all__ = ["gpt2_config_values", "gpt2_weights"]

log = logging.getLogger(__name__)

_HF_KINDS = {  # GPT-2 config.json key -> kind of value (see qkv.models.pretrained.hf.check_values)
    **dict.fromkeys(("vocab_size", "n_positions", "n_layer", "n_head", "n_embd"), "count"),
    "n_inner": "count?",
    "layer_norm_epsilon": "positive",
    "activation_function": "name",
    **dict.fromkeys(("resid_pdrop", "embd_pdrop", "attn_pdrop"), "probability"),
    **dict.fromkeys(
        (
            "tie_word_embeddings",
            "scale_attn_weights",
            "add_cross_attention",
            "scale_attn_by_inverse_layer_idx",
            "reorder_and_upcast_attn",
        ),
        "flag",
    ),
}


def gpt2_config_values(config: dict[str, Any]) -> dict[str, Any]:
    """The :class:`~qkv.models.pretrained.gpt.GPTConfig` fields of a GPT-2 ``config.json`` dict.

    Raises ``ValueError`` for another ``model_type``, a missing size, a mistyped value, and
    GPT-2 options that change the computation and that qkv does not implement
    (cross-attention).
    """
    kind = config.get("model_type", "gpt2")
    if kind != "gpt2":
        raise ValueError(
            f"model_type {quoted(kind)} is not GPT-2 format (GPT reads model_type 'gpt2')"
        )
    sizes = ("vocab_size", "n_positions", "n_layer", "n_head", "n_embd")
    missing = [k for k in sizes if k not in config]
    if missing:
        raise ValueError(f"GPT-2 config.json lacks {', '.join(missing)}")
    check_values(config, _HF_KINDS)
    if config.get("add_cross_attention"):
        raise ValueError("GPT-2 option add_cross_attention=true is not supported")
    act = config.get("activation_function", "gelu_new")
    if act not in HF_ACTIVATIONS:
        raise ValueError(f"activation_function {quoted(act)} not supported: {list(HF_ACTIVATIONS)}")
    drops = {config.get(k, 0.1) for k in ("resid_pdrop", "embd_pdrop", "attn_pdrop")}
    if len(drops) > 1:  # only while training; qkv has one dropout rate
        log.warning("GPT-2 dropouts %s differ: resid_pdrop is used for all", sorted(drops))
    return dict(
        vocab_size=config["vocab_size"],
        max_len=config["n_positions"],
        num_layers=config["n_layer"],
        num_heads=config["n_head"],
        dim=config["n_embd"],
        ff_dim=config.get("n_inner"),
        activation=HF_ACTIVATIONS[act],
        layer_norm_eps=config.get("layer_norm_epsilon", 1e-5),
        dropout=config.get("resid_pdrop", 0.1),
        tie_embeddings=config.get("tie_word_embeddings", True),
        scale_by_head_dim=config.get("scale_attn_weights", True),
        scale_by_layer=config.get("scale_attn_by_inverse_layer_idx", False),
    )


def gpt2_weights(hf: dict[str, Tensor], tie_embeddings: bool) -> dict[str, Tensor]:
    """Rename (and transpose, split) Hugging Face GPT-2 weights into :class:`GPT` names.

    Names may carry the ``transformer.`` prefix (other heads than ``lm_head`` are then
    dropped); the causal-mask buffers of old checkpoints and a tied ``lm_head`` are
    dropped; unknown names are kept, for the caller's name check to report.
    """
    state: dict[str, Tensor] = {}
    hf = base_weights(hf, "transformer.", keep=["lm_head.weight"])
    top = {
        "wte.weight": "tok_emb.weight",
        "wpe.weight": "pos_emb.weight",
        "ln_f.weight": "final_norm.weight",
        "ln_f.bias": "final_norm.bias",
    }
    for name, tensor in hf.items():
        if name == "lm_head.weight":
            if not tie_embeddings:
                state["lm_head.weight"] = tensor
            continue  # tied: the same tensor as wte
        if name in top:
            state[top[name]] = tensor
            continue
        parts = name.split(".", 2)  # h, i, rest
        if len(parts) != 3 or parts[0] != "h":
            state[name] = tensor  # unknown: reported by the name check
            continue
        prefix, rest = f"layers.{parts[1]}.", parts[2]
        if rest in ("attn.bias", "attn.masked_bias"):
            continue  # causal-mask buffers of old checkpoints
        for new_name, value in _convert_block_weight(rest, tensor).items():
            state[prefix + new_name] = value
    return state


def _convert_block_weight(rest: str, tensor: Tensor) -> dict[str, Tensor]:
    """One weight of a GPT-2 block: ``Conv1D`` ``(in, out)`` -> ``nn.Linear`` ``(out, in)``."""
    simple = {
        "ln_1": "attn_norm",
        "ln_2": "ff_norm",
        "attn.c_proj": "self_attn.out_proj",
        "mlp.c_fc": "ff.linear1",
        "mlp.c_proj": "ff.linear2",
    }
    module, _, kind = rest.rpartition(".")
    if module == "attn.c_attn":
        value = tensor.t() if kind == "weight" else tensor  # (3E, E) or (3E,)
        q, k, v = value.chunk(3, dim=0)
        return {f"self_attn.{p}_proj.{kind}": x.contiguous() for p, x in zip("qkv", (q, k, v))}
    if module in simple:
        is_conv = kind == "weight" and not module.startswith("ln_")
        return {f"{simple[module]}.{kind}": tensor.t().contiguous() if is_conv else tensor}
    return {rest: tensor}  # unknown: reported by the name check
