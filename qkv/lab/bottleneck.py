"""Lab ``bottleneck``: one context vector fails on long sentences; attention does not.

Claim:
    An RNN encoder–decoder without attention must squeeze the whole source sentence into
    its last state, so translation quality falls as sentences get longer; attention lets
    each target word look back at every source word and removes the fall (Bahdanau et al.
    2015, Figure 2).

Method:
    Generate the Korean→English toy corpus with source lengths from 2 up to ``max_len``
    words (40 in the full run), train four translators with matched parameter counts (a GRU
    encoder–decoder without attention, with Bahdanau attention, with Luong attention, and
    a Transformer) with the same data, steps budget and seed, then translate the held-out
    test set greedily and score BLEU (sacreBLEU) and exact match in buckets of source
    length. The fall is the relative BLEU lost from the shortest to the longest bucket,
    ``(BLEU_short - BLEU_long) / BLEU_short``.

    The quick setting (for the tests) must learn in seconds, so it uses a *word-list*
    corpus instead of the grammar: a list of 2–16 Korean nouns from the toy lexicon and
    their English words in the same order ("고양이 쥐 개" → "cat mouse dog"), 12 nouns only,
    and trains just the no-attention RNN and the Luong RNN. Remembering the whole list is
    exactly what one context vector cannot do for long lists.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path

from qkv.lab.common import LabRun, Table, new_figure, save_figure, seed_all
from qkv.lab.training import (
    MODEL_FAMILIES,
    count_parameters,
    match_width,
    train_model,
    vocab_sizes,
    write_toy_corpus,
)

__all__ = ["Setting", "QUICK", "FULL", "MODELS", "bucket_scores", "run", "table"]

log = logging.getLogger(__name__)

MODELS = ("rnn-none", "rnn-bahdanau", "rnn-luong", "transformer")


@dataclass(frozen=True)
class Setting:
    """Corpus, model and training sizes of one run."""

    n_train: int
    n_test: int
    min_len: int
    max_len: int
    buckets: tuple[tuple[int, int], ...]  # inclusive source-length ranges (Korean words)
    embed: int
    reference_width: int  # hidden_dim of rnn-none; the others match its parameter count
    steps: int
    max_seconds: float  # per model, 0 = no limit
    max_tokens: int
    lr: float
    seed: int = 0
    corpus: str = "toy"  # "toy" (the grammar) or "word-list" (quick)
    models: tuple[str, ...] = MODELS


QUICK = Setting(
    n_train=3000, n_test=200, min_len=2, max_len=16, buckets=((2, 5), (13, 16)),
    embed=32, reference_width=64, steps=150, max_seconds=0, max_tokens=1500, lr=5e-3,
    corpus="word-list", models=("rnn-none", "rnn-luong"),
)  # fmt: skip
FULL = Setting(
    n_train=20000, n_test=800, min_len=2, max_len=40,
    buckets=((2, 5), (6, 10), (11, 15), (16, 20), (21, 25), (26, 30), (31, 35), (36, 40)),
    embed=96, reference_width=256, steps=4000, max_seconds=300, max_tokens=3000, lr=2e-3,
)  # fmt: skip


def _models(setting: Setting, vocab: tuple[int, int]) -> dict[str, dict]:
    """Model sections with widths chosen to match rnn-none's parameter count."""
    reference = MODEL_FAMILIES["rnn-none"](setting.reference_width, setting.embed)
    target = count_parameters(reference, vocab)
    models = {"rnn-none": reference}
    for name in setting.models[1:]:
        width, _ = match_width(name, setting.embed, target, vocab)
        models[name] = MODEL_FAMILIES[name](width, setting.embed)
    return models


def word_list_corpus(folder: Path, setting: Setting, nouns: int = 12) -> dict[str, list]:
    """Lists of Korean nouns and their English words, same order; written like the toy."""
    import random

    from qkv.data.toy import ToyPair
    from qkv.data.toy_lexicon import NOUNS

    rng = random.Random(setting.seed)
    lexicon = [(n.ko, n.en[-1]) for n in NOUNS[:nouns]]
    sizes = {"train": setting.n_train, "valid": 60, "test": setting.n_test}
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


def bucket_scores(
    sources: list[str], hyps: list[str], refs: list[str], buckets
) -> list[dict[str, float]]:
    """BLEU and exact match of the sentences whose source length falls in each bucket."""
    from qkv.evaluate import bleu

    rows = []
    for lo, hi in buckets:
        idx = [i for i, s in enumerate(sources) if lo <= len(s.split()) <= hi]
        h, r = [hyps[i] for i in idx], [refs[i] for i in idx]
        rows.append({
            "bucket": f"{lo}-{hi}",
            "sentences": len(idx),
            "bleu": bleu(h, r).score if idx else float("nan"),
            "exact_match": sum(a == b for a, b in zip(h, r)) / max(len(idx), 1),
        })  # fmt: skip
    return rows


def _relative_drop(rows: list[dict[str, float]]) -> float:
    first, last = rows[0]["bleu"], rows[-1]["bleu"]
    return (first - last) / first if first > 0 else float("nan")


def _evaluate(trained, test, setting: Setting) -> dict:
    from qkv.evaluate import bleu, translate_texts

    sources, refs = [p.ko for p in test], [p.en for p in test]
    outs = translate_texts(trained.model, trained.src_tok, trained.tgt_tok, sources)
    hyps = [o[0].text for o in outs]
    rows = bucket_scores(sources, hyps, refs, setting.buckets)
    return {
        "parameters": trained.parameters,
        "steps": trained.steps,
        "train_seconds": trained.seconds,
        "bleu_all": bleu(hyps, refs).score,
        "exact_match_all": sum(a == b for a, b in zip(hyps, refs)) / len(refs),
        "buckets": rows,
        "relative_drop": _relative_drop(rows),
        "examples": [
            {"src": s, "ref": r, "hyp": h} for s, r, h in list(zip(sources, refs, hyps))[-3:]
        ],  # fmt: skip
    }


def _figure(results: dict[str, dict], setting: Setting, out: Path) -> str:
    fig = new_figure(11, 4.2)
    ax_bleu, ax_em = fig.subplots(1, 2)
    mids = [(lo + hi) / 2 for lo, hi in setting.buckets]
    styles = {"rnn-none": "k--o", "rnn-bahdanau": "-s", "rnn-luong": "-^", "transformer": "-D"}
    for name, r in results.items():
        label = f"{name} ({r['parameters'] / 1e6:.2f}M)"
        ax_bleu.plot(mids, [b["bleu"] for b in r["buckets"]], styles[name], label=label)
        ax_em.plot(mids, [100 * b["exact_match"] for b in r["buckets"]], styles[name], label=label)
    for ax, what in ((ax_bleu, "BLEU"), (ax_em, "exact match (%)")):
        ax.set_xlabel("source sentence length (Korean words)")
        ax.set_ylabel(what)
        ax.set_xticks(mids, [f"{lo}–{hi}" for lo, hi in setting.buckets], fontsize=8)
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
    ax_bleu.legend(fontsize=8)
    fig.suptitle(f"{setting.corpus} Korean→English: quality against sentence length "
                 "(cf. Bahdanau et al. 2015, Fig. 2)")  # fmt: skip
    return save_figure(fig, out / "bleu-vs-length.png")


def run(out: Path, *, quick: bool = False) -> LabRun:
    """Generate the corpus, train the four models one after another, score by length."""
    setting = QUICK if quick else FULL
    seed_all(setting.seed)
    data = out / "data"
    if setting.corpus == "word-list":
        splits = word_list_corpus(data, setting)
    else:
        splits = write_toy_corpus(data, (setting.n_train, 200, setting.n_test),
                                  setting.min_len, setting.max_len, setting.seed)  # fmt: skip
    vocab = vocab_sizes(data)
    models = _models(setting, vocab)
    optim = {"steps": setting.steps, "max_tokens": setting.max_tokens, "lr": setting.lr,
             "warmup": min(200, setting.steps // 5), "label_smoothing": 0.1,
             "max_seconds": setting.max_seconds, "seed": setting.seed}  # fmt: skip
    results = {}
    for name, model in models.items():
        trained = train_model(name, model, data, out / "models", optim)
        results[name] = _evaluate(trained, splits["test"], setting)
        log.info("%s: BLEU %.1f, drop %.2f", name, results[name]["bleu_all"],
                 results[name]["relative_drop"])  # fmt: skip
    figure = _figure(results, setting, out)
    drops = {n: r["relative_drop"] for n, r in results.items()}
    verdict = "relative BLEU lost from shortest to longest bucket: " + ", ".join(
        f"{n} {100 * d:.0f}%" for n, d in drops.items()
    )
    return LabRun(
        name="bottleneck",
        quick=quick,
        config={
            **asdict(setting),
            "models": models,
            "vocab": vocab,
            "optim": optim,
            "multi30k": "not run",
        },  # fmt: skip
        seeds=[setting.seed],
        results=results,
        figures=[figure],
        verdict=verdict,
    )


def table(run: LabRun) -> Table:
    """BLEU per length bucket, parameters and the relative drop, per model."""
    first = next(iter(run.results.values()))
    buckets = [b["bucket"] for b in first["buckets"]]
    rows = []
    for name, r in run.results.items():
        cells = [f"{b['bleu']:.1f}" for b in r["buckets"]]
        rows.append([name, f"{r['parameters'] / 1e6:.2f}M", *cells,
                     f"{r['bleu_all']:.1f}", f"{100 * r['relative_drop']:.0f}%"])  # fmt: skip
    columns = ["model", "params", *[f"BLEU {b}" for b in buckets], "BLEU all", "drop"]
    return Table("BLEU by source length (Korean words), greedy", columns, rows)
