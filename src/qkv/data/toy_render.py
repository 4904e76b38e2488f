"""Rendering a toy sentence in both languages, with the gold word alignment between them.

Korean puts particles after nouns (이/가, 을/를, ...), relative clauses before the noun
and the verb last; English puts articles first, relative clauses after the noun and the
verb after the subject. :func:`render` writes both and records which Korean word each
English word comes from (see :mod:`qkv.data.toy`).
"""

from __future__ import annotations

from dataclasses import dataclass

from qkv.data.toy_lexicon import NP, Nominal, RelClause, Sentence, Verb, particle

__all__ = ["ToyPair", "render"]


@dataclass(frozen=True)
class ToyPair:
    """One Korean sentence, its English translation and their gold word alignment.

    ``alignment`` holds (korean_word_index, english_word_index) pairs over the
    whitespace tokens of ``ko`` and ``en``, sorted.
    """

    ko: str
    en: str
    alignment: list[tuple[int, int]]


class _Renderer:
    """Renders a tree twice: Korean (recording each word's key) then English (aligned)."""

    def __init__(self) -> None:
        self.ko: list[str] = []
        self.index: dict[tuple[int, str], int] = {}
        self.en: list[str] = []
        self.pairs: set[tuple[int, int]] = set()

    def k(self, node: object, role: str, word: str) -> None:
        self.index[(id(node), role)] = len(self.ko)
        self.ko.append(word)

    def e(self, words: tuple[str, ...] | list[str], *keys: tuple[object, str]) -> None:
        for word in words:
            for node, role in keys:
                self.pairs.add((self.index[(id(node), role)], len(self.en)))
            self.en.append(word)

    # Korean side ---------------------------------------------------------------------
    def ko_nominal(self, n: Nominal, role: str) -> None:
        if n.rel is not None:
            self.ko_rel(n.rel)
        if n.indefinite:
            self.k(n, "det", "한")
        for i, adj in enumerate(n.adjs):
            self.k(n, f"adj{i}", adj.ko)
        self.k(n, "head", particle(n.noun.ko, role))

    def ko_np(self, p: NP, role: str) -> None:
        for i, item in enumerate(p.items):
            self.ko_nominal(item, role if i == len(p.items) - 1 else "and")

    def ko_rel(self, r: RelClause) -> None:
        if r.arg is not None:
            self.ko_np(r.arg, "obj" if r.gap == "subj" else "subj")
        form = {"past": r.verb.rel_past, "present": r.verb.rel_present}
        self.k(r, "verb", form.get(r.tense, r.verb.rel_future))

    def ko_sentence(self, s: Sentence) -> None:
        if s.time is not None:
            for i, word in enumerate(s.time.ko):
                self.k(s, f"time{i}", word)
        for i, c in enumerate(s.clauses):
            self.ko_np(c.subj, "topic" if (i == 0 and s.topic) else "subj")
            if c.place is not None:
                self.ko_nominal(c.place, "place")
            if c.obj is not None:
                self.ko_np(c.obj, "obj")
            if i < len(s.clauses) - 1:
                self.k(c, "verb", c.verb.connective)
            elif s.tense == "future":
                self.k(c, "verb", c.verb.rel_future)
                self.k(c, "will", "것이다")
            else:
                self.k(c, "verb", c.verb.ko_past if s.tense == "past" else c.verb.ko_present)

    # English side --------------------------------------------------------------------
    def en_nominal(self, n: Nominal) -> None:
        head = (n, "head")
        if n.noun.prep:
            self.e((n.noun.prep,), head)
        if n.indefinite:
            first = n.adjs[0].en if n.adjs else n.noun.en[0]
            self.e(("an" if first[0] in "aeiou" else "a",), (n, "det"))
        else:
            self.e(("the",), head)
        for i, adj in enumerate(n.adjs):
            self.e((adj.en,), (n, f"adj{i}"))
        self.e(n.noun.en, head)
        if n.rel is not None:
            self.en_rel(n.rel)

    def en_np(self, p: NP) -> None:
        for i, item in enumerate(p.items):
            if i:
                self.e(("and",), (p.items[i - 1], "head"))
            self.en_nominal(item)

    def en_rel(self, r: RelClause) -> None:
        plural = r.gap == "obj" and r.arg is not None and r.arg.plural
        words = ["that", *_en_verb(r.verb, r.tense, plural)]
        if r.gap == "obj" and r.arg is not None:
            self.e(words[:1], (r, "verb"))
            self.en_np(r.arg)
            self.e(words[1:], (r, "verb"))
        else:
            self.e(words, (r, "verb"))
            if r.arg is not None:
                self.en_np(r.arg)

    def en_sentence(self, s: Sentence) -> None:
        last = len(s.clauses) - 1
        for i, c in enumerate(s.clauses):
            self.en_np(c.subj)
            words = _en_verb(c.verb, s.tense, c.subj.plural)
            if i == last and s.tense == "future":
                self.e(words[:1], (c, "will"))
                self.e(words[1:], (c, "verb"))
            else:
                self.e(words, (c, "verb"))
            if c.obj is not None:
                self.en_np(c.obj)
            if c.place is not None:
                self.en_nominal(c.place)
            if i < last:
                self.e(("and",), (c, "verb"))
        if s.time is not None:
            n_ko, n_en = len(s.time.ko), len(s.time.en)
            for j, word in enumerate(s.time.en):
                keys = [(s, f"time{j}")] if n_ko == n_en else [(s, f"time{i}") for i in range(n_ko)]
                self.e((word,), *keys)


def _en_verb(v: Verb, tense: str, plural: bool) -> list[str]:
    if tense == "past":
        return [v.en_past]
    if tense == "present":
        return [v.en_base if plural else v.en_3sg]
    return ["will", v.en_base]


def render(sentence: Sentence) -> ToyPair:
    """Render a syntax tree as a Korean/English pair with its gold word alignment.

    Args:
        sentence: the tree (see :class:`Sentence`).

    Returns:
        The :class:`ToyPair`; every word on either side is aligned to at least one word.
    """
    r = _Renderer()
    r.ko_sentence(sentence)
    r.en_sentence(sentence)
    return ToyPair(" ".join(r.ko), " ".join(r.en), sorted(r.pairs))
