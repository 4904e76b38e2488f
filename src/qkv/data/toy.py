"""The built-in Korean→English toy corpus: a seeded grammar with gold word alignments.

Korean is subject–object–verb with postpositional particles and prenominal relative
clauses; English is subject–verb–object with articles and postnominal relative clauses.
So "쥐를 잡은 고양이가 잤다" is "the cat that caught the mouse slept": the verb moves
from the end to the middle and the relative clause from before the noun to after it, and
the gold alignment between the two is non-monotonic.

A sentence grows from a minimal clause by random expansions (adjectives, "a", relative
clauses, places, a time adverb, coordinated nouns, coordinated clauses) until it reaches
a length drawn between ``min_len`` and ``max_len`` Korean words. Particles follow the real
rule: 이/을/은/과 after a final consonant (batchim), 가/를/는/와 after a vowel.

Example::

    >>> pair = render(Sentence([Clause(np("고양이"), verb("catch"), np("쥐"))], "past"))
    >>> pair.ko, pair.en
    ('고양이가 쥐를 잡았다', 'the cat caught the mouse')
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

from qkv.data.toy_lexicon import (
    ADJECTIVES,
    NOUNS,
    NP,
    PLACES,
    TENSES,
    TIMES,
    VERBS,
    Adjective,
    Clause,
    Nominal,
    Noun,
    RelClause,
    Sentence,
    has_batchim,
    np,
    particle,
    verb,
)
from qkv.data.toy_render import ToyPair, render

__all__ = [
    "ToyPair",
    "ToyConfig",
    "Nominal",
    "NP",
    "RelClause",
    "Clause",
    "Sentence",
    "has_batchim",
    "particle",
    "np",
    "verb",
    "render",
    "generate_pair",
    "make_splits",
    "toy_splits",
    "sentence_length",
]

MAX_DEPTH = 2  # relative clauses nest at most this deep
MAX_CLAUSES = 3
STALL = 3000  # make_splits gives up after this many duplicate draws in a row
MAX_PAIRS = 1_000_000  # minutes of generation already: more is a typo or a job for files


@dataclass(frozen=True)
class ToyConfig:
    """Sizes and lengths of the toy corpus; lengths count Korean words."""

    seed: int = 0
    n_train: int = 10_000
    n_valid: int = 500
    n_test: int = 500
    min_len: int = 2
    max_len: int = 12

    def __post_init__(self) -> None:
        for name in ("n_train", "n_valid", "n_test"):
            if getattr(self, name) < 0:
                raise ValueError(f"ToyConfig.{name} must be >= 0, got {getattr(self, name)}")
        total = self.n_train + self.n_valid + self.n_test
        if total > MAX_PAIRS:
            raise ValueError(
                f"{total:,} toy pairs requested; at most {MAX_PAIRS:,} are made (a few "
                "minutes of generation; more is a job for a corpus of files)"
            )
        if not 2 <= self.min_len <= self.max_len:
            raise ValueError(
                f"ToyConfig needs 2 <= min_len <= max_len, got {self.min_len}, {self.max_len}"
            )


# --------------------------------------------------------------------------- generation


def _size_np(p: NP | None) -> int:
    return 0 if p is None else sum(_size_nominal(n) for n in p.items)


def _size_nominal(n: Nominal | None) -> int:
    if n is None:
        return 0
    rel = 0 if n.rel is None else 1 + _size_np(n.rel.arg)
    return 1 + len(n.adjs) + int(n.indefinite) + rel


def sentence_length(s: Sentence) -> int:
    """Number of Korean words the sentence renders to (without rendering it)."""
    words = (len(s.time.ko) if s.time else 0) + int(s.tense == "future")
    for c in s.clauses:
        words += 1 + _size_np(c.subj) + _size_np(c.obj) + _size_nominal(c.place)
    return words


def _nominals(s: Sentence) -> Iterator[tuple[Nominal, NP | None]]:
    """Every nominal of the tree with the noun phrase that holds it (None for places)."""

    def walk_np(p: NP | None) -> Iterator[tuple[Nominal, NP | None]]:
        for n in p.items if p is not None else ():
            yield n, p
            if n.rel is not None:
                yield from walk_np(n.rel.arg)

    for c in s.clauses:
        yield from walk_np(c.subj)
        yield from walk_np(c.obj)
        if c.place is not None:
            yield c.place, None


def _pick_noun(rng: random.Random, allowed: frozenset[str], avoid: Noun | None = None) -> Noun:
    choices = [n for n in NOUNS if n.tags & allowed and n is not avoid]
    return rng.choice(choices)


def _new_np(rng: random.Random, allowed: frozenset[str], depth: int) -> NP:
    return NP([Nominal(_pick_noun(rng, allowed), depth=depth)], allowed)


def _new_clause(rng: random.Random) -> Clause:
    v = rng.choice(VERBS)
    obj = _new_np(rng, v.obj, 0) if v.obj is not None else None
    return Clause(_new_np(rng, v.subj, 0), v, obj)


def _expansions(rng: random.Random, s: Sentence, room: int) -> list[tuple[int, object]]:
    """Candidate growth steps that add at most ``room`` Korean words: (weight, action)."""
    out: list[tuple[int, object]] = []
    for n, holder in _nominals(s):
        tags = n.noun.tags
        used = {a.rank for a in n.adjs}
        adjs = [a for a in ADJECTIVES if a.tags & tags and a.rank not in used]
        if len(n.adjs) < 2 and adjs:
            out.append((2, lambda n=n, adjs=adjs: _add_adjective(n, rng.choice(adjs))))
        if holder is None:
            continue
        if n.noun.count and not n.indefinite and n.rel is None:
            out.append((1, lambda n=n: setattr(n, "indefinite", True)))
        if n.rel is None and not n.indefinite and n.depth < MAX_DEPTH and room >= 2:
            out.append((3, lambda n=n: _add_relative(rng, n)))
        if len(holder.items) == 1:
            out.append((1, lambda h=holder: _coordinate(rng, h)))
    for c in s.clauses:
        if c.place is None:
            out.append((1, lambda c=c: setattr(c, "place", Nominal(rng.choice(PLACES)))))
    times = [t for t in TIMES if s.tense in t.tenses and len(t.ko) <= room]
    if s.time is None and times:
        out.append((1, lambda: setattr(s, "time", rng.choice(times))))
    if len(s.clauses) < MAX_CLAUSES and room >= 3:
        out.append((1, lambda: s.clauses.append(_new_clause(rng))))
    return out


def _add_adjective(n: Nominal, adj: Adjective) -> None:
    n.adjs = sorted([*n.adjs, adj], key=lambda a: a.rank)


def _add_relative(rng: random.Random, n: Nominal) -> None:
    """Attach a one- or two-word relative clause whose gap the head noun can fill."""
    fits_subj = [v for v in VERBS if v.subj & n.noun.tags]
    fits_obj = [v for v in VERBS if v.obj is not None and v.obj & n.noun.tags]
    gap = "obj" if fits_obj and (not fits_subj or rng.random() < 0.35) else "subj"
    v = rng.choice(fits_obj if gap == "obj" else fits_subj)
    tense = rng.choice(TENSES)
    arg_tags = v.subj if gap == "obj" else v.obj
    arg = _new_np(rng, arg_tags, n.depth + 1) if arg_tags is not None else None
    n.rel = RelClause(v, tense, gap, arg)


def _coordinate(rng: random.Random, p: NP) -> None:
    p.items.append(Nominal(_pick_noun(rng, p.allowed, p.items[0].noun), depth=p.items[0].depth))


def _grow(rng: random.Random, target: int, max_len: int) -> Sentence:
    s = Sentence([_new_clause(rng)], rng.choice(TENSES), topic=rng.random() < 0.2)
    while (length := sentence_length(s)) < target:
        candidates = _expansions(rng, s, max_len - length)
        if not candidates:
            break
        weights = [w for w, _ in candidates]
        action = rng.choices([a for _, a in candidates], weights=weights)[0]
        action()  # type: ignore[operator]
    return s


def generate_pair(rng: random.Random, min_len: int = 2, max_len: int = 12) -> ToyPair:
    """Draw one sentence pair whose Korean side has ``min_len``..``max_len`` words.

    Args:
        rng: the random source (the result depends only on its state).
        min_len: fewest Korean words (at least 2).
        max_len: most Korean words.

    Returns:
        A :class:`ToyPair`.
    """
    if not 2 <= min_len <= max_len:
        raise ValueError(f"need 2 <= min_len <= max_len, got {min_len}, {max_len}")
    for _ in range(1000):
        s = _grow(rng, rng.randint(min_len, max_len), max_len)
        if min_len <= sentence_length(s) <= max_len:
            return render(s)
    raise RuntimeError(f"could not grow a sentence of {min_len}..{max_len} words")


def make_splits(
    n_train: int, n_valid: int, n_test: int, seed: int = 0, min_len: int = 2, max_len: int = 12
) -> dict[str, list[ToyPair]]:
    """Generate disjoint train/valid/test splits of the toy corpus.

    Pairs are deduplicated by Korean and by English sentence, so no sentence of one split
    occurs in another. The result depends only on the arguments.

    Args:
        n_train: number of training pairs.
        n_valid: number of validation pairs.
        n_test: number of test pairs.
        seed: random seed.
        min_len: fewest Korean words per sentence.
        max_len: most Korean words per sentence.

    Returns:
        ``{"train": [...], "valid": [...], "test": [...]}``.
    """
    config = ToyConfig(seed, n_train, n_valid, n_test, min_len, max_len)
    rng = random.Random(config.seed)
    total = n_train + n_valid + n_test
    seen_ko: set[str] = set()
    seen_en: set[str] = set()
    pairs: list[ToyPair] = []
    misses = 0  # draws in a row that gave nothing new: the grammar is nearly exhausted
    while len(pairs) < total and misses < STALL:
        pair = generate_pair(rng, min_len, max_len)
        misses += 1
        if pair.ko not in seen_ko and pair.en not in seen_en:
            seen_ko.add(pair.ko)
            seen_en.add(pair.en)
            pairs.append(pair)
            misses = 0
    if len(pairs) < total:
        raise ValueError(
            f"the toy grammar gave only {len(pairs)} distinct sentences of "
            f"{min_len}..{max_len} words, {total} requested: widen the length range"
        )
    return {
        "train": pairs[:n_train],
        "valid": pairs[n_train : n_train + n_valid],
        "test": pairs[n_train + n_valid :],
    }


def toy_splits(config: ToyConfig) -> dict[str, list[ToyPair]]:
    """Generate the splits a :class:`ToyConfig` describes (see :func:`make_splits`)."""
    return make_splits(
        config.n_train, config.n_valid, config.n_test, config.seed, config.min_len, config.max_len
    )
