"""Turn a recipe's data section into tokenised training, validation and test sets."""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass

from qkv.data.corpus import read_parallel, read_tsv
from qkv.data.tokenizers import Tokenizer, train_tokenizers
from qkv.data.toy import make_splits

__all__ = ["Prepared", "prepare", "load_pairs"]

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


def load_pairs(data) -> tuple[Pairs, Pairs, Pairs]:
    """Read or generate the (source, target) text pairs of train, valid and test."""
    if data.kind == "toy":
        splits = make_splits(
            data.n_train,
            data.n_valid,
            data.n_test,
            seed=data.seed,
            min_len=data.min_len,
            max_len=data.max_len,
        )
        return tuple([(p.ko, p.en) for p in splits[name]] for name in ("train", "valid", "test"))
    if data.kind == "files":
        read = {}
        for name in ("train", "valid", "test"):
            files = getattr(data, name)
            limit = data.max_tokens if name == "train" else None
            ratio = data.max_ratio if name == "train" else None
            read[name] = (
                read_parallel(*files, max_len=limit, max_ratio=ratio).pairs() if files else []
            )
        return read["train"], read["valid"], read["test"]
    corpus = read_tsv(
        data.path,
        src_column=data.src_column,
        tgt_column=data.tgt_column,
        max_len=data.max_tokens,
        max_ratio=data.max_ratio,
    )
    return split_held_out(corpus.pairs(), data.n_valid, data.n_test, data.seed)


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
