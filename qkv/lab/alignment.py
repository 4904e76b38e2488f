"""Lab ``alignment``: a decoder query is compared with every source key; related words win.

Claim:
    When a translator emits a target word, its query is compared with the key of every
    source word, and the softmax puts the weight on the source words that word translates,
    even when the word order differs (Korean is subject–object–verb, English
    subject–verb–object), so attention recovers a word alignment nobody taught it.

Method:
    Train Korean→English translators on the toy corpus (whitespace words, the ``word``
    tokenizer, so tokens are words): RNNs with Bahdanau, Luong global and Luong local-p
    attention, and a Transformer. Feed each held-out pair with teacher forcing and, for
    every English word, take the source word with the largest attention weight. Score
    these links against the grammar's gold alignment with the alignment error rate (Och &
    Ney 2003; every gold link is "sure"): :math:`AER = 1 - 2|A \\cap S| / (|A| + |S|)`.
    For the Transformer, every (layer, head) of the cross-attention, the mean of the last
    layer and the mean of all maps are scored; the best (layer, head) is chosen on the
    validation pairs and reported on the test pairs. Baselines: the monotonic diagonal
    (the :math:`j`-th of ``T`` target words links to source word
    :math:`\\mathrm{round}(j (S-1)/(T-1))`) and a uniformly random source word (expected AER).

    The full run adds real sentences: Tatoeba kor-eng (5,749 pairs, ``kor.txt``) with
    held-out validation and test sets split by Korean sentence (no source sentence in two
    splits), a BPE tokenizer per language, a Bahdanau GRU and a Transformer trained for a
    wall-clock budget each. There is no gold alignment, so it reports held-out sacreBLEU
    and draws the attention heatmaps of three held-out sentences. The heatmaps show each
    model's attention while it translates greedily (its own output, titled as such), not
    the teacher-forced reference that the AER scores.
"""

from __future__ import annotations

import logging
import textwrap
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from qkv.data.prepare import load_pairs
from qkv.data.toy import ToyPair
from qkv.lab.common import (
    LabRun,
    Table,
    corpus_folder,
    fonts_for,
    new_figure,
    save_figure,
    seed_all,
)
from qkv.lab.training import MODEL_FAMILIES, train_model, write_toy_corpus
from qkv.train.recipe import DataConfig
from qkv.translate.evaluate import bleu, translate_texts
from qkv.viz import plot_alignment

__all__ = [
    "Setting",
    "TatoebaSetting",
    "QUICK",
    "FULL",
    "aer",
    "attention_maps",
    "baselines",
    "run",
    "table",
    "tatoeba_part",
]

log = logging.getLogger(__name__)

SHOWN = ["고양이가 쥐를 잡았다"]  # plus the two longest test sentences of at most 10 words
# the heatmap of a multi-head model shows one map of many (Hypothesis.alignment): say which;
# the AER table's "best map" is another one
SHOWN_MAP = {"transformer": "\n(mean of the last layer's heads)"}


@dataclass(frozen=True)
class TatoebaSetting:
    """The Tatoeba kor-eng part of the full run (real sentences, BPE, no gold alignment)."""

    models: tuple[str, ...]
    vocab_size: int  # per language (two BPE vocabularies)
    embed: int
    width: int
    transformer_width: int
    dropout: float
    n_valid: int
    n_test: int
    steps: int
    max_seconds: float  # per model
    max_tokens: int
    lr: float
    path: str = ""  # "" = the shared corpora folder's ko-en/tatoeba/kor.txt
    shown: int = 3  # held-out sentences drawn as heatmaps
    seed: int = 0


@dataclass(frozen=True)
class Setting:
    """Corpus, models and training of one run."""

    n_train: int
    n_valid: int
    n_test: int
    min_len: int
    max_len: int
    models: tuple[str, ...]
    embed: int
    width: int
    transformer_width: int
    steps: int
    max_seconds: float
    max_tokens: int
    lr: float
    seed: int = 0
    tatoeba: TatoebaSetting | None = None  # None: not part of this setting


QUICK = Setting(
    n_train=2500,
    n_valid=40,
    n_test=100,
    min_len=2,
    max_len=8,
    models=("transformer",),
    embed=32,
    width=64,
    transformer_width=64,
    steps=400,
    max_seconds=0,
    max_tokens=800,
    lr=3e-3,
)
TATOEBA = TatoebaSetting(
    models=("rnn-bahdanau", "transformer"),
    vocab_size=2000,
    embed=128,
    width=192,
    transformer_width=192,
    dropout=0.3,
    n_valid=300,
    n_test=500,
    steps=20000,
    max_seconds=450,
    max_tokens=1000,
    lr=1e-3,
)
FULL = Setting(
    n_train=12000,
    n_valid=200,
    n_test=500,
    min_len=2,
    max_len=12,
    models=("rnn-bahdanau", "rnn-luong", "rnn-luong-local", "transformer"),
    embed=64,
    width=128,
    transformer_width=128,
    steps=20000,
    max_seconds=180,
    max_tokens=2000,
    lr=3e-3,
    tatoeba=TATOEBA,
)


def aer(predicted: list[set], gold: list[set]) -> float:
    """Corpus alignment error rate with sure links only: ``1 - 2|A∩S| / (|A| + |S|)``."""
    hit = sum(len(a & s) for a, s in zip(predicted, gold))
    total = sum(len(a) + len(s) for a, s in zip(predicted, gold))
    return 1.0 - 2.0 * hit / total


def _argmax_links(weights: np.ndarray) -> set:
    """Links (source, target) from the argmax source word of each target row ``(T, S)``."""
    return {(int(i), j) for j, i in enumerate(weights.argmax(-1))}


def baselines(pairs: list[ToyPair]) -> dict[str, float]:
    """AER of the monotonic diagonal and (expected) of a uniformly random source word."""
    gold = [set(p.alignment) for p in pairs]
    diagonal, hit, total = [], 0.0, 0
    for p in pairs:
        s, t = len(p.ko.split()), len(p.en.split())
        diagonal.append({(round(j * (s - 1) / max(t - 1, 1)), j) for j in range(t)})
        links = {}
        for i, j in p.alignment:
            links.setdefault(j, set()).add(i)
        hit += sum(len(v) / s for v in links.values())  # expected hits of a random link
        total += t + len(p.alignment)
    return {"diagonal": aer(diagonal, gold), "random (expected)": 1.0 - 2.0 * hit / total}


@torch.no_grad()
def attention_maps(trained, pairs: list[ToyPair], batch: int = 64) -> list[dict[str, np.ndarray]]:
    """Teacher-forced cross-attention ``(T_en, S_ko)`` per pair, keyed by map name.

    RNNs give one map (``attention``); a Transformer gives ``L{l}H{h}`` for every layer and
    head, ``last-layer mean`` and ``all mean``. Row ``j`` is the attention while predicting
    English word ``j``.
    """
    model, src_tok, tgt_tok = trained.model, trained.src_tok, trained.tgt_tok
    out = []
    for start in range(0, len(pairs), batch):
        chunk = pairs[start : start + batch]
        srcs = [src_tok.encode(p.ko) for p in chunk]
        tgts = [[tgt_tok.bos_id, *tgt_tok.encode(p.en)] for p in chunk]
        src = _pad(srcs, model.pad_id)
        tgt = _pad(tgts, model.pad_id)
        _, attn = model(src, tgt)
        cross = torch.stack(attn.cross, 1)  # (B, L, H, T, S)
        for b, (s, t) in enumerate(zip(srcs, tgts)):
            maps = cross[b, :, :, : len(t) - 1, : len(s)].double().numpy()  # (L, H, T_en, S)
            out.append(_named(maps))
    return out


def _named(maps: np.ndarray) -> dict[str, np.ndarray]:
    n_layers, n_heads = maps.shape[:2]
    if n_layers == 1 and n_heads == 1:
        return {"attention": maps[0, 0]}
    named = {f"L{l}H{h}": maps[l, h] for l in range(n_layers) for h in range(n_heads)}
    named["last-layer mean"] = maps[-1].mean(0)
    named["all mean"] = maps.mean((0, 1))
    return named


def _pad(rows: list[list[int]], pad: int) -> torch.Tensor:
    longest = max(len(r) for r in rows)
    return torch.tensor([r + [pad] * (longest - len(r)) for r in rows])


def score_maps(trained, valid: list[ToyPair], test: list[ToyPair]) -> dict[str, float]:
    """Test AER of every map, and of the map that is best on the validation pairs."""
    gold_v, gold_t = [set(p.alignment) for p in valid], [set(p.alignment) for p in test]
    maps_v, maps_t = attention_maps(trained, valid), attention_maps(trained, test)
    names = list(maps_t[0])
    valid_aer = {n: aer([_argmax_links(m[n]) for m in maps_v], gold_v) for n in names}
    test_aer = {n: aer([_argmax_links(m[n]) for m in maps_t], gold_t) for n in names}
    best = min(valid_aer, key=valid_aer.get)
    summary = {"best map (chosen on valid)": best, "aer_best": test_aer[best]}
    summary["aer_averaged"] = test_aer["all mean" if "all mean" in test_aer else "attention"]
    return {**summary, "aer_per_map": test_aer}


def _heatmaps(
    trained_models: dict, sentences: list[str], out: Path, prefix: str = "alignment"
) -> list[str]:
    paths = []
    for k, text in enumerate(sentences):
        with fonts_for([text]):
            fig = new_figure(5.2 * len(trained_models), 5.0)
            axes = np.atleast_1d(fig.subplots(1, len(trained_models)))
            for ax, (name, tr) in zip(axes, trained_models.items()):
                best = translate_texts(tr.model, tr.src_tok, tr.tgt_tok, [text])[0][0]
                # the model's own greedy output, not the reference (AER uses the reference)
                title = f"{name}, greedy output{SHOWN_MAP.get(name, '')}:\n→ {_wrap(best.text)}"
                src = tr.src_tok.tokens(text)  # words for the toy, BPE pieces for Tatoeba
                plot_alignment(best.alignment.numpy(), src, best.target_labels, title=title, ax=ax)
            paths.append(save_figure(fig, out / f"{prefix}-{k + 1}.png"))
    return paths


def _wrap(text: str, width: int = 40) -> str:
    """Break a long translation into lines for a subplot title."""
    return "\n".join(textwrap.wrap(text, width)) or text


def _shown(test: list[ToyPair]) -> list[str]:
    longer = sorted((p for p in test if len(p.ko.split()) <= 10), key=lambda p: -len(p.ko.split()))
    return SHOWN + [p.ko for p in longer[:2]]


def _tatoeba_data(t: TatoebaSetting) -> dict[str, Any]:
    """The recipe data section: Korean column → English column, held out by source."""
    path = t.path or str(corpus_folder("tatoeba-ko-en", "kor.txt") / "kor.txt")
    return {
        "kind": "tsv",
        "path": path,
        "src_column": 1,
        "tgt_column": 0,
        "n_valid": t.n_valid,
        "n_test": t.n_test,
        "seed": t.seed,
        "max_tokens": 60,
    }


def _tatoeba_shown(test: list[tuple[str, str]], n: int) -> list[str]:
    """The first ``n`` distinct held-out sources of at least four words (split order)."""
    shown: list[str] = []
    for src, _ in test:
        if len(src.split()) >= 4 and src not in shown and len(shown) < n:
            shown.append(src)
    return shown


def tatoeba_part(out: Path, t: TatoebaSetting) -> dict[str, Any]:
    """Train on Tatoeba kor-eng, score held-out BLEU, draw heatmaps; ``{"skipped": why}``."""
    data = _tatoeba_data(t)
    if not Path(data["path"]).is_file():
        reason = (
            f"Tatoeba kor-eng not found ({data['path']} missing; 'qkv data download "
            "tatoeba-ko-en' fetches it); that part not run"
        )
        log.warning("%s", reason)
        return {"skipped": reason}
    seed_all(t.seed)
    train, _, test = load_pairs(DataConfig(**data))  # the same split the trainer makes
    tokenizer = {"kind": "bpe", "vocab_size": t.vocab_size, "joint": False}
    optim = {
        "steps": t.steps,
        "max_tokens": t.max_tokens,
        "lr": t.lr,
        "warmup": 200,
        "label_smoothing": 0.1,
        "max_seconds": t.max_seconds,
        "seed": t.seed,
    }
    sources, refs = [s for s, _ in test], [r for _, r in test]
    models, trained, results = {}, {}, {}
    for name in t.models:
        width = t.transformer_width if name == "transformer" else t.width
        models[name] = {**MODEL_FAMILIES[name](width, t.embed), "dropout": t.dropout}
        trained[name] = train_model(
            name, models[name], data, out / "models-tatoeba", optim, tokenizer=tokenizer
        )
        results[name] = _held_out_bleu(trained[name], sources, refs)
        log.info(
            "tatoeba %s: %d steps, BLEU %.1f", name, trained[name].steps, results[name]["bleu"]
        )
    figures = _heatmaps(trained, _tatoeba_shown(test, t.shown), out, prefix="tatoeba-alignment")
    return {
        "models": results,
        "shown": _tatoeba_shown(test, t.shown),
        "figures": figures,
        "sizes": {"train": len(train), "test": len(test), "test sources": len(set(sources))},
        **{"data": data, "tokenizer": tokenizer, "model_sections": models, "optim": optim},
    }


def _held_out_bleu(trained, sources: list[str], refs: list[str]) -> dict[str, Any]:
    """Greedy sacreBLEU on the held-out pairs, the training record and five examples."""
    outs = translate_texts(trained.model, trained.src_tok, trained.tgt_tok, sources)
    hyps = [o[0].text for o in outs]
    examples = [{"src": s, "ref": r, "hyp": h} for s, r, h in zip(sources[:5], refs, hyps)]
    record = {"parameters": trained.parameters, "steps": trained.steps}
    return {
        "bleu": bleu(hyps, refs).score,
        **record,
        "train_seconds": trained.seconds,
        "examples": examples,
    }


def _toy_part(out: Path, setting: Setting) -> tuple[dict, dict, list[str], dict]:
    """Train on the toy corpus and score AER: results, baselines, figures, config."""
    data = out / "data"
    splits = write_toy_corpus(
        data,
        (setting.n_train, setting.n_valid, setting.n_test),
        setting.min_len,
        setting.max_len,
        setting.seed,
    )
    optim = {
        "steps": setting.steps,
        "max_tokens": setting.max_tokens,
        "lr": setting.lr,
        "warmup": min(200, setting.steps // 5),
        "label_smoothing": 0.1,
        "max_seconds": setting.max_seconds,
        "seed": setting.seed,
    }
    models, trained, results = {}, {}, {}
    for name in setting.models:
        width = setting.transformer_width if name == "transformer" else setting.width
        models[name] = MODEL_FAMILIES[name](width, setting.embed)
        trained[name] = train_model(name, models[name], data, out / "models", optim)
        results[name] = {
            **score_maps(trained[name], splits["valid"], splits["test"]),
            "parameters": trained[name].parameters,
            "steps": trained[name].steps,
            "train_seconds": trained[name].seconds,
        }
        log.info("%s: AER %.3f", name, results[name]["aer_best"])
    base = baselines(splits["test"])
    figures = _heatmaps(trained, _shown(splits["test"]), out)
    return results, base, figures, {"model_sections": models, "optim": optim}


def run(out: Path, *, quick: bool = False) -> LabRun:
    """Train the models, score their attention against the gold alignment, draw heatmaps."""
    setting = QUICK if quick else FULL
    seed_all(setting.seed)
    results, base, figures, config = _toy_part(out, setting)
    if setting.tatoeba is None:
        tatoeba = {"skipped": "the quick setting runs the toy part only"}
    else:
        tatoeba = tatoeba_part(out, setting.tatoeba)
    figures += tatoeba.get("figures", [])
    verdict = "test AER (lower is better): " + ", ".join(
        [f"{n} {r['aer_best']:.3f}" for n, r in results.items()]
        + [f"{n} baseline {v:.3f}" for n, v in base.items()]
    )
    if "models" in tatoeba:
        verdict += "; Tatoeba held-out BLEU: " + ", ".join(
            f"{n} {r['bleu']:.1f}" for n, r in tatoeba["models"].items()
        )
    else:
        verdict += f"; Tatoeba skipped: {tatoeba['skipped']}"
    return LabRun(
        name="alignment",
        quick=quick,
        config={**asdict(setting), **config, "corpus": "toy Korean→English (qkv.data.toy)"},
        seeds=[setting.seed],
        results={"models": results, "baselines": base, "tatoeba": tatoeba},
        figures=figures,
        verdict=verdict,
    )


def table(run: LabRun) -> Table:
    """AER per model (best map and averaged) and of the baselines."""
    rows = []
    for name, r in run.results["models"].items():
        rows.append(
            [
                name,
                r["best map (chosen on valid)"],
                f"{r['aer_best']:.3f}",
                f"{r['aer_averaged']:.3f}",
            ]
        )
    for name, value in run.results["baselines"].items():
        rows.append([f"baseline: {name}", "", f"{value:.3f}", ""])
    tatoeba = run.results.get("tatoeba", {})
    for name, r in tatoeba.get("models", {}).items():
        rows.append(
            [
                f"Tatoeba kor-eng: {name}",
                f"{r['steps']} steps",
                "no gold",
                f"held-out BLEU {r['bleu']:.1f}",
            ]
        )
    if "skipped" in tatoeba:
        rows.append(["Tatoeba: skipped (reason in the verdict)", "", "", ""])
    return Table(
        "alignment error rate on the test pairs (lower is better)",
        ["model", "best map", "AER best", "AER averaged"],
        rows,
    )
