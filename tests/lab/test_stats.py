"""Intervals of the lab: the t-interval against SciPy and by hand, the bootstrap of corpus
BLEU against sacreBLEU on the resampled sentences, and the verdict helpers."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qkv.lab.stats import (
    Interval,
    apart,
    bleu_counts,
    bleu_from_counts,
    bootstrap,
    bootstrap_bleu,
    bootstrap_ratio,
    separated,
    t_interval,
    t_quantile,
)

WORDS = "the a cat dog sat on mat ran fast slow big small".split()


def test_t_quantile_of_known_cases():
    # printed tables: t_{0.975} for 1, 2, 4 and 30 degrees of freedom
    for df, expected in ((1, 12.7062), (2, 4.3027), (4, 2.7764), (30, 2.0423)):
        assert t_quantile(0.975, df) == pytest.approx(expected, abs=2e-4)


def test_t_quantile_against_scipy():
    stats = pytest.importorskip("scipy.stats", reason="SciPy is the peer of the t quantile")
    for df in (1, 2, 3, 5, 10, 50):
        for p in (0.6, 0.9, 0.975, 0.995):
            assert t_quantile(p, df) == pytest.approx(stats.t.ppf(p, df), rel=1e-6)


def test_t_interval_by_hand():
    # mean 2, sample standard deviation 1, n = 3: half width t_{0.975,2} / sqrt(3)
    iv = t_interval([1.0, 2.0, 3.0])
    half = 4.302652729911275 / math.sqrt(3)
    assert iv.mean == 2.0
    assert iv.low == pytest.approx(2 - half, abs=1e-6) and iv.high == pytest.approx(2 + half)


def test_one_seed_has_no_t_interval():
    iv = t_interval([5.0])
    assert iv.mean == 5.0 and iv.low == -math.inf and iv.high == math.inf
    assert not apart(iv, Interval(100.0, 99.0, 101.0))


def _sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 9)))


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10**6), st.integers(1, 30))
def test_bleu_of_summed_counts_is_sacrebleus_corpus_bleu(seed, n):
    """Any subset with repeats (a bootstrap resample) scores what sacreBLEU's corpus_bleu
    gives on the resampled sentences."""
    sacrebleu = pytest.importorskip("sacrebleu")
    rng = random.Random(seed)
    hyps, refs = [_sentence(rng) for _ in range(n)], [_sentence(rng) for _ in range(n)]
    pick = [rng.randrange(n) for _ in range(n)]
    counts = bleu_counts(hyps, refs)[pick].sum(0)
    direct = sacrebleu.corpus_bleu([hyps[i] for i in pick], [[refs[i] for i in pick]]).score
    assert bleu_from_counts(counts) == pytest.approx(direct, abs=1e-9)


def test_bootstrap_bleu_mean_is_the_seed_mean_and_the_interval_holds_it():
    sacrebleu = pytest.importorskip("sacrebleu")
    rng = random.Random(3)
    refs = [_sentence(rng) for _ in range(60)]
    seeds = [[r if rng.random() < p else _sentence(rng) for r in refs] for p in (0.5, 0.6)]
    iv = bootstrap_bleu(seeds, refs, resamples=300)
    direct = [sacrebleu.corpus_bleu(h, [refs]).score for h in seeds]
    assert iv.mean == pytest.approx(np.mean(direct))
    assert iv.low < iv.mean < iv.high and iv.high - iv.low > 1.0


def test_bootstrap_of_identical_items_has_no_width():
    counts = np.ones((2, 40, 2))  # every item hits: the ratio is 1 in every replicate
    iv = bootstrap(counts, lambda s: s[0] / s[1], resamples=200)
    assert (iv.mean, iv.low, iv.high) == (1.0, 1.0, 1.0)


def test_bootstrap_ratio_interval_covers_like_a_binomial():
    """Exact match of 400 sentences, 25 % hits, one seed: the bootstrap interval of a
    proportion is close to the normal one, p ± 1.96 sqrt(p (1 - p) / n)."""
    rng = np.random.default_rng(0)
    hits = (rng.random((1, 400)) < 0.25).astype(float)
    iv = bootstrap_ratio(hits, np.ones_like(hits), resamples=2000)
    p = hits.mean()
    half = 1.96 * math.sqrt(p * (1 - p) / 400)
    assert iv.mean == pytest.approx(p)
    assert iv.low == pytest.approx(p - half, abs=0.01) and iv.high == pytest.approx(
        p + half, abs=0.01
    )


def test_bootstrap_ratios_are_one_seed_bootstrap_ratios_at_once():
    """Each column of bootstrap_ratios is bootstrap_ratio of that column (the same draws)."""
    from qkv.lab.stats import bootstrap_ratios

    rng = np.random.default_rng()
    lengths = rng.integers(3, 20, 60).astype(float)  # query rows per sentence
    shares = rng.random((60, 5)) * lengths[:, None]  # attention summed over those rows
    mean, low, high = bootstrap_ratios(shares, lengths, resamples=500, seed=7)
    for m in range(5):
        iv = bootstrap_ratio(shares[None, :, m], lengths[None], resamples=500, seed=7)
        assert (mean[m], low[m], high[m]) == pytest.approx((iv.mean, iv.low, iv.high), abs=1e-12)
    assert np.all(low < mean) and np.all(mean < high)
    mean, low, high = bootstrap_ratios(shares[:1], lengths[:1])  # one item: no interval
    assert mean == pytest.approx(shares[0] / lengths[0]) and np.all(np.isinf(low) & np.isinf(high))


def test_seeds_that_disagree_widen_the_interval():
    same = np.ones((3, 50)) * 0.5
    spread = np.stack([np.full(50, v) for v in (0.2, 0.5, 0.8)])
    narrow = bootstrap_ratio(same, np.ones_like(same))
    wide = bootstrap_ratio(spread, np.ones_like(spread))
    assert narrow.high - narrow.low == 0.0 and wide.high - wide.low > 0.3


@given(st.floats(-100, 100), st.floats(0, 10), st.floats(-100, 100), st.floats(0, 10))
def test_apart_is_symmetric_and_means_no_overlap(m1, w1, m2, w2):
    a, b = Interval(m1, m1 - w1, m1 + w1), Interval(m2, m2 - w2, m2 + w2)
    assert apart(a, b) == apart(b, a)
    overlap = max(a.low, b.low) <= min(a.high, b.high)
    assert apart(a, b) == (not overlap)


def test_separated_names_the_pairs_outside_each_others_intervals():
    named = {
        "none": Interval(10.0, 8.0, 12.0),
        "bahdanau": Interval(30.0, 27.0, 33.0),
        "luong": Interval(31.0, 29.0, 34.0),
    }
    assert separated(named) == ["luong higher than none", "bahdanau higher than none"]


def test_a_ratio_with_nothing_counted_is_nan_without_a_warning():
    import warnings

    zeros = np.zeros((2, 5))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        iv = bootstrap_ratio(zeros, zeros, resamples=50)
    assert math.isnan(iv.mean) and math.isnan(iv.low) and math.isnan(iv.high)
