"""``qkv demo``: the main job on the built-in Korean→English toy corpus.

Generates the corpus, trains an RNN with Luong attention and a Transformer (each for a
fixed number of seeded steps on one thread, so every machine gets the same models as far
as torch allows; a slower one takes longer), then an RNN without attention, scores them on
held-out sentences (exact match and sacreBLEU, greedy search), translates a few sentences
including "고양이가 쥐를 잡았다", and writes ``runs/demo/`` with the checkpoints, attention
heatmaps (PNG) and one attention page per model (HTML: a sentence selector; every layer and
head of the Transformer).
"""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import shlex
import shutil
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
from qkv.translate.evaluate import bleu, decoding_settings, translate_texts
from qkv.viz import save_alignments
from qkv.viz.translations import save_translations

__all__ = [
    "DEMO_SENTENCES",
    "STEPS",
    "Score",
    "attention_pictures",
    "demo_recipes",
    "run_demo",
    "run_cli",
]

log = logging.getLogger(__name__)

DEMO_SENTENCES = [
    "고양이가 쥐를 잡았다",
    "쥐를 잡은 고양이가 잤다",
    "어제 작은 개가 공원에서 공을 찾았다",
]

# Short sentences keep the demo to a few minutes on two CPU cores; longer ones (up to 40
# words) are what `qkv lab bottleneck` uses. The remaining errors are under-training
# (dropped or swapped clauses), not ambiguity: more fresh sentences (20k rather than 10k)
# and a cosine schedule raised BLEU (measured: BENCHMARKS.md, 'demo').
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
# Steps, not seconds: a time budget gave a loaded machine fewer steps and other numbers.
# Sized for the whole demo to take at most 4 minutes on two quiet cores (the README's demo
# section says how). Two cores: the RNN with attention has one; the Transformer, then the
# RNN without attention share the other (the order of MODELS), so both finish together.
STEPS = {"rnn-luong": 2500, "transformer": 850, "rnn-none": 500}
QUICK_STEPS = 60
SEED = 0
BEAM = 1  # the demo scores greedy search; `qkv evaluate --beam 5` scores beam search


def demo_recipes(out: Path, *, quick: bool = False) -> dict[str, Recipe]:
    """The recipes the demo trains: RNN with attention, Transformer, RNN without attention."""
    data = dict(TOY, n_train=1500, n_test=100, n_valid=60) if quick else TOY
    recipes = {}
    for name, model in MODELS.items():
        optim = {  # the recipe's train section
            "steps": QUICK_STEPS if quick else STEPS[name],
            "max_tokens": 1200,
            "lr": LR[name],
            "warmup": 60,
            "schedule": "cosine",  # annealed over the steps
            "eval_every": 100_000,
            "save_every": 100_000,
            "label_smoothing": 0.1,
            "valid_bleu_sentences": 60,
            "threads": 1,  # one core each, and the same sums whatever the machine's cores
            "seed": SEED,
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
    """Held-out quality of one trained model, and the search that translated."""

    name: str
    exact_match: float
    bleu: float
    steps: int
    seconds: float
    decoding: str  # e.g. "greedy, max length 1.5 × source + 10 (at most 64)"


def _evaluate(name: str, ckpt_path: Path, test: list[tuple[str, str]], result) -> Score:
    ckpt = load_checkpoint(ckpt_path)
    src = tokenizer_from_json(ckpt.tokenizers["src"])
    tgt = tokenizer_from_json(ckpt.tokenizers["tgt"])
    texts = [s for s, _ in test]
    hyps = [h[0].text for h in translate_texts(ckpt.model, src, tgt, texts, beam=BEAM)]
    refs = [t for _, t in test]
    exact = sum(h == r for h, r in zip(hyps, refs)) / max(len(refs), 1)
    decoding = decoding_settings(ckpt.model, BEAM)
    return Score(name, exact, bleu(hyps, refs).score, result.steps, result.seconds, decoding)


def attention_pictures(out: Path, ckpt_path: Path, sentences: list[str]) -> list[tuple[str, str]]:
    """Translate ``sentences`` (greedy search) and show where the model looked.

    Writes ``out/attention.html``, the page of ``qkv translate --show-attention``: a
    sentence selector and, for a Transformer, every layer and head of the cross-attention
    and of both self-attentions (an RNN has its alignments); and a heatmap of each
    sentence's alignment, ``out/alignment-1.png``, ``-2.png``, ... A model without
    attention gets neither.

    Returns:
        ``(sentence, translation)`` per sentence.
    """
    ckpt = load_checkpoint(ckpt_path)
    src = tokenizer_from_json(ckpt.tokenizers["src"])
    tgt = tokenizer_from_json(ckpt.tokenizers["tgt"])
    results = translate_texts(ckpt.model, src, tgt, sentences, beam=BEAM)
    entries = []
    for text, nbest in zip(sentences, results):
        best = nbest[0]
        if best.alignment is not None:
            ids = src.encode(text.strip())[: best.alignment.shape[-1]]
            entries.append((text, ids, [src.id_to_token(i) for i in ids], best))
    if entries:
        save_translations(ckpt.model, entries, out / "attention.html")
        items = [(b.alignment, tokens, b.target_labels, t) for t, _, tokens, b in entries]
        try:
            save_alignments(items, out / "alignment.png")  # alignment-1.png, -2.png, ...
        except ImportError as err:  # matplotlib (the viz extra) is optional
            log.warning("no heatmaps: %s", err)
    return [(text, nbest[0].text) for text, nbest in zip(sentences, results)]


def _train_and_score(recipe: Recipe, test: list[tuple[str, str]]) -> Score:
    """Entry point of a worker process: train one model and score it, on one thread."""
    torch.set_num_threads(1)
    result = train(recipe, progress=False)
    return _evaluate(recipe.name, recipe.out_dir / "last.safetensors", test, result)


def _train_all(
    recipes: dict[str, Recipe], test: list[tuple[str, str]], progress: bool
) -> dict[str, Score]:
    """Train and score the models in two worker processes (one core each), in the order
    given.

    Two start at once; the third starts on whichever core frees first, so the steps in
    ``STEPS`` are chosen to keep both cores busy for the same wall time.
    """
    logs = {n: r.out_dir / "log.jsonl" for n, r in recipes.items()}
    no_time_limit = {n: 0 for n in recipes}  # the bars count steps and training time
    with ProcessPoolExecutor(max_workers=2, mp_context=mp.get_context("spawn")) as pool:
        futures = {n: pool.submit(_train_and_score, r, test) for n, r in recipes.items()}
        with LogProgress(logs, no_time_limit, enabled=progress) as bars:
            while not all(f.done() for f in futures.values()):
                bars.refresh()
                time.sleep(0.5)
        return {n: f.result() for n, f in futures.items()}


def run_demo(out: Path, *, quick: bool = False, progress: bool = True) -> dict:
    """Train, evaluate and visualise; return every number (also written to results.json),
    the wall time in ``seconds`` included."""
    started = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    recipes = demo_recipes(out, quick=quick)
    for recipe in recipes.values():  # a fresh run: no log rows from an earlier demo
        (recipe.out_dir / "log.jsonl").unlink(missing_ok=True)
    test = load_pairs(next(iter(recipes.values())).data)[2]
    scores = _train_all(recipes, test, progress)
    pictures = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the sums the scores were made with, in the workers
    try:
        for name, recipe in recipes.items():
            if recipe.model.get("attention") != "none":
                ckpt = recipe.out_dir / "last.safetensors"
                pictures[name] = attention_pictures(recipe.out_dir, ckpt, DEMO_SENTENCES)
    finally:
        torch.set_num_threads(threads)
    summary = {
        "scores": [vars(scores[name]) for name in recipes],
        "translations": pictures,
        "test_sentences": len(test),
        "seconds": time.perf_counter() - started,
    }
    text = json.dumps(summary, indent=2, ensure_ascii=False)
    write_text_atomic(out / "results.json", text)  # UTF-8 whatever the locale
    write_text_atomic(out / "sentences.txt", "".join(f"{s}\n" for s in DEMO_SENTENCES))
    return summary


def _search(decoding: str) -> str:
    """The search of a :func:`decoding_settings` text: "greedy" or "beam 5"."""
    return decoding.split(",")[0]


def qkv_command() -> str:
    """How to call qkv in a command printed to paste: ``qkv`` when the shell finds this
    qkv on its PATH, else the path this process was started by (``.venv/bin/qkv``), else
    ``python -m qkv`` with this interpreter."""
    started = Path(sys.argv[0])
    found = shutil.which("qkv")
    if started.name == "qkv":
        if found is not None and Path(found).resolve() == started.resolve():
            return "qkv"
        return shlex.quote(str(started))
    if found is not None and Path(found).resolve().parent == Path(sys.executable).parent:
        return "qkv"
    return f"{shlex.quote(sys.executable)} -m qkv"


def _report(out: Path, summary: dict, qkv: str = "qkv") -> None:
    from rich.table import Table

    console = stdout_console(soft_wrap=True)
    table = Table(title=f"held-out toy test set ({summary['test_sentences']} sentences)")
    for col in ("model", "exact match", "BLEU", "steps", "train time"):
        table.add_column(col, justify="left" if col == "model" else "right")
    for s in summary["scores"]:
        search = _search(s["decoding"])  # beam search scores the same model differently
        table.add_row(
            s["name"],
            f"{100 * s['exact_match']:.1f}% ({search})",
            f"{s['bleu']:.1f} ({search})",
            str(s["steps"]),
            f"{s['seconds']:.0f} s",
        )
    console.print(table)
    models: dict[str, list[str]] = {}  # each decoding setting, and the models it scored
    for s in summary["scores"]:
        models.setdefault(s["decoding"], []).append(s["name"])
    for decoding, names in models.items():
        console.print(f"decoding of {', '.join(names)}: {decoding}", markup=False)
    for name, pairs in summary["translations"].items():
        console.print(name, style="bold", markup=False)
        for src, hyp in pairs:  # as written: a "[/x]" in a sentence is text, not markup
            console.print(f"  {src}  →  {hyp}", markup=False)
    minutes, seconds = divmod(round(summary["seconds"]), 60)
    console.print(f"\nThe demo took {minutes} min {seconds:02d} s.", markup=False)
    console.print(
        f"Everything is in {out}/: checkpoints (*/last.safetensors), attention "
        f"pages (*/attention.html), heatmaps (*/alignment-*.png), results.json.",
        markup=False,
    )
    ckpt = shlex.quote(str(out / "transformer" / "last.safetensors"))  # commands to paste
    page, sentences = (shlex.quote(str(out / name)) for name in ("try.html", "sentences.txt"))
    console.print("Next, try:")
    lines = [
        f"echo '고양이가 쥐를 잡았다' | {qkv} translate {ckpt} --beam 5",
        f"{qkv} translate {ckpt} --show-attention {page} < {sentences}",
        f'{qkv} walkthrough "Sally likes Sam" --no-positions',
    ]
    if Path("configs/toy-transformer.yaml").is_file():  # run from the repository
        lines.append(f"{qkv} train configs/toy-transformer.yaml --set train.steps=300")
    for line in lines:
        console.print(f"  {line}", markup=False)
    if qkv != "qkv":  # said once: how to type qkv alone
        activate = shlex.quote(str(Path(sys.executable).parent / "activate"))
        console.print(
            f"(qkv is not on this shell's PATH; `source {activate}` once per shell puts it "
            "there, then `qkv ...` runs as well)",
            markup=False,
        )


def run_cli(args) -> int:
    """``qkv demo [--out DIR] [--quick]``."""
    out = Path(args.out)
    summary = run_demo(out, quick=args.quick)
    if hasattr(sys.stdout, "reconfigure"):  # Hangul: UTF-8 whatever the locale
        sys.stdout.reconfigure(encoding="utf-8")
    _report(out, summary, qkv_command())
    return 0
