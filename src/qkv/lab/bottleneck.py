"""Lab ``bottleneck``: one context vector fails on long sentences; attention does not.

Claim:
    An RNN encoder–decoder without attention must squeeze the whole source sentence into
    its last state, so translation quality falls as sentences get longer; attention lets
    each target word look back at every source word and removes the fall (Bahdanau et al.
    2015, Figure 2).

Method:
    Generate the Korean→English toy corpus with source lengths from 2 up to ``max_len``
    words (40 in the full run; the grammar can grow sentences up to 60 words, with two
    levels of relative clauses and three coordinated clauses), train four translators with
    matched parameter counts (a GRU encoder–decoder without attention, with Bahdanau
    attention, with Luong attention, and a Transformer) on the same data, each with every
    seed of ``seeds``, until they converge: validation every ``eval_every`` steps, stop
    after ``patience`` evaluations without a better validation BLEU (or loss), a generous
    step cap, no time budget (:func:`qkv.lab.training.until_converged`). Then translate the
    held-out test set greedily and score BLEU (sacreBLEU) and exact match in buckets of
    source length. Every number is the mean over seeds with a 95% interval (a bootstrap
    over test sentences and seeds, :mod:`qkv.lab.stats`). The fall is the relative BLEU
    lost from the shortest to the longest bucket, ``(BLEU_short - BLEU_long) /
    BLEU_short``, with its interval from the same bootstrap; the claim holds for an
    attention model when the no-attention model's fall is larger and the two intervals
    are apart (:func:`verdict`).

    The quick setting (for the tests) must learn in seconds, so it uses a *word-list*
    corpus instead of the grammar: a list of 2–16 Korean nouns from the toy lexicon and
    their English words in the same order ("고양이 쥐 개" → "cat mouse dog"), 12 nouns only,
    and trains just the no-attention RNN and the Luong RNN, two seeds, a step cap of 150.
    Remembering the whole list is exactly what one context vector cannot do for long lists.

    The full run then repeats the comparison on real sentences, Multi30k German→English
    (a BPE vocabulary per language, four models of matched size, three seeds, trained to
    convergence), scored with sacreBLEU per bucket of German source length on
    ``test_2016_flickr``; a bucket of fewer than ``MIN_SENTENCES`` sentences is marked too
    small to decide. When the shared corpus is absent that part is skipped and the reason
    is recorded in ``result.json``.
"""

from __future__ import annotations

import logging
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from qkv.data.corpus import read_parallel
from qkv.data.toy import ToyPair
from qkv.data.toy_lexicon import NOUNS
from qkv.lab.common import (
    LabRun,
    Table,
    corpus_folder,
    finished_part,
    new_figure,
    save_figure,
    seed_all,
    verdict_head,
)
from qkv.lab.stats import (
    Interval,
    apart,
    bleu_counts,
    bleu_from_counts,
    bootstrap,
    bootstrap_bleu,
    bootstrap_ratio,
    t_interval,
)
from qkv.lab.training import (
    MODEL_FAMILIES,
    TrainJob,
    by_model,
    count_parameters,
    curve_figure,
    match_width,
    scored_trainings,
    until_converged,
    vocab_sizes,
    write_toy_corpus,
)
from qkv.translate.evaluate import translate_texts

__all__ = [
    "Setting",
    "Multi30kSetting",
    "QUICK",
    "FULL",
    "MIN_SENTENCES",
    "MODELS",
    "bucket_scores",
    "multi30k_part",
    "relative_drop",
    "run",
    "table",
    "verdict",
]

log = logging.getLogger(__name__)

MODELS = ("rnn-none", "rnn-bahdanau", "rnn-luong", "transformer")
MIN_SENTENCES = 50  # a bucket with fewer test sentences is marked too small to decide


@dataclass(frozen=True)
class Multi30kSetting:
    """The Multi30k German→English part of the full run (BPE, real sentences)."""

    buckets: tuple[tuple[int, int], ...]  # inclusive source-length ranges (German words)
    vocab_size: int  # per language (two BPE vocabularies)
    embed: int
    reference_width: int  # hidden_dim of rnn-none; the others match its parameter count
    step_cap: int
    eval_every: int
    patience: int  # evaluations without a better validation BLEU before stopping
    valid_bleu_sentences: int
    max_tokens: int
    lr: float
    test: str = "test_2016_flickr"
    folder: str = ""  # "" = the shared corpora folder's multi30k/
    seeds: tuple[int, ...] = (0, 1, 2)
    models: tuple[str, ...] = MODELS


@dataclass(frozen=True)
class Setting:
    """Corpus, model and training sizes of one run."""

    n_train: int
    n_valid: int
    n_test: int
    min_len: int
    max_len: int
    buckets: tuple[tuple[int, int], ...]  # inclusive source-length ranges (Korean words)
    embed: int
    reference_width: int  # hidden_dim of rnn-none; the others match its parameter count
    step_cap: int
    eval_every: int
    patience: int  # evaluations without a better validation BLEU before stopping
    valid_bleu_sentences: int
    max_tokens: int
    lr: float
    seeds: tuple[int, ...] = (0, 1, 2)  # one training per model and seed
    seed: int = 0  # the corpus
    corpus: str = "toy"  # "toy" (the grammar) or "word-list" (quick)
    models: tuple[str, ...] = MODELS
    resamples: int = 1000  # bootstrap replicates of each interval
    multi30k: Multi30kSetting | None = None  # None: not part of this setting


QUICK = Setting(
    n_train=3000,
    n_valid=60,
    n_test=200,
    min_len=2,
    max_len=16,
    buckets=((2, 5), (13, 16)),
    embed=32,
    reference_width=64,
    step_cap=150,
    eval_every=50,
    patience=2,
    valid_bleu_sentences=30,
    max_tokens=1500,
    lr=5e-3,
    seeds=(0, 1),
    corpus="word-list",
    models=("rnn-none", "rnn-luong"),
    resamples=300,
)
MULTI30K = Multi30kSetting(
    buckets=((4, 7), (8, 9), (10, 11), (12, 13), (14, 16), (17, 30)),
    vocab_size=4000,
    embed=128,
    reference_width=256,
    step_cap=100_000,
    eval_every=500,
    patience=8,
    valid_bleu_sentences=1014,
    max_tokens=2000,
    lr=2e-3,
)
FULL = Setting(
    n_train=20000,
    n_valid=300,
    n_test=1600,
    min_len=2,
    max_len=40,
    buckets=((2, 5), *((lo, lo + 4) for lo in range(6, 37, 5))),  # 2-5, 6-10, ..., 36-40
    embed=64,
    reference_width=128,
    step_cap=40_000,
    eval_every=250,
    patience=6,
    valid_bleu_sentences=300,
    max_tokens=3000,
    lr=3e-3,
    multi30k=MULTI30K,
)


def _models(
    names: tuple[str, ...], reference_width: int, embed: int, vocab: tuple[int, int]
) -> dict[str, dict]:
    """Model sections with widths chosen to match rnn-none's parameter count."""
    reference = MODEL_FAMILIES["rnn-none"](reference_width, embed)
    target = count_parameters(reference, vocab)
    models = {"rnn-none": reference}
    for name in names[1:]:
        width, _ = match_width(name, embed, target, vocab)
        models[name] = MODEL_FAMILIES[name](width, embed)
    return models


def _optim(s: Setting | Multi30kSetting) -> dict:
    """The train section of every training of ``s`` (the seed is set per training)."""
    return {
        "max_tokens": s.max_tokens,
        "lr": s.lr,
        "warmup": min(200, s.step_cap // 5),
        "label_smoothing": 0.1,
        **until_converged(
            eval_every=s.eval_every,
            patience=s.patience,
            step_cap=s.step_cap,
            valid_bleu_sentences=s.valid_bleu_sentences,
        ),
    }


def word_list_corpus(folder: Path, setting: Setting, nouns: int = 12) -> dict[str, list]:
    """Lists of Korean nouns and their English words, same order; written like the toy."""
    rng = random.Random(setting.seed)
    lexicon = [(n.ko, n.en[-1]) for n in NOUNS[:nouns]]
    sizes = {"train": setting.n_train, "valid": setting.n_valid, "test": setting.n_test}
    splits: dict[str, list] = {}
    for name, size in sizes.items():
        pairs = []
        for _ in range(size):
            words = [
                rng.choice(lexicon) for _ in range(rng.randint(setting.min_len, setting.max_len))
            ]
            ko, en = " ".join(k for k, _ in words), " ".join(e for _, e in words)
            pairs.append(ToyPair(ko, en, [(i, i) for i in range(len(words))]))
        splits[name] = pairs
    folder.mkdir(parents=True, exist_ok=True)
    for name, pairs in splits.items():
        for lang in ("ko", "en"):
            text = "".join(getattr(p, lang) + "\n" for p in pairs)
            (folder / f"{name}.{lang}").write_text(text, encoding="utf-8")
    return splits


def _in_bucket(sources: list[str], lo: int, hi: int) -> list[int]:
    return [i for i, s in enumerate(sources) if lo <= len(s.split()) <= hi]


def bucket_scores(
    sources: list[str],
    hyps: list[list[str]],
    refs: list[str],
    buckets,
    *,
    resamples: int = 1000,
) -> list[dict[str, Any]]:
    """BLEU and exact match of the sentences whose source length falls in each bucket.

    Args:
        sources, refs: the test set.
        hyps: one list of translations per seed.
        buckets: inclusive ``(lo, hi)`` source-length ranges.

    Returns:
        One row per bucket: its sentence count, BLEU and exact match (each the mean over
        seeds with its bootstrap interval, ``{"mean", "low", "high"}``), the per-seed BLEU,
        and ``too_few`` when it has fewer than ``MIN_SENTENCES`` sentences. A bucket that no
        sentence falls into scores NaN (not 0: nothing was measured there).
    """
    rows = []
    for k, (lo, hi) in enumerate(buckets):
        idx = _in_bucket(sources, lo, hi)
        r = [refs[i] for i in idx]
        h = [[seed_hyps[i] for i in idx] for seed_hyps in hyps]
        hits = np.array([[float(a == b) for a, b in zip(hh, r)] for hh in h])
        bleu = bootstrap_bleu(h, r, resamples=resamples, seed=k) if idx else _nan()
        em = (
            bootstrap_ratio(hits, np.ones_like(hits), resamples=resamples, seed=k)
            if idx
            else _nan()
        )
        rows.append(
            {
                "bucket": f"{lo}-{hi}",
                "sentences": len(idx),
                "too_few": len(idx) < MIN_SENTENCES,
                "bleu": bleu.as_dict(),
                "exact_match": em.as_dict(),
                "bleu_per_seed": [
                    bleu_from_counts(bleu_counts(hh, r).sum(0)) if idx else math.nan for hh in h
                ],
            }
        )
    return rows


def _nan() -> Interval:
    return Interval(math.nan, math.nan, math.nan)


def relative_drop(
    sources: list[str], hyps: list[list[str]], refs: list[str], buckets, *, resamples: int = 1000
) -> Interval:
    """``(BLEU_first - BLEU_last) / BLEU_first`` between the first and the last bucket,
    averaged over seeds, with the bootstrap interval (both buckets resampled together)."""
    first, last = _in_bucket(sources, *buckets[0]), _in_bucket(sources, *buckets[-1])
    if not first or not last:
        return _nan()
    idx = first + last
    counts = []
    for seed_hyps in hyps:
        c = bleu_counts([seed_hyps[i] for i in idx], [refs[i] for i in idx])
        short = np.zeros_like(c)
        short[: len(first)] = c[: len(first)]
        counts.append(np.concatenate([short, c - short], 1))  # (N, 20): short | long

    def drop(summed: np.ndarray) -> float:
        a, b = bleu_from_counts(summed[:10]), bleu_from_counts(summed[10:])
        return (a - b) / a if a > 0 else math.nan

    return bootstrap(np.stack(counts), drop, resamples=resamples, seed=len(buckets))


def _translate(sources: list[str]):
    """The score kept for each training: its greedy translations of the test sources."""

    def score(trained) -> dict[str, Any]:
        started = time.perf_counter()
        outs = translate_texts(trained.model, trained.src_tok, trained.tgt_tok, sources)
        return {"hyps": [o[0].text for o in outs], "decode_seconds": time.perf_counter() - started}

    return score


def _evaluate(scored: list[dict], sources: list[str], refs: list[str], buckets, resamples) -> dict:
    """Scores of one model's trainings (one per seed) on the test set, by length."""
    hyps = [s["score"]["hyps"] for s in scored]
    records = [s["training"] for s in scored]
    hits = np.array([[float(a == b) for a, b in zip(h, refs)] for h in hyps])
    return {
        "parameters": records[0]["parameters"],
        "steps": t_interval([r["steps"] for r in records]).as_dict(),
        "train_seconds": t_interval([r["train_seconds"] for r in records]).as_dict(),
        "decode_seconds": sum(s["score"]["decode_seconds"] for s in scored),
        "trainings": records,
        "bleu_all": bootstrap_bleu(hyps, refs, resamples=resamples).as_dict(),
        "exact_match_all": bootstrap_ratio(hits, np.ones_like(hits), resamples=resamples).as_dict(),
        "buckets": bucket_scores(sources, hyps, refs, buckets, resamples=resamples),
        "relative_drop": relative_drop(sources, hyps, refs, buckets, resamples=resamples).as_dict(),
        "examples": [
            {"src": s, "ref": r, "hyp": h} for s, r, h in list(zip(sources, refs, hyps[0]))[-3:]
        ],
    }


def _train_all(
    models: dict, data, out: Path, optim: dict, seeds, test, buckets, resamples: int, **kw
) -> dict:
    """Train each model with each seed and score its greedy translations of ``test``
    (each training's translations kept in its folder as soon as it has trained)."""
    jobs = [
        TrainJob(f"{name}-seed{seed}", model, data, out, {**optim, "seed": seed}, **kw)
        for name, model in models.items()
        for seed in seeds
    ]
    scored = by_model(scored_trainings(jobs, _translate(test[0])), models, seeds)
    results = {}
    for name in models:
        results[name] = _evaluate(scored[name], *test, buckets, resamples)
        log.info(
            "%s: %s steps, BLEU %s, drop %s",
            name,
            Interval(**results[name]["steps"]).format(0),
            Interval(**results[name]["bleu_all"]).format(1),
            Interval(**results[name]["relative_drop"]).format(0, 100),
        )
    return results


STYLES = {"rnn-none": "k--o", "rnn-bahdanau": "-s", "rnn-luong": "-^", "transformer": "-D"}


def _figure(results: dict[str, dict], buckets, title: str, path: Path, *, em: bool = True) -> str:
    """Per-bucket means over seeds with their 95% interval as a band, per model."""
    fig = new_figure(11 if em else 7.5, 4.2)
    axes = fig.subplots(1, 2 if em else 1)
    ax_bleu, ax_em = (axes[0], axes[1]) if em else (axes, None)
    mids = [(lo + hi) / 2 for lo, hi in buckets]
    for name, r in results.items():
        label = f"{name} ({r['parameters'] / 1e6:.2f}M)"
        panels = [(ax_bleu, "bleu", 1.0), (ax_em, "exact_match", 100.0)]
        for ax, key, scale in panels:
            if ax is None:
                continue
            rows = [b[key] for b in r["buckets"]]
            (line,) = ax.plot(mids, [scale * v["mean"] for v in rows], STYLES[name], label=label)
            ax.fill_between(
                mids,
                [scale * v["low"] for v in rows],
                [scale * v["high"] for v in rows],
                color=line.get_color(),
                alpha=0.18,
                linewidth=0,
            )
    language = "Korean" if em else "German"
    for ax, what in ((ax_bleu, "BLEU"), (ax_em, "exact match (%)")):
        if ax is None:
            continue
        ax.set_xlabel(f"source sentence length ({language} words)")
        ax.set_ylabel(f"{what}, mean and 95% interval")
        ax.set_xticks(mids, [f"{lo}–{hi}" for lo, hi in buckets], fontsize=7)
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
    ax_bleu.legend(fontsize=8)
    seeds = len(next(iter(results.values()))["trainings"]) if results else 0
    fig.suptitle(
        f"{title}: quality against sentence length\n{seeds} seed(s) per model "
        "(cf. Bahdanau et al. 2015, Fig. 2)",
        fontsize=10,
    )
    return save_figure(fig, path)


def _curves(results: dict[str, dict]) -> dict[str, list]:
    return {name: [t["curve"] for t in r["trainings"]] for name, r in results.items()}


def verdict(results: dict[str, dict]) -> str:
    """The claim, decided by the intervals of the relative drop.

    It holds for an attention model when the no-attention model's drop is larger and
    their intervals are apart; "holds" when it holds for every attention model, "does not
    hold" for none, "holds for X, not for Y" otherwise. A model whose drop is undefined
    (no BLEU in the shortest bucket) is named undecided.
    """
    if "rnn-none" not in results or len(results) < 2:
        return "no comparison (the no-attention model and another are needed)"
    none = Interval(**results["rnn-none"]["relative_drop"])
    holds, fails, undecided = [], [], []
    for name, r in results.items():
        if name == "rnn-none":
            continue
        other = Interval(**r["relative_drop"])
        if math.isnan(none.mean) or math.isnan(other.mean):
            undecided.append(name)  # no BLEU in the shortest bucket: no drop to compare
        elif none.mean > other.mean and apart(none, other):
            holds.append(name)
        else:
            fails.append(name)
    drops = ", ".join(
        f"{n} {Interval(**r['relative_drop']).format(0, 100)}%".replace("n/a%", "n/a")
        for n, r in results.items()
    )
    head = verdict_head(holds, fails)
    if undecided:
        head += f" (undecided for {', '.join(undecided)}: no BLEU in the shortest bucket)"
    return f"{head} (relative BLEU drop, shortest to longest bucket, 95% interval: {drops})"


def _small_buckets(results: dict[str, dict]) -> list[str]:
    first = next(iter(results.values()), None)
    if first is None:
        return []
    return [f"{b['bucket']} ({b['sentences']})" for b in first["buckets"] if b["too_few"]]


def multi30k_part(out: Path, m: Multi30kSetting, resamples: int = 1000) -> dict[str, Any]:
    """Train and score the four models on Multi30k de→en; ``{"skipped": why}`` without data."""
    folder = Path(m.folder) if m.folder else corpus_folder("multi30k", "train.de")
    files = {
        s: [str(folder / f"{s}.{lang}") for lang in ("de", "en")] for s in ("train", "val", m.test)
    }
    missing = [f for pair in files.values() for f in pair if not Path(f).is_file()]
    if missing:
        reason = (
            f"Multi30k not found ({', '.join(missing)} missing; 'qkv data download "
            "multi30k' fetches it); de→en part not run"
        )
        log.warning("%s", reason)
        return {"skipped": reason}
    seed_all(m.seeds[0])
    tokenizer = {"kind": "bpe", "vocab_size": m.vocab_size, "joint": False}
    vocab = vocab_sizes(*files["train"], tokenizer)
    models = _models(m.models, m.reference_width, m.embed, vocab)
    data = {
        "kind": "files",
        "train": files["train"],
        "valid": files["val"],
        "test": files[m.test],
        "max_tokens": 100,
        "max_ratio": 3.0,
    }
    optim = _optim(m)
    test = _test_split(*files[m.test])
    results = _train_all(
        models,
        data,
        out / "models-multi30k",
        optim,
        m.seeds,
        test,
        m.buckets,
        resamples,
        tokenizer=tokenizer,
    )
    figure = _figure(
        results, m.buckets, "Multi30k German→English", out / "bleu-vs-length-multi30k.png", em=False
    )
    curves = curve_figure(_curves(results), out / "curves-multi30k.png", "Multi30k de→en")
    return {
        "models": results,
        "verdict": verdict(results),
        "small_buckets": _small_buckets(results),
        "figure": figure,
        "curves": curves,
        "model_sections": models,
        "vocab": vocab,
        "optim": optim,
        "data": data,
        "tokenizer": tokenizer,
    }


def _test_split(src: str, ref: str) -> tuple[list[str], list[str]]:
    """Sources and references of a held-out split, read as ``qkv evaluate`` reads them.

    Lines end at LF only (``str.splitlines`` also splits at U+2028 or U+0085, which would
    pair sources with the wrong references), and the two files must have as many lines.
    """
    pairs = read_parallel(src, ref, max_len=None, max_ratio=None)
    return pairs.src, pairs.tgt


def _toy_part(out: Path, setting: Setting) -> tuple[dict, dict]:
    """Train and score the models on the toy (or word-list) corpus: results and config."""
    data = out / "data"
    if setting.corpus == "word-list":
        splits = word_list_corpus(data, setting)
    else:
        splits = write_toy_corpus(
            data,
            (setting.n_train, setting.n_valid, setting.n_test),
            setting.min_len,
            setting.max_len,
            setting.seed,
        )
    vocab = vocab_sizes(data / "train.ko", data / "train.en")
    models = _models(setting.models, setting.reference_width, setting.embed, vocab)
    optim = _optim(setting)
    test = ([p.ko for p in splits["test"]], [p.en for p in splits["test"]])
    results = _train_all(
        models, data, out / "models", optim, setting.seeds, test, setting.buckets, setting.resamples
    )
    return results, {"models": models, "vocab": vocab, "optim": optim}


def run(out: Path, *, quick: bool = False) -> LabRun:
    """Toy corpus (and Multi30k in the full run): train the models, score by length."""
    setting = QUICK if quick else FULL
    seed_all(setting.seed)
    toy_setting = {k: v for k, v in asdict(setting).items() if k != "multi30k"}
    toy, config = finished_part(out, "toy", toy_setting, lambda: _toy_part(out, setting))
    title = f"{setting.corpus} Korean→English"
    figures = [_figure(toy, setting.buckets, title, out / "bleu-vs-length.png")]
    figures.append(curve_figure(_curves(toy), out / "curves.png", title))
    if setting.multi30k is None:
        multi30k = {"skipped": "the quick setting runs the toy part only"}
    else:
        multi30k = finished_part(
            out,
            "multi30k",
            {**asdict(setting.multi30k), "resamples": setting.resamples},
            lambda: multi30k_part(out, setting.multi30k, setting.resamples),
        )
    figures += [multi30k[k] for k in ("figure", "curves") if k in multi30k]
    text = f"{setting.corpus}: {verdict(toy)}"
    if "models" in multi30k:
        text += f"; Multi30k de→en: {multi30k['verdict']}"
        if multi30k["small_buckets"]:
            text += (
                f"; Multi30k buckets under {MIN_SENTENCES} test sentences, too small to "
                f"decide alone: {', '.join(multi30k['small_buckets'])}"
            )
    else:
        text += f"; Multi30k de→en skipped: {multi30k['skipped']}"
    return LabRun(
        name="bottleneck",
        quick=quick,
        config={**asdict(setting), **config},
        seeds=list(setting.seeds),
        results={"toy": toy, "multi30k": multi30k},
        figures=figures,
        verdict=text,
    )


def _rows(results: dict[str, dict], width: int) -> list[list[str]]:
    rows = []
    for name, r in results.items():
        cells = [Interval(**b["bleu"]).format(1) for b in r["buckets"]]
        cells += [""] * (width - len(cells))
        rows.append(
            [
                name,
                f"{r['parameters'] / 1e6:.2f}M",
                Interval(**r["steps"]).format(0),
                *cells,
                Interval(**r["bleu_all"]).format(1),
                Interval(**r["relative_drop"]).format(0, 100),
            ]
        )
    return rows


def _bucket_names(results: dict[str, dict]) -> list[str]:
    """The bucket names of the first model's scores (none without models)."""
    first = next(iter(results.values()), None)
    return [b["bucket"] for b in first["buckets"]] if first else []


def table(run: LabRun) -> Table:
    """BLEU per length bucket, parameters, steps and the relative drop (%), per model and
    corpus: means over seeds with their 95% intervals."""
    toy, multi30k = run.results["toy"], run.results["multi30k"]
    buckets, other = _bucket_names(toy), _bucket_names(multi30k.get("models", {}))
    width = max(len(buckets), len(other))  # every row as wide, whichever part has more buckets
    rows = _rows(toy, width)
    if "models" in multi30k:
        rows.append(["Multi30k de→en", "", "", *other, *[""] * (width - len(other)), "", ""])
        rows += _rows(multi30k["models"], width)
    else:
        rows.append(["Multi30k de→en: skipped (reason in the verdict)", *[""] * (width + 4)])
    columns = ["model", "params", "steps", *[f"BLEU {b}" for b in buckets]]
    columns += [""] * (width - len(buckets)) + ["BLEU all", "drop %"]
    return Table(
        "BLEU by source length (toy: Korean words; Multi30k: German words), greedy, "
        "mean over seeds [95% interval]",
        columns,
        rows,
    )
