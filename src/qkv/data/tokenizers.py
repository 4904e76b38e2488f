"""Tokenizers with one interface: BPE (Hugging Face ``tokenizers``), characters, words.

Every tokenizer maps text to ids and back, reserves the same special ids
(``<pad>`` = 0, ``<unk>`` = 1, ``<s>`` = 2, ``</s>`` = 3), and stores itself as JSON so
that a checkpoint can hold it without pickle. ``encode`` adds no ``<s>``/``</s>``
(batching does) and never returns a special id for text: "<s>" typed in a sentence is
text (BPE, characters) or an unknown word (words); ``decode`` drops pad/bos/eos ids.

Detokenisation is exact, ``decode(encode(s)) == s``, for normal text: no leading
whitespace, no tabs or line breaks, and (for BPE and characters) only characters seen in
training; the word tokenizer also needs single spaces (U+0020) between words, and keeps
any other character, a no-break space included, inside its word. BPE uses the
SentencePiece convention (Kudo & Richardson, 2018): spaces become "▁" and are part of the
following token, so the decoder can put them back.
"""

from __future__ import annotations

import json
import operator
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = [
    "SPECIAL_TOKENS",
    "PAD_ID",
    "UNK_ID",
    "BOS_ID",
    "EOS_ID",
    "Tokenizer",
    "CharTokenizer",
    "WordTokenizer",
    "BPETokenizer",
    "bytes_to_unicode",
    "token_label",
    "tokenizer_from_json",
    "train_tokenizers",
]

SPECIAL_TOKENS = ("<pad>", "<unk>", "<s>", "</s>")
PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
FORMAT_VERSION = 1


class Tokenizer:
    """The interface every qkv tokenizer implements."""

    pad_id: int = PAD_ID
    unk_id: int = UNK_ID
    bos_id: int = BOS_ID
    eos_id: int = EOS_ID
    kind: str = ""

    @property
    def vocab_size(self) -> int:
        """Number of ids, special tokens included."""
        raise NotImplementedError

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, without ``<s>``/``</s>``."""
        raise NotImplementedError

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids`` (ints, or a 1-D integer tensor); pad, ``<s>`` and ``</s>`` are dropped.

        Raises:
            ValueError: an id outside the vocabulary.
            TypeError: an id that is not an integer (a 2-D tensor: decode one row at a time).
        """
        raise NotImplementedError

    def _checked_ids(self, ids: Iterable[int]) -> list[int]:
        """``ids`` as Python ints, checked, without pad, ``<s>`` and ``</s>``.

        A tensor's elements are 0-d tensors, which hash by identity: ``tensor(0) in {0}`` is
        False, so without the conversion "<pad>" and "<s>" were decoded as text.
        """
        size, kept = self.vocab_size, []
        for item in ids:
            try:
                index = operator.index(item)
            except TypeError:
                raise TypeError(
                    f"decode takes a sequence of integer ids, not of {type(item).__name__} "
                    "(decode a batch one row at a time)"
                ) from None
            if not 0 <= index < size:
                raise ValueError(f"id {index} is outside the vocabulary (0..{size - 1})")
            if index not in (PAD_ID, BOS_ID, EOS_ID):
                kept.append(index)
        return kept

    def id_to_token(self, index: int) -> str:
        """The token string of one id (for showing attention over tokens)."""
        raise NotImplementedError

    def tokens(self, text: str) -> list[str]:
        """The token strings ``text`` splits into."""
        return [self.id_to_token(i) for i in self.encode(text)]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Encode many texts (faster than a loop for BPE)."""
        return [self.encode(t) for t in texts]

    def _payload(self) -> dict[str, Any]:
        raise NotImplementedError

    def to_json(self) -> str:
        """The tokenizer as a JSON string (read back with :func:`tokenizer_from_json`)."""
        return json.dumps(
            {"type": self.kind, "version": FORMAT_VERSION, **self._payload()}, ensure_ascii=False
        )

    @classmethod
    def from_json(cls, text: str) -> Tokenizer:
        """Rebuild a tokenizer from :meth:`to_json` output; the type must match ``cls``."""
        tok = tokenizer_from_json(text)
        if not isinstance(tok, cls):
            raise ValueError(f"JSON holds a {tok.kind!r} tokenizer, not {cls.kind!r}")
        return tok


class _VocabTokenizer(Tokenizer):
    """Shared code of the character and word tokenizers: a list of token strings."""

    def __init__(self, tokens: Sequence[str]) -> None:
        tokens = list(tokens)
        if tuple(tokens[: len(SPECIAL_TOKENS)]) != SPECIAL_TOKENS:
            tokens = list(SPECIAL_TOKENS) + [t for t in tokens if t not in SPECIAL_TOKENS]
        if len(set(tokens)) != len(tokens):
            raise ValueError("vocabulary has duplicate tokens")
        self.itos = tokens
        self.stoi = {t: i for i, t in enumerate(tokens)}
        # what text can map to: "<pad>", "<s>" or "</s>" typed in text is an unknown word
        self._text_ids = {t: i for t, i in self.stoi.items() if i >= len(SPECIAL_TOKENS)}

    @classmethod
    def _count(cls, texts: Iterable[str]) -> Counter[str]:
        raise NotImplementedError

    @classmethod
    def train(
        cls, texts: Iterable[str], max_size: int | None = None, min_freq: int = 1
    ) -> _VocabTokenizer:
        """Build the vocabulary from training texts, most frequent tokens first.

        Args:
            texts: training sentences.
            max_size: largest vocabulary, special tokens included (None: no limit).
            min_freq: drop tokens seen fewer times.

        Returns:
            The tokenizer.
        """
        counts = cls._count(texts)
        for special in SPECIAL_TOKENS:  # "<unk>" written in a corpus is an unknown word
            counts.pop(special, None)
        kept = (t for t, c in counts.items() if c >= min_freq)
        ordered = sorted(kept, key=lambda t: (-counts[t], t))
        if max_size is not None:
            ordered = ordered[: max(0, max_size - len(SPECIAL_TOKENS))]
        return cls(list(SPECIAL_TOKENS) + ordered)

    @property
    def vocab_size(self) -> int:
        return len(self.itos)

    def id_to_token(self, index: int) -> str:
        return self.itos[index]

    def _ids(self, pieces: Iterable[str]) -> list[int]:
        return [self._text_ids.get(p, UNK_ID) for p in pieces]

    def _pieces(self, ids: Iterable[int]) -> list[str]:
        return [self.itos[i] for i in self._checked_ids(ids)]

    def _payload(self) -> dict[str, Any]:
        return {"vocab": self.itos}


class CharTokenizer(_VocabTokenizer):
    """One token per Unicode character (spaces included)."""

    kind = "char"

    @classmethod
    def _count(cls, texts: Iterable[str]) -> Counter[str]:
        counts: Counter[str] = Counter()
        for text in texts:
            counts.update(text)
        return counts

    def encode(self, text: str) -> list[int]:
        return self._ids(text)

    def decode(self, ids: Iterable[int]) -> str:
        return "".join(self._pieces(ids))


def _words(text: str) -> list[str]:
    """The words of ``text``: split on the space U+0020 alone, as BPE's pre-tokenizer is.

    ``str.split()`` also splits on no-break spaces (U+00A0, U+202F: "Nummer\u00a028" in
    Multi30k, "ici\u202f!" in French) and other Unicode spaces, which decoding then turned
    into plain spaces.
    """
    return [word for word in text.split(" ") if word]


class WordTokenizer(_VocabTokenizer):
    """One token per space-separated word; decoding joins words with single spaces."""

    kind = "word"

    @classmethod
    def _count(cls, texts: Iterable[str]) -> Counter[str]:
        counts: Counter[str] = Counter()
        for text in texts:
            counts.update(_words(text))
        return counts

    def encode(self, text: str) -> list[int]:
        return self._ids(_words(text))

    def decode(self, ids: Iterable[int]) -> str:
        return " ".join(self._pieces(ids))


def _hf() -> Any:
    try:
        import tokenizers
    except ModuleNotFoundError as err:
        raise ModuleNotFoundError(
            "BPE needs the 'tokenizers' package: pip install 'qkv[hf]'", name="tokenizers"
        ) from err
    return tokenizers


def _without_special_merges(hf_tokenizer: Any) -> Any:
    """``hf_tokenizer`` without the merges whose result is a special token's string.

    Trained on text that holds "<s>" or "<pad>" (markup, corpora that write "<unk>"), BPE
    learns merges such as ("<", "s>") whose result is looked up in the vocabulary, where
    "<s>" is id 2: "b<s>" then encoded to [▁, b, <s>=BOS] and "d</s>x" carried an EOS, as
    a "<pad>" word once did for the word tokenizer. Without those merges such text stays
    text (pieces "<", "s>"), and decodes back to itself.
    """
    data = json.loads(hf_tokenizer.to_str())
    model = data.get("model") or {}
    merges = model.get("merges") or []
    pieces = [m if isinstance(m, list) else m.split(" ", 1) for m in merges]
    kept = [m for m, p in zip(merges, pieces) if "".join(p) not in SPECIAL_TOKENS]
    if len(kept) == len(merges):
        return hf_tokenizer
    model["merges"] = kept
    return _hf().Tokenizer.from_str(json.dumps(data))


class BPETokenizer(Tokenizer):
    """Byte-pair encoding (Sennrich et al., 2016) trained with Hugging Face ``tokenizers``."""

    kind = "bpe"

    def __init__(self, hf_tokenizer: Any) -> None:
        for index, token in enumerate(SPECIAL_TOKENS):
            if hf_tokenizer.token_to_id(token) != index:
                raise ValueError(f"BPE vocabulary must have {token} at id {index}")
        hf_tokenizer = _without_special_merges(hf_tokenizer)
        if hasattr(hf_tokenizer, "encode_special_tokens"):
            hf_tokenizer.encode_special_tokens = True  # "<s>" in text is text, not an id
        self.hf = hf_tokenizer

    @classmethod
    def train(
        cls, texts: Iterable[str], vocab_size: int = 8000, min_frequency: int = 2
    ) -> BPETokenizer:
        """Learn a BPE vocabulary from training sentences.

        Args:
            texts: training sentences.
            vocab_size: target vocabulary size, special tokens included (the result is larger
                when the training text has more distinct characters than this).
            min_frequency: merges must be seen at least this often.

        Returns:
            The trained tokenizer.
        """
        hf = _hf()
        tok = hf.Tokenizer(hf.models.BPE(unk_token="<unk>"))
        tok.pre_tokenizer = hf.pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
        tok.decoder = hf.decoders.Metaspace(replacement="▁", prepend_scheme="always")
        trainer = hf.trainers.BpeTrainer(
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            special_tokens=list(SPECIAL_TOKENS),
            show_progress=False,
        )
        tok.train_from_iterator(texts, trainer)
        return cls(tok)

    @property
    def vocab_size(self) -> int:
        return self.hf.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self.hf.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self.hf.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        return self.hf.decode(self._checked_ids(ids), skip_special_tokens=False)

    def id_to_token(self, index: int) -> str:
        return self.hf.id_to_token(index)

    def _payload(self) -> dict[str, Any]:
        return {"tokenizer": json.loads(self.hf.to_str())}


def tokenizer_from_json(text: str) -> Tokenizer:
    """Rebuild any qkv tokenizer from the JSON that its ``to_json`` wrote.

    Args:
        text: the JSON string.

    Returns:
        A :class:`BPETokenizer`, :class:`CharTokenizer` or :class:`WordTokenizer`.

    Raises:
        ValueError: the JSON is not a qkv tokenizer (the message says why).
    """
    try:
        data = json.loads(text)
        kind = data["type"]
    except (json.JSONDecodeError, TypeError, KeyError) as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ValueError(f"not a qkv tokenizer JSON ({first})") from None
    if data.get("version") != FORMAT_VERSION:
        version = data.get("version")
        raise ValueError(f"tokenizer JSON version {version!r}, expected {FORMAT_VERSION}")
    if kind in ("char", "word"):
        vocab = data.get("vocab")
        if not isinstance(vocab, list) or not all(isinstance(t, str) for t in vocab):
            raise ValueError(f"{kind} tokenizer JSON: 'vocab' must be a list of strings")
        if tuple(vocab[: len(SPECIAL_TOKENS)]) != SPECIAL_TOKENS:  # else every id would shift
            raise ValueError(
                f"{kind} tokenizer JSON: 'vocab' must start with {', '.join(SPECIAL_TOKENS)}"
            )
        return (CharTokenizer if kind == "char" else WordTokenizer)(vocab)
    if kind == "bpe":
        if not isinstance(data.get("tokenizer"), dict):
            raise ValueError("bpe tokenizer JSON: 'tokenizer' must be an object")
        try:
            hf = _hf().Tokenizer.from_str(json.dumps(data["tokenizer"]))
        except Exception as err:  # tokenizers raises its own Exception subclass
            first = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise ValueError(f"bpe tokenizer JSON: not readable by tokenizers ({first})") from None
        return BPETokenizer(hf)
    raise ValueError(f"unknown tokenizer type {kind!r}; expected bpe, char or word")


def train_tokenizers(
    kind: str,
    src_texts: Sequence[str],
    tgt_texts: Sequence[str],
    *,
    vocab_size: int = 8000,
    joint: bool = True,
) -> tuple[Tokenizer, Tokenizer]:
    """Train source and target tokenizers, with one joint or two separate vocabularies.

    Args:
        kind: ``"bpe"``, ``"char"`` or ``"word"``.
        src_texts: source training sentences.
        tgt_texts: target training sentences.
        vocab_size: vocabulary size (per vocabulary); for char/word it is a maximum.
        joint: one vocabulary trained on both sides (the same object is returned twice).

    Returns:
        ``(src_tokenizer, tgt_tokenizer)``.
    """

    def train(texts: Sequence[str]) -> Tokenizer:
        if kind == "bpe":
            return BPETokenizer.train(texts, vocab_size)
        if kind == "char":
            return CharTokenizer.train(texts, max_size=vocab_size)
        if kind == "word":
            return WordTokenizer.train(texts, max_size=vocab_size)
        raise ValueError(f"unknown tokenizer kind {kind!r}; expected bpe, char or word")

    if joint:
        tok = train(list(src_texts) + list(tgt_texts))
        return tok, tok
    return train(src_texts), train(tgt_texts)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's spelling of bytes (byte-level BPE): printable Latin-1 bytes stand for
    themselves, the other 68 (controls, space, ...) get the characters from U+0100 on, in
    byte order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    keep += range(ord("®"), ord("ÿ") + 1)
    spelling = {b: chr(b) for b in keep}
    others = [b for b in range(256) if b not in spelling]
    spelling |= {b: chr(256 + i) for i, b in enumerate(others)}
    return dict(sorted(spelling.items()))


_BYTE_OF_CHAR = {c: b for b, c in bytes_to_unicode().items()}


def token_label(tokenizer: Any, token_id: int) -> str:
    """What one token stands for, to label it in a view: its text, a line break as ``↵``
    and a tab as ``→``. A byte-level piece that holds part of a character (a Hangul
    syllable or an emoji split over tokens) decodes alone to U+FFFD, the same for every
    such piece; its bytes are shown instead, e.g. ``'‹ED 95›'``, after the text of the
    whole characters it holds.

    Args:
        tokenizer: a Hugging Face ``tokenizers.Tokenizer`` or a qkv :class:`Tokenizer`.
        token_id: the token.
    """
    hf = tokenizer.hf if isinstance(tokenizer, BPETokenizer) else tokenizer
    if isinstance(tokenizer, Tokenizer) and hf is tokenizer:  # characters, words
        special = token_id < len(SPECIAL_TOKENS)
        text = tokenizer.id_to_token(token_id) if special else tokenizer.decode([token_id])
    else:
        text = hf.decode([token_id], skip_special_tokens=False)
        piece = hf.id_to_token(token_id)
        if "\ufffd" in text and piece is not None and set(piece) <= _BYTE_OF_CHAR.keys():
            text = _bytes_label(bytes(_BYTE_OF_CHAR[c] for c in piece))
    return text.replace("\n", "↵").replace("\t", "→")


def _bytes_label(raw: bytes) -> str:
    """The text of ``raw``, each run of bytes that is no whole UTF-8 character as its hex
    digits between ``‹›``."""
    out = []
    while raw:
        try:
            out.append(raw.decode("utf-8"))
            break
        except UnicodeDecodeError as err:  # the text before the bad bytes, then the bytes
            out.append(raw[: err.start].decode("utf-8"))
            out.append(f"‹{raw[err.start : err.end].hex(' ').upper()}›")
            raw = raw[err.end :]
    return "".join(out)
