"""``qkv demo``: the main job on the built-in Korean→English toy corpus.

Generates the corpus, trains an RNN with Luong attention and a Transformer (each within a
time budget), scores both on held-out sentences (exact match and sacreBLEU), translates a
few sentences including "고양이가 쥐를 잡았다", and writes ``runs/demo/`` with the
checkpoints, attention heatmaps (PNG) and an interactive attention viewer (HTML).
"""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import shlex
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from qkv.data.prepare import load_pairs
from qkv.data.tokenizers import tokenizer_from_json
from qkv.files import write_text_atomic
from qkv.models.checkpoint import load_checkpoint
from qkv.train.loop import train
from qkv.train.progress import LogProgress
from qkv.train.progress import console as stdout_console
from qkv.train.recipe import Recipe, recipe_from_dict
from qkv.translate.evaluate import bleu, translate_texts
from qkv.viz import plot_alignment, save_html
from qkv.viz.alignments import describe_alignment

__all__ = ["DEMO_SENTENCES", "Score", "demo_recipes", "run_demo", "run_cli"]

log = logging.getLogger(__name__)

DEMO_SENTENCES = [
    "고양이가 쥐를 잡았다",
    "쥐를 잡은 고양이가 잤다",
    "어제 작은 개가 공원에서 공을 찾았다",
]

# Short sentences keep the demo to a few minutes on two CPU cores; longer ones (up to 40
# words) are what `qkv lab bottleneck` uses. The remaining errors are under-training
# (dropped or swapped clauses), not ambiguity: more fresh sentences (20k rather than 10k)
# and a cosine schedule that anneals by the time budget raised BLEU (measured:
# BENCHMARKS.md, 'demo').
TOY = {"kind": "toy", "n_train": 20000, "n_valid": 200, "n_test": 500, "min_len": 2, "max_len": 6}
MODELS = {
    # Small: a GRU step is sequential, so a narrower one trains more steps. Without input
    # feeding the decoder GRU runs over the whole target at once and attention is one
    # batched product: more steps in the same time than the input-fed decoder, and more
    # exact translations (measured: BENCHMARKS.md, 'demo').
    "rnn-luong": {
        "type": "rnn",
        "cell": "gru",
        "embed_dim": 96,
        "hidden_dim": 128,
        "bidirectional": True,
        "attention": "luong",
        "score": "general",
        "input_feeding": False,
    },
    "transformer": {
        "type": "transformer",
        "d_model": 128,
        "num_heads": 4,
        "num_encoder_layers": 2,
        "num_decoder_layers": 2,
        "ff_dim": 256,
        "dropout": 0.0,
        "norm_first": True,
    },
    "rnn-none": {  # the same size as rnn-luong, without attention
        "type": "rnn",
        "cell": "gru",
        "embed_dim": 96,
        "hidden_dim": 128,
        "bidirectional": True,
        "attention": "none",
    },
}
LR = {"rnn-luong": 5e-3, "transformer": 3e-3, "rnn-none": 5e-3}
# Two cores: the RNN with attention has one; the Transformer, then the RNN without attention
# share the other (the order of MODELS), so both finish together.
SECONDS = {"rnn-luong": 210.0, "transformer": 170.0, "rnn-none": 40.0}


def demo_recipes(out: Path, *, quick: bool = False) -> dict[str, Recipe]:
    """The recipes the demo trains: RNN with attention, Transformer, RNN without attention."""
    data = dict(TOY, n_train=1500, n_test=100, n_valid=60) if quick else TOY
    recipes = {}
    for name, model in MODELS.items():
        optim = {  # the recipe's train section
            "steps": 60 if quick else 5000,
            "max_tokens": 1200,
            "lr": LR[name],
            "warmup": 60,
            "schedule": "cosine",  # annealed by the time budget (qkv.train.schedule)
            "eval_every": 100_000,
            "save_every": 100_000,
            "label_smoothing": 0.1,
            "max_seconds": 0 if quick else SECONDS[name],
            "valid_bleu_sentences": 60,
            "threads": 1,
        }
        recipes[name] = recipe_from_dict(
            {
                "name": name,
                "out": str(out / name),
                "data": data,
                "tokenizer": {"kind": "word"},
                "model": model,
                "train": optim,
            }
        )
    return recipes


@dataclass
class Score:
    """Held-out quality of one trained model."""

    name: str
    exact_match: float
    bleu: float
    steps: int
    seconds: float


def _evaluate(name: str, ckpt_path: Path, test: list[tuple[str, str]], result) -> Score:
    ckpt = load_checkpoint(ckpt_path)
    src = tokenizer_from_json(ckpt.tokenizers["src"])
    tgt = tokenizer_from_json(ckpt.tokenizers["tgt"])
    hyps = [h[0].text for h in translate_texts(ckpt.model, src, tgt, [s for s, _ in test])]
    refs = [t for _, t in test]
    exact = sum(h == r for h, r in zip(hyps, refs)) / max(len(refs), 1)
    return Score(name, exact, bleu(hyps, refs).score, result.steps, result.seconds)


def _pictures(out: Path, ckpt_path: Path, sentences: list[str]) -> list[tuple[str, str]]:
    """Translate ``sentences``; write a heatmap PNG per sentence and one HTML viewer."""
    ckpt = load_checkpoint(ckpt_path)
    src = tokenizer_from_json(ckpt.tokenizers["src"])
    tgt = tokenizer_from_json(ckpt.tokenizers["tgt"])
    results = translate_texts(ckpt.model, src, tgt, sentences)
    pairs = []
    for i, (text, nbest) in enumerate(zip(sentences, results)):
        best = nbest[0]
        pairs.append((text, best.text))
        if best.alignment is None:
            continue
        src_tokens = src.tokens(text)
        tgt_tokens = best.target_labels
        try:
            plot_alignment(
                best.alignment,
                src_tokens,
                tgt_tokens,
                title=f"{text} → {best.text}",
                path=out / f"alignment-{i + 1}.png",
            )
        except ImportError as err:  # matplotlib (the viz extra) is optional
            log.warning("no heatmaps: %s", err)
        save_html(
            out / f"alignment-{i + 1}.html",
            best.alignment[None, None],
            src_tokens=src_tokens,
            tgt_tokens=tgt_tokens,
            title=f"{text} → {best.text}",
            map_label=describe_alignment(ckpt.model),
        )
    return pairs


def _train_in_process(recipe: Recipe):
    """Entry point of a worker process: one model, one thread."""
    torch.set_num_threads(1)
    return train(recipe, progress=False)


def _train_all(recipes: dict[str, Recipe], progress: bool) -> dict:
    """Train the models in two worker processes (one core each), in the order given.

    Two start at once; the third starts on whichever core frees first, so the budgets in
    ``SECONDS`` are chosen to keep both cores busy for the same wall time.
    """
    logs = {n: r.out_dir / "log.jsonl" for n, r in recipes.items()}
    limits = {n: r.train.max_seconds for n, r in recipes.items()}
    with ProcessPoolExecutor(max_workers=2, mp_context=mp.get_context("spawn")) as pool:
        futures = {n: pool.submit(_train_in_process, r) for n, r in recipes.items()}
        with LogProgress(logs, limits, enabled=progress) as bars:
            while not all(f.done() for f in futures.values()):
                bars.refresh()
                time.sleep(0.5)
        return {n: f.result() for n, f in futures.items()}


def run_demo(out: Path, *, quick: bool = False, progress: bool = True) -> dict:
    """Train, evaluate and visualise; return every number (also written to results.json)."""
    out.mkdir(parents=True, exist_ok=True)
    recipes = demo_recipes(out, quick=quick)
    for recipe in recipes.values():  # a fresh run: no log rows from an earlier demo
        (recipe.out_dir / "log.jsonl").unlink(missing_ok=True)
    test = load_pairs(next(iter(recipes.values())).data)[2]
    scores, pictures = [], {}
    trained = _train_all(recipes, progress)
    for name, recipe in recipes.items():
        result = trained[name]
        scores.append(_evaluate(name, recipe.out_dir / "last.safetensors", test, result))
        if name != "rnn-none":
            pictures[name] = _pictures(
                recipe.out_dir, recipe.out_dir / "last.safetensors", DEMO_SENTENCES
            )
    summary = {
        "scores": [vars(s) for s in scores],
        "translations": pictures,
        "test_sentences": len(test),
    }
    text = json.dumps(summary, indent=2, ensure_ascii=False)
    write_text_atomic(out / "results.json", text)  # UTF-8 whatever the locale
    return summary


def _report(out: Path, summary: dict) -> None:
    from rich.table import Table

    console = stdout_console(soft_wrap=True)
    table = Table(title=f"held-out toy test set ({summary['test_sentences']} sentences)")
    for col in ("model", "exact match", "BLEU", "steps", "train time"):
        table.add_column(col, justify="left" if col == "model" else "right")
    for s in summary["scores"]:
        table.add_row(
            s["name"],
            f"{100 * s['exact_match']:.1f}%",
            f"{s['bleu']:.1f}",
            str(s["steps"]),
            f"{s['seconds']:.0f} s",
        )
    console.print(table)
    for name, pairs in summary["translations"].items():
        console.print(name, style="bold", markup=False)
        for src, hyp in pairs:  # as written: a "[/x]" in a sentence is text, not markup
            console.print(f"  {src}  →  {hyp}", markup=False)
    console.print(
        f"\nEverything is in {out}/: checkpoints (*/last.safetensors), attention "
        f"heatmaps (*/alignment-*.png), viewers (*/alignment-*.html), results.json.",
        markup=False,
    )
    ckpt = shlex.quote(str(out / "transformer" / "last.safetensors"))  # commands to paste
    console.print("Next, try:")
    console.print(f"  echo '고양이가 쥐를 잡았다' | qkv translate {ckpt} --beam 5", markup=False)
    console.print(
        f"  qkv translate {ckpt} --show-attention attention.html < sentences.txt", markup=False
    )
    console.print('  qkv walkthrough "Sally likes Sam" --no-positions')
    console.print("  qkv train configs/toy-transformer.yaml")


def run_cli(args) -> int:
    """``qkv demo [--out DIR] [--quick]``."""
    out = Path(args.out)
    summary = run_demo(out, quick=args.quick)
    if hasattr(sys.stdout, "reconfigure"):  # Hangul: UTF-8 whatever the locale
        sys.stdout.reconfigure(encoding="utf-8")
    _report(out, summary)
    return 0
