"""LLaMA-family decoders in Hugging Face folders: ``config.json`` keys and weight names,
read for :class:`~qkv.models.pretrained.llama.Llama`.

Three ``model_type`` s share the LLaMA layout (RMSNorm, rotary positions, grouped-query
attention, SwiGLU) and differ in a few options, read as transformers 5 reads them:

- ``llama``: ``attention_bias`` (on the four attention projections), ``mlp_bias``,
  ``head_dim``, ``rope_scaling`` (``linear``, ``dynamic``, ``llama3``);
- ``mistral``: no biases; ``sliding_window`` (``null``: none) in every layer;
- ``qwen2``: biases on the query, key and value projections (none on the output one);
  a sliding window only with ``use_sliding_window``, and then only in the layers from
  ``max_window_layers`` on (or those ``layer_types`` names ``"sliding_attention"``).

The rotary settings are ``rope_theta`` and ``rope_scaling`` (older files) or
``rope_parameters`` (transformers 5), with the type under ``rope_type`` or ``type``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import Tensor

from qkv.errors import ConfigError
from qkv.files import parse_json
from qkv.models.pretrained.hf import HF_ACTIVATIONS, base_weights, check_values, model_folder
from qkv.modules.positional import (
    DynamicRopeScaling,
    LinearRopeScaling,
    Llama3RopeScaling,
    RopeScaling,
)

__all__ = ["LLAMA_MODEL_TYPES", "llama_config_values", "llama_weights", "read_llama_config"]

LLAMA_MODEL_TYPES = ("llama", "mistral", "qwen2")
_DEFAULT_MAX_LEN = {"llama": 2048, "mistral": 4096 * 32, "qwen2": 32768}
_ROPE_TYPES = ("default", "linear", "dynamic", "llama3")

_HF_KINDS = {  # config.json key -> kind of value (see qkv.models.pretrained.hf.check_values)
    **dict.fromkeys(
        (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "max_position_embeddings",
        ),
        "count",
    ),
    **dict.fromkeys(("num_key_value_heads", "head_dim", "sliding_window"), "count?"),
    "max_window_layers": "index",
    "rms_norm_eps": "positive",
    "rope_theta": "positive",
    "hidden_act": "name",
    "attention_dropout": "probability",
    **dict.fromkeys(
        ("tie_word_embeddings", "attention_bias", "mlp_bias", "use_sliding_window"), "flag"
    ),
}


def read_llama_config(path: str | Path) -> dict[str, Any]:
    """The ``config.json`` of the folder ``path``, parsed by :func:`qkv.files.parse_json`.

    Raises:
        FileNotFoundError: the folder or its ``config.json`` does not exist.
        ConfigError: not JSON, or not a JSON object (one line naming the file).
    """
    file = model_folder(path) / "config.json"
    if not file.is_file():
        raise FileNotFoundError(f"{file} not found (a Hugging Face model folder has one)")
    try:
        config = parse_json(file.read_bytes())
    except ValueError as err:
        raise ConfigError(f"{file}: {err}") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{file}: expected a JSON object, got {type(config).__name__}")
    return config


def llama_config_values(config: dict[str, Any]) -> dict[str, Any]:
    """The :class:`~qkv.models.pretrained.llama.LlamaConfig` fields of a ``config.json`` dict.

    A dict without ``model_type`` is read as ``llama`` (the GGUF reader gives such dicts).

    Raises:
        ConfigError: another ``model_type`` (named), a missing size, a mistyped value, or a
            rotary scaling other than linear, dynamic and llama3.
    """
    kind = config.get("model_type", "llama")
    if kind not in LLAMA_MODEL_TYPES:
        raise ConfigError(
            f"model_type {kind!r} is not a LLaMA-family decoder that qkv reads "
            f"({', '.join(LLAMA_MODEL_TYPES)})"
        )
    sizes = ("vocab_size", "hidden_size", "intermediate_size")
    sizes += ("num_hidden_layers", "num_attention_heads")
    missing = [k for k in sizes if k not in config]
    if missing:
        raise ConfigError(f"{kind} config.json lacks {', '.join(missing)}")
    try:
        check_values(config, _HF_KINDS)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    act = config.get("hidden_act", "silu")
    if act not in HF_ACTIVATIONS:
        raise ConfigError(f"hidden_act {act!r} not supported: {list(HF_ACTIVATIONS)}")
    layers = config["num_hidden_layers"]
    max_len = config.get("max_position_embeddings", _DEFAULT_MAX_LEN[kind])
    attention_bias = kind == "llama" and config.get("attention_bias", False)
    window, full_layers = _sliding_window(kind, config, layers)
    return dict(
        vocab_size=config["vocab_size"],
        max_len=max_len,
        num_layers=layers,
        num_heads=config["num_attention_heads"],
        num_kv_heads=config.get("num_key_value_heads") or config["num_attention_heads"],
        dim=config["hidden_size"],
        ff_dim=config["intermediate_size"],
        head_dim=config.get("head_dim"),
        activation=HF_ACTIVATIONS[act],
        norm_eps=config.get("rms_norm_eps", 1e-6),
        rope_base=float(_rope_parameters(config).get("rope_theta", 10000.0)),
        rope_scaling=_rope_scaling(config, max_len),
        qkv_bias=kind == "qwen2" or attention_bias,
        out_bias=attention_bias,
        mlp_bias=kind == "llama" and config.get("mlp_bias", False),
        tie_embeddings=config.get("tie_word_embeddings", False),
        sliding_window=window,
        full_layers=full_layers,
        attention_dropout=float(config.get("attention_dropout", 0.0)),
    )


def _sliding_window(kind: str, config: dict[str, Any], layers: int):
    """``(window or None, layers that attend to every earlier token)``."""
    window = config.get("sliding_window")
    if kind == "llama" or window is None:
        return None, ()
    if kind == "mistral":
        return window, ()
    if not config.get("use_sliding_window", False):  # qwen2
        return None, ()
    types = config.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != layers:
            raise ConfigError(
                f"layer_types must list the {layers} layers' attention, got {types!r}"
            )
        unknown = sorted(set(types) - {"full_attention", "sliding_attention"})
        if unknown:
            raise ConfigError(
                f"layer_types holds {unknown[0]!r} (full_attention, sliding_attention)"
            )
        return window, tuple(i for i, t in enumerate(types) if t == "full_attention")
    first = config.get("max_window_layers", 28)
    return window, tuple(range(min(first, layers)))


def _rope_parameters(config: dict[str, Any]) -> dict[str, Any]:
    """The rotary settings: ``rope_parameters`` (transformers 5) or ``rope_scaling`` with
    ``rope_theta`` beside it (older files)."""
    params = config.get("rope_scaling") or config.get("rope_parameters") or {}
    if not isinstance(params, dict):
        raise ConfigError(f"rope_parameters must be an object, got {params!r}")
    params = dict(params)
    if "rope_theta" in config:
        params.setdefault("rope_theta", config["rope_theta"])
    return params


def _rope_scaling(config: dict[str, Any], max_len: int) -> RopeScaling | None:
    params = _rope_parameters(config)
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in _ROPE_TYPES:
        raise ConfigError(
            f"rope type {kind!r} is not supported (qkv reads {', '.join(_ROPE_TYPES)})"
        )
    if kind == "default":
        return None
    need = ["factor"] + (["low_freq_factor", "high_freq_factor"] if kind == "llama3" else [])
    missing = [k for k in need if k not in params]
    if missing:
        raise ConfigError(f"rope type {kind!r} needs {', '.join(missing)}")
    try:
        check_values(params, dict.fromkeys(need, "positive"))
    except ValueError as err:
        raise ConfigError(f"rope {err}") from None
    factor = float(params["factor"])
    if kind == "linear":
        return LinearRopeScaling(factor)
    if kind == "dynamic":
        return DynamicRopeScaling(factor, max_len)
    original = params.get("original_max_position_embeddings", max_len)
    return Llama3RopeScaling(
        factor, float(params["low_freq_factor"]), float(params["high_freq_factor"]), original
    )


_LAYER_NAMES = {  # Hugging Face name inside layers.{i}. -> qkv's
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "self_attn.q_proj",
    "self_attn.k_proj": "self_attn.k_proj",
    "self_attn.v_proj": "self_attn.v_proj",
    "self_attn.o_proj": "self_attn.out_proj",
    "post_attention_layernorm": "ff_norm",
    "mlp.gate_proj": "ff.gate_proj",
    "mlp.up_proj": "ff.up_proj",
    "mlp.down_proj": "ff.down_proj",
}


def llama_weights(hf: dict[str, Tensor], tie_embeddings: bool) -> dict[str, Tensor]:
    """Rename Hugging Face ``LlamaForCausalLM`` (Mistral, Qwen2) weights into :class:`Llama`
    names.

    Names may carry the ``model.`` prefix (other heads than ``lm_head`` are then dropped);
    the rotary buffers of old checkpoints (``rotary_emb.inv_freq``) and a tied
    ``lm_head`` are dropped; unknown names are kept, for the caller's name check to report.
    """
    state: dict[str, Tensor] = {}
    top = {"embed_tokens.weight": "tok_emb.weight", "norm.weight": "final_norm.weight"}
    for name, tensor in base_weights(hf, "model.", keep=["lm_head.weight"]).items():
        if name == "lm_head.weight":
            if not tie_embeddings:
                state[name] = tensor
            continue
        if name in top:
            state[top[name]] = tensor
            continue
        parts = name.split(".", 2)  # layers, i, rest
        if len(parts) != 3 or parts[0] != "layers":
            state[name] = tensor  # unknown: reported by the name check
            continue
        module, _, kind = parts[2].rpartition(".")
        if module == "self_attn.rotary_emb":
            continue  # inv_freq of old checkpoints: recomputed from the config
        new = _LAYER_NAMES.get(module)
        state[f"layers.{parts[1]}.{new}.{kind}" if new else name] = tensor
    return state
