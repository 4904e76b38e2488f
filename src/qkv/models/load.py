"""One function loads every model qkv reads, with what using it needs.

:func:`load` takes a path and gives a :class:`Loaded`: the model in eval mode, its
tokenizer, its chat template and special tokens, its context, and what kind of model it
is. The path may be

- a GGUF file (llama.cpp's format; a LLaMA-family decoder);
- a Hugging Face folder (``config.json`` and the weights): LLaMA, Mistral, Qwen2 or GPT-2
  decoders, BERT-family encoders, ViT and DeiT image classifiers;
- a checkpoint written by ``qkv train`` (a ``.safetensors`` file, or its run folder: its
  ``best`` checkpoint, else its ``last``): a language model with the tokenizer it was
  trained with, a translator with its two, an image classifier with its class names.

:func:`describe` says what kind a path holds from its config or header alone, before any
weight is read, so that a command can refuse the wrong kind of model in one line.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from qkv.data.tokenizers import token_label, tokenizer_from_json
from qkv.engine import TextStream, encode_text, generate
from qkv.errors import CheckpointError, ModelFileError, UserError
from qkv.files import parse_json
from qkv.models.checkpoint import load_checkpoint
from qkv.models.pretrained.bert import BertConfig, BertModel
from qkv.models.pretrained.gguf import read_gguf_metadata
from qkv.models.pretrained.gguf_tokenizer import (
    chat_template_of,
    render_chat,
    special_tokens_of,
    tokenizer_from_gguf,
)
from qkv.models.pretrained.gpt import GPT, GPTConfig
from qkv.models.pretrained.hf import read_config, read_json
from qkv.models.pretrained.hf_tokenizer import load_tokenizer
from qkv.models.pretrained.llama import Llama
from qkv.models.pretrained.vit import ViT
from qkv.models.tensor_file import TensorFile

__all__ = [
    "CAUSAL_LM",
    "ENCODER",
    "IMAGE_CLASSIFIER",
    "KINDS",
    "TRANSLATOR",
    "Loaded",
    "checkpoint_file",
    "describe",
    "load",
    "load_trained",
]

log = logging.getLogger(__name__)

CAUSAL_LM, ENCODER, TRANSLATOR, IMAGE_CLASSIFIER = (
    "causal language model",
    "encoder",
    "translator",
    "image classifier",
)
KINDS = (CAUSAL_LM, ENCODER, TRANSLATOR, IMAGE_CLASSIFIER)
_LLAMA_TYPES = ("llama", "mistral", "qwen2")
_VIT_TYPES = ("vit", "deit")
_CHECKPOINT_KINDS = {
    "gpt": CAUSAL_LM,
    "llama": CAUSAL_LM,
    "transformer": TRANSLATOR,
    "rnn": TRANSLATOR,
    "vit": IMAGE_CLASSIFIER,
    "cnn": IMAGE_CLASSIFIER,
}


@dataclass
class Loaded:
    """A model with what using it needs (see :func:`load`).

    Attributes:
        model: the model, in eval mode.
        tokenizer: the tokenizer of its text (a Hugging Face ``tokenizers.Tokenizer`` or a
            qkv :class:`~qkv.data.tokenizers.Tokenizer`; a translator's target side);
            ``None`` for an image classifier.
        kind: one of :data:`KINDS`.
        path: the file or folder it came from.
        name: a short name for titles (the folder's or file's name).
        chat_template: the Jinja chat template, or ``None``.
        special_tokens: ``bos_token``, ``eos_token``, ... as the template sees them.
        context: the positions the model was trained for (``None``: not known).
        source_tokenizer: a translator's source side.
        labels: an image classifier's class names.
        extra: what a qkv checkpoint holds beside the weights (its recipe, ...).
        model_type: the checkpoint's model type (``"gpt"``, ``"transformer"``, ...), a
            Hugging Face folder's ``model_type``, or ``"gguf"``.
        context_policy: what :meth:`generate` does past the model's positions
            (:data:`qkv.engine.CONTEXT_POLICIES`): ``"crop"`` for a language model trained
            by ``qkv train`` (nanoGPT's sampling), else ``"error"``.
    """

    model: nn.Module
    tokenizer: Any
    kind: str
    path: Path
    name: str = ""
    chat_template: str | None = None
    special_tokens: dict[str, str] = field(default_factory=dict)
    context: int | None = None
    source_tokenizer: Any = None
    labels: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)
    model_type: str = ""
    context_policy: str = "error"

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """The token ids of ``text`` (with the tokenizer's own special tokens, a BOS, unless
        ``add_special_tokens=False``)."""
        return encode_text(self.tokenizer, text, add_special_tokens)

    def decode(self, ids: Sequence[int]) -> str:
        """The text of token ids, special tokens left out."""
        return self.tokenizer.decode(list(ids))

    def token_label(self, token_id: int) -> str:
        """What one token stands for, to label it in a view
        (:func:`~qkv.data.tokenizers.token_label`)."""
        return token_label(self.tokenizer, token_id)

    def chat_prompt(self, messages: list[dict[str, str]], add_generation_prompt: bool = True):
        """The prompt text of a conversation in the model's chat template (tokenize it with
        ``add_special_tokens=False``).

        Raises:
            ModelFileError: the model has no chat template, or it fails to render.
        """
        if self.chat_template is None:
            raise ModelFileError(f"{self.path}: the model has no chat template")
        return render_chat(
            self.chat_template, messages, add_generation_prompt, **self.special_tokens
        )

    def generate(self, prompt: str, max_new_tokens: int = 128, **options: Any) -> TextStream:
        """Continue ``prompt``, streamed: :func:`qkv.generate` with this model and tokenizer
        (``options`` as there; ``context`` defaults to :attr:`context_policy`)."""
        options.setdefault("context", self.context_policy)
        return generate(self.model, self.tokenizer, prompt, max_new_tokens, **options)

    def chat(
        self, messages: list[dict[str, str]], max_new_tokens: int = 256, **options: Any
    ) -> TextStream:
        """The assistant's answer to a conversation, streamed (the model's chat template
        renders ``messages``; ``options`` as :func:`qkv.generate`)."""
        prompt = self.chat_prompt(messages)
        return generate(
            self.model,
            self.tokenizer,
            self.encode(prompt, add_special_tokens=False),
            max_new_tokens,
            **options,
        )

    @torch.no_grad()
    def attention(self, text: str, text_b: str | None = None) -> tuple[Tensor, list[str]]:
        """The attention probabilities of every layer and head on one input, from one
        forward pass of the model.

        An encoder reads the text (or the pair, with token type ids 0 then 1) with its
        tokenizer's special tokens; a causal language model reads the text alone, each
        token attending to itself and the tokens before it.

        Returns:
            ``(maps, tokens)``: maps ``(L, H, T, T)`` float (rows are queries, each a
            distribution over the keys), and the ``T`` tokens' labels (an encoder's word
            pieces; a decoder's :meth:`token_label` s).

        Raises:
            ValueError: no token, a pair given to a decoder, more tokens than a decoder's
                positions, or ids the model lacks.
        """
        device = next(self.model.parameters()).device
        if self.kind == ENCODER:
            enc = self.tokenizer.encode(text, text_b) if text_b else self.tokenizer.encode(text)
            if enc.overflowing:
                log.warning("input truncated to %d tokens", len(enc.ids))
            out = self.model(
                torch.tensor([enc.ids], device=device),
                attention_mask=torch.tensor([enc.attention_mask], device=device),
                token_type_ids=torch.tensor([enc.type_ids], device=device),
                need_weights=True,
            )
            labels = list(enc.tokens)
        elif self.kind == CAUSAL_LM:
            if text_b is not None:
                raise ValueError("a language model reads one text, not a pair")
            ids = self.encode(text)
            if not ids:
                raise ValueError(f"{text!r} gives no token")
            limit = getattr(self.model, "max_positions", None)
            if limit is not None and len(ids) > limit:
                raise ValueError(
                    f"the text has {len(ids)} tokens, the model reads at most {limit} "
                    "(model.max_len)"
                )
            out = self.model(torch.tensor([ids], device=device), need_weights=True)
            labels = [self.token_label(i) for i in ids]
        else:
            raise ValueError(f"a {self.kind} shows its attention elsewhere (qkv show --help)")
        maps = torch.stack([a[0] for a in out.attentions]).float().cpu()  # (L, H, T, T)
        return maps, labels


def checkpoint_file(path: str | Path) -> Path | None:
    """The qkv checkpoint that ``path`` names: the file, or a run folder's
    ``best.safetensors``, else its ``last.safetensors``, else its first checkpoint;
    ``None`` when there is none (a Hugging Face folder: one with ``config.json``)."""
    path = Path(path)
    if path.is_file():
        return path if path.suffix == ".safetensors" else None
    if not path.is_dir() or (path / "config.json").exists():
        return None
    for name in ("best", "last"):
        if (path / f"{name}.safetensors").is_file():
            return path / f"{name}.safetensors"
    return next((p for p in sorted(path.glob("*.safetensors")) if p.is_file()), None)


def describe(path: str | Path) -> tuple[str, str]:
    """What ``path`` holds, read from its config or header alone: ``(kind, what)``, the
    kind one of :data:`KINDS` and ``what`` a few words naming the model (its
    ``model_type``, architecture or checkpoint type).

    Raises:
        ModelFileError: no such file or folder, or nothing qkv reads.
    """
    path = Path(path)
    if not path.exists():
        what = "checkpoint file" if path.suffix == ".safetensors" else "model file or folder"
        raise ModelFileError(f"{path}: no such {what}{_hub_hint(str(path))}")
    if path.suffix == ".gguf" and path.is_file():
        return CAUSAL_LM, "a GGUF file"
    checkpoint = checkpoint_file(path)
    if checkpoint is not None:
        kind = _checkpoint_type(checkpoint)
        if kind not in _CHECKPOINT_KINDS:
            raise ModelFileError(f"{checkpoint}: not a qkv checkpoint")
        return _CHECKPOINT_KINDS[kind], f"a qkv {kind} checkpoint"
    if path.is_file():
        raise ModelFileError(
            f"{path}: not a model file qkv reads (a .gguf file, a qkv .safetensors "
            "checkpoint, or a Hugging Face folder)"
        )
    if not (path / "config.json").is_file():
        raise ModelFileError(
            f"{path}: a folder without best.safetensors or last.safetensors (a run of qkv "
            "train) or config.json (a Hugging Face model)"
        )
    try:
        model_type = read_config(path).get("model_type", "llama")
    except (OSError, ValueError) as err:
        raise ModelFileError(
            f"{path}: not a Hugging Face model folder ({_one_line(err)})"
        ) from None
    what = f"model_type {model_type!r}"
    if model_type in _LLAMA_TYPES or model_type == "gpt2":
        return CAUSAL_LM, what
    if model_type in _VIT_TYPES:
        return IMAGE_CLASSIFIER, what
    return ENCODER, what  # the BERT family; BertConfig names a type it does not read


def load(path: str | Path, dtype: torch.dtype | str | None = None) -> Loaded:
    """The model at ``path`` (see the module docstring), in eval mode, with its tokenizer,
    chat template, special tokens and context.

    Args:
        path: a GGUF file, a Hugging Face folder, or a qkv checkpoint (file or run folder).
        dtype: float32 (``None``), the checkpoint's own type (``"auto"``) or a floating
            ``torch.dtype``, for GGUF files and Hugging Face folders; a qkv checkpoint
            comes back in the type it was saved in.

    Raises:
        UserError: (a subclass) no such path, a file or folder qkv does not read, a
            config or weights that do not fit (one line naming the file and what is
            wrong).
    """
    path = Path(path)
    kind, _ = describe(path)
    checkpoint = checkpoint_file(path)
    if checkpoint is not None:
        return load_trained(checkpoint)
    if path.suffix == ".gguf" and path.is_file():
        model = Llama.from_pretrained(path, dtype=dtype)
        meta = read_gguf_metadata(path)
        tokenizer = tokenizer_from_gguf(meta, source=str(path))
        return Loaded(
            model,
            tokenizer,
            CAUSAL_LM,
            path,
            path.name,
            chat_template_of(meta),
            special_tokens_of(meta),
            model.config.max_len,
            model_type="gguf",
        )
    return _from_folder(path, kind, dtype)


def _from_folder(path: Path, kind: str, dtype: torch.dtype | str | None) -> Loaded:
    """A Hugging Face folder's model and tokenizer; unreadable files are user errors."""
    from safetensors import SafetensorError

    config = read_config(path)
    model_type = config.get("model_type", "llama")
    try:
        if kind == IMAGE_CLASSIFIER:
            model = ViT.from_pretrained(path, dtype=dtype)
            name = path.resolve().name
            return Loaded(
                model, None, kind, path, name, labels=model.config.labels, model_type=model_type
            )
        if kind == ENCODER:
            BertConfig.from_hf(config)  # another model type is named before anything is read
            tokenizer = load_tokenizer(path)
            model = BertModel.from_pretrained(path, dtype=dtype)
            positions = model.config.max_length
            limit = (tokenizer.truncation or {}).get("max_length")
            if limit is None or limit > positions:  # never past the positions
                tokenizer.enable_truncation(max_length=positions)
            name = path.resolve().name
            return Loaded(
                model, tokenizer, kind, path, name, context=positions, model_type=model_type
            )
        cls = GPT if model_type == "gpt2" else Llama
        if cls is GPT:
            GPTConfig.from_hf(config)
        tokenizer = load_tokenizer(path)
        model = cls.from_pretrained(path, dtype=dtype)
    except UserError:
        raise
    except (OSError, ValueError, KeyError, TypeError, RuntimeError, SafetensorError) as err:
        raise ModelFileError(
            f"{path}: cannot load a {model_type} model: {_one_line(err)}"
        ) from None
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return Loaded(
        model,
        tokenizer,
        CAUSAL_LM,
        path,
        path.resolve().name,
        _folder_chat_template(path),
        _folder_special_tokens(path),
        model.config.max_len,
        model_type=model_type,
    )


def load_trained(path: str | Path) -> Loaded:
    """A checkpoint written by ``qkv train`` (a ``.safetensors`` file): the model with the
    tokenizers it was trained with (a translator's two) or its class names.

    Raises:
        CheckpointError: what :func:`~qkv.models.checkpoint.load_checkpoint` refuses, no
            tokenizer or one that cannot be read, or tokenizers of another run (their
            vocabularies do not fit the model's).
    """
    path = Path(path)
    ckpt = load_checkpoint(path, training_state=False)
    kind = _CHECKPOINT_KINDS[ckpt.model_type]
    model, tokenizers = ckpt.model.eval(), ckpt.tokenizers
    if kind == IMAGE_CLASSIFIER:
        labels = getattr(model.config, "labels", ())
        if not labels:
            try:
                labels = tuple(parse_json(tokenizers["tgt"])["names"])
            except (KeyError, ValueError, TypeError):
                labels = tuple(str(i) for i in range(model.config.num_labels))
        return Loaded(
            model,
            None,
            kind,
            path,
            _run_name(path),
            labels=labels,
            extra=ckpt.extra,
            model_type=ckpt.model_type,
        )
    sides = ("tgt",) if kind == CAUSAL_LM else ("src", "tgt")
    read = {}
    if not set(sides) <= set(tokenizers):
        raise CheckpointError(f"{path}: the checkpoint holds no tokenizers")
    for side in sides:
        try:
            read[side] = tokenizer_from_json(tokenizers[side])
        except (ValueError, ModuleNotFoundError) as err:
            raise CheckpointError(f"{path}: its {side} tokenizer cannot be read: {err}") from None
    _check_vocab_sizes(path, model, read)
    context = getattr(model, "max_positions", None)
    return Loaded(
        model,
        read["tgt"],
        kind,
        path,
        _run_name(path),
        context=context,
        source_tokenizer=read.get("src"),
        extra=ckpt.extra,
        model_type=ckpt.model_type,
        context_policy="crop",
    )


def _check_vocab_sizes(path: Path, model: nn.Module, tokenizers: dict[str, Any]) -> None:
    """The tokenizers give no id the model lacks, and a translator's target tokenizer has
    every id the model outputs (tokenizers of another run would fail midway)."""
    config = model.config
    if "src" not in tokenizers:  # a language model: one tokenizer, one vocabulary
        if tokenizers["tgt"].vocab_size != config.vocab_size:
            raise CheckpointError(
                f"{path}: the tokenizer has {tokenizers['tgt'].vocab_size} ids, the model "
                f"{config.vocab_size}"
            )
        return
    src, tgt = tokenizers["src"].vocab_size, tokenizers["tgt"].vocab_size
    if src > config.src_vocab_size:
        raise CheckpointError(
            f"{path}: its src tokenizer has {src} tokens, more than the model's "
            f"src_vocab_size {config.src_vocab_size}"
        )
    if tgt < config.tgt_vocab_size:
        raise CheckpointError(
            f"{path}: its tgt tokenizer has {tgt} tokens, fewer than the model's "
            f"tgt_vocab_size {config.tgt_vocab_size}"
        )


def _checkpoint_type(path: Path) -> str | None:
    """A qkv checkpoint's model type, read from its header alone; ``None`` for another
    safetensors file."""
    try:
        header = parse_json(TensorFile(path).metadata.get("qkv", "null"))
    except (CheckpointError, ValueError, TypeError, OSError):
        return None
    return header.get("model_type") if isinstance(header, dict) else None


def _run_name(path: Path) -> str:
    """``runs/digits-vit/best.safetensors`` -> ``digits-vit/best.safetensors``."""
    return f"{path.parent.name}/{path.name}" if path.parent.name else path.name


def _folder_chat_template(folder: Path) -> str | None:
    """A Hugging Face folder's chat template: ``chat_template.jinja``, else the
    ``chat_template`` of ``tokenizer_config.json``."""
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    config = folder / "tokenizer_config.json"
    template = read_json(config).get("chat_template") if config.is_file() else None
    return template if isinstance(template, str) else None


def _folder_special_tokens(folder: Path) -> dict[str, str]:
    """The special tokens that ``tokenizer_config.json`` names, as a template sees them."""
    config = folder / "tokenizer_config.json"
    raw = read_json(config) if config.is_file() else {}
    found = {}
    for name in ("bos_token", "eos_token", "unk_token", "pad_token"):
        value = raw.get(name)
        value = value.get("content") if isinstance(value, dict) else value
        if isinstance(value, str):
            found[name] = value
    return found


def _hub_hint(name: str) -> str:
    """For a name shaped like a Hugging Face Hub id (``owner/model``), a hint that qkv
    reads local files and folders only, and how to fetch one."""
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", name) or Path(name).parent.exists():
        return ""  # a path in a folder that is there, or no owner/model shape
    return (
        f"; qkv reads local files and folders only (download the model first, e.g. "
        f"`huggingface-cli download {name} --local-dir {name.split('/')[1]}`)"
    )


def _one_line(err: BaseException, limit: int = 300) -> str:
    """An exception message on one line, cut to ``limit`` characters."""
    text = " ".join(str(err).split()) or type(err).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"
