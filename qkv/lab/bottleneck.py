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

    The full run then repeats the comparison on real sentences, Multi30k German→English
    (a BPE vocabulary per language, four models of matched size, a wall-clock budget per
    model), scored with sacreBLEU per bucket of German source length on
    ``test_2016_flickr``. When the shared
    corpus is absent that part is skipped and the reason is recorded in ``result.json``.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from qkv.data.corpus import read_parallel
from qkv.data.toy import ToyPair
from qkv.data.toy_lexicon import NOUNS
from qkv.lab.common import LabRun, Table, corpus_folder, new_figure, save_figure, seed_all
from qkv.lab.training import (
    MODEL_FAMILIES,
    count_parameters,
    match_width,
    train_model,
    vocab_sizes,
    write_toy_corpus,
)
from qkv.translate.evaluate import bleu, translate_texts

__all__ = [
    "Setting",
    "Multi30kSetting",
    "QUICK",
    "FULL",
    "MODELS",
    "bucket_scores",
    "multi30k_part",
    "run",
    "table",
]

log = logging.getLogger(__name__)

MODELS = ("rnn-none", "rnn-bahdanau", "rnn-luong", "transformer")


@dataclass(frozen=True)
class Multi30kSetting:
    """The Multi30k German→English part of the full run (BPE, real sentences)."""

    buckets: tuple[tuple[int, int], ...]  # inclusive source-length ranges (German words)
    vocab_size: int  # per language (two BPE vocabularies)
    embed: int
    reference_width: int  # hidden_dim of rnn-none; the others match its parameter count
    steps: int
    max_seconds: float  # per model
    max_tokens: int
    lr: float
    test: str = "test_2016_flickr"
    folder: str = ""  # "" = the shared corpora folder's multi30k/
    seed: int = 0
    models: tuple[str, ...] = MODELS


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
    multi30k: Multi30kSetting | None = None  # None: not part of this setting


QUICK = Setting(
    n_train=3000,
    n_test=200,
    min_len=2,
    max_len=16,
    buckets=((2, 5), (13, 16)),
    embed=32,
    reference_width=64,
    steps=150,
    max_seconds=0,
    max_tokens=1500,
    lr=5e-3,
    corpus="word-list",
    models=("rnn-none", "rnn-luong"),
)
MULTI30K = Multi30kSetting(
    buckets=((4, 7), (8, 9), (10, 11), (12, 13), (14, 16), (17, 30)),
    vocab_size=4000,
    embed=128,
    reference_width=256,
    steps=20000,
    max_seconds=390,
    max_tokens=2000,
    lr=2e-3,
)
FULL = Setting(
    n_train=20000,
    n_test=800,
    min_len=2,
    max_len=40,
    buckets=((2, 5), (6, 10), (11, 15), (16, 20), (21, 25), (26, 30), (31, 35), (36, 40)),
    embed=96,
    reference_width=256,
    steps=20000,
    max_seconds=280,
    max_tokens=3000,
    lr=2e-3,
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


def _optim(steps: int, max_tokens: int, lr: float, max_seconds: float, seed: int) -> dict:
    return {
        "steps": steps,
        "max_tokens": max_tokens,
        "lr": lr,
        "warmup": min(200, steps // 5),
        "label_smoothing": 0.1,
        "max_seconds": max_seconds,
        "seed": seed,
    }


def word_list_corpus(folder: Path, setting: Setting, nouns: int = 12) -> dict[str, list]:
    """Lists of Korean nouns and their English words, same order; written like the toy."""
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
    """BLEU and exact match of the sentences whose source length falls in each bucket.

    A bucket that no sentence falls into scores NaN (not 0: nothing was measured there).
    """
    rows = []
    for lo, hi in buckets:
        idx = [i for i, s in enumerate(sources) if lo <= len(s.split()) <= hi]
        h, r = [hyps[i] for i in idx], [refs[i] for i in idx]
        rows.append(
            {
                "bucket": f"{lo}-{hi}",
                "sentences": len(idx),
                "bleu": bleu(h, r).score if idx else float("nan"),
                "exact_match": sum(a == b for a, b in zip(h, r)) / len(idx)
                if idx
                else float("nan"),
            }
        )
    return rows


def _relative_drop(rows: list[dict[str, float]]) -> float:
    first, last = rows[0]["bleu"], rows[-1]["bleu"]
    return (first - last) / first if first > 0 else float("nan")


def _evaluate(trained, sources: list[str], refs: list[str], buckets) -> dict:
    outs = translate_texts(trained.model, trained.src_tok, trained.tgt_tok, sources)
    hyps = [o[0].text for o in outs]
    rows = bucket_scores(sources, hyps, refs, buckets)
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
        ],
    }


def _train_all(models: dict, data, out: Path, optim: dict, test, buckets, **kw) -> dict:
    """Train each model in turn and score its greedy translations of ``test`` by length."""
    results = {}
    for name, model in models.items():
        trained = train_model(name, model, data, out, optim, **kw)
        started = time.perf_counter()
        results[name] = _evaluate(trained, *test, buckets)
        results[name]["decode_seconds"] = time.perf_counter() - started
        log.info(
            "%s: %d steps, BLEU %.1f, drop %.2f",
            name,
            trained.steps,
            results[name]["bleu_all"],
            results[name]["relative_drop"],
        )
    return results


def _figure(results: dict[str, dict], buckets, title: str, path: Path, *, em: bool = True) -> str:
    fig = new_figure(11 if em else 7.5, 4.2)
    axes = fig.subplots(1, 2 if em else 1)
    ax_bleu, ax_em = (axes[0], axes[1]) if em else (axes, None)
    mids = [(lo + hi) / 2 for lo, hi in buckets]
    styles = {"rnn-none": "k--o", "rnn-bahdanau": "-s", "rnn-luong": "-^", "transformer": "-D"}
    for name, r in results.items():
        label = f"{name} ({r['parameters'] / 1e6:.2f}M)"
        ax_bleu.plot(mids, [b["bleu"] for b in r["buckets"]], styles[name], label=label)
        if ax_em is not None:
            ems = [100 * b["exact_match"] for b in r["buckets"]]
            ax_em.plot(mids, ems, styles[name], label=label)
    language = "Korean" if em else "German"
    for ax, what in ((ax_bleu, "BLEU"), (ax_em, "exact match (%)")):
        if ax is None:
            continue
        ax.set_xlabel(f"source sentence length ({language} words)")
        ax.set_ylabel(what)
        ax.set_xticks(mids, [f"{lo}–{hi}" for lo, hi in buckets], fontsize=8)
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
    ax_bleu.legend(fontsize=8)
    fig.suptitle(
        f"{title}: quality against sentence length (cf. Bahdanau et al. 2015, Fig. 2)",
        fontsize=None if em else 10,
    )
    return save_figure(fig, path)


def multi30k_part(out: Path, m: Multi30kSetting) -> dict[str, Any]:
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
    seed_all(m.seed)
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
    optim = _optim(m.steps, m.max_tokens, m.lr, m.max_seconds, m.seed)
    test = _test_split(*files[m.test])
    results = _train_all(
        models, data, out / "models-multi30k", optim, test, m.buckets, tokenizer=tokenizer
    )
    figure = _figure(
        results, m.buckets, "Multi30k German→English", out / "bleu-vs-length-multi30k.png", em=False
    )
    return {
        "models": results,
        "figure": figure,
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
            (setting.n_train, 200, setting.n_test),
            setting.min_len,
            setting.max_len,
            setting.seed,
        )
    vocab = vocab_sizes(data / "train.ko", data / "train.en")
    models = _models(setting.models, setting.reference_width, setting.embed, vocab)
    optim = _optim(setting.steps, setting.max_tokens, setting.lr, setting.max_seconds, setting.seed)
    test = ([p.ko for p in splits["test"]], [p.en for p in splits["test"]])
    results = _train_all(models, data, out / "models", optim, test, setting.buckets)
    return results, {"models": models, "vocab": vocab, "optim": optim}


def _drops(results: dict[str, dict]) -> str:
    return ", ".join(f"{n} {100 * r['relative_drop']:.0f}%" for n, r in results.items())


def run(out: Path, *, quick: bool = False) -> LabRun:
    """Toy corpus (and Multi30k in the full run): train the models, score by length."""
    setting = QUICK if quick else FULL
    seed_all(setting.seed)
    toy, config = _toy_part(out, setting)
    title = f"{setting.corpus} Korean→English"
    figures = [_figure(toy, setting.buckets, title, out / "bleu-vs-length.png")]
    if setting.multi30k is None:
        multi30k = {"skipped": "the quick setting runs the toy part only"}
    else:
        multi30k = multi30k_part(out, setting.multi30k)
    figures += [multi30k["figure"]] if "figure" in multi30k else []
    verdict = f"relative BLEU lost from shortest to longest bucket: {setting.corpus}: {_drops(toy)}"
    if "models" in multi30k:
        verdict += f"; Multi30k de→en: {_drops(multi30k['models'])}"
    else:
        verdict += f"; Multi30k de→en skipped: {multi30k['skipped']}"
    return LabRun(
        name="bottleneck",
        quick=quick,
        config={**asdict(setting), **config},
        seeds=[setting.seed],
        results={"toy": toy, "multi30k": multi30k},
        figures=figures,
        verdict=verdict,
    )


def _rows(results: dict[str, dict], width: int) -> list[list[str]]:
    rows = []
    for name, r in results.items():
        cells = [f"{b['bleu']:.1f}" for b in r["buckets"]]
        cells += [""] * (width - len(cells))
        rows.append(
            [
                name,
                f"{r['parameters'] / 1e6:.2f}M",
                str(r["steps"]),
                *cells,
                f"{r['bleu_all']:.1f}",
                f"{100 * r['relative_drop']:.0f}%",
            ]
        )
    return rows


def _bucket_names(results: dict[str, dict]) -> list[str]:
    """The bucket names of the first model's scores (none without models)."""
    first = next(iter(results.values()), None)
    return [b["bucket"] for b in first["buckets"]] if first else []


def table(run: LabRun) -> Table:
    """BLEU per length bucket, parameters, steps and the relative drop, per model and corpus."""
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
    columns += [""] * (width - len(buckets)) + ["BLEU all", "drop"]
    return Table(
        "BLEU by source length (toy: Korean words; Multi30k: German words), greedy", columns, rows
    )
