"""Reading Hugging Face model folders: config, weights, and checks of names and values.

A Hugging Face folder holds ``config.json``, the weights (``model.safetensors`` or
``pytorch_model.bin``) and, usually, a tokenizer (read by
:mod:`~qkv.models.pretrained.hf_tokenizer`).
Nothing here imports ``transformers``: the weights are read with ``safetensors`` (or
``torch.load(weights_only=True)``, which refuses pickled code).
"""

from __future__ import annotations

import importlib
import json
import logging
import math
import pickle
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

__all__ = [
    "HF_ACTIVATIONS",
    "PADDED_POSITIONS",
    "base_weights",
    "check_names",
    "check_values",
    "config_errors",
    "load_state_dict",
    "model_folder",
    "optional_import",
    "read_config",
    "read_json",
]

log = logging.getLogger(__name__)

_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
# weights of other frameworks or names (TensorFlow, Flax, GGUF, raw torch.save files)
_OTHER_WEIGHTS = {".h5", ".msgpack", ".gguf", ".ckpt", ".pt", ".pth", ".bin", ".safetensors"}
# model_types whose positions count real tokens from pad_token_id + 1 (RoBERTa's scheme)
PADDED_POSITIONS = ("roberta", "xlm-roberta", "camembert", "mpnet")
HF_ACTIVATIONS = {  # Hugging Face activation name -> qkv.modules.FeedForward's
    "gelu": "gelu",
    "gelu_python": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
    "quick_gelu": "quick_gelu",
}


def optional_import(module: str, extra: str = "hf") -> Any:
    """Import an optional dependency, or say which extra installs it.

    Args:
        module: the module's dotted name, e.g. ``"safetensors.torch"``.
        extra: the ``qkv`` extra that installs it, named in the error.

    Returns:
        the imported module.

    Raises:
        ImportError: the module is not installed; the message names the extra.
    """
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"{module} is needed here: pip install 'qkv[{extra}]'") from e


def model_folder(path: str | Path) -> Path:
    """``path`` as a :class:`~pathlib.Path`, checked to be a folder.

    Raises:
        FileNotFoundError: ``path`` is not a folder.
    """
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"not a model folder: {path}")
    return path


def read_json(path: str | Path) -> dict[str, Any]:
    """A JSON file as a dict; ``{}`` when the file does not exist."""
    path = Path(path)
    if not path.is_file():
        return {}
    try:
        with path.open(encoding="utf-8") as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from None


def read_config(path: str | Path) -> dict[str, Any]:
    """The ``config.json`` of a Hugging Face folder, as a dict.

    Raises:
        FileNotFoundError: the folder or its ``config.json`` does not exist.
    """
    file = model_folder(path) / "config.json"
    if not file.is_file():
        raise FileNotFoundError(f"{file} not found (a Hugging Face model folder has one)")
    config = read_json(file)
    if not isinstance(config, dict):
        raise ValueError(f"{file}: expected a JSON object, got {type(config).__name__}")
    return config


def load_state_dict(path: str | Path) -> dict[str, Tensor]:
    """The weights of a Hugging Face folder, by their original names.

    ``model.safetensors`` is preferred; ``pytorch_model.bin`` is read with
    ``torch.load(weights_only=True)`` (tensors only, no pickled code). A sharded checkpoint
    (``model.safetensors.index.json`` or ``pytorch_model.bin.index.json`` naming the shard
    of each weight) is read shard by shard.

    Returns:
        ``{name: tensor}`` on the CPU.
    """
    folder = model_folder(path)
    for name in _WEIGHT_FILES:
        if (folder / name).is_file():
            return _read_weights(folder / name)
        index = folder / f"{name}.index.json"
        if index.is_file():
            return _read_shards(index)
    others = sorted(f.name for f in folder.iterdir() if f.suffix in _OTHER_WEIGHTS)
    found = f"; found {', '.join(others[:3])}, which qkv does not read" if others else ""
    raise FileNotFoundError(
        f"no weights in {folder}: expected one of {', '.join(_WEIGHT_FILES)} "
        f"(or a sharded checkpoint's .index.json){found}"
    )


def _read_weights(file: Path) -> dict[str, Tensor]:
    try:
        if file.name.endswith(".safetensors"):
            return dict(optional_import("safetensors.torch").load_file(str(file), device="cpu"))
        state = torch.load(file, map_location="cpu", weights_only=True)
    except ModuleNotFoundError:
        raise
    except pickle.UnpicklingError as err:  # pickled code, or not a torch file at all
        raise ValueError(
            f"{file}: not a weights-only PyTorch checkpoint ({_unpickling_reason(err)}); "
            "qkv never runs pickled code: save the weights as model.safetensors"
        ) from None
    except Exception as err:  # SafetensorError, torch's RuntimeError
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(f"{file}: not a readable checkpoint ({first})") from None
    if not isinstance(state, dict):
        raise ValueError(f"{file} does not hold a state dict (got {type(state).__name__})")
    other = next((k for k, v in state.items() if not isinstance(v, Tensor)), None)
    if other is not None:  # e.g. {"model": state_dict, "epoch": 3}
        raise ValueError(
            f"{file}: {other!r} holds a {type(state[other]).__name__}, not a tensor "
            "(a training checkpoint? save the model's state_dict() alone)"
        )
    return state


def _unpickling_reason(err: Exception) -> str:
    """The line of torch's long weights-only message that says what was refused."""
    boilerplate = ("Weights only load failed", "Please file an issue", "Check the documentation")
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    reasons = [line for line in lines if not line.startswith(boilerplate)]
    return reasons[0] if reasons else "refused by torch.load(weights_only=True)"


def _read_shards(index: Path) -> dict[str, Tensor]:
    """Every shard that ``index`` names; the weights must be where the index says."""
    content = read_json(index)
    weight_map = content.get("weight_map") if isinstance(content, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise ValueError(f"{index}: no weight_map naming the shard of each weight")
    bad = next((n for n, shard in weight_map.items() if not isinstance(shard, str)), None)
    if bad is not None:
        raise ValueError(f"{index}: the shard of {bad} is {weight_map[bad]!r}, not a file name")
    state: dict[str, Tensor] = {}
    for shard in sorted(set(weight_map.values())):
        file = index.parent / shard
        if not file.is_file() or file.parent != index.parent:
            raise FileNotFoundError(f"{index}: shard {shard!r} not found in {index.parent}")
        part = _read_weights(file)
        listed = {n for n, s in weight_map.items() if s == shard}
        misplaced = sorted(listed ^ set(part))
        if misplaced:
            name = misplaced[0]
            where = "listed for it but not in it" if name in listed else "in it, listed elsewhere"
            raise ValueError(
                f"{index}: {len(misplaced)} weights of shard {shard} are not where the index "
                f"says, e.g. {name} ({where})"
            )
        state.update(part)
    return state


def base_weights(
    state: dict[str, Tensor], prefix: str, keep: Iterable[str] = ()
) -> dict[str, Tensor]:
    """The base model's weights of a checkpoint that has a task head, without ``prefix``.

    ``BertForMaskedLM`` stores its encoder under ``bert.``, ``GPT2LMHeadModel`` its decoder
    under ``transformer.``; the head's own weights are dropped (logged), except the names
    in ``keep``. A checkpoint in which no name has ``prefix`` is returned as it is.
    """
    if not any(name.startswith(prefix) for name in state):
        return state
    keep = set(keep)
    heads = {n for n in state if not n.startswith(prefix) and n not in keep}
    if heads:
        log.info("ignoring %d weights of a task head: %s ...", len(heads), min(heads))
    return {n.removeprefix(prefix): t for n, t in state.items() if n not in heads}


def check_names(expected: Iterable[str], given: Iterable[str], *, what: str = "checkpoint") -> None:
    """Raise ``ValueError`` naming the missing and the unexpected weights, in one line.

    Args:
        expected: names the model needs.
        given: names the checkpoint provides (already renamed, harmless extras removed).
        what: how to call the checkpoint in the message (its path).
    """
    expected, given = set(expected), set(given)
    missing, unexpected = sorted(expected - given), sorted(given - expected)
    if missing or unexpected:
        parts = [
            f"{kind} ({len(names)}): {_first(names)}"
            for kind, names in (("missing", missing), ("unexpected", unexpected))
            if names
        ]
        raise ValueError(f"weights of {what} do not match the model: " + "; ".join(parts))


def _first(names: list[str], shown: int = 8) -> str:
    more = f", ... ({len(names) - shown} more)" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


_KINDS = {  # kind of a config value -> (test, what the message says it must be)
    "count": (lambda v: _is_int(v) and v >= 1, "an integer >= 1"),
    "index": (lambda v: _is_int(v) and v >= 0, "an integer >= 0"),
    "positive": (lambda v: _is_number(v) and v > 0, "a number > 0"),
    "probability": (lambda v: _is_number(v) and 0 <= v <= 1, "a number in [0, 1]"),
    "flag": (lambda v: isinstance(v, bool), "true or false"),
    "name": (lambda v: isinstance(v, str), "a string"),
}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_values(values: Mapping[str, Any], kinds: Mapping[str, str]) -> None:
    """Raise ``ValueError`` naming the first value that is not of its kind.

    Args:
        values: a config (keys absent from it are not checked).
        kinds: key -> ``"count"`` (an int >= 1), ``"index"`` (an int >= 0), ``"positive"``,
            ``"probability"``, ``"flag"`` (a bool) or ``"name"`` (a string); a trailing
            ``"?"`` also allows ``None``.
    """
    for key, kind in kinds.items():
        if key not in values or (kind.endswith("?") and values[key] is None):
            continue
        test, expected = _KINDS[kind.rstrip("?")]
        if not test(values[key]):
            null = " or null" if kind.endswith("?") else ""
            raise ValueError(f"{key} must be {expected}{null}, got {values[key]!r}")


@contextmanager
def config_errors(path: str | Path) -> Iterator[None]:
    """Prefix the ``ValueError`` of reading a folder's config with its ``config.json``."""
    try:
        yield
    except ValueError as err:
        raise ValueError(f"{Path(path) / 'config.json'}: {err}") from None


def load_into(
    model: nn.Module,
    state: dict[str, Tensor],
    *,
    what: str,
    dtype: torch.dtype | str | None = None,
    config: Mapping[str, Any] | None = None,
) -> None:
    """Check ``state`` against ``model`` (names, tied weights once; shapes), load it, cast it.

    ``dtype``: ``None`` for float32, ``"auto"`` for the checkpoint's own floating type (the
    ``dtype``/``torch_dtype`` of its ``config``, else its first floating weight's, as
    transformers decides), or a floating ``torch.dtype`` or its name (``"bfloat16"``).
    """
    target = _load_dtype(dtype, state, config or {})
    names = set(dict(model.named_parameters()))  # tied parameters appear once
    names |= {n for n, _ in model.named_buffers() if _is_persistent(model, n)}
    check_names(names, state, what=what)
    own = model.state_dict()
    integer = next(
        (n for n, t in state.items() if own[n].is_floating_point() and not t.is_floating_point()),
        None,
    )
    if integer is not None:
        raise ValueError(
            f"weights of {what}: {integer} is {state[integer].dtype} (qkv reads floating-point "
            "weights; quantized checkpoints are not supported)"
        )
    wrong = [n for n, t in state.items() if t.shape != own[n].shape]
    if wrong:
        n = wrong[0]
        raise ValueError(
            f"weights of {what} do not fit the sizes of its config.json: {n} is "
            f"{tuple(state[n].shape)} in the checkpoint, {tuple(own[n].shape)} in the model"
            + (f" ({len(wrong) - 1} more)" if len(wrong) > 1 else "")
        )
    model.load_state_dict(state, strict=False)
    model.to(target)


def _load_dtype(
    dtype: torch.dtype | str | None, state: dict[str, Tensor], config: Mapping[str, Any]
) -> torch.dtype:
    if dtype is None:
        return torch.float32
    if dtype == "auto":
        named = _floating(config.get("dtype") or config.get("torch_dtype"))
        first = next((t.dtype for t in state.values() if t.is_floating_point()), torch.float32)
        return named or first
    if isinstance(dtype, torch.dtype) and dtype.is_floating_point:
        return dtype
    if _floating(dtype) is not None:  # "bfloat16", as transformers also accepts
        return _floating(dtype)
    raise ValueError(
        f"dtype must be None, 'auto' or a floating torch.dtype or its name, got {dtype!r}"
    )


def _floating(name: Any) -> torch.dtype | None:
    """The floating ``torch.dtype`` that a config names (``"bfloat16"``), else ``None``."""
    value = getattr(torch, name, None) if isinstance(name, str) else None
    return value if isinstance(value, torch.dtype) and value.is_floating_point else None


def _is_persistent(model: nn.Module, name: str) -> bool:
    owner, _, leaf = name.rpartition(".")
    module = model.get_submodule(owner) if owner else model
    return leaf not in module._non_persistent_buffers_set
