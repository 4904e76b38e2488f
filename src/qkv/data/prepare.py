"""Turn a recipe's data section into tokenised training, validation and test sets."""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from pathlib import Path

from qkv.data.corpus import CHARS_PER_WORD, CorpusError, read_parallel, read_tsv
from qkv.data.download import fetch_hint
from qkv.data.tokenizers import Tokenizer, train_tokenizers
from qkv.data.toy import make_splits

__all__ = ["Prepared", "held_out_pairs", "load_pairs", "prepare"]

log = logging.getLogger(__name__)

Pairs = list[tuple[str, str]]


@dataclass
class Prepared:
    """Text pairs of each split, the tokenizers, and the tokenised examples."""

    train: Pairs
    valid: Pairs
    test: Pairs
    src_tok: Tokenizer
    tgt_tok: Tokenizer
    train_examples: list[tuple[list[int], list[int]]]
    valid_examples: list[tuple[list[int], list[int]]]


def _named(key: str, read, *args, **kwargs):
    """``read(*args, **kwargs)``; a file it cannot read is named with the recipe's key."""
    try:
        return read(*args, **kwargs)
    except CorpusError as err:
        raise CorpusError(f"{key}: {err}") from None


def load_pairs(data) -> tuple[Pairs, Pairs, Pairs]:
    """Read or generate the (source, target) text pairs of train, valid and test.

    Raises:
        CorpusError: a file cannot be read, or no training pair is left after filtering
            (the message names the files and the filters).
        CorpusError: also when the toy grammar cannot give what the data section asks for.
    """
    if data.kind == "toy":
        return _toy_pairs(data)
    for key in ("data.train", "data.valid", "data.test", "data.path"):
        files = getattr(data, key.removeprefix("data."))
        _refuse_missing(key, [files] if isinstance(files, str) else files)
    if data.kind == "files":
        train = _named(
            "data.train",
            read_parallel,
            *data.train,
            max_len=data.max_tokens,
            max_ratio=data.max_ratio,
        )
        if not len(train):
            raise CorpusError(f"data.train: {_nothing_left(train.report, data)}")
        _warn_if_filtered("data.train", train.report, data)
        return train.pairs(), _held_out_files(data, "valid"), _held_out_files(data, "test")
    corpus = _named(
        "data.path",
        read_tsv,
        data.path,
        src_column=data.src_column,
        tgt_column=data.tgt_column,
        max_len=data.max_tokens,
        max_ratio=data.max_ratio,
    )
    if not len(corpus):
        raise CorpusError(f"data.path: {_nothing_left(corpus.report, data)}")
    _warn_if_filtered("data.path", corpus.report, data)
    train, valid, test = split_held_out(corpus.pairs(), data.n_valid, data.n_test, data.seed)
    if not train:
        raise CorpusError(
            f"data.path: {data.path}: all {len(corpus)} pairs kept went to the held-out sets "
            f"(data.n_valid {data.n_valid}, data.n_test {data.n_test}); none is left to train on"
        )
    return train, valid, test


def held_out_pairs(data, split: str) -> Pairs:
    """The ``valid`` or ``test`` pairs of ``data``, as :func:`load_pairs` gives them.

    A ``files`` corpus reads that split's two files alone: its training files (the largest,
    and not needed to evaluate) may be elsewhere or gone. Toy and TSV corpora draw their
    held-out pairs from the whole corpus, so they are read whole.
    """
    if split not in ("valid", "test"):
        raise ValueError(f"split must be 'valid' or 'test', got {split!r}")
    if data.kind != "files":
        _, valid, test = load_pairs(data)
        return valid if split == "valid" else test
    return _held_out_files(data, split)


def _refuse_missing(key: str, files) -> None:
    """A file that is not there, named by its key, with the command that fetches it when
    it is a file of a corpus that ``qkv data download`` knows."""
    for file in files:
        if file and not Path(file).exists():
            raise CorpusError(f"{key}: {file}: no such file{fetch_hint(Path(file))}")


def _held_out_files(data, split: str) -> Pairs:
    """A held-out split of a ``files`` corpus, unfiltered (scores count every pair)."""
    files = getattr(data, split)
    if not files:
        return []
    return _named(f"data.{split}", read_parallel, *files, max_len=None, max_ratio=None).pairs()


def _nothing_left(report, data) -> str:
    if not report.total:
        return f"{report.source}: no sentence pairs in the file(s); nothing to train on"
    return (
        f"{report.source}: no training pair left after filtering: of {report.total} pairs, "
        f"{report.empty} have an empty side, {report.too_long} more than data.max_tokens "
        f"({data.max_tokens}) words or {CHARS_PER_WORD}× as many characters, "
        f"{report.ratio} a length ratio over data.max_ratio ({data.max_ratio})"
    )


def _warn_if_filtered(key: str, report, data) -> None:
    """Warn when the length filters drop more than a tenth of the pairs, which only
    ``--verbose`` showed: words are counted between spaces, so a Chinese or Japanese
    sentence is one word, and most of its pairs fail the ratio test."""
    if report.too_long + report.ratio > 0.1 * report.total:
        log.warning(
            "%s: %s; data.max_tokens (%d words) and data.max_ratio (%g) decide what is dropped",
            key,
            report.summary(),
            data.max_tokens,
            data.max_ratio,
        )


def _toy_pairs(data) -> tuple[Pairs, Pairs, Pairs]:
    try:
        splits = make_splits(
            data.n_train,
            data.n_valid,
            data.n_test,
            seed=data.seed,
            min_len=data.min_len,
            max_len=data.max_len,
        )
    except (ValueError, RuntimeError) as err:  # the grammar cannot give what is asked
        raise CorpusError(
            f"data: {err} (data.n_train + n_valid + n_test, data.min_len..max_len)"
        ) from None
    return tuple([(p.ko, p.en) for p in splits[name]] for name in ("train", "valid", "test"))


def split_held_out(
    pairs: Pairs, n_valid: int, n_test: int, seed: int
) -> tuple[Pairs, Pairs, Pairs]:
    """Seeded split where no source sentence of valid/test occurs in train."""
    sources = sorted({s for s, _ in pairs})
    random.Random(seed).shuffle(sources)
    by_source: dict[str, Pairs] = {}
    for s, t in pairs:
        by_source.setdefault(s, []).append((s, t))
    held, splits = 0, {"valid": [], "test": []}
    for name, n in (("valid", n_valid), ("test", n_test)):
        while len(splits[name]) < n and held < len(sources):
            splits[name].extend(by_source[sources[held]])
            held += 1
    train = [p for s in sources[held:] for p in by_source[s]]
    return train, splits["valid"], splits["test"]


def prepare(recipe) -> Prepared:
    """Read the data, train the tokenizers on the training side, and tokenise."""
    train, valid, test = load_pairs(recipe.data)
    tok = recipe.tokenizer
    src_tok, tgt_tok = train_tokenizers(
        tok.kind,
        [s for s, _ in train],
        [t for _, t in train],
        vocab_size=tok.vocab_size,
        joint=tok.joint,
    )

    def encode(pairs: Pairs):
        srcs = src_tok.encode_batch([s for s, _ in pairs])
        tgts = tgt_tok.encode_batch([t for _, t in pairs])
        return [(s, t) for s, t in zip(srcs, tgts) if s and t]

    log.info("data: %d train, %d valid, %d test pairs", len(train), len(valid), len(test))
    return Prepared(train, valid, test, src_tok, tgt_tok, encode(train), encode(valid))
