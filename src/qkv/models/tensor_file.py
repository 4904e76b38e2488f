"""A safetensors file read from its header: every tensor's name, dtype, shape and place
in the file, known before any data is read, so that a file whose header claims more than
it holds, or more than memory can take, is refused first; and the memory a load may use.

qkv's checkpoints (:mod:`qkv.models.checkpoint`) and Hugging Face folders
(:mod:`qkv.models.pretrained.hf`) both read their tensors through :class:`TensorFile`.
"""

from __future__ import annotations

import math
import os
import re
import resource
import struct
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from qkv.errors import CheckpointError
from qkv.files import parse_json, quoted

__all__ = [
    "SAFETENSORS_MAX_HEADER",
    "StoredTensor",
    "TensorFile",
    "available_memory",
    "count_layers",
]


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
