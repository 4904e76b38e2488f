"""Checkpoints: one safetensors file, tensors plus a JSON header; never pickle.

A checkpoint holds the model's weights, and optionally the optimiser's tensors, under
prefixed names (``model.*``, ``optim.<param>.<key>``, ``rng.torch``); everything else
(model type and config, tokenizers, optimiser hyper-parameters, step, data position,
Python RNG state, anything the caller adds) is JSON in the safetensors metadata under
the key ``qkv``. The file is written to a temporary name in the same folder, flushed to
disk and renamed, so a crash leaves either the old checkpoint or the new one, never half
of one.

Reading trusts nothing the file says before checking it against what the file holds: the
safetensors header is read alone (:class:`TensorFile`: names, dtypes, shapes, offsets,
never the data), the config's layer counts are compared with the layers of weights in the
file (:func:`count_layers`) and its sizes with the weights' shapes on the meta device,
what the model and its buffers (the positional table of ``max_len``) would take with the
memory available (:func:`available_memory`), and only then are the tensors that are
needed read, one by one.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import logging
import os
import random
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from qkv.errors import CheckpointError, ConfigFieldError
from qkv.files import UnsafeJSONError, parse_json, quoted
from qkv.models.cnn import CNN, CNNConfig
from qkv.models.pretrained.gpt import GPT, GPTConfig
from qkv.models.pretrained.llama import Llama, LlamaConfig
from qkv.models.pretrained.vit import ViT, ViTConfig
from qkv.models.tensor_file import StoredTensor, TensorFile, available_memory, count_layers
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

log = logging.getLogger(__name__)

FORMAT = "qkv-checkpoint-1"
_MODELS = {
    "transformer": (TransformerSeq2SeqConfig, TransformerSeq2Seq),
    "rnn": (RNNSeq2SeqConfig, RNNSeq2Seq),
    "cnn": (CNNConfig, CNN),
    "vit": (ViTConfig, ViT),
    "gpt": (GPTConfig, GPT),
    "llama": (LlamaConfig, Llama),
}
_LAYER_FIELDS = {  # model type -> the config fields that count repeated layers
    "transformer": ("num_encoder_layers", "num_decoder_layers"),
    "rnn": ("num_layers",),
    "vit": ("num_hidden_layers",),
    "cnn": (),
    "gpt": ("num_layers",),
    "llama": ("num_layers",),
}
# the dtypes a qkv model's weights are saved in (all the same); float8 is storage only
_MODEL_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
_RNG_BYTES = 1 << 16  # torch's CPU generator state is 5,056 bytes


def build_model(kind: str, config: dict[str, Any]) -> nn.Module:
    """Build a model from its type name and config dict."""
    if kind not in _MODELS:
        raise ValueError(f"unknown model type {quoted(kind)}; expected one of {_names()}")
    config_class, model_class = _MODELS[kind]
    return model_class(config_class.from_dict(config))


def model_kind(model: nn.Module) -> str:
    """The type name :func:`build_model` understands for ``model``."""
    name = type(model).__name__
    kinds = {"TransformerSeq2Seq": "transformer", "RNNSeq2Seq": "rnn", "ViT": "vit", "CNN": "cnn"}
    kinds.update(GPT="gpt", Llama="llama")
    if name not in kinds:
        raise ValueError(f"cannot checkpoint a {name}; supported: {', '.join(kinds)}")
    return kinds[name]


def _names() -> str:
    return ", ".join(repr(kind) for kind in _MODELS)


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
    path: str | Path,
    *,
    map_location: str = "cpu",
    check_finite: bool = True,
    training_state: bool = True,
) -> Checkpoint:
    """Read a checkpoint written by :func:`save_checkpoint` (no pickle involved).

    Nothing the header says is trusted before it is checked against what the file holds,
    and nothing is allocated before that: the config's layer counts against the layers of
    weights in the file, its sizes against the weights' shapes (on the meta device), the
    weights' dtypes against each other, and the memory the model, its buffers (the
    positional table of ``max_len``) and the tensors to read would take against the memory
    available. Then only the tensors needed are read.

    Training stops at the first non-finite loss, before anything is saved, so a model
    weight that is NaN or infinite means a corrupt or foreign file: it would translate to
    garbage (or resume to a NaN loss) without saying why, and is refused.

    Args:
        path: the ``.safetensors`` file.
        map_location: the device the tensors are read onto.
        check_finite: refuse model weights that hold NaN or inf (one ``isfinite`` pass
            over the floating-point weights; the optimiser's tensors are not checked).
        training_state: also read the optimiser's tensors and the RNG state (to resume
            training); ``False`` reads the model's weights only (to translate), and
            ``optimizer_state`` and ``rng`` are then ``None``.

    Raises:
        CheckpointError: missing file, not safetensors, not a qkv checkpoint, a model
            config that is invalid, weights that do not fit the model it describes (layer
            counts, names, shapes, mixed or unsupported dtypes), a model that cannot fit
            in the memory available, or (``check_finite``) a weight that is not finite
            (one line naming the file and the key or tensor). Weights come back in the
            dtype they were saved in.
    """
    path = Path(path)
    if path.is_dir():
        raise CheckpointError(
            f"{path}: is a directory, not a checkpoint file (e.g. best.safetensors)"
        )
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    file = TensorFile(path, what="safetensors checkpoint")
    header = _qkv_header(path, file.metadata)
    _check_header(path, header, file.tensors)
    kind, config = _config(path, header)
    named = _current_names(kind, file.tensors)  # the model's name of each tensor -> the file's
    renamed = any(name != in_file for name, in_file in named.items())
    if renamed and training_state and any(k.startswith("optim.") for k in file.tensors):
        raise CheckpointError(
            f"{path}: a GPT checkpoint of the layout before qkv's shared decoder blocks: its "
            "weights load (training_state=False), its optimiser state, kept in the old "
            "order of the parameters, cannot be resumed"
        )
    held = {name: file.tensors[in_file] for name, in_file in named.items()}
    stored = {k[len("model.") :]: t for k, t in held.items() if k.startswith("model.")}
    _check_layers(path, _MODELS[kind][1], kind, config, stored)
    with torch.device("meta"):
        skeleton = _MODELS[kind][1](config)
    mismatch = _mismatch(skeleton.state_dict(), {k: t.meta() for k, t in stored.items()})
    if mismatch:
        raise CheckpointError(f"{path}: weights do not fit the model config ({mismatch})")
    _check_dtypes(path, stored)
    wanted = [f"model.{k}" for k in stored]
    if training_state:
        _check_training_tensors(path, held, skeleton)
        wanted += [k for k in held if k.startswith("optim.") or k == "rng.torch"]
    _check_memory(path, config, skeleton, sum(held[k].nbytes for k in wanted))
    tensors = {k: file.read(named[k]).to(map_location) for k in wanted}
    if check_finite:
        _check_finite(path, tensors)
    model = _build(path, _MODELS[kind][1], config, tensors)
    return Checkpoint(
        model=model,
        model_type=kind,
        model_config=header["model_config"],
        tokenizers=header.get("tokenizers", {}),
        extra=header.get("extra", {}),
        optimizer_state=_optimizer_state(header, tensors) if training_state else None,
        rng={"torch": tensors["rng.torch"], "python": header["rng_python"]}
        if "rng.torch" in tensors
        else None,
        path=path,
    )


# GPT's blocks before the decoder stack that GPT and Llama share (qkv.modules.decoder):
# decoder.layers.<i>.norm1 / norm3 / self_attn / ff, and decoder.final_norm
_OLD_GPT_NAME = re.compile(
    r"^(model|optim)\.decoder\.(layers\.\d+\.(norm1|norm3|self_attn|ff)|final_norm)\."
)
_NEW_GPT_PART = {"norm1": "attn_norm", "norm3": "ff_norm", "self_attn": "self_attn", "ff": "ff"}


def _current_names(kind: str, names) -> dict[str, str]:
    """``{name in today's model: name in the file}``: a GPT checkpoint written before
    GPT's blocks became :class:`~qkv.modules.DecoderBlock` s names its tensors by the old
    layout, read under today's names."""

    def current(name: str) -> str:
        match = _OLD_GPT_NAME.match(name) if kind == "gpt" else None
        if match is None:
            return name
        prefix, part, block = match.group(1), match.group(2), match.group(3)
        if block is not None:
            part = part[: -len(block)] + _NEW_GPT_PART[block]
        return f"{prefix}.{part}.{name[match.end() :]}"

    return {current(name): name for name in names}


def saved_extra(path: str | Path) -> dict[str, Any] | None:
    """The training state (``extra``: step, metrics...) of checkpoint ``path``, read from
    its header without its tensors; ``None`` when it is not a readable qkv checkpoint."""
    try:
        header = _qkv_header(Path(path), TensorFile(path).metadata)
        return dict(header.get("extra") or {})
    except (CheckpointError, TypeError, ValueError):
        return None


def _qkv_header(path: Path, metadata: dict[str, str]) -> dict[str, Any]:
    """The ``qkv`` JSON of a file's safetensors metadata (bounded in nesting and numbers)."""
    try:
        header = parse_json(metadata["qkv"])
    except KeyError:
        header = None
    except ValueError as err:
        raise CheckpointError(f"{path}: corrupt qkv header: {err}") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a qkv checkpoint (no '{FORMAT}' header)")
    return header


def _config(path: Path, header: dict) -> tuple[str, Any]:
    """The model type and its config dataclass (checked field by field)."""
    kind = header["model_type"]
    try:
        if kind not in _MODELS:
            raise ValueError(f"unknown model type {quoted(kind)}; expected one of {_names()}")
        return kind, _MODELS[kind][0].from_dict(header["model_config"])
    except ConfigFieldError as err:  # its value may be a number of 4,000 digits
        config = str(err).partition(".")[0]
        why = f"{config}.{err.field} = {quoted(err.value)}: {err.why}"
        raise CheckpointError(f"{path}: bad model config ({why})") from None
    except (ValueError, TypeError) as err:
        why = " ".join(str(err).split())[:300] or type(err).__name__
        raise CheckpointError(f"{path}: bad model config ({why})") from None


def _check_layers(
    path: Path, model_class: type, kind: str, config: Any, stored: dict[str, StoredTensor]
) -> None:
    """Each layer count of the config is the number of layers of weights in the file."""
    fields = _LAYER_FIELDS[kind]
    for name in fields:

        def names_with(n: int, name: str = name) -> list[str]:
            counts = {f: n if f == name else 1 for f in fields}
            with torch.device("meta"):
                return list(model_class(dataclasses.replace(config, **counts)).state_dict())

        found, claimed = count_layers(names_with, stored), getattr(config, name)
        if found is not None and found != claimed:
            raise CheckpointError(
                f"{path}: model_config.{name} {claimed} does not match the {found} "
                f"layer(s) of weights in the file"
            )


def _check_dtypes(path: Path, stored: dict[str, StoredTensor]) -> None:
    """The model's weights share one dtype, one that qkv models are trained in."""
    floating = {k: t.dtype for k, t in stored.items() if t.dtype.is_floating_point}
    odd = next((k for k, d in floating.items() if d not in _MODEL_DTYPES), None)
    if odd is not None:
        names = ", ".join(str(d).removeprefix("torch.") for d in _MODEL_DTYPES)
        raise CheckpointError(
            f"{path}: corrupt weights: model.{odd} is {floating[odd]}; the weights of a qkv "
            f"model are one of {names}"
        )
    counts: dict[torch.dtype, int] = {}
    for dtype in floating.values():
        counts[dtype] = counts.get(dtype, 0) + 1
    if len(counts) > 1:
        common = max(counts, key=counts.__getitem__)
        odd = next(k for k, d in floating.items() if d != common)
        raise CheckpointError(
            f"{path}: corrupt weights: model.{odd} is {floating[odd]}, the other weights "
            f"are {common} ({len(floating) - counts[common]} of {len(floating)} differ)"
        )


def _check_training_tensors(path: Path, tensors: dict[str, StoredTensor], skeleton) -> None:
    """The optimiser's tensors are no larger than the largest weight; the RNG state is
    torch's few kilobytes of bytes."""
    largest = max((p.numel() for p in skeleton.parameters()), default=0)
    for name, t in tensors.items():
        if name.startswith("optim.") and t.numel > largest:
            raise CheckpointError(
                f"{path}: corrupt checkpoint: optimiser tensor {quoted(name)} has shape "
                f"{t.shape}, larger than any weight of the model ({largest:,} values)"
            )
    rng = tensors.get("rng.torch")
    if rng is not None and (
        rng.dtype != torch.uint8 or len(rng.shape) != 1 or rng.nbytes > _RNG_BYTES
    ):
        raise CheckpointError(
            f"{path}: corrupt checkpoint: rng.torch is {rng.dtype} of shape {rng.shape}, "
            "not the bytes of a random generator's state"
        )


def _check_memory(path: Path, config: Any, skeleton: nn.Module, read: int) -> None:
    """The tensors to read, the model and its buffers fit in the memory available.

    Building the model holds its weights in float32 and then in the saved dtype, and a
    sinusoidal table is computed through temporaries of its size: twice each, as a bound.
    """
    tensors = {id(t): t for t in [*skeleton.parameters(), *skeleton.buffers()]}.values()
    need = read + 2 * sum(t.numel() * t.element_size() for t in tensors)
    free = available_memory()
    if free is None or need <= free:
        return
    named = [*skeleton.named_parameters(), *skeleton.named_buffers()]
    name, largest = max(named, key=lambda item: item[1].numel() * item[1].element_size())
    size = largest.numel() * largest.element_size()
    keys = [
        f"{f.name} {getattr(config, f.name)}"
        for f in dataclasses.fields(config)
        if largest.ndim
        and getattr(config, f.name) == max(largest.shape)
        and not isinstance(getattr(config, f.name), bool)
    ]
    because = f" (model_config: {', '.join(keys)})" if keys else ""
    raise CheckpointError(
        f"{path}: the model needs about {_gib(need)} of memory, more than the {_gib(free)} "
        f"available: {name} alone is {tuple(largest.shape)} {largest.dtype}, "
        f"{_gib(size)}{because}"
    )


def _gib(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB"


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


def _build(
    path: Path, model_class: type, config: Any, tensors: dict[str, torch.Tensor]
) -> nn.Module:
    """The model the config describes, holding the saved weights in their saved dtypes
    (names, shapes, dtypes and memory were checked before anything was read)."""
    weights = {k[len("model.") :]: v for k, v in tensors.items() if k.startswith("model.")}
    try:
        model = model_class(config)
    except (RuntimeError, MemoryError) as err:  # the memory went elsewhere meanwhile
        why = " ".join(str(err).split())[:300] or type(err).__name__
        raise CheckpointError(f"{path}: cannot build the model ({why})") from None
    for name, current in model.state_dict().items():
        if weights[name].dtype != current.dtype:  # float64 / bfloat16 models come back so
            owner, _, leaf = name.rpartition(".")
            tensor = getattr(model.get_submodule(owner), leaf)
            tensor.data = tensor.data.to(weights[name].dtype)  # in place: ties stay tied
    model.load_state_dict(weights)
    return model


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
            raise CheckpointError(
                f"{path}: corrupt qkv header: tokenizer {quoted(side)} is not a string"
            )
        try:  # its reader (qkv.data.tokenizers) names what else is wrong with it
            parse_json(text)
        except UnsafeJSONError as err:
            raise CheckpointError(
                f"{path}: corrupt qkv header: tokenizer {quoted(side)} is {err}"
            ) from None
        except ValueError:
            pass
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
