"""Reading Hugging Face model folders: config, weights, and checks of names and values.

A Hugging Face folder holds ``config.json``, the weights (``model.safetensors`` or
``pytorch_model.bin``) and, usually, a tokenizer (read by
:mod:`~qkv.models.pretrained.hf_tokenizer`).
Nothing here imports ``transformers``: the weights are read from their safetensors headers
(:class:`~qkv.models.tensor_file.TensorFile`), or with ``torch.load(weights_only=True)``,
which refuses pickled code.

Nothing a folder says is trusted before it is checked against what it holds
(:func:`load_checked`): every JSON file is parsed with a bound on nesting and digits
(:func:`~qkv.files.parse_json`); the config's layer count, then its sizes, are compared
with the names and shapes of the stored weights, read from the headers alone, on a model
built on the meta device (which allocates nothing); what the model would take is compared
with the memory available; only then are the tensors that the model uses read.
"""

from __future__ import annotations

import importlib
import logging
import math
import pickle
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from qkv.errors import CheckpointError, ModelFileError
from qkv.files import parse_json, quoted
from qkv.models.tensor_file import TensorFile, available_memory, count_layers

__all__ = [
    "HF_ACTIVATIONS",
    "PADDED_POSITIONS",
    "StoredWeights",
    "base_weights",
    "check_names",
    "check_values",
    "config_errors",
    "load_checked",
    "load_into",
    "load_state_dict",
    "model_folder",
    "open_weights",
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


def read_json(path: str | Path) -> Any:
    """A JSON file of a model folder (usually a dict); ``{}`` when the file does not exist.

    Parsed with :func:`~qkv.files.parse_json`: nesting and integers are bounded, so a
    hostile file is one line, never a ``RecursionError`` or a conversion of 5,000 digits.

    Raises:
        ModelFileError: the file is not UTF-8, not JSON, or nested too deep or holding an
            integer too long (the message names the file).
    """
    path = Path(path)
    if not path.is_file():
        return {}
    try:
        return parse_json(path.read_bytes())
    except ValueError as err:
        raise ModelFileError(f"{path}: {err}") from None


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
        raise ModelFileError(f"{file}: expected a JSON object, got {type(config).__name__}")
    return config


@dataclass
class StoredWeights:
    """The weights of a Hugging Face folder as their files describe them, none read yet.

    Attributes:
        where: the file to name in messages (``model.safetensors``, ``pytorch_model.bin``
            or a sharded checkpoint's index).
        tensors: ``{name: tensor on the meta device}``: each weight's dtype and shape,
            from the safetensors headers (or, for ``pytorch_model.bin``, from the file
            mapped into memory, not read).
    """

    where: Path
    tensors: dict[str, Tensor]
    _read: Callable[[str], Tensor]

    def read(self, names: Iterable[str] | None = None) -> dict[str, Tensor]:
        """The tensors ``names`` (all when ``None``), read from their files onto the CPU;
        the bytes of the others are never read."""
        try:
            return {n: self._read(n) for n in (self.tensors if names is None else names)}
        except CheckpointError as err:  # a file that ends inside a tensor
            raise ModelFileError(str(err)) from None

    @property
    def nbytes(self) -> dict[str, int]:
        """``{name: bytes its tensor takes}``."""
        return {n: t.numel() * t.element_size() for n, t in self.tensors.items()}


def open_weights(path: str | Path) -> StoredWeights:
    """The weights of a Hugging Face folder, by their original names, before reading them.

    ``model.safetensors`` is preferred; ``pytorch_model.bin`` is opened with
    ``torch.load(weights_only=True, mmap=True)`` (tensors only, no pickled code; the bytes
    stay in the file until used). A sharded checkpoint (``model.safetensors.index.json`` or
    ``pytorch_model.bin.index.json`` naming the shard of each weight) is opened shard by
    shard; each weight must be in the shard the index names.

    Raises:
        FileNotFoundError: no weights that qkv reads in the folder.
        ModelFileError: a file that is not a weights file (a safetensors header that is not
            the format's, pickled code, a training checkpoint), or a broken index.
    """
    folder = model_folder(path)
    for name in _WEIGHT_FILES:
        if (folder / name).is_file():
            return _open_file(folder / name)
        index = folder / f"{name}.index.json"
        if index.is_file():
            return _open_shards(index)
    others = sorted(f.name for f in folder.iterdir() if f.suffix in _OTHER_WEIGHTS)
    found = f"; found {', '.join(others[:3])}, which qkv does not read" if others else ""
    raise FileNotFoundError(
        f"no weights in {folder}: expected one of {', '.join(_WEIGHT_FILES)} "
        f"(or a sharded checkpoint's .index.json){found}"
    )


def load_state_dict(path: str | Path) -> dict[str, Tensor]:
    """The weights of a Hugging Face folder, by their original names, all read
    (:func:`open_weights` reads only those asked for).

    Returns:
        ``{name: tensor}`` on the CPU.
    """
    return open_weights(path).read()


def _open_file(file: Path) -> StoredWeights:
    if file.name.endswith(".safetensors"):
        try:
            stored = TensorFile(file, what="readable checkpoint")
        except CheckpointError as err:
            raise ModelFileError(str(err)) from None
        tensors = {n: t.meta() for n, t in stored.tensors.items()}
        return StoredWeights(file, tensors, stored.read)
    state = _torch_load(file)
    tensors = {n: torch.empty_like(t, device="meta") for n, t in state.items()}
    return StoredWeights(file, tensors, state.__getitem__)


def _torch_load(file: Path) -> dict[str, Tensor]:
    """A ``pytorch_model.bin``'s tensors, mapped from the file (read when used)."""
    try:
        try:
            state = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as err:
            if "mmap" not in str(err):
                raise
            state = torch.load(file, map_location="cpu", weights_only=True)  # legacy format
    except pickle.UnpicklingError as err:  # pickled code, or not a torch file at all
        raise ModelFileError(
            f"{file}: not a weights-only PyTorch checkpoint ({_unpickling_reason(err)}); "
            "qkv never runs pickled code: save the weights as model.safetensors"
        ) from None
    except Exception as err:  # torch's RuntimeError, a zip file's errors
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ModelFileError(f"{file}: not a readable checkpoint ({quoted(first, 200)})") from None
    if not isinstance(state, dict):
        raise ModelFileError(f"{file} does not hold a state dict (got {type(state).__name__})")
    other = next((k for k, v in state.items() if not isinstance(v, Tensor)), None)
    if other is not None:  # e.g. {"model": state_dict, "epoch": 3}
        raise ModelFileError(
            f"{file}: {quoted(other)} holds a {type(state[other]).__name__}, not a tensor "
            "(a training checkpoint? save the model's state_dict() alone)"
        )
    return state


def _unpickling_reason(err: Exception) -> str:
    """The line of torch's long weights-only message that says what was refused."""
    boilerplate = ("Weights only load failed", "Please file an issue", "Check the documentation")
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    reasons = [line for line in lines if not line.startswith(boilerplate)]
    return quoted(reasons[0], 200) if reasons else "refused by torch.load(weights_only=True)"


def _open_shards(index: Path) -> StoredWeights:
    """Every shard that ``index`` names, headers only; the weights must be where the index
    says."""
    content = read_json(index)
    weight_map = content.get("weight_map") if isinstance(content, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise ModelFileError(f"{index}: no weight_map naming the shard of each weight")
    bad = next((n for n, shard in weight_map.items() if not isinstance(shard, str)), None)
    if bad is not None:
        raise ModelFileError(
            f"{index}: the shard of {quoted(bad)} is {quoted(weight_map[bad])}, not a file name"
        )
    tensors: dict[str, Tensor] = {}
    readers: dict[str, Callable[[str], Tensor]] = {}
    for shard in sorted(set(weight_map.values())):
        file = index.parent / shard
        if not file.is_file() or file.parent != index.parent:
            raise FileNotFoundError(f"{index}: shard {quoted(shard)} not found in {index.parent}")
        part = _open_file(file)
        listed = {n for n, s in weight_map.items() if s == shard}
        misplaced = sorted(listed ^ set(part.tensors))
        if misplaced:
            name = misplaced[0]
            where = "listed for it but not in it" if name in listed else "in it, listed elsewhere"
            raise ModelFileError(
                f"{index}: {len(misplaced)} weights of shard {quoted(shard)} are not where the "
                f"index says, e.g. {quoted(name)} ({where})"
            )
        tensors.update(part.tensors)
        readers.update(dict.fromkeys(part.tensors, part._read))
    return StoredWeights(index, tensors, lambda name: readers[name](name))


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
            raise ValueError(f"{key} must be {expected}{null}, got {quoted(values[key])}")


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
    assign: bool = False,
) -> None:
    """Check ``state`` against ``model`` (names, tied weights once; shapes), load it, cast it.

    ``dtype``: ``None`` for float32, ``"auto"`` for the checkpoint's own floating type (the
    ``dtype``/``torch_dtype`` of its ``config``, else its first floating weight's, as
    transformers decides), or a floating ``torch.dtype`` or its name (``"bfloat16"``).
    ``assign``: the tensors of ``state`` become the model's parameters (contiguous) instead
    of being copied into them, for a model built on the meta device, so that the weights
    are held once; the caller ties shared weights again.
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
    if assign:
        state = {name: tensor.contiguous() for name, tensor in state.items()}
    model.load_state_dict(state, strict=False, assign=assign)
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


def load_checked(
    path: str | Path,
    config: Mapping[str, Any],
    build: Callable[[int | None], nn.Module],
    rename: Callable[[dict[str, Tensor]], dict[str, Tensor]],
    *,
    layers_key: str | None,
    weights: StoredWeights | None = None,
    dtype: torch.dtype | str | None = None,
) -> nn.Module:
    """The model of a Hugging Face folder, built only once the folder's sizes are checked.

    A ``config.json`` is a claim: ``num_hidden_layers: 100000`` or ``hidden_size: 49152``
    would build gigabytes of layers before any weight is compared with them. Here nothing
    is allocated before these checks, each refusal one line naming the file and the key:

    1. the weights' names and shapes are read from their headers (:func:`open_weights`)
       and renamed by ``rename`` on the meta device;
    2. the config's layer count (``config[layers_key]``) is compared with the layers of
       weights stored (:func:`~qkv.models.tensor_file.count_layers`, on models of one and
       two layers built on the meta device);
    3. the model is built on the meta device, and its weights' names and shapes are
       compared with the stored ones (a size that differs is named by its config key);
    4. what the model, its buffers and the tensors to read take is compared with the
       memory available (:func:`~qkv.models.tensor_file.available_memory`);
    5. only the stored tensors that feed the model's weights are read (a task head that
       ``rename`` drops is never read), renamed, and loaded (:func:`load_into`).

    Args:
        path: the folder.
        config: its ``config.json`` (the dict), to name keys in messages.
        build: ``build(n)`` is the model with ``n`` layers, ``build(None)`` the model the
            config describes (called on the meta device for the checks).
        rename: the stored weights (``{Hugging Face name: tensor}``) under the model's
            names, transposed or split as the model holds them; a weight it drops is
            not read.
        layers_key: the ``config.json`` key of the layer count, or ``None`` when the layers
            share their weights (ALBERT).
        weights: the folder's :func:`open_weights`, when the caller opened them already.
        dtype: as :func:`load_into`.

    Returns:
        the model holding the stored weights (in training mode, as built).

    Raises:
        ModelFileError: a config that does not match its weights (layers, names, shapes),
            a model that cannot fit in the memory available, or unreadable weights.
    """
    folder = model_folder(path)
    weights = weights or open_weights(folder)
    what = f"{folder / 'config.json'}"
    stored = _renamed_meta(weights.tensors, rename)
    if layers_key is not None:
        _check_layers(what, config, layers_key, build, stored, weights.where)
    with torch.device("meta"):
        skeleton = build(None)
    expected = _weight_shapes(skeleton)
    try:
        check_names(expected, stored, what=str(weights.where))
    except ValueError as err:
        raise ModelFileError(str(err)) from None
    _check_shapes(what, config, expected, stored, weights)
    sources = sorted(set().union(*(stored[n].sources for n in expected)))
    nbytes = weights.nbytes
    target = _load_dtype(dtype, {n: weights.tensors[n] for n in sources}, config)
    _check_memory(what, config, skeleton, sum(nbytes[n] for n in sources), target)
    state = rename(weights.read(sources))
    try:
        model = build(None)
    except (RuntimeError, MemoryError) as err:  # the memory went elsewhere meanwhile
        why = " ".join(str(err).split())[:300] or type(err).__name__
        raise ModelFileError(f"{folder}: cannot build the model ({why})") from None
    load_into(model, state, what=str(folder), dtype=dtype, config=config)
    return model


@dataclass
class _Renamed:
    """A renamed weight on the meta device, and the stored tensors it is made of."""

    tensor: Tensor
    sources: frozenset[str]

    @property
    def shape(self) -> torch.Size:
        return self.tensor.shape


def _renamed_meta(
    tensors: dict[str, Tensor], rename: Callable[[dict[str, Tensor]], dict[str, Tensor]]
) -> dict[str, _Renamed]:
    """``rename`` run on meta tensors, each renamed weight with the stored names it comes
    from: the same tensor, a view of it, or (split and transposed, GPT-2's ``c_attn``) a
    tensor whose autograd graph leads back to it."""
    leaves = {}
    for name, t in tensors.items():
        leaf = torch.empty_like(t, device="meta")
        if leaf.is_floating_point() or leaf.is_complex():
            leaf.requires_grad_(True)
        leaves[name] = leaf
    by_id = {id(t): n for n, t in leaves.items()}
    with torch.enable_grad():
        renamed = rename(dict(leaves))
    return {n: _Renamed(t.detach(), _sources(t, by_id)) for n, t in renamed.items()}


def _sources(tensor: Tensor, by_id: dict[int, str]) -> frozenset[str]:
    found, nodes, seen = set(), [tensor.grad_fn], set()
    for t in (tensor, tensor._base):
        if t is not None and id(t) in by_id:
            found.add(by_id[id(t)])
    while nodes:
        node = nodes.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        variable = getattr(node, "variable", None)  # AccumulateGrad: a leaf
        if variable is not None and id(variable) in by_id:
            found.add(by_id[id(variable)])
        nodes.extend(next_node for next_node, _ in node.next_functions)
    return frozenset(found)


def _weight_shapes(model: nn.Module) -> dict[str, torch.Size]:
    """The names and shapes a checkpoint of ``model`` holds (tied weights once)."""
    shapes = {n: p.shape for n, p in model.named_parameters()}
    for name, buffer in model.named_buffers():
        if _is_persistent(model, name):
            shapes[name] = buffer.shape
    return shapes


def _layer_names(build: Callable[[int | None], nn.Module], n: int) -> list[str]:
    with torch.device("meta"):
        return list(_weight_shapes(build(n)))


def _check_layers(
    what: str,
    config: Mapping[str, Any],
    key: str,
    build: Callable[[int | None], nn.Module],
    stored: Mapping[str, Any],
    where: Path,
) -> None:
    """``config[key]`` is the number of layers of weights stored."""
    claimed = config.get(key)
    try:
        found = count_layers(lambda n: _layer_names(build, n), stored)
    except (ValueError, TypeError):  # a model that has no one-layer form
        return
    if found is not None and claimed is not None and found != claimed:
        known = set(_layer_names(build, max(found, 1)))
        others = sorted(n for n in stored if n not in known)
        also = f"; unexpected ({len(others)}): {_first(others, 4)}" if others else ""
        raise ModelFileError(
            f"{what}: {key} {quoted(claimed)} does not match the {found} layer(s) of weights "
            f"in {where.name}{also}"
        )


def _keys_of(config: Mapping[str, Any], sizes: Iterable[int], others: Iterable[int]) -> list[str]:
    """The integer keys of ``config`` whose value is one of ``sizes`` and none of
    ``others``: the keys that made a shape."""
    sizes, others = set(sizes), set(others)
    return [
        f"{k} {quoted(v)}"
        for k, v in config.items()
        if _is_int(v) and v in sizes and v not in others
    ]


def _check_shapes(
    what: str,
    config: Mapping[str, Any],
    expected: Mapping[str, torch.Size],
    stored: Mapping[str, _Renamed],
    weights: StoredWeights,
) -> None:
    """Every stored weight has the shape that the config gives the model's."""
    wrong = [n for n, shape in expected.items() if stored[n].shape != shape]
    if not wrong:
        return
    name = wrong[0]
    want, got = tuple(expected[name]), tuple(stored[name].shape)
    keys = _keys_of(config, want, got)
    sources = sorted(stored[name].sources)
    if len(sources) == 1 and tuple(weights.tensors[sources[0]].shape) == got:
        name = quoted(sources[0])  # as the file names it
    elif sources:
        name = f"{name} (from {quoted(', '.join(sources))})"
    claim = f"{', '.join(keys)} {'does' if len(keys) == 1 else 'do'}" if keys else "the sizes do"
    more = f" ({len(wrong) - 1} more weights differ)" if len(wrong) > 1 else ""
    raise ModelFileError(
        f"{what}: {claim} not match the weights in {weights.where.name}: {name} is {got} "
        f"there, {want} by the config{more}"
    )


def _check_memory(
    what: str, config: Mapping[str, Any], skeleton: nn.Module, read: int, target: torch.dtype
) -> None:
    """The tensors to read, the model built in float32 and (another dtype) its copy fit in
    the memory available."""
    tensors = list({id(t): t for t in [*skeleton.parameters(), *skeleton.buffers()]}.values())
    numel = sum(t.numel() for t in tensors)
    need = read + 4 * numel + (target.itemsize * numel if target != torch.float32 else 0)
    free = available_memory()
    if free is None or need <= free:
        return
    named = [*skeleton.named_parameters(), *skeleton.named_buffers()]
    name, largest = max(named, key=lambda item: item[1].numel())
    keys = _keys_of(config, [max(largest.shape, default=0)], ())
    because = f" ({', '.join(keys)})" if keys else ""
    raise ModelFileError(
        f"{what}: the model needs about {_gib(need)} of memory, more than the {_gib(free)} "
        f"available: {name} alone is {tuple(largest.shape)}{because}"
    )


def _gib(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB"
