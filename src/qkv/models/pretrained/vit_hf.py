"""ViT and DeiT in Hugging Face folders: their configs, weight names, and the checks of both.

Two ``model_type`` s share one layout, read by :class:`~qkv.models.pretrained.vit.ViT`:

- **ViT** (``"vit"``): ``ViTModel`` (with or without its pooler) and
  ``ViTForImageClassification`` (a linear head on the class token, weights under
  ``vit.``).
- **DeiT** (``"deit"``): a distillation token after the class token (two learned
  positions before the patches). ``DeiTModel``, ``DeiTForImageClassification`` (one head
  on the class token) and ``DeiTForImageClassificationWithTeacher`` (a second head on the
  distillation token; the logits are the mean of the two heads), weights under ``deit.``.

Which heads and pooler a folder holds is read from its weights; the sizes come from its
``config.json`` and are checked against the weights before anything is built, so that a
config that does not fit them is named by its key.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

from torch import Tensor

from qkv.errors import ConfigError
from qkv.files import parse_json, quoted
from qkv.models.pretrained.hf import HF_ACTIVATIONS, base_weights, model_folder

__all__ = [
    "SUPPORTED_TYPES",
    "check_sizes",
    "read_vit_config",
    "vit_config_values",
    "vit_weights",
]

log = logging.getLogger(__name__)

SUPPORTED_TYPES = ("vit", "deit")
_HEADS = (  # task-head weights kept beside the prefixed encoder
    "classifier.weight",
    "classifier.bias",
    "cls_classifier.weight",
    "cls_classifier.bias",
    "distillation_classifier.weight",
    "distillation_classifier.bias",
)
_LAYER = r"^encoder\.layer\.(\d+)\."
_RENAMES = [  # Hugging Face name (prefix removed) -> qkv name
    (r"^embeddings\.patch_embeddings\.projection\.", "patches.projection."),
    (r"^embeddings\.cls_token$", "cls_token"),
    (r"^embeddings\.distillation_token$", "distillation_token"),
    (r"^embeddings\.position_embeddings$", "positions"),
    (_LAYER + r"attention\.attention\.query\.", r"encoder.layers.\1.self_attn.q_proj."),
    (_LAYER + r"attention\.attention\.key\.", r"encoder.layers.\1.self_attn.k_proj."),
    (_LAYER + r"attention\.attention\.value\.", r"encoder.layers.\1.self_attn.v_proj."),
    (_LAYER + r"attention\.output\.dense\.", r"encoder.layers.\1.self_attn.out_proj."),
    (_LAYER + r"layernorm_before\.", r"encoder.layers.\1.norm1."),
    (_LAYER + r"intermediate\.dense\.", r"encoder.layers.\1.ff.linear1."),
    (_LAYER + r"output\.dense\.", r"encoder.layers.\1.ff.linear2."),
    (_LAYER + r"layernorm_after\.", r"encoder.layers.\1.norm2."),
    (r"^layernorm\.", "encoder.final_norm."),
    (r"^(classifier|cls_classifier)\.", "head."),
    (r"^distillation_classifier\.", "distillation_head."),
]
_CONFIG_KEYS = (  # config.json keys that ViTConfig takes as they are
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "hidden_act",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "layer_norm_eps",
    "num_channels",
    "qkv_bias",
    "pooler_output_size",
    "pooler_act",
)


def read_vit_config(path: str | Path) -> dict[str, Any]:
    """The ``config.json`` of a ViT or DeiT folder, as a dict.

    Raises:
        FileNotFoundError: the folder or its ``config.json`` does not exist.
        ConfigError: not JSON, not an object, or another ``model_type`` (named).
    """
    file = model_folder(path) / "config.json"
    if not file.is_file():
        raise FileNotFoundError(f"{file} not found (a Hugging Face model folder has one)")
    try:
        raw = parse_json(file.read_bytes())
    except ValueError as err:
        raise ConfigError(f"{file}: {err}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{file}: expected a JSON object, got {type(raw).__name__}")
    kind = raw.get("model_type")
    if kind not in SUPPORTED_TYPES:
        raise ConfigError(
            f"{file}: model_type {quoted(kind)} is not a Vision Transformer that qkv reads "
            f"(supported: {', '.join(SUPPORTED_TYPES)})"
        )
    return raw


def vit_weights(state: dict[str, Tensor], kind: str) -> dict[str, Tensor]:
    """The weights of a ViT or DeiT checkpoint, renamed to qkv's names.

    The encoder's prefix (``vit.``, ``deit.``) is removed and the classification heads
    kept; the mask token of masked image modelling is dropped. Any other unknown name is
    kept as it is, so that the name check reports it.
    """
    state = base_weights(state, f"{kind}.", keep=_HEADS)
    if "embeddings.mask_token" in state:
        log.info("ignoring embeddings.mask_token (masked image modelling only)")
    return {_rename(n): t for n, t in state.items() if n != "embeddings.mask_token"}


def _rename(name: str) -> str:
    for pattern, replacement in _RENAMES:
        new, count = re.subn(pattern, replacement, name)
        if count:
            return new
    return name  # pooler.dense.* keeps its name; anything else is reported as unexpected


def vit_config_values(config: dict[str, Any], state: dict[str, Tensor]) -> dict[str, Any]:
    """``ViTConfig`` keyword arguments from a ``config.json`` dict and the renamed weights.

    The sizes come from the config; the pooler, the heads and the distillation token from
    what the weights hold (``model_type`` ``"deit"`` always has the token).

    Raises:
        ValueError: a value of the wrong kind, naming its key.
    """
    values = {k: config[k] for k in _CONFIG_KEYS if k in config}
    for key in ("image_size", "patch_size"):
        if key in config:
            values[key] = _size(key, config[key])
    act = values.get("hidden_act", "gelu")
    if act not in HF_ACTIVATIONS:
        raise ValueError(f"hidden_act {quoted(act)} not supported: {list(HF_ACTIVATIONS)}")
    values["distillation_token"] = config.get("model_type") == "deit"
    values["add_pooler"] = "pooler.dense.weight" in state
    values["distillation_head"] = "distillation_head.weight" in state
    values["num_labels"] = 0
    if "head.weight" in state:
        labels = _labels(config)
        values["num_labels"] = len(labels) if labels else config.get("num_labels", 2)
        values["labels"] = labels
    return values


def _size(key: str, value: Any) -> int | tuple[int, int]:
    """An image or patch size: an integer, or ``[height, width]``."""
    if isinstance(value, list) and len(value) == 2:
        return tuple(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise ValueError(f"{key} must be an integer or [height, width], got {quoted(value)}")


def _labels(config: dict[str, Any]) -> tuple[str, ...]:
    """The class names of ``id2label`` in class order; ``()`` when the config has none."""
    id2label = config.get("id2label")
    if id2label is None:
        return ()
    if not isinstance(id2label, dict) or sorted(id2label, key=_as_int) != [
        str(i) for i in range(len(id2label))
    ]:
        raise ValueError(f"id2label must map '0' .. 'n-1' to class names, got {quoted(id2label)}")
    return tuple(str(id2label[str(i)]) for i in range(len(id2label)))


def _as_int(key: str) -> int:
    return int(key) if key.isdigit() else -1


def check_sizes(config: Any, state: dict[str, Tensor]) -> None:
    """Raise ``ValueError`` naming the first config key whose size the weights contradict.

    Args:
        config: a :class:`~qkv.models.pretrained.vit.ViTConfig`.
        state: the renamed weights (:func:`vit_weights`).
    """
    ph, pw = config.patch_hw

    def says(key: str, value: Any) -> str:  # what the config says, as the message quotes it
        return f"{key} = {quoted(value)}"

    labels = (
        f"id2label ({len(config.labels)} labels)"
        if config.labels
        else says("num_labels", config.num_labels)
    )
    checks = [  # (weight, dimension, size the config gives it, what the config says)
        (
            "patches.projection.weight",
            0,
            config.hidden_size,
            says("hidden_size", config.hidden_size),
        ),
        (
            "patches.projection.weight",
            1,
            config.num_channels,
            says("num_channels", config.num_channels),
        ),
        ("patches.projection.weight", 2, ph, says("patch_size", config.patch_size)),
        ("patches.projection.weight", 3, pw, says("patch_size", config.patch_size)),
        (
            "encoder.layers.0.ff.linear1.weight",
            0,
            config.intermediate_size,
            says("intermediate_size", config.intermediate_size),
        ),
        (
            "pooler.dense.weight",
            0,
            config.pooler_size,
            says("pooler_output_size", config.pooler_size),
        ),
        ("head.weight", 0, config.num_labels, labels),
        ("positions", 1, config.num_positions, says("image_size", config.image_size)),
    ]
    for name, dim, expected, said in checks:
        given = state.get(name)
        if given is not None and given.ndim > dim and given.shape[dim] != expected:
            detail = ""
            if name == "positions":
                detail = (
                    f" ({config.num_patches} patches of {ph}x{pw} + "
                    f"{config.num_special_tokens} special tokens = {expected} positions)"
                )
            raise ValueError(
                f"{said} does not fit the weights: {name} is {tuple(given.shape)}{detail}"
            )
    layers = {int(m[1]) for n in state if (m := re.match(r"^encoder\.layers\.(\d+)\.", n))}
    if layers and max(layers) + 1 != config.num_hidden_layers:
        raise ValueError(
            f"num_hidden_layers = {config.num_hidden_layers!r} does not fit the weights: "
            f"they hold {max(layers) + 1} layers"
        )
