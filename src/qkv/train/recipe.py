"""A training recipe: data, tokenizers, model and optimisation in one validated config.

YAML is read only by the command line (:func:`load_yaml`); everything below it takes the
frozen :class:`Recipe`. Unknown keys and impossible values are :class:`ConfigError` s that
name the key, e.g. ``train.lr: must be > 0``; a value quoted in an error is cut to 80
characters.

``data.root`` names the folder that the relative file names of the data section
(``train``, ``valid``, ``test``, ``path``, ``files``) are read from; without it they are read from
the current folder. The shipped Multi30k, Tatoeba and Tiny Shakespeare recipes set it to
the folder where ``qkv data download NAME`` puts the corpus (``~/.cache/qkv/NAME``); a copy
elsewhere is read with ``--set data.root=FOLDER``, and a missing file names the command
that fetches it. The built recipe holds the joined paths (and no ``root``), so a run
folder's stored recipe names the files it read.

The YAML is read with YAML 1.2's core schema (:mod:`qkv.train.yaml_config`), the same in
the file and in ``--set KEY=VALUE``: only ``true``/``false`` are booleans (``yes``, ``no``,
``on``, ``off`` are strings, which a boolean key refuses), ``010`` is ten, ``5e-4`` is a
float, and ``1:30:00`` is a string, not YAML 1.1's base-60 number 5400. Aliases
(``*name``) are refused, lists and mappings nest at most 50 deep, integers have at most
``sys.get_int_max_str_digits()`` digits, and the file is a regular file of at most 1 MiB.

.. code-block:: yaml

    name: toy-transformer
    data: {kind: toy, n_train: 6000}
    tokenizer: {kind: word}
    model: {type: transformer, d_model: 128, num_heads: 4}
    train: {steps: 1500, max_tokens: 2048, lr: 0.001}

``data.kind: digits`` trains an image classifier instead (``model.type: vit`` or
``cnn``) on scikit-learn's 8 x 8 handwritten digits (:mod:`qkv.data.digits`), in batches
of ``train.batch_size`` images; it has no tokenizer section.

``data.kind: text`` trains a language model (``model.type: gpt`` or ``llama``) on the
plain-text ``data.files`` (:mod:`qkv.data.text_lm`): ``tokenizer.kind`` ``char`` (the
default here) or ``bpe`` (byte-level, ``tokenizer.vocab_size`` ids), the last
``data.valid_fraction`` of the text held out (0.1: nanoGPT's 90/10), batches of
``train.batch_size`` random windows of ``data.block_size`` tokens, and validation on
``train.eval_batches`` fixed batches of validation windows with a sample of
``train.sample_tokens`` tokens (:mod:`qkv.train.language`). ``train.label_smoothing``
defaults to 0 here. A GPT's ``model.max_len`` (its learned positions) defaults to
``data.block_size``. ``train.sequence_parallel: P`` (text only) splits each window across
P processes under ``torchrun`` (ring attention; ``data.block_size`` must divide into 2P
equal chunks; the processes started must be a multiple of P); in one process it changes
nothing. ``train.attention_budget_mb`` (any recipe; 0: none) sets
``QKV_ATTENTION_BUDGET_MB``, the most one attention call's score matrix may take, while
it trains.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import stat
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from qkv.errors import ConfigError, ConfigFieldError
from qkv.files import quoted
from qkv.models.cnn import CNNConfig
from qkv.models.pretrained.gpt import GPTConfig
from qkv.models.pretrained.llama import LlamaConfig
from qkv.models.pretrained.vit import ViTConfig
from qkv.models.translators.config import RNNSeq2SeqConfig, TransformerSeq2SeqConfig
from qkv.train.yaml_config import yaml_error, yaml_loader

__all__ = [
    "ConfigError",
    "DataConfig",
    "OptimConfig",
    "Recipe",
    "IMAGE_DATA",
    "TokenizerConfig",
    "apply_overrides",
    "load_yaml",
    "recipe_from_dict",
]

MAX_CONFIG_BYTES = 2**20  # a recipe is a few hundred bytes


@dataclass(frozen=True)
class DataConfig:
    """Where the sentence pairs come from.

    ``kind: toy`` generates the built-in Korean→English corpus; ``kind: files`` reads
    aligned files (``train: [SRC, TGT]``, same for ``valid`` and ``test``); ``kind: tsv``
    reads one tab-separated file (Tatoeba's format) and splits off valid/test sets;
    ``kind: digits`` reads scikit-learn's handwritten digits (images, not sentences), split
    by ``seed`` (:mod:`qkv.data.digits`); ``kind: text`` reads the plain-text ``files`` of
    a language model, split at ``1 - valid_fraction`` of the text and cut into windows of
    ``block_size`` tokens (:mod:`qkv.data.text_lm`).
    """

    kind: str = "toy"
    n_train: int = 8000
    n_valid: int = 300
    n_test: int = 300
    min_len: int = 2
    max_len: int = 12
    seed: int = 0
    train: tuple[str, ...] = ()
    valid: tuple[str, ...] = ()
    test: tuple[str, ...] = ()
    path: str = ""
    src_column: int = 1
    tgt_column: int = 0
    max_tokens: int = 100
    max_ratio: float = 3.0
    files: tuple[str, ...] = ()
    block_size: int = 256
    valid_fraction: float = 0.1

    def __post_init__(self) -> None:
        _choice(self, "kind", ("toy", "files", "tsv", "digits", "text"))
        for name in ("n_train", "n_valid", "n_test", "min_len", "max_len", "max_tokens"):
            _positive(self, name, allow_zero=name == "n_test")  # validation picks the best
        if self.kind == "toy" and not 2 <= self.min_len <= self.max_len:
            raise ConfigError(
                f"data.min_len: the toy corpus needs 2 <= data.min_len <= data.max_len, "
                f"got min_len {self.min_len}, max_len {self.max_len}"
            )
        if self.kind == "files":
            for name in ("train", "valid", "test"):
                files = getattr(self, name)
                if len(files) != 2 and (name != "test" or files):
                    optional = " (or none)" if name == "test" else ""
                    raise ConfigError(
                        f"data.{name}: give two files [SOURCE, TARGET]{optional}, "
                        f"got {quoted(list(files))}"
                    )
        for name in ("train", "valid", "test"):
            if self.kind != "files" and getattr(self, name):
                raise ConfigError(
                    f"data.{name}: files are read only with kind 'files', not {self.kind!r}"
                )
        if not self.max_ratio >= 1:  # the smoothed ratio of any pair is >= 1
            raise ConfigError(
                f"data.max_ratio: must be >= 1 (a pair's ratio is), got {self.max_ratio}"
            )
        if self.kind != "tsv" and self.path:
            raise ConfigError(f"data.path: read only with kind 'tsv', not {self.kind!r}")
        if self.kind == "tsv" and not self.path:
            raise ConfigError("data.path: a TSV file is needed for kind 'tsv'")
        if self.kind == "tsv":
            self._check_columns()
        if self.kind != "toy":
            self._refuse_toy_keys()
        if self.kind == "digits":
            self._refuse_text_keys()
        if self.kind == "text":
            self._check_text()
        else:
            for name in ("files", "block_size", "valid_fraction"):
                if getattr(self, name) != getattr(DataConfig, name):
                    raise ConfigError(f"data.{name}: read only with kind 'text', not {self.kind!r}")

    def _check_text(self) -> None:
        """A language model's text: files, windows and the validation share."""
        self._refuse_text_keys("a language model's text")
        if self.seed != DataConfig.seed:
            raise ConfigError(
                "data.seed: not read with kind 'text' (the split is the text's tail; "
                "train.seed draws the windows)"
            )
        if not self.files:
            raise ConfigError("data.files: give one or more plain-text files for kind 'text'")
        _positive(self, "block_size")
        if not 0 < self.valid_fraction < 1:
            raise ConfigError(
                f"data.valid_fraction: must be in (0, 1), got {quoted(self.valid_fraction)}"
            )

    def _refuse_toy_keys(self) -> None:
        """Keys that only shape the toy corpus would do nothing for files, silently."""
        for name in ("n_train", "min_len", "max_len"):
            if getattr(self, name) != getattr(DataConfig, name):  # the toy defaults
                hint = " (data.max_tokens drops long pairs of files)" * (name == "max_len")
                raise ConfigError(
                    f"data.{name}: read only with kind 'toy', not {self.kind!r}{hint}"
                )

    def _refuse_text_keys(self, why: str = "its split is fixed") -> None:
        """The digits' split is fixed (:mod:`qkv.data.digits`) and a language model's text
        is windows: keys that size or filter sentence splits would do nothing, silently."""
        for name in ("n_valid", "n_test", "max_tokens", "max_ratio", "src_column", "tgt_column"):
            if getattr(self, name) != getattr(DataConfig, name):
                raise ConfigError(f"data.{name}: not read with kind {self.kind!r} ({why})")

    def _check_columns(self) -> None:
        for name in ("src_column", "tgt_column"):
            _positive(self, name, allow_zero=True)
        if self.src_column == self.tgt_column:
            raise ConfigError(
                f"data.tgt_column: must differ from data.src_column, both are {self.src_column}"
            )


@dataclass(frozen=True)
class TokenizerConfig:
    """``kind``: ``word``, ``char`` or ``bpe``; ``joint``: one vocabulary for both sides."""

    kind: str = "word"
    vocab_size: int = 8000
    joint: bool = False

    def __post_init__(self) -> None:
        _choice(self, "kind", ("word", "char", "bpe"))
        if not self.vocab_size > 4:  # word and char would map every token to <unk>
            raise ConfigError(
                f"tokenizer.vocab_size: must be > 4 (the special tokens <pad>, <unk>, <s> "
                f"and </s> take 4 ids), got {self.vocab_size}"
            )
        if self.kind == "bpe" and self.vocab_size > 2**20:  # 2**31 made the trainer abort
            raise ConfigError(
                f"tokenizer.vocab_size: must be <= {2**20} for bpe (its trainer "
                f"reserves memory for every id), got {self.vocab_size}"
            )


@dataclass(frozen=True)
class OptimConfig:
    """Optimisation: AdamW, warmup then ``inverse_sqrt`` / ``cosine`` / ``constant``."""

    steps: int = 2000
    max_tokens: int = 2048  # translators: target tokens per batch
    batch_size: int = 64  # image classifiers: images per batch; language models: windows
    accumulate: int = 1
    lr: float = 1e-3
    warmup: int = 200
    schedule: str = "inverse_sqrt"
    min_lr: float = 0.0
    weight_decay: float = 0.0
    decay_matrices_only: bool = False  # no decay on biases and norms' gains (nanoGPT's rule)
    betas: tuple[float, float] = (0.9, 0.98)
    label_smoothing: float = 0.1
    clip_norm: float = 1.0
    bf16: bool | str = False  # bf16 autocast: true, false or "auto" (where bf16 is native)
    eval_every: int = 250
    eval_batches: int = 20  # language models: validation batches (nanoGPT's eval_iters)
    sample_tokens: int = 200  # language models: tokens sampled at each evaluation (0: none)
    save_every: int = 250
    patience: int = 0
    valid_bleu_sentences: int = 300
    seed: int = 0
    device: str = "auto"
    threads: int = 0
    max_seconds: float = 0.0  # stop (and checkpoint) after this much training time, counted
    # over resumes; 0 = none
    sequence_parallel: int = 1  # language models: processes that split each window (ring)
    attention_budget_mb: float = 0.0  # QKV_ATTENTION_BUDGET_MB while training; 0 = none

    def __post_init__(self) -> None:
        for name in ("steps", "max_tokens", "batch_size", "accumulate", "eval_every", "save_every"):
            _positive(self, name)
        _positive(self, "eval_batches")
        for name in (
            "warmup",
            "patience",
            "valid_bleu_sentences",
            "threads",
            "max_seconds",
            "sample_tokens",
            "attention_budget_mb",
        ):
            _positive(self, name, allow_zero=True)
        _positive(self, "sequence_parallel")
        if self.attention_budget_mb == math.inf:
            raise ConfigError("train.attention_budget_mb: must be finite (0: no budget)")
        if not 0 < self.lr < math.inf:
            raise ConfigError(f"train.lr: must be > 0 and finite, got {self.lr}")
        if not 0 <= self.min_lr <= self.lr:  # a negative rate would climb the loss
            raise ConfigError(
                f"train.min_lr: must be in [0, train.lr = {self.lr}], got {self.min_lr}"
            )
        if not all(0 <= b < 1 for b in self.betas):
            raise ConfigError(f"train.betas: each must be in [0, 1), got {self.betas}")
        _positive(self, "weight_decay", allow_zero=True)
        if not self.clip_norm >= 0:
            raise ConfigError(
                f"train.clip_norm: must be >= 0 (0: no clipping), got {self.clip_norm}"
            )
        if not 0 <= self.label_smoothing < 1:
            raise ConfigError(
                f"train.label_smoothing: must be in [0, 1), got {self.label_smoothing}"
            )
        if not -(2**63) <= self.seed < 2**64:  # what torch.manual_seed takes
            raise ConfigError(f"train.seed: must be in [-2**63, 2**64), got {quoted(self.seed)}")
        if self.threads > 2**31 - 1:  # torch.set_num_threads takes a C int
            raise ConfigError(f"train.threads: must be <= {2**31 - 1}, got {quoted(self.threads)}")
        _choice(self, "schedule", ("inverse_sqrt", "cosine", "constant"), section="train")
        _choice(self, "device", ("auto", "cpu", "cuda"), section="train")
        if not isinstance(self.bf16, bool) and self.bf16 != "auto":
            raise ConfigError(f"train.bf16: must be true, false or 'auto', got {quoted(self.bf16)}")


@dataclass(frozen=True)
class Recipe:
    """Everything a training run needs. ``model`` holds ``type`` plus the model config."""

    name: str = "run"
    out: str = ""
    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    model: dict = field(default_factory=lambda: {"type": "transformer"})
    train: OptimConfig = field(default_factory=OptimConfig)

    def __post_init__(self) -> None:
        check_model_section(self.model, self.data.kind)
        self._refuse_other_task_keys()
        if self.model.get("share_vocab") and not self.tokenizer.joint:  # else built mid-run
            raise ConfigError(
                "model.share_vocab: one embedding for both sides needs one "
                "vocabulary for both; set tokenizer.joint: true"
            )

    @property
    def images(self) -> bool:
        """Whether this recipe trains an image classifier (else a translator)."""
        return self.data.kind in IMAGE_DATA

    @property
    def language(self) -> bool:
        """Whether this recipe trains a language model on plain text."""
        return self.data.kind in TEXT_DATA

    def _refuse_other_task_keys(self) -> None:
        """Keys of translators in an image recipe and back would do nothing, silently."""
        if not self.language:
            for name in ("eval_batches", "sample_tokens", "sequence_parallel"):
                if getattr(self.train, name) != getattr(OptimConfig, name):
                    raise ConfigError(
                        f"train.{name}: read only with language models (data.kind 'text')"
                    )
        if self.language:
            self._check_language()
        elif self.images:
            if self.tokenizer != TokenizerConfig():
                raise ConfigError("tokenizer: images have no tokenizer; remove the section")
            if self.train.max_tokens != OptimConfig.max_tokens:
                raise ConfigError(
                    "train.max_tokens: images are batched by train.batch_size, not by tokens"
                )
        elif self.train.batch_size != OptimConfig.batch_size:
            raise ConfigError(
                "train.batch_size: read only with image data (data.kind 'digits'); "
                "translators are batched by train.max_tokens"
            )

    def _check_language(self) -> None:
        """A language model reads windows of tokens: a char or bpe tokenizer of its own,
        batches of ``train.batch_size`` windows, and (GPT) as many positions as a window."""
        if self.tokenizer.kind not in TEXT_TOKENIZERS:
            raise ConfigError(
                f"tokenizer.kind: a language model's text is read by 'char' or 'bpe', "
                f"not {self.tokenizer.kind!r}"
            )
        if self.tokenizer.joint:
            raise ConfigError("tokenizer.joint: a language model has one tokenizer already")
        if self.tokenizer.kind == "bpe" and self.tokenizer.vocab_size < BYTE_BPE_MIN:
            raise ConfigError(
                f"tokenizer.vocab_size: a byte-level BPE needs >= {BYTE_BPE_MIN} (4 special "
                f"tokens and the 256 bytes), got {self.tokenizer.vocab_size}"
            )
        for name in ("max_tokens", "valid_bleu_sentences"):
            if getattr(self.train, name) != getattr(OptimConfig, name):
                raise ConfigError(
                    f"train.{name}: not read with language models (batches are "
                    "train.batch_size windows; validation is loss and perplexity)"
                )
        sp, block = self.train.sequence_parallel, self.data.block_size
        if block % (2 * sp):
            raise ConfigError(
                f"train.sequence_parallel: {sp} processes split a window of data.block_size "
                f"{block} tokens into {2 * sp} equal chunks (causal zig-zag); make "
                f"data.block_size a multiple of {2 * sp}"
            )
        positions = self.model.get("max_len")
        if self.model["type"] == "gpt" and positions is not None:
            if positions < self.data.block_size:
                raise ConfigError(
                    f"data.block_size: {self.data.block_size} tokens, more than the "
                    f"{positions} learned positions of model.max_len; raise model.max_len "
                    "or leave it out (it defaults to data.block_size)"
                )

    @property
    def out_dir(self) -> Path:
        return Path(self.out or f"runs/{self.name}")


IMAGE_DATA = ("digits",)  # data kinds that hold images: image classifiers train on them
TEXT_DATA = ("text",)  # data kinds of plain text: language models train on them
TEXT_TOKENIZERS = ("char", "bpe")
BYTE_BPE_MIN = 260  # the special tokens and the 256 bytes
IMAGE_MODELS = {"vit": ViTConfig, "cnn": CNNConfig}
TEXT_MODELS = {"transformer": TransformerSeq2SeqConfig, "rnn": RNNSeq2SeqConfig}
LM_MODELS = {"gpt": GPTConfig, "llama": LlamaConfig}
LM_EXCLUDED = {"rope_scaling"}  # read from a pretrained model's own files only
# what the data sets in an image model's config (placeholders here, the data's at training)
IMAGE_FIELDS = {"image_size": 8, "num_channels": 1, "num_labels": 10, "labels": ()}


def check_model_section(model: dict, data_kind: str = "toy") -> None:
    """Validate the model section now (with placeholder vocabulary sizes, or image sizes
    for the image models)."""
    images, language = data_kind in IMAGE_DATA, data_kind in TEXT_DATA
    kinds = IMAGE_MODELS if images else LM_MODELS if language else TEXT_MODELS
    if not isinstance(model, dict) or model.get("type") not in kinds:
        names = " or ".join(repr(k) for k in kinds)
        other_type = isinstance(model, dict) and model.get("type") in {**IMAGE_MODELS, **LM_MODELS}
        also = f" for data.kind {data_kind!r}" if images or language or other_type else ""
        raise ConfigError(f"model.type: must be {names}{also}")
    fields = {k: v for k, v in model.items() if k != "type"}
    if images:
        placeholders = {
            k: v for k, v in IMAGE_FIELDS.items() if k != "labels" or model["type"] == "vit"
        }
    elif language:
        placeholders = {"vocab_size": 8}
    else:
        placeholders = {"src_vocab_size": 8, "tgt_vocab_size": 8, "pad_id": 0, "bos_id": 2}
        placeholders["eos_id"] = 3
    for reserved in placeholders:
        if reserved in fields:
            source = "the images" if images else "the tokenizer"
            raise ConfigError(f"model.{reserved}: set from {source}, do not give it")
    kind = kinds[model["type"]]
    known = {f.name for f in dataclasses.fields(kind)} - set(placeholders)
    if language:
        known -= LM_EXCLUDED
    if images and model["type"] == "vit":  # the head is trained, the rest is DeiT's loading
        known -= {"distillation_token", "distillation_head", "add_pooler"}
        known -= {"pooler_output_size", "pooler_act"}
    for key in fields:
        if key not in known:
            raise ConfigError(
                f"model.{_short(key)}: unknown key for type {model['type']}; "
                f"known: {', '.join(sorted(known | {'type'}))}"
            )
    try:
        kind.from_dict({**fields, **placeholders})
    except ConfigFieldError as err:  # named by its YAML key, not the config class's field
        raise ConfigError(f"model.{err.field}: {err.why}, got {quoted(err.value)}") from None
    except (ValueError, TypeError) as err:
        raise ConfigError(f"model: {_short(str(err), 300)}") from None


def recipe_from_dict(d: dict) -> Recipe:
    """Build a :class:`Recipe` from nested dicts (as read from YAML); ``data.root``, when
    given, is joined to the relative file names of the data section (see the module)."""
    return _build(Recipe, _language_defaults(_rooted(d)), "")


def _language_defaults(d: Any) -> Any:
    """A text recipe's own defaults where it leaves keys out: a character tokenizer and no
    label smoothing (the translators' defaults are words and 0.1)."""
    data = d.get("data") if isinstance(d, dict) else None
    if not isinstance(data, dict) or data.get("kind") not in TEXT_DATA:
        return d
    d = dict(d)
    for section, key, value in (("tokenizer", "kind", "char"), ("train", "label_smoothing", 0.0)):
        part = {} if d.get(section) is None else d[section]
        if isinstance(part, dict) and key not in part:
            d[section] = {**part, key: value}
    return d


def _rooted(d: Any) -> Any:
    """``d`` with ``data.root`` joined to the relative paths of ``data.train``, ``valid``,
    ``test`` and ``path`` and removed: the recipe holds the paths that are read."""
    data = d.get("data") if isinstance(d, dict) else None
    if not isinstance(data, dict) or "root" not in data:
        return d
    data = dict(data)
    root = data.pop("root")
    if root is None:  # ``root:`` left empty: the current folder
        return {**d, "data": data}
    if not isinstance(root, str) or not root:
        raise ConfigError(f"data.root: expected a folder, got {quoted(root)}")
    if data.get("kind", DataConfig.kind) == "toy":
        raise ConfigError("data.root: read only with kind 'files' or 'tsv', not 'toy'")
    folder = Path(root).expanduser()

    def join(file):
        if not isinstance(file, str) or not file or Path(file).is_absolute():
            return file  # a wrong type is named by the key's own check
        return str(folder / file)

    for key in ("train", "valid", "test", "files"):
        if isinstance(data.get(key), list | tuple):
            data[key] = [join(file) for file in data[key]]
    if "path" in data:
        data["path"] = join(data["path"])
    return {**d, "data": data}


def _build(cls, d: Any, where: str):
    if not isinstance(d, dict):
        raise ConfigError(
            f"{where.rstrip('.') or 'config'}: expected a mapping, got {type(d).__name__}"
        )
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    for key in d:
        if key not in known:
            raise ConfigError(
                f"{where}{_short(key)}: unknown key; known: {', '.join(sorted(known))}"
            )
    kwargs = {}
    for key, value in d.items():
        kwargs[key] = _convert(hints[key], value, f"{where}{key}")
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{where.rstrip('.') or 'config'}: {_short(str(err), 300)}") from None


def _convert(hint, value, where: str):
    if dataclasses.is_dataclass(hint):  # a section left empty (``data:``): its defaults
        return _build(hint, {} if value is None else value, where + ".")
    origin = typing.get_origin(hint)
    if origin is tuple:
        return _convert_tuple(typing.get_args(hint), value, where)
    if origin in (typing.Union, types.UnionType) or hint is Any or origin is dict or hint is dict:
        return value
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint in (int, float, str, bool) and (
        not isinstance(value, hint) or (hint is int and isinstance(value, bool))
    ):
        raise ConfigError(f"{where}: expected {hint.__name__}, got {quoted(value)}")
    return value


def _convert_tuple(args: tuple, value, where: str) -> tuple:
    """A list for ``tuple[X, ...]`` (any length) or ``tuple[X, Y]`` (exactly that many)."""
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"{where}: expected a list, got {quoted(value)}")
    if len(args) == 2 and args[1] is Ellipsis:
        kinds = [args[0]] * len(value)
    else:
        kinds = list(args)
        if len(value) != len(kinds):
            raise ConfigError(
                f"{where}: expected a list of {len(kinds)}, got {quoted(list(value))}"
            )
    return tuple(_convert(k, v, f"{where}[{i}]") for i, (k, v) in enumerate(zip(kinds, value)))


def _choice(obj, name: str, choices, section: str | None = None) -> None:
    if getattr(obj, name) not in choices:
        where = f"{section or _section(obj)}.{name}"
        raise ConfigError(
            f"{where}: must be one of {', '.join(map(repr, choices))}, "
            f"got {quoted(getattr(obj, name))}"
        )


def _positive(obj, name: str, allow_zero: bool = False) -> None:
    value = getattr(obj, name)
    if not (value > 0 or (allow_zero and value == 0)):  # NaN too
        raise ConfigError(
            f"{_section(obj)}.{name}: must be {'>= 0' if allow_zero else '> 0'}, "
            f"got {quoted(value)}"
        )


def _section(obj) -> str:
    return {"DataConfig": "data", "TokenizerConfig": "tokenizer", "OptimConfig": "train"}.get(
        type(obj).__name__, type(obj).__name__
    )


def apply_overrides(d: dict, overrides: list[str]) -> dict:
    """Apply ``key.sub=value`` overrides (values parsed as YAML) to a nested dict copy."""
    d = copy.deepcopy(d)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {quoted(item)}: expected KEY=VALUE")
        key, raw = item.split("=", 1)
        node = d
        parts = key.strip().split(".")
        if not all(parts):  # "=3", "train..lr=1", "train.=1": no key to set
            raise ConfigError(
                f"--set {quoted(item)}: expected SECTION.KEY=VALUE, e.g. train.lr=3e-4"
            )
        for part in parts[:-1]:
            if node.get(part) is None:  # absent, or left empty in the YAML (``data:``)
                node[part] = {}
            node = node[part]
            if not isinstance(node, dict):
                raise ConfigError(f"--set {_short(key)}: {_short(part)} is not a section")
        try:
            node[parts[-1]] = yaml.load(raw, Loader=yaml_loader())
        except yaml.YAMLError as err:
            raise ConfigError(
                f"--set {_short(key)}: the value is not valid YAML ({yaml_error(err)})"
            ) from None
    return d


def load_yaml(path: str | Path, overrides: list[str] | None = None) -> Recipe:
    """Read a YAML recipe, apply ``--set`` overrides and validate it."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{path}: is a directory, not a YAML config file")
    try:
        if not stat.S_ISREG(path.stat().st_mode):  # /dev/zero would be read forever
            raise ConfigError(f"{path}: not a regular file, not a YAML config file")
        with path.open("rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
        if len(data) > MAX_CONFIG_BYTES:
            raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES // 2**20} MiB, not a recipe")
        text = data.decode("utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not valid UTF-8 (byte {err.start + 1})") from None
    except OSError as err:
        raise ConfigError(f"{path}: cannot read: {err.strerror or err}") from None
    try:
        d = yaml.load(text, Loader=yaml_loader())
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {yaml_error(err)}") from None
    if d is None:
        d = {}
    if not isinstance(d, dict):
        raise ConfigError(
            f"{path}: expected a mapping of sections at the top, got a {type(d).__name__}"
        )
    try:
        return recipe_from_dict(apply_overrides(d, overrides or []))
    except ConfigError as err:
        raise ConfigError(f"{_origin(path, d, overrides or [], err)}: {err}") from None


def _origin(path: Path, d: dict, overrides: list[str], err: ConfigError) -> str:
    """Where the value that ``err`` refuses was given: the file, when the file alone has
    the same error, else the ``--set`` of that key (or the file with all the ``--set``s)."""
    if not overrides or str(err).startswith("--set "):
        return str(path)
    try:
        recipe_from_dict(d)
    except ConfigError as alone:
        if str(alone) == str(err):
            return str(path)
    key = str(err).split(":", 1)[0].split("[", 1)[0]  # "train.betas[0]" -> "train.betas"
    for item in reversed(overrides):  # the last --set of a key is the one that holds
        name = item.split("=", 1)[0].strip()
        if key == name or key.startswith(name + ".") or name.startswith(key + "."):
            return f"--set {_short(item)}"
    return f"{path} with --set {' --set '.join(_short(item, 40) for item in overrides)}"


def _short(text, limit: int = 80) -> str:
    """``text`` cut to ``limit`` characters (``…`` marks a cut): a key or a ``--set`` item
    named in an error, unquoted (a key that is not a string: :func:`quoted`)."""
    if not isinstance(text, str):
        return quoted(text, limit)
    return text if len(text) <= limit else text[: limit - 1] + "…"
