"""Means with 95% intervals, and which differences lie outside them.

Every number the lab reports for a comparison is a mean over seeds with an interval:

* over seeds alone (a training's steps, a gradient norm): the Student-t interval
  :math:`\\bar x \\pm t_{n-1,\\,0.975}\\, s / \\sqrt n` (:func:`t_interval`);
* over test sentences and seeds (corpus BLEU, exact match, AER): a hierarchical bootstrap
  (:func:`bootstrap`; Koehn 2004 for BLEU over sentences). Each replicate draws the seeds
  with replacement and, independently, the test sentences with replacement, recomputes
  the corpus score from the summed per-sentence counts (for BLEU: sacreBLEU's n-gram
  matches and lengths, :func:`bleu_counts`, scored by sacreBLEU's ``compute_bleu``) and
  averages it over the drawn seeds; the interval is the 2.5 and 97.5 percentiles. With
  one seed it is the bootstrap over sentences alone.

A verdict is read off the intervals: :func:`apart` says whether two intervals do not
overlap, :func:`separated` lists which pairs of named intervals are apart.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "Interval",
    "apart",
    "bleu_counts",
    "bleu_from_counts",
    "bootstrap",
    "bootstrap_bleu",
    "bootstrap_ratio",
    "bootstrap_ratios",
    "ratio_replicates",
    "separated",
    "t_interval",
    "t_quantile",
]

LEVEL = 0.95
RESAMPLES = 1000


@dataclass(frozen=True)
class Interval:
    """A mean and its interval ``[low, high]`` (infinite when one value cannot bound it)."""

    mean: float
    low: float
    high: float

    def as_dict(self) -> dict[str, float]:
        return {"mean": self.mean, "low": self.low, "high": self.high}

    def __str__(self) -> str:
        if not math.isfinite(self.low) or not math.isfinite(self.high):
            return f"{self.mean:.3g} [no interval]"
        return f"{self.mean:.3g} [{self.low:.3g}, {self.high:.3g}]"

    def format(self, digits: int = 1, scale: float = 1.0) -> str:
        """``mean [low, high]`` with ``digits`` decimals, each multiplied by ``scale``."""
        m, lo, hi = (scale * v for v in (self.mean, self.low, self.high))
        if not math.isfinite(m):
            return "n/a"
        if not math.isfinite(lo) or not math.isfinite(hi):
            return f"{m:.{digits}f} [–]"
        return f"{m:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def _t_density(x: float, df: float) -> float:
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    return math.exp(log_c - (df + 1) / 2 * math.log1p(x * x / df))


def _t_cdf(t: float, df: float, pieces: int = 2000) -> float:
    """P(T <= t) for t >= 0: 1/2 plus Simpson's rule over the density on [0, t]."""
    h = t / pieces
    inner = sum((4 if k % 2 else 2) * _t_density(k * h, df) for k in range(1, pieces))
    return 0.5 + h / 3 * (_t_density(0.0, df) + inner + _t_density(t, df))


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile (``p`` in [0.5, 1)) of Student's t with ``df`` degrees of freedom.

    Bisection on the CDF (the density integrated by Simpson's rule): no SciPy needed.
    """
    if not 0.5 <= p < 1 or df < 1:
        raise ValueError(f"need 0.5 <= p < 1 and df >= 1, got p={p}, df={df}")
    lo, hi = 0.0, 1.0
    while _t_cdf(hi, df) < p:
        lo, hi = hi, 2 * hi
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _t_cdf(mid, df) < p else (lo, mid)
    return (lo + hi) / 2


def t_interval(values: Sequence[float], level: float = LEVEL) -> Interval:
    """Mean of ``values`` with the Student-t interval ``mean ± t s / √n``.

    One value has no spread to measure: its interval is ``(-inf, inf)``.
    """
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        return Interval(math.nan, math.nan, math.nan)
    mean = float(x.mean())
    if x.size == 1:
        return Interval(mean, -math.inf, math.inf)
    half = t_quantile(0.5 + level / 2, x.size - 1) * float(x.std(ddof=1)) / math.sqrt(x.size)
    return Interval(mean, mean - half, mean + half)


def _draw_items(rng: np.random.Generator, n_items: int, resamples: int) -> np.ndarray:
    """How often each of ``n_items`` items is drawn in each replicate: ``(R, N)``, each row
    ``n_items`` draws with replacement (the first draws of a seed's generator, so every
    bootstrap here with the same seed resamples the same items)."""
    return rng.multinomial(n_items, np.full(n_items, 1 / n_items), size=resamples)


def bootstrap(
    counts: np.ndarray,
    statistic: Callable[[np.ndarray], float],
    *,
    resamples: int = RESAMPLES,
    level: float = LEVEL,
    seed: int = 0,
) -> Interval:
    """Hierarchical bootstrap of a corpus score over seeds and test items.

    Args:
        counts: ``(S, N, K)``: for each of ``S`` seeds (trained models) and ``N`` test
            items, the ``K`` counts the corpus score is computed from (summed over items).
        statistic: the corpus score of summed counts ``(K,)`` (BLEU of n-gram counts, a
            ratio of hits).
        resamples: bootstrap replicates.
        level: the interval's coverage.
        seed: the random seed of the resampling (the result is reproducible).

    Returns:
        The mean over seeds of the score on all items, and the percentile interval of the
        replicates (each: seeds and items drawn with replacement, the score of the drawn
        items averaged over the drawn seeds).
    """
    counts = np.asarray(counts, dtype=np.float64)
    if counts.ndim != 3:
        raise ValueError(f"counts must be (seeds, items, K), got shape {counts.shape}")
    n_seeds, n_items, _ = counts.shape
    if n_items == 0 or n_seeds == 0:
        return Interval(math.nan, math.nan, math.nan)
    mean = float(np.mean([statistic(c.sum(0)) for c in counts]))
    rng = np.random.default_rng(seed)
    weights = _draw_items(rng, n_items, resamples)  # (R, N)
    sums = np.einsum("rn,snk->srk", weights.astype(np.float64), counts)  # (S, R, K)
    scores = np.array([[statistic(sums[s, r]) for r in range(resamples)] for s in range(n_seeds)])
    drawn = rng.integers(0, n_seeds, size=(resamples, n_seeds))  # (R, S) seeds per replicate
    replicates = scores[drawn, np.arange(resamples)[:, None]].mean(1)  # (R,)
    if np.isnan(replicates).all():  # nothing to score in any replicate (no links at all)
        return Interval(mean, math.nan, math.nan)
    tail = 100 * (1 - level) / 2
    low, high = np.nanpercentile(replicates, [tail, 100 - tail])
    return Interval(mean, float(low), float(high))


def ratio_replicates(
    numerators: np.ndarray, denominators: np.ndarray, *, resamples: int = RESAMPLES, seed: int = 0
) -> np.ndarray:
    """Bootstrap replicates of many ratios of sums over the same items: ``(R, M)``.

    Each replicate draws the ``N`` items with replacement (the draws of
    :func:`bootstrap_ratio` with the same ``seed``) and gives ``sum(numerators[:, m]) /
    sum(denominators)`` over the drawn items, for each of the ``M`` columns.

    Args:
        numerators: ``(N, M)``: for each of ``N`` items, the ``M`` numerators.
        denominators: ``(N,)``: the denominator of each item.
    """
    num = np.asarray(numerators, dtype=np.float64)
    den = np.asarray(denominators, dtype=np.float64)
    weights = _draw_items(np.random.default_rng(seed), len(den), resamples)  # (R, N)
    return (weights @ num) / (weights @ den)[:, None]


def bootstrap_ratios(
    numerators: np.ndarray,
    denominators: np.ndarray,
    *,
    resamples: int = RESAMPLES,
    level: float = LEVEL,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Many ratios of sums over the same items at once, with bootstrap intervals.

    The one-seed case of :func:`bootstrap` for ``M`` statistics that share their items
    and their denominator (the share of attention on [CLS] of every head, over the query
    rows of the same sentences), from :func:`ratio_replicates`.

    Returns:
        ``(mean, low, high)``, each ``(M,)``: ``sum(numerators) / sum(denominators)`` and
        the percentile interval of the replicates; with one item, which has no spread to
        measure, ``(-inf, inf)``.
    """
    num = np.asarray(numerators, dtype=np.float64)
    den = np.asarray(denominators, dtype=np.float64)
    mean = num.sum(0) / den.sum()
    if len(den) < 2:
        return mean, np.full_like(mean, -math.inf), np.full_like(mean, math.inf)
    replicates = ratio_replicates(num, den, resamples=resamples, seed=seed)
    tail = 100 * (1 - level) / 2
    low, high = np.percentile(replicates, [tail, 100 - tail], axis=0)
    return mean, low, high


def bleu_counts(hypotheses: Sequence[str], references: Sequence[str]) -> np.ndarray:
    """Per-sentence sacreBLEU statistics ``(N, 10)``: hypothesis and reference lengths,
    then matched and total n-grams for n = 1..4 (sacreBLEU's defaults: 13a, cased)."""
    from sacrebleu.metrics import BLEU

    if not hypotheses:
        return np.zeros((0, 10))
    stats = BLEU()._extract_corpus_statistics(list(hypotheses), [list(references)])
    return np.asarray(stats, dtype=np.float64)


def bleu_from_counts(summed: np.ndarray) -> float:
    """Corpus BLEU (0-100) of summed :func:`bleu_counts`, by sacreBLEU's ``compute_bleu``
    with the smoothing of its corpus BLEU (``exp``)."""
    from sacrebleu.metrics import BLEU

    s = [int(round(v)) for v in summed]
    return BLEU.compute_bleu(s[2:6], s[6:10], s[0], s[1], smooth_method="exp").score


def bootstrap_bleu(
    hypotheses: Sequence[Sequence[str]],
    references: Sequence[str],
    *,
    resamples: int = RESAMPLES,
    level: float = LEVEL,
    seed: int = 0,
) -> Interval:
    """Corpus BLEU averaged over seeds, with its hierarchical bootstrap interval.

    Args:
        hypotheses: one list of translations of ``references`` per seed.
        references: the test references.
    """
    counts = np.stack([bleu_counts(h, references) for h in hypotheses])
    return bootstrap(counts, bleu_from_counts, resamples=resamples, level=level, seed=seed)


def _ratio(summed: np.ndarray) -> float:
    return float(summed[0] / summed[1]) if summed[1] > 0 else math.nan


def bootstrap_ratio(
    hits: np.ndarray,
    totals: np.ndarray,
    *,
    resamples: int = RESAMPLES,
    level: float = LEVEL,
    seed: int = 0,
) -> Interval:
    """``sum(hits) / sum(totals)`` averaged over seeds, with its bootstrap interval.

    ``hits`` and ``totals`` are ``(S, N)``: exact match is ``hits`` = 0/1 and ``totals`` = 1;
    AER is one minus the ratio of ``2|A∩S|`` to ``|A| + |S|``.
    """
    counts = np.stack([np.asarray(hits, float), np.asarray(totals, float)], -1)
    return bootstrap(counts, _ratio, resamples=resamples, level=level, seed=seed)


def apart(a: Interval, b: Interval) -> bool:
    """Whether the two intervals do not overlap (one lies wholly above the other)."""
    return a.low > b.high or b.low > a.high


def separated(named: dict[str, Interval], higher: str = "higher") -> list[str]:
    """The pairs of ``named`` whose intervals are apart, as ``"A higher than B"`` lines
    (``higher`` names the direction: ``"higher"``, ``"lower AER"``...), best mean first."""
    order = sorted(named, key=lambda n: -named[n].mean)
    lines = []
    for i, a in enumerate(order):
        for b in order[i + 1 :]:
            if apart(named[a], named[b]):
                lines.append(f"{a} {higher} than {b}")
    return lines
