"""Plain text for language models: files read and checked, a tokenizer, a tail split and
fixed-length random windows (nanoGPT's ``get_batch``).

The files are read as UTF-8 and joined (a line break between two files when the first does
not end with one). A character tokenizer (:class:`~qkv.data.tokenizers.CharTokenizer`,
every character of the whole text, as nanoGPT's ``prepare.py`` builds its vocabulary) or a
byte-level BPE trained on the training part with Hugging Face ``tokenizers`` (every byte is
a token before any merge, so any text encodes and decodes back exactly) turns the text into
ids. The last ``valid_fraction`` of the characters is the validation split, as nanoGPT's
90/10.

A training batch is ``B`` windows of ``T + 1`` consecutive ids from random starts: the
first ``T`` are the input, the last ``T`` the targets (the next token of each position).
"""

from __future__ import annotations

import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from qkv.data.download import fetch_hint
from qkv.data.tokenizers import SPECIAL_TOKENS, BPETokenizer, CharTokenizer, Tokenizer
from qkv.errors import CorpusError

__all__ = [
    "TextSplits",
    "read_text_files",
    "split_text",
    "text_splits",
    "train_byte_bpe",
    "train_text_tokenizer",
    "window_starts",
    "windows",
]

_CHUNK = 1 << 16  # characters per piece that BPE encodes (cut at line ends; run in parallel)


def read_text_files(paths: Sequence[str | Path], key: str = "data.files") -> str:
    """The text of ``paths``, joined; each file checked to be a non-empty UTF-8 text file.

    Raises:
        CorpusError: no file, a missing file, a folder, a file that is empty or holds only
            white space, a NUL byte (a binary file) or bytes that are not UTF-8.
    """
    if not paths:
        raise CorpusError(f"{key}: give at least one plain-text file")
    parts = []
    for name in paths:
        path = Path(name).expanduser()
        where = f"{key}: {name}"
        try:
            mode = path.stat().st_mode
        except FileNotFoundError:
            raise CorpusError(f"{where}: no such file{fetch_hint(path)}") from None
        except OSError as err:
            raise CorpusError(f"{where}: cannot read: {err.strerror or err}") from None
        if stat.S_ISDIR(mode):
            raise CorpusError(f"{where}: is a folder, not a text file")
        if not stat.S_ISREG(mode):
            raise CorpusError(f"{where}: not a regular file")
        try:
            raw = path.read_bytes()
        except OSError as err:
            raise CorpusError(f"{where}: cannot read: {err.strerror or err}") from None
        nul = raw.find(b"\0")
        if nul >= 0:
            raise CorpusError(f"{where}: a binary file, not text (a NUL byte at byte {nul + 1})")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise CorpusError(
                f"{where}: not UTF-8 text (byte 0x{raw[err.start]:02x} at byte {err.start + 1})"
            ) from None
        if not text.strip():
            raise CorpusError(f"{where}: is empty" + " (only white space)" * bool(text))
        parts.append(text)
    joined = parts[0]
    for text in parts[1:]:
        joined += ("" if joined.endswith("\n") else "\n") + text
    return joined


def split_text(text: str, valid_fraction: float) -> tuple[str, str]:
    """``(train, valid)``: the first ``1 - valid_fraction`` of the characters and the rest
    (nanoGPT: ``n = len(data); train = data[:int(n * 0.9)]``)."""
    cut = int(len(text) * (1 - valid_fraction))
    return text[:cut], text[cut:]


def train_byte_bpe(text: str, vocab_size: int) -> BPETokenizer:
    """A byte-level BPE (GPT-2's pre-tokenizer and decoder, no added prefix space) trained
    on ``text``: the special tokens take ids 0-3, then the 256 bytes, then the merges, up to
    ``vocab_size`` ids (at least 260)."""
    try:
        import tokenizers as hf
    except ModuleNotFoundError as err:
        raise ModuleNotFoundError(
            "BPE needs the 'tokenizers' package: pip install 'qkv[hf]'", name="tokenizers"
        ) from err
    tok = hf.Tokenizer(hf.models.BPE())
    tok.pre_tokenizer = hf.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = hf.decoders.ByteLevel()
    trainer = hf.trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=hf.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_chunks(text), trainer)
    return BPETokenizer(tok)


def train_text_tokenizer(kind: str, text: str, train_text: str, vocab_size: int) -> Tokenizer:
    """``kind`` ``"char"``: the characters of the whole ``text`` (at most ``vocab_size`` ids,
    the rarest dropped); ``"bpe"``: :func:`train_byte_bpe` on ``train_text``."""
    if kind == "char":
        return CharTokenizer.train([text], max_size=vocab_size)
    if kind == "bpe":
        return train_byte_bpe(train_text, vocab_size)
    raise ValueError(f"a text tokenizer is 'char' or 'bpe', got {kind!r}")


def _chunks(text: str) -> list[str]:
    """``text`` in pieces of about ``_CHUNK`` characters, each ending at a line end."""
    pieces, start = [], 0
    while start < len(text):
        end = text.find("\n", start + _CHUNK)
        end = len(text) if end < 0 else end + 1
        pieces.append(text[start:end])
        start = end
    return pieces


def _encode(tokenizer: Tokenizer, text: str) -> Tensor:
    """``(N,)`` int64 ids of ``text``."""
    if isinstance(tokenizer, BPETokenizer):
        ids = [i for piece in tokenizer.encode_batch(_chunks(text)) for i in piece]
    else:
        ids = tokenizer.encode(text)
    return torch.tensor(ids, dtype=torch.long)


@dataclass
class TextSplits:
    """The token ids of the training and validation text, and the tokenizer.

    ``src_tok`` and ``tgt_tok`` name the one tokenizer, where a translator's data holds its
    two (a checkpoint stores and a resumed run compares them the same way).
    """

    train: Tensor  # (N_train,) int64
    valid: Tensor  # (N_valid,) int64
    tokenizer: Tokenizer

    @property
    def src_tok(self) -> Tokenizer:
        return self.tokenizer

    @property
    def tgt_tok(self) -> Tokenizer:
        return self.tokenizer


def text_splits(
    files: Sequence[str | Path], kind: str, vocab_size: int, valid_fraction: float
) -> TextSplits:
    """Read ``files``, train the tokenizer and encode the training and validation parts."""
    text = read_text_files(files)
    train_text, valid_text = split_text(text, valid_fraction)
    tokenizer = train_text_tokenizer(kind, text, train_text, vocab_size)
    return TextSplits(_encode(tokenizer, train_text), _encode(tokenizer, valid_text), tokenizer)


def window_starts(length: int, block: int, count: int, generator: torch.Generator) -> Tensor:
    """``(count,)`` random starts of windows of ``block + 1`` ids in ``length`` ids."""
    return torch.randint(length - block, (count,), generator=generator)


def windows(ids: Tensor, starts: Tensor, block: int) -> tuple[Tensor, Tensor]:
    """Inputs and targets ``(B, T)``: ``ids[s : s + T]`` and ``ids[s + 1 : s + T + 1]``."""
    rows = ids[starts[:, None] + torch.arange(block + 1)]  # (B, T + 1)
    return rows[:, :-1], rows[:, 1:]
