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
import math
import os
import random
import re
import resource
import shutil
import struct
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from qkv.errors import CheckpointError, ConfigFieldError
from qkv.files import UnsafeJSONError, parse_json, quoted
from qkv.models.cnn import CNN, CNNConfig
from qkv.models.translators.config import RNNSeq2SeqConfig, TransformerSeq2SeqConfig
from qkv.models.translators.rnn import RNNSeq2Seq
from qkv.models.translators.transformer import TransformerSeq2Seq

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "ModelKinds",
    "StoredTensor",
    "TensorFile",
    "available_memory",
    "build_model",
    "count_layers",
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
}
# A model type whose module reads this one (the ViT, through the Hugging Face loader) is
# given by the caller: ``models={"vit": (ViTConfig, ViT)}`` (qkv.train.classify.IMAGE_MODELS).
ModelKinds = Mapping[str, tuple[type, type]]
_LAYER_FIELDS = {  # model type -> the config fields that count repeated layers
    "transformer": ("num_encoder_layers", "num_decoder_layers"),
    "rnn": ("num_layers",),
    "vit": ("num_hidden_layers",),
    "cnn": (),
}
# the dtypes a qkv model's weights are saved in (all the same); float8 is storage only
_MODEL_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
_RNG_BYTES = 1 << 16  # torch's CPU generator state is 5,056 bytes


def build_model(kind: str, config: dict[str, Any], models: ModelKinds | None = None) -> nn.Module:
    """Build a model from its type name and config dict (``models``: more types, see
    ``ModelKinds``)."""
    kinds = {**_MODELS, **(models or {})}
    if kind not in kinds:
        raise ValueError(f"unknown model type {quoted(kind)}; expected one of {_names(kinds)}")
    config_class, model_class = kinds[kind]
    return model_class(config_class.from_dict(config))


def model_kind(model: nn.Module) -> str:
    """The type name :func:`build_model` understands for ``model``."""
    name = type(model).__name__
    kinds = {"TransformerSeq2Seq": "transformer", "RNNSeq2Seq": "rnn", "ViT": "vit", "CNN": "cnn"}
    if name not in kinds:
        raise ValueError(f"cannot checkpoint a {name}; supported: {', '.join(kinds)}")
    return kinds[name]


def _names(kinds: ModelKinds) -> str:
    return ", ".join(repr(kind) for kind in kinds)


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


SAFETENSORS_MAX_HEADER = 100_000_000  # the format's own bound: safetensors refuses more
_SAFETENSORS_DTYPES = {  # the header's name -> torch's (those this torch has)
    name: getattr(torch, attr)
    for name, attr in (
        ("F64", "float64"),
        ("F32", "float32"),
        ("F16", "float16"),
        ("BF16", "bfloat16"),
        ("I64", "int64"),
        ("I32", "int32"),
        ("I16", "int16"),
        ("I8", "int8"),
        ("U64", "uint64"),
        ("U32", "uint32"),
        ("U16", "uint16"),
        ("U8", "uint8"),
        ("BOOL", "bool"),
        ("F8_E4M3", "float8_e4m3fn"),
        ("F8_E4M3FNUZ", "float8_e4m3fnuz"),
        ("F8_E5M2", "float8_e5m2"),
        ("F8_E5M2FNUZ", "float8_e5m2fnuz"),
        ("C64", "complex64"),
    )
    if hasattr(torch, attr)
}


@dataclass(frozen=True)
class StoredTensor:
    """One tensor of a safetensors file, as its (checked) header describes it.

    Attributes:
        dtype, shape: the tensor's.
        offset: where its bytes start, from the start of the file.
        nbytes: how many bytes it takes (its elements times the dtype's size).
    """

    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int
    nbytes: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def meta(self) -> torch.Tensor:
        """An empty tensor of this dtype and shape on the meta device (no memory)."""
        return torch.empty(self.shape, dtype=self.dtype, device="meta")


class TensorFile:
    """A safetensors file: its header read and checked alone, its tensors read one by one.

    Opening reads the 8-byte length and the JSON header only (at most
    ``SAFETENSORS_MAX_HEADER`` bytes, parsed with a bound on nesting), and checks every
    entry against the file: a known dtype, a shape of whole numbers, and offsets whose
    span is the shape times the dtype's size, the tensors tiling the data without gap or
    overlap, as the format requires. No tensor data is read until :meth:`read` asks for one
    tensor, so a tensor that is never asked for costs nothing, however large.

    Args:
        path: the file.
        what: how an unreadable file is refused: ``"{path}: not a {what} (why)"``.

    Attributes:
        path: the file.
        tensors: ``{name: StoredTensor}``.
        metadata: the header's ``__metadata__`` (``{str: str}``).

    Raises:
        CheckpointError: the file cannot be read, or its header is not safetensors'.
    """

    def __init__(self, path: str | Path, *, what: str = "safetensors file"):
        self.path, self._what = Path(path), what
        try:
            with self.path.open("rb") as f:
                size = os.fstat(f.fileno()).st_size
                prefix = f.read(8)
                if len(prefix) < 8:
                    raise self._refused(f"{size} bytes, shorter than the header's length")
                (length,) = struct.unpack("<Q", prefix)
                if length > min(SAFETENSORS_MAX_HEADER, size - 8):
                    raise self._refused(
                        f"a header of {length:,} bytes in a file of {size:,} bytes "
                        f"(at most {SAFETENSORS_MAX_HEADER:,})"
                    )
                text = f.read(length)
        except OSError as err:
            raise CheckpointError(f"{self.path}: cannot be read ({err.strerror or err})") from None
        try:
            header = parse_json(text)
        except ValueError as err:
            raise self._refused(f"header: {err}") from None
        self.metadata, self.tensors = self._entries(header, start=8 + length, end=size)

    def _refused(self, why: str) -> CheckpointError:
        return CheckpointError(f"{self.path}: not a {self._what} ({why})")

    def _entries(
        self, header: Any, start: int, end: int
    ) -> tuple[dict[str, str], dict[str, StoredTensor]]:
        if not isinstance(header, dict):
            raise self._refused(f"the header is a {type(header).__name__}, not an object")
        metadata = header.get("__metadata__") or {}
        if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
            raise self._refused("__metadata__ is not an object of strings")
        tensors = {}
        for name, entry in header.items():
            if name != "__metadata__":
                tensors[name] = self._entry(name, entry, start)
        at = start  # the tensors tile the data, in the order of their offsets
        for name, t in sorted(tensors.items(), key=lambda item: item[1].offset):
            if t.offset != at:
                raise self._refused(
                    f"tensor {quoted(name)} starts at byte {t.offset:,}, not {at:,}"
                )
            at += t.nbytes
        if at != end:
            raise self._refused(f"the tensors end at byte {at:,}, the file at byte {end:,}")
        return metadata, tensors

    def _entry(self, name: str, entry: Any, start: int) -> StoredTensor:
        fields = ("dtype", "shape", "data_offsets")
        if not isinstance(entry, dict) or not all(k in entry for k in fields):
            raise self._refused(f"tensor {quoted(name)} has no dtype, shape and data_offsets")
        dtype = _SAFETENSORS_DTYPES.get(entry["dtype"]) if isinstance(entry["dtype"], str) else None
        if dtype is None:
            raise self._refused(f"tensor {quoted(name)} has dtype {quoted(entry['dtype'])}")
        shape, offsets = entry["shape"], entry["data_offsets"]
        if not isinstance(shape, list) or not all(_is_count(n) for n in shape):
            raise self._refused(f"tensor {quoted(name)} has shape {quoted(shape)}")
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(_is_count(n) for n in offsets)
            or offsets[0] > offsets[1]
        ):
            raise self._refused(f"tensor {quoted(name)} has data_offsets {quoted(offsets)}")
        nbytes = math.prod(shape) * dtype.itemsize
        if offsets[1] - offsets[0] != nbytes:
            raise self._refused(
                f"tensor {quoted(name)} of shape {tuple(shape)} and dtype {entry['dtype']} "
                f"takes {nbytes:,} bytes, its offsets span {offsets[1] - offsets[0]:,}"
            )
        return StoredTensor(dtype, tuple(shape), start + offsets[0], nbytes)

    def read(self, name: str) -> torch.Tensor:
        """Tensor ``name`` read from the file into CPU memory (only its own bytes)."""
        stored = self.tensors[name]
        tensor = torch.empty(stored.shape, dtype=stored.dtype)
        if not stored.nbytes:
            return tensor
        view = memoryview(tensor.reshape(-1).view(torch.uint8).numpy())
        try:
            with self.path.open("rb") as f:
                f.seek(stored.offset)
                done = 0
                while done < stored.nbytes:
                    got = f.readinto(view[done:])
                    if not got:
                        raise self._refused(f"the file ends inside tensor {quoted(name)}")
                    done += got
        except OSError as err:
            raise CheckpointError(f"{self.path}: cannot be read ({err.strerror or err})") from None
        if sys.byteorder != "little":  # safetensors stores little-endian
            tensor = tensor.view(-1).view(torch.uint8).view(-1, stored.dtype.itemsize)
            tensor = tensor.flip(-1).contiguous().view(stored.dtype).view(stored.shape)
        return tensor


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63


def available_memory() -> int | None:
    """Bytes this process may still allocate, or ``None`` when nothing says.

    The least of the kernel's ``MemAvailable``, the room left under the process's address
    space limit (``ulimit -v``) and the room left in its control group (``memory.max``).
    """
    bounds = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                bounds.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        used = _status_kib("VmSize")
        if used is not None:
            bounds.append(max(0, soft - used * 1024))
    try:
        group = Path("/proc/self/cgroup").read_text().strip().rpartition(":")[2]
        folder = Path("/sys/fs/cgroup") / group.lstrip("/")
        limit = (folder / "memory.max").read_text().strip()
        if limit != "max":
            bounds.append(max(0, int(limit) - int((folder / "memory.current").read_text())))
    except (OSError, ValueError):
        pass
    return min(bounds) if bounds else None


def _status_kib(key: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(f"{key}:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def count_layers(names_with: Callable[[int], Iterable[str]], names: Iterable[str]) -> int | None:
    """How many layers the weights ``names`` hold, as a model of ``n`` layers names them.

    ``names_with(n)`` gives the weight names of the model with ``n`` layers (built on the
    meta device: no memory). The names its second layer adds (``encoder.layers.1.norm1.
    weight``, ``rnn.weight_ih_l1``) become patterns with the layer index free; the layers
    of ``names`` are the distinct indices that match. Building the model that a config
    describes before this check would create every layer it claims (ten million layers:
    hours), whatever the file holds.

    Returns:
        The number of layers in ``names``, or ``None`` when the layers share their weights
        (a second layer adds no name).
    """
    one, two = set(names_with(1)), set(names_with(2))
    patterns = []
    for name in two - one:
        for index in re.finditer(r"\d+", name):
            before, after = name[: index.start()], name[index.end() :]
            if index[0] == "1" and f"{before}0{after}" in one:
                patterns.append(re.escape(before) + r"(\d+)" + re.escape(after))
    if not patterns:
        return None
    layer = re.compile("|".join(f"(?:{p})" for p in sorted(set(patterns))))
    found = set()
    for name in names:
        match = layer.fullmatch(name)
        if match:
            found.add(next(g for g in match.groups() if g is not None))
    return len(found)


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
    models: ModelKinds | None = None,
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
        models: model types beyond the translators and the CNN, ``{type: (config class,
            model class)}`` (the ViT: ``qkv.train.classify.IMAGE_MODELS``).

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
    kinds = {**_MODELS, **(models or {})}
    kind, config = _config(path, header, kinds)
    stored = {k[len("model.") :]: t for k, t in file.tensors.items() if k.startswith("model.")}
    _check_layers(path, kinds[kind][1], kind, config, stored)
    with torch.device("meta"):
        skeleton = kinds[kind][1](config)
    mismatch = _mismatch(skeleton.state_dict(), {k: t.meta() for k, t in stored.items()})
    if mismatch:
        raise CheckpointError(f"{path}: weights do not fit the model config ({mismatch})")
    _check_dtypes(path, stored)
    wanted = [f"model.{k}" for k in stored]
    if training_state:
        _check_training_tensors(path, file.tensors, skeleton)
        wanted += [k for k in file.tensors if k.startswith("optim.") or k == "rng.torch"]
    _check_memory(path, config, skeleton, sum(file.tensors[k].nbytes for k in wanted))
    tensors = {k: file.read(k).to(map_location) for k in wanted}
    if check_finite:
        _check_finite(path, tensors)
    model = _build(path, kinds[kind][1], config, tensors)
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


def _config(path: Path, header: dict, kinds: ModelKinds) -> tuple[str, Any]:
    """The model type and its config dataclass (checked field by field)."""
    kind = header["model_type"]
    try:
        if kind not in kinds:
            raise ValueError(f"unknown model type {quoted(kind)}; expected one of {_names(kinds)}")
        return kind, kinds[kind][0].from_dict(header["model_config"])
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
