"""Checkpoints: one safetensors file, tensors plus a JSON header; never pickle.

A checkpoint holds the model's weights, and optionally the optimiser's tensors, under
prefixed names (``model.*``, ``optim.<param>.<key>``, ``rng.torch``); everything else
(model type and config, tokenizers, optimiser hyper-parameters, step, data position,
Python RNG state, anything the caller adds) is JSON in the safetensors metadata under
the key ``qkv``. The file is written to a temporary name in the same folder, flushed to
disk and renamed, so a crash leaves either the old checkpoint or the new one, never half
of one.
"""

from __future__ import annotations

import glob
import json
import os
import random
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from qkv.errors import CheckpointError
from qkv.models.translators.config import RNNSeq2SeqConfig, TransformerSeq2SeqConfig
from qkv.models.translators.rnn import RNNSeq2Seq
from qkv.models.translators.transformer import TransformerSeq2Seq

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "build_model",
    "load_checkpoint",
    "restore_rng",
    "rng_state",
    "save_checkpoint",
]

FORMAT = "qkv-checkpoint-1"


def build_model(kind: str, config: dict[str, Any]) -> nn.Module:
    """Build a seq2seq model from its type name and config dict."""
    if kind == "transformer":
        return TransformerSeq2Seq(TransformerSeq2SeqConfig.from_dict(config))
    if kind == "rnn":
        return RNNSeq2Seq(RNNSeq2SeqConfig.from_dict(config))
    raise ValueError(f"unknown model type {kind!r}; expected 'transformer' or 'rnn'")


def model_kind(model: nn.Module) -> str:
    """The type name :func:`build_model` understands for ``model``."""
    name = type(model).__name__
    kinds = {"TransformerSeq2Seq": "transformer", "RNNSeq2Seq": "rnn"}
    if name not in kinds:
        raise ValueError(f"cannot checkpoint a {name}; supported: {', '.join(kinds)}")
    return kinds[name]


def rng_state() -> dict[str, Any]:
    """The torch and Python RNG states (torch's as a tensor, Python's as JSON)."""
    return {"torch": torch.get_rng_state(), "python": random.getstate()}


def restore_rng(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` captured."""
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))


def save_checkpoint(
    path: str | Path,
    model: nn.Module,
    *,
    tokenizers: dict[str, str] | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    rng: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write ``model`` (and training state) to ``path`` atomically.

    Args:
        path: the file to write (``.safetensors``).
        model: a seq2seq model with a ``config`` dataclass (``to_dict``).
        tokenizers: ``{"src": json, "tgt": json}`` from the tokenizers' ``to_json``.
        optimizer: saved with its state tensors and hyper-parameters.
        rng: from :func:`rng_state`.
        extra: any JSON-serialisable training state (step, epoch, metrics...).

    Returns:
        The path written.
    """
    from safetensors.torch import save_file

    path = Path(path)
    tensors = {f"model.{k}": v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    header: dict[str, Any] = {
        "format": FORMAT,
        "model_type": model_kind(model),
        "model_config": model.config.to_dict(),
        "tokenizers": tokenizers or {},
        "extra": extra or {},
    }
    if optimizer is not None:
        state = optimizer.state_dict()
        for pid, pstate in state["state"].items():
            for key, value in pstate.items():
                tensors[f"optim.{pid}.{key}"] = torch.as_tensor(value).detach().cpu().contiguous()
        header["optimizer"] = {"param_groups": state["param_groups"]}
    if rng is not None:
        tensors["rng.torch"] = rng["torch"]
        header["rng_python"] = rng["python"]
    _write_atomic(path, tensors, {"qkv": json.dumps(header, ensure_ascii=False)}, save_file)
    return path


def _write_atomic(path: Path, tensors, metadata, save_file) -> None:
    """Write into a private folder beside ``path``, then rename the file over ``path``.

    safetensors writes through a temporary file of its own in the target's folder; inside
    ``.NAME.XXXX.tmp/`` it cannot be mistaken for anything else, so the folders that a
    killed process left behind (older than ``STALE_TMP_S``) are removed on the next save.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_tmp(path)
    folder = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    tmp = folder / path.name
    try:
        save_file(_dedupe_shared(tensors), str(tmp), metadata=metadata)
        os.chmod(tmp, 0o666 & ~_umask())  # safetensors' 0600: only we could read it
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


STALE_TMP_S = 600.0  # a save in progress (another process) is never this old


def _remove_stale_tmp(path: Path) -> None:
    """Remove the private folders of saves of ``path`` that were killed (``kill -9``)."""
    now = time.time()
    for old in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
        try:  # a file still being written inside has a fresh mtime
            newest = max([old.stat().st_mtime] + [f.stat().st_mtime for f in old.iterdir()])
        except OSError:  # gone meanwhile, or not a folder of ours
            continue
        if now - newest > STALE_TMP_S:
            shutil.rmtree(old, ignore_errors=True)


def _umask() -> int:
    """The process's umask (only readable by setting one: 077 meanwhile, not 000)."""
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def _dedupe_shared(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """safetensors refuses tensors that share memory (tied embeddings): store copies."""
    seen: set[int] = set()
    out = {}
    for name, t in tensors.items():
        ptr = t.untyped_storage().data_ptr() if t.numel() else -1
        out[name] = t.clone() if ptr in seen else t
        seen.add(ptr)
    return out


@dataclass
class Checkpoint:
    """What :func:`load_checkpoint` returns."""

    model: nn.Module
    model_type: str
    model_config: dict[str, Any]
    tokenizers: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    optimizer_state: dict[str, Any] | None = None
    rng: dict[str, Any] | None = None
    path: Path | None = None


def load_checkpoint(
    path: str | Path, *, map_location: str = "cpu", check_finite: bool = True
) -> Checkpoint:
    """Read a checkpoint written by :func:`save_checkpoint` (no pickle involved).

    Training stops at the first non-finite loss, before anything is saved, so a model
    weight that is NaN or infinite means a corrupt or foreign file: it would translate to
    garbage (or resume to a NaN loss) without saying why, and is refused.

    Args:
        path: the ``.safetensors`` file.
        map_location: the device the tensors are read onto.
        check_finite: refuse model weights that hold NaN or inf (one ``isfinite`` pass
            over the floating-point weights; the optimiser's tensors are not checked).

    Raises:
        CheckpointError: missing file, not safetensors, not a qkv checkpoint, a model
            config that is invalid, weights that do not fit the model it describes, or
            (``check_finite``) a weight that is not finite (one line naming the file and
            the first such tensor). Weights come back in the dtype they were saved in.
    """
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    if path.is_dir():
        raise CheckpointError(
            f"{path}: is a directory, not a checkpoint file (e.g. best.safetensors)"
        )
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    try:
        with safe_open(str(path), framework="pt", device=map_location) as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except (SafetensorError, OSError, ValueError) as err:
        raise CheckpointError(f"{path}: not a safetensors checkpoint ({err})") from None
    try:
        header = json.loads(meta["qkv"])
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            raise KeyError("format")
    except (KeyError, json.JSONDecodeError):
        raise CheckpointError(f"{path}: not a qkv checkpoint (no '{FORMAT}' header)") from None
    _check_header(path, header, tensors)
    if check_finite:
        _check_finite(path, tensors)
    model = _build(path, header, tensors)
    return Checkpoint(
        model=model,
        model_type=header["model_type"],
        model_config=header["model_config"],
        tokenizers=header.get("tokenizers", {}),
        extra=header.get("extra", {}),
        optimizer_state=_optimizer_state(header, tensors),
        rng={"torch": tensors["rng.torch"], "python": header["rng_python"]}
        if "rng.torch" in tensors
        else None,
        path=path,
    )


def saved_extra(path: str | Path) -> dict[str, Any] | None:
    """The training state (``extra``: step, metrics...) of checkpoint ``path``, read from
    its header without its tensors; ``None`` when it is not a readable qkv checkpoint."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            header = json.loads((f.metadata() or {})["qkv"])
        return dict(header.get("extra") or {})
    except (SafetensorError, OSError, KeyError, ValueError, TypeError, AttributeError):
        return None


def _check_finite(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    """Refuse model weights that hold NaN or inf, naming the first such tensor."""
    bad = [
        name
        for name, t in sorted(tensors.items())
        if name.startswith("model.") and t.is_floating_point() and not torch.isfinite(t).all()
    ]
    if not bad:
        return
    t = tensors[bad[0]]
    nan, inf = int(torch.isnan(t).sum()), int(torch.isinf(t).sum())
    held = " and ".join(f"{n} {what}" for n, what in ((nan, "NaN"), (inf, "inf")) if n)
    more = f"; {len(bad) - 1} more tensor(s) are not finite either" if len(bad) > 1 else ""
    raise CheckpointError(
        f"{path}: corrupt weights: {bad[0]} holds {held} of {t.numel()} values{more}"
    )


def _build(path: Path, header: dict, tensors: dict) -> nn.Module:
    """The model the header describes, holding the saved weights in their saved dtypes.

    The config is first built on the meta device, so that sizes that do not match the
    weights (a corrupt ``src_vocab_size`` of 10**9) are named without allocating them.
    """
    weights = {k[len("model.") :]: v for k, v in tensors.items() if k.startswith("model.")}
    with torch.device("meta"):
        skeleton = _build_or_fail(path, header)
    mismatch = _mismatch(skeleton.state_dict(), weights)
    if mismatch:
        raise CheckpointError(f"{path}: weights do not fit the model config ({mismatch})")
    model = _build_or_fail(path, header)
    for name, current in model.state_dict().items():
        if weights[name].dtype != current.dtype:  # float64 / bfloat16 models come back so
            owner, _, leaf = name.rpartition(".")
            tensor = getattr(model.get_submodule(owner), leaf)
            tensor.data = tensor.data.to(weights[name].dtype)  # in place: ties stay tied
    model.load_state_dict(weights)
    return model


def _build_or_fail(path: Path, header: dict) -> nn.Module:
    try:
        return build_model(header["model_type"], header["model_config"])
    except (ValueError, TypeError, OverflowError, RuntimeError, MemoryError) as err:
        why = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CheckpointError(f"{path}: bad model config ({why})") from None


def _mismatch(expected: dict[str, torch.Tensor], weights: dict[str, torch.Tensor]) -> str:
    """What keeps ``weights`` from loading into a model with state ``expected`` ("": fits)."""
    missing = [k for k in expected if k not in weights]
    unexpected = [k for k in weights if k not in expected]
    kinds = (("missing", missing), ("unexpected", unexpected))
    parts = [
        f"{len(names)} {kind} tensor(s), e.g. model.{names[0]}" for kind, names in kinds if names
    ]
    if parts:
        return "; ".join(parts)
    for name, want in expected.items():
        got = weights[name]
        if got.shape != want.shape:
            shapes = f"{tuple(got.shape)} in the file, the model's is {tuple(want.shape)}"
            return f"model.{name} is {shapes}"
        if got.is_floating_point() != want.is_floating_point():
            return f"model.{name} is {got.dtype} in the file, the model's is {want.dtype}"
    return ""


def _check_header(path: Path, header: dict, tensors: dict) -> None:
    """The parts of a ``qkv`` header that loading relies on have the right JSON types."""
    expected = {
        "model_type": (str, "a string"),
        "model_config": (dict, "an object"),
        "tokenizers": (dict, "an object"),
        "extra": (dict, "an object"),
        "optimizer": (dict, "an object"),
        "rng_python": (list, "a list"),
    }
    for key, (kind, name) in expected.items():
        if key in header and not isinstance(header[key], kind):
            got = type(header[key]).__name__
            raise CheckpointError(f"{path}: corrupt qkv header: {key!r} is not {name} ({got})")
    for key in ("model_type", "model_config"):
        if key not in header:
            raise CheckpointError(f"{path}: corrupt qkv header: no {key!r}")
    for side, text in header.get("tokenizers", {}).items():
        if not isinstance(text, str):
            raise CheckpointError(f"{path}: corrupt qkv header: tokenizer {side!r} is not a string")
    optimizer = header.get("optimizer")
    if optimizer is not None and not isinstance(optimizer.get("param_groups"), list):
        raise CheckpointError(f"{path}: corrupt qkv header: the optimizer has no param_groups")
    if "rng.torch" in tensors and "rng_python" not in header:
        raise CheckpointError(f"{path}: corrupt qkv header: the Python RNG state is missing")
    for name in tensors:
        if name.startswith("optim.") and not _optim_name(name):
            raise CheckpointError(f"{path}: corrupt checkpoint: tensor name {name!r}")


def _optim_name(name: str) -> bool:
    parts = name.split(".", 2)
    return len(parts) == 3 and parts[1].isdigit()


def _optimizer_state(header: dict, tensors: dict) -> dict | None:
    if "optimizer" not in header:
        return None
    state: dict[int, dict[str, torch.Tensor]] = {}
    for name, value in tensors.items():
        if name.startswith("optim."):
            _, pid, key = name.split(".", 2)
            state.setdefault(int(pid), {})[key] = value
    groups = [_tuples(g) if isinstance(g, dict) else g for g in header["optimizer"]["param_groups"]]
    return {"state": state, "param_groups": groups}


def _tuples(group: dict) -> dict:
    """JSON turned a group's tuples (Adam's ``betas``) into lists: turn them back."""
    return {k: tuple(v) if isinstance(v, list) and k != "params" else v for k, v in group.items()}
