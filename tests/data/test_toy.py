"""The toy Korean→English grammar: particles, translations, alignments, splits."""

from __future__ import annotations

import random
import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qkv.data.toy import (
    MAX_PAIRS,
    NP,
    Clause,
    Nominal,
    RelClause,
    Sentence,
    ToyConfig,
    generate_pair,
    has_batchim,
    make_splits,
    np,
    particle,
    render,
    sentence_length,
    toy_splits,
    verb,
)
from qkv.data.toy_lexicon import ADJECTIVES, NOUNS, PLACES, TIMES, VERBS

PARTICLES = {"이", "가", "을", "를", "은", "는", "과", "와"}


def test_lexicon_is_large_enough():
    transitive = [v for v in VERBS if v.transitive]
    assert len(NOUNS) >= 40 and len(ADJECTIVES) >= 15
    assert len(transitive) >= 20 and len(VERBS) - len(transitive) >= 15
    assert len({n.ko for n in NOUNS + PLACES}) == len(NOUNS + PLACES)


def test_the_cat_caught_the_mouse():
    pair = render(Sentence([Clause(np("고양이"), verb("catch"), np("쥐"))], "past"))
    assert pair.ko == "고양이가 쥐를 잡았다"
    assert pair.en == "the cat caught the mouse"
    # 고양이가 ↔ the cat, 쥐를 ↔ the mouse, 잡았다 ↔ caught: SOV vs SVO, not monotonic
    assert pair.alignment == [(0, 0), (0, 1), (1, 3), (1, 4), (2, 2)]


@pytest.mark.parametrize(
    ("word", "expected"),
    [("고양이", False), ("쥐", False), ("곰", True), ("물", True), ("선생님", True), ("빵", True)],
    ids=lambda x: str(x),
)
def test_batchim(word, expected):
    assert has_batchim(word) is expected


@given(st.integers(0xAC00, 0xD7A3))
def test_batchim_agrees_with_unicode_decomposition(code):
    syllable = chr(code)
    # a syllable with a final consonant decomposes into three jamo, one without into two
    assert has_batchim(syllable) == (len(unicodedata.normalize("NFD", syllable)) == 3)


def test_particles_follow_batchim():
    assert [particle("고양이", r) for r in ("subj", "obj", "topic", "and")] == [
        "고양이가",
        "고양이를",
        "고양이는",
        "고양이와",
    ]
    assert [particle("곰", r) for r in ("subj", "obj", "topic", "and")] == [
        "곰이",
        "곰을",
        "곰은",
        "곰과",
    ]
    with pytest.raises(ValueError):
        has_batchim("cat")


def test_relative_clause_moves_after_the_noun():
    cat = Nominal(NOUNS[0], rel=RelClause(verb("catch"), "past", "subj", np("쥐")))
    pair = render(Sentence([Clause(NP([cat]), verb("sleep"))], "past"))
    assert pair.ko == "쥐를 잡은 고양이가 잤다"
    assert pair.en == "the cat that caught the mouse slept"
    # 잡은 ↔ "that caught"; 쥐를 ↔ "the mouse" which now comes after the verb
    assert (1, 2) in pair.alignment and (1, 3) in pair.alignment
    assert (0, 4) in pair.alignment and (0, 5) in pair.alignment


def test_object_relative_and_future():
    mouse = Nominal(
        np("쥐").items[0].noun, rel=RelClause(verb("catch"), "future", "obj", np("고양이"))
    )
    pair = render(Sentence([Clause(np("개"), verb("see"), NP([mouse]))], "future"))
    assert pair.ko == "개가 고양이가 잡을 쥐를 볼 것이다"
    assert pair.en == "the dog will see the mouse that the cat will catch"


def test_coordination_agreement_time_place_and_articles():
    subj = np("고양이", "곰")
    apple = Nominal(np("사과").items[0].noun, indefinite=True)
    place = Nominal(PLACES[0])
    now = next(t for t in TIMES if t.en == ("every", "day"))
    clauses = [Clause(subj, verb("eat"), NP([apple]), place), Clause(np("아이"), verb("laugh"))]
    pair = render(Sentence(clauses, "present", time=now, topic=True))
    assert pair.ko == "매일 고양이와 곰은 공원에서 한 사과를 먹고 아이가 웃는다"
    assert pair.en == "the cat and the bear eat an apple in the park and the child laughs every day"
    assert sentence_length(Sentence(clauses, "present", time=now)) == len(pair.ko.split())


def _check_pair(pair, min_len, max_len):
    ko, en = pair.ko.split(), pair.en.split()
    assert min_len <= len(ko) <= max_len
    assert pair.en == pair.en.lower()
    assert {i for i, _ in pair.alignment} == set(range(len(ko)))
    assert {j for _, j in pair.alignment} == set(range(len(en)))
    for token in ko:  # every noun+particle token uses the particle its noun's batchim needs
        for noun in NOUNS + PLACES:
            rest = token[len(noun.ko) :]
            if token.startswith(noun.ko) and rest in PARTICLES:
                assert particle(noun.ko, _role(rest)) == token, token


def _role(p: str) -> str:
    return {"이": "subj", "가": "subj", "을": "obj", "를": "obj", "은": "topic", "는": "topic"}.get(
        p, "and"
    )


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), lo=st.integers(2, 30), span=st.integers(0, 15))
def test_generated_pairs_are_well_formed(seed, lo, span):
    pair = generate_pair(random.Random(seed), lo, lo + span)
    _check_pair(pair, lo, lo + span)


def test_long_sentences():
    rng = random.Random(7)
    for _ in range(20):
        _check_pair(generate_pair(rng, 40, 48), 40, 48)


def test_word_order_is_non_monotonic_on_average():
    rng = random.Random(3)
    crossings = 0
    for _ in range(50):
        pair = generate_pair(rng, 3, 10)
        a = pair.alignment
        crossings += any(i1 < i2 and j1 > j2 for i1, j1 in a for i2, j2 in a)
    assert crossings >= 45  # SOV→SVO: the verb crosses its object in almost every sentence


def test_splits_are_disjoint_reproducible_and_sized():
    splits = make_splits(300, 50, 50, seed=1, min_len=2, max_len=10)
    assert [len(splits[k]) for k in ("train", "valid", "test")] == [300, 50, 50]
    ko = [{p.ko for p in s} for s in splits.values()]
    en = [{p.en for p in s} for s in splits.values()]
    assert sum(map(len, ko)) == 400 and len(set().union(*ko)) == 400
    assert len(set().union(*en)) == 400
    assert make_splits(300, 50, 50, seed=1, min_len=2, max_len=10) == splits
    assert make_splits(300, 50, 50, seed=2, min_len=2, max_len=10) != splits
    assert toy_splits(ToyConfig(1, 300, 50, 50, 2, 10)) == splits


def test_config_validation_and_impossible_requests():
    with pytest.raises(ValueError, match="min_len"):
        ToyConfig(min_len=5, max_len=4)
    with pytest.raises(ValueError, match="n_valid"):
        ToyConfig(n_valid=-1)
    # a typo of a few zeros generated for hours: refused before any work
    largest = MAX_PAIRS - 1000
    assert ToyConfig(n_train=largest, n_valid=500, n_test=500).n_train == largest
    with pytest.raises(ValueError, match=f"^{MAX_PAIRS + 1:,} toy pairs requested; at most"):
        ToyConfig(n_train=largest + 1)
    with pytest.raises(ValueError, match="^100,001,000 toy pairs requested"):
        make_splits(100_000_000, 500, 500)
    with pytest.raises(ValueError, match="distinct"):
        make_splits(3000, 0, 0, seed=0, min_len=2, max_len=2)
