"""Training helpers shared by the translation experiments (``bottleneck``, ``alignment``).

The toy corpus is generated once and written as line-aligned files, so every model of an
experiment trains on exactly the same pairs (the gold word alignments stay in memory).
Model widths are chosen so that every model has about the same number of parameters.

A lab training runs until it has converged (:func:`until_converged`): it validates every
``eval_every`` steps and stops when ``patience`` evaluations in a row bring no better
validation BLEU (or, at equal BLEU, loss), with a generous step cap and no wall-clock
budget; the best evaluation's checkpoint is the model scored. :class:`Trained` reports the
steps, the time, why it stopped and the validation curve (from the run's ``log.jsonl``),
which :func:`curve_figure` draws.

A lab training continues what its folder holds: an experiment stopped after hours (a
kill, a reboot) is run again with the same command and ``--out``, its finished trainings
are loaded as they are and the interrupted one resumes from its last checkpoint (saved at
every evaluation), exactly as the uninterrupted training would have gone on.
:func:`train_models` trains the independent trainings of an experiment in
``parallel_trainings(N)`` processes at once (``qkv lab NAME --jobs N``), one thread each
(:mod:`qkv.lab.processes`), on the CPU or, with ``parallel_trainings(N, "cuda")``
(``--device cuda``), on the GPU; the models are scored on the CPU either way.
:func:`scored_trainings` also scores each model as soon as it has trained and keeps the
score beside the training's record in its folder, where it stands for the training on
any machine: an experiment too long for one sitting goes on where the last one stopped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from qkv.data.tokenizers import tokenizer_from_json, train_tokenizers
from qkv.data.toy import ToyPair, make_splits
from qkv.errors import CheckpointError
from qkv.lab import common
from qkv.lab.common import progress_bars
from qkv.lab.processes import run_in_processes
from qkv.models.checkpoint import build_model, load_checkpoint
from qkv.train.loop import train
from qkv.train.progress import LogProgress
from qkv.train.recipe import recipe_from_dict

__all__ = [
    "MODEL_FAMILIES",
    "TrainJob",
    "Trained",
    "by_model",
    "count_parameters",
    "curve_figure",
    "match_width",
    "parallel_trainings",
    "progress_bars",
    "read_curve",
    "scored_trainings",
    "train_model",
    "train_models",
    "training_bars",
    "until_converged",
    "vocab_sizes",
    "write_toy_corpus",
]

log = logging.getLogger(__name__)

SPLITS = ("train", "valid", "test")


# how many trainings train_models runs at once, and on which device
_PROCESSES: dict[str, Any] = {"trainings": 1, "device": "cpu"}


@contextlib.contextmanager
def parallel_trainings(processes: int, device: str = "cpu") -> Iterator[None]:
    """Inside this block :func:`train_models` trains up to ``processes`` models at once,
    on ``device`` ("cpu" or "cuda")."""
    if processes < 1:
        raise ValueError(f"parallel trainings: at least 1 process, got {processes}")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"parallel trainings: device 'cpu' or 'cuda', got {device!r}")
    before = dict(_PROCESSES)
    _PROCESSES.update(trainings=processes, device=device)
    try:
        yield
    finally:
        _PROCESSES.update(before)


@contextlib.contextmanager
def training_bars(out_dirs: dict[str, Path]) -> Iterator[None]:
    """A bar per run (name -> its folder) that follows its ``log.jsonl`` (step, loss,
    seconds trained) from a second thread while the block trains; nothing unless
    :func:`progress_bars`."""
    if not common.bars_shown():
        yield
        return
    stop = threading.Event()
    logs = {name: folder / "log.jsonl" for name, folder in out_dirs.items()}
    with LogProgress(logs, dict.fromkeys(out_dirs, 0)) as bars:

        def follow() -> None:
            while not stop.wait(0.5):
                bars.refresh()

        thread = threading.Thread(target=follow, name="training-bars", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()


def write_toy_corpus(
    folder: Path, sizes: tuple[int, int, int], min_len: int, max_len: int, seed: int
) -> dict[str, list[ToyPair]]:
    """Generate the toy splits and write ``folder/{train,valid,test}.{ko,en}``."""
    splits = make_splits(*sizes, seed=seed, min_len=min_len, max_len=max_len)
    folder.mkdir(parents=True, exist_ok=True)
    for name in SPLITS:
        for lang in ("ko", "en"):
            text = "".join(getattr(p, lang) + "\n" for p in splits[name])
            (folder / f"{name}.{lang}").write_text(text, encoding="utf-8")
    return splits


def _data_section(folder: Path) -> dict[str, Any]:
    files = {name: [str(folder / f"{name}.ko"), str(folder / f"{name}.en")] for name in SPLITS}
    return {"kind": "files", **files, "max_tokens": 1000, "max_ratio": 20.0}


def vocab_sizes(
    src_file: Path, tgt_file: Path, tokenizer: dict[str, Any] | None = None
) -> tuple[int, int]:
    """Source and target vocabulary sizes of the tokenizers trained on two training files.

    ``tokenizer`` is a recipe's tokenizer section (default: the ``word`` tokenizer).
    """
    tok = {"kind": "word", "vocab_size": 8000, "joint": False, **(tokenizer or {})}
    src = Path(src_file).read_text(encoding="utf-8").splitlines()
    tgt = Path(tgt_file).read_text(encoding="utf-8").splitlines()
    s, t = train_tokenizers(tok["kind"], src, tgt, vocab_size=tok["vocab_size"], joint=tok["joint"])
    return s.vocab_size, t.vocab_size


def count_parameters(model: dict[str, Any], vocab: tuple[int, int]) -> int:
    """Trainable parameters of the model that ``model`` (a recipe's model section) builds."""
    fields = {k: v for k, v in model.items() if k != "type"}
    fields.update(src_vocab_size=vocab[0], tgt_vocab_size=vocab[1], pad_id=0, bos_id=1, eos_id=2)
    built = build_model(model["type"], fields)
    return sum(p.numel() for p in built.parameters() if p.requires_grad)


def _rnn(attention: str, **extra: Any) -> Callable[[int, int], dict[str, Any]]:
    def make(width: int, embed: int) -> dict[str, Any]:
        return {
            "type": "rnn",
            "cell": "gru",
            "embed_dim": embed,
            "hidden_dim": width,
            "bidirectional": True,
            "attention": attention,
            **extra,
        }

    return make


def _transformer(width: int, embed: int) -> dict[str, Any]:
    return {
        "type": "transformer",
        "d_model": width,
        "num_heads": 4,
        "num_encoder_layers": 2,
        "num_decoder_layers": 2,
        "ff_dim": 2 * width,
        "dropout": 0.1,
    }


# name -> (width, embed) -> model section; width = RNN hidden_dim or Transformer d_model
MODEL_FAMILIES: dict[str, Callable[[int, int], dict[str, Any]]] = {
    "rnn-none": _rnn("none"),
    "rnn-bahdanau": _rnn("bahdanau"),
    "rnn-luong": _rnn("luong", score="general", input_feeding=True),
    "rnn-luong-local": _rnn(
        "luong", score="general", input_feeding=True, window="predictive", window_size=3
    ),
    "transformer": _transformer,
}


def match_width(family: str, embed: int, target: int, vocab: tuple[int, int]) -> tuple[int, int]:
    """The width (multiple of 8) whose parameter count is closest to ``target``; and the count."""
    make = MODEL_FAMILIES[family]
    best = (0, 0)
    lo, hi = 1, 256  # widths 8 .. 2048; the count grows with the width: bisect
    while lo <= hi:
        mid = (lo + hi) // 2
        n = count_parameters(make(8 * mid, embed), vocab)
        if best == (0, 0) or abs(n - target) < abs(best[1] - target):
            best = (8 * mid, n)
        lo, hi = (mid + 1, hi) if n < target else (lo, mid - 1)
    return best


def until_converged(
    *, eval_every: int, patience: int, step_cap: int, valid_bleu_sentences: int
) -> dict[str, Any]:
    """The train-section keys of a training that stops on the validation set.

    It validates every ``eval_every`` steps (loss, and greedy BLEU on the first
    ``valid_bleu_sentences`` validation pairs; 0: loss only) and stops after ``patience``
    evaluations in a row without a better one, or at ``step_cap`` steps; no time budget.
    """
    return {
        "steps": step_cap,
        "eval_every": eval_every,
        "save_every": eval_every,
        "patience": patience,
        "valid_bleu_sentences": valid_bleu_sentences,
        "max_seconds": 0,
    }


@dataclass
class Trained:
    """A trained model, its tokenizers and how the training went.

    Attributes:
        steps: optimiser steps trained.
        seconds: training time over every resume (validations included).
        parameters: the model's parameter count.
        best_step: the step of the checkpoint loaded (the best validation).
        stopped: why training ended ("patience ...", "step cap", "time budget").
        curve: one row per validation: step, seconds, valid_loss, valid_bleu.
    """

    model: nn.Module
    src_tok: Any
    tgt_tok: Any
    steps: int
    seconds: float
    parameters: int
    best_step: int = 0
    stopped: str = ""
    curve: list[dict[str, float]] | None = None

    def record(self) -> dict[str, Any]:
        """How the training went, for ``result.json``."""
        return {
            "parameters": self.parameters,
            "steps": self.steps,
            "best_step": self.best_step,
            "train_seconds": self.seconds,
            "stopped": self.stopped,
            "curve": self.curve or [],
        }


def read_curve(log_file: Path, score: str = "valid_bleu") -> list[dict[str, float]]:
    """The validation rows of a run's ``log.jsonl``: step, training seconds at that step,
    validation loss and the validation ``score`` (BLEU for translators,
    ``"valid_accuracy"`` for image classifiers)."""
    seconds: dict[int, float] = {}
    curve = []
    if not Path(log_file).is_file():
        return curve
    for line in Path(log_file).read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        if "seconds" in row:
            seconds[row["step"]] = row["seconds"]
        if "valid_loss" in row:
            curve.append(
                {
                    "step": row["step"],
                    "seconds": seconds.get(row["step"], float("nan")),
                    "valid_loss": row["valid_loss"],
                    score: row.get(score, float("nan")),
                }
            )
    return curve


def _why_stopped(result, patience: int) -> str:
    if result.done_because:
        if "train.steps" in result.done_because:  # a finished run, continued
            return "step cap"
        if "patience" in result.done_because:
            return f"patience: {patience} evaluations without improvement"
        if "max_seconds" in result.done_because:
            return "time budget"
        return result.done_because
    return "step cap"


def curve_figure(curves: dict[str, list[list[dict[str, float]]]], path: Path, title: str) -> str:
    """Validation loss and BLEU against steps: ``model -> [curve of each seed]``, one colour
    per model and one line style per seed."""
    fig = common.new_figure(11, 4.0)
    ax_loss, ax_bleu = fig.subplots(1, 2)
    styles = [("-", "solid"), ("--", "dashed"), (":", "dotted"), ("-.", "dash-dot")]
    for k, (name, seeds) in enumerate(curves.items()):
        for seed, curve in enumerate(seeds):
            steps = [r["step"] for r in curve]
            style = {"color": f"C{k % 10}", "linestyle": styles[seed % len(styles)][0], "lw": 1.2}
            label = name if seed == 0 else None
            ax_loss.plot(steps, [r["valid_loss"] for r in curve], label=label, **style)
            ax_bleu.plot(steps, [r["valid_bleu"] for r in curve], **style)
    for ax, what in ((ax_loss, "validation loss (per token)"), (ax_bleu, "validation BLEU")):
        ax.set_xlabel("step")
        ax.set_ylabel(what)
        ax.grid(alpha=0.3)
    seeds = max(len(s) for s in curves.values())
    key = ", ".join(f"seed {i} {name}" for i, (_, name) in enumerate(styles[:seeds]))
    ax_loss.legend(fontsize=8, title=key if seeds > 1 else None, title_fontsize=7)
    fig.suptitle(f"{title}: validation curves (training stops on them)")
    return common.save_figure(fig, path)


@dataclass(frozen=True)
class TrainJob:
    """One lab training: the arguments of :func:`train_model`.

    Attributes:
        name: the run's name (its folder under ``out``).
        model: a recipe's model section.
        data: a folder with ``{train,valid,test}.{ko,en}``, or a recipe's data section.
        out: folder for the checkpoints.
        optim: the recipe's train section (threads, device and evaluation are fixed here).
        tokenizer: a recipe's tokenizer section (default ``{"kind": "word"}``).
        device: where it trains ("cpu" or "cuda"; :func:`train_models` sets it).
    """

    name: str
    model: dict[str, Any]
    data: Path | dict[str, Any]
    out: Path
    optim: dict[str, Any]
    tokenizer: dict[str, Any] | None = None
    device: str = "cpu"

    def recipe(self):
        return recipe_from_dict(
            {
                "name": self.name,
                "out": str(self.out / self.name),
                "data": self.data if isinstance(self.data, dict) else _data_section(self.data),
                "tokenizer": self.tokenizer or {"kind": "word"},
                "model": self.model,
                "train": {
                    "eval_every": 1_000_000,
                    "save_every": 1_000_000,
                    "valid_bleu_sentences": 0,
                    "device": self.device,
                    "threads": 1,
                    **self.optim,
                },
            }
        )


def _continue(recipe):
    """Train ``recipe`` on from what its folder holds (a finished run trains nothing); a
    folder of other data or another model (the experiment's setting changed) starts over."""
    try:
        return train(recipe, resume=True, progress=False)
    except CheckpointError as err:
        log.warning("%s; training %s from the start", err, recipe.name)
        return train(recipe, resume=False, progress=False)


def _train_job(job: TrainJob) -> None:
    """One job in a child process of :func:`train_models`."""
    logging.basicConfig(level=logging.WARNING)
    _continue(job.recipe())


def _train_each(jobs: list[TrainJob], finished: Callable[[int], object]) -> None:
    """Train every job (up to ``parallel_trainings`` at once, each in its own process);
    ``finished(i)`` as soon as job ``i`` has trained."""
    processes = min(_PROCESSES["trainings"], len(jobs))
    if processes > 1:
        log.info("training %d models, %d at a time", len(jobs), processes)
        with training_bars({job.name: job.out / job.name for job in jobs}):
            run_in_processes(_train_job, jobs, processes, [job.name for job in jobs], finished)
    else:
        for i in range(len(jobs)):
            finished(i)  # train_model in there trains it


def _on_device(jobs: list[TrainJob]) -> list[TrainJob]:
    return [dataclasses.replace(job, device=_PROCESSES["device"]) for job in jobs]


def train_models(jobs: list[TrainJob]) -> list[Trained]:
    """Train every job (up to ``parallel_trainings`` at once, each in its own process);
    the trained models in the order of ``jobs``."""
    jobs = _on_device(jobs)
    trained: dict[int, Trained] = {}

    def load(i: int) -> None:  # what its process trained
        trained[i] = train_model(jobs[i])

    _train_each(jobs, load)
    return [trained[i] for i in range(len(jobs))]


SCORED = "scored.json"  # a finished training's record and score, in its folder


def _data_key(data: Path | dict[str, Any]) -> dict[str, Any]:
    """The data a training read, by content: its files' SHA-256 (paths differ between
    machines) and the rest of its data section."""
    section = _data_section(data) if isinstance(data, Path) else data
    key = {}
    for name, value in section.items():
        if name in SPLITS:
            files = value if isinstance(value, list) else [value]
            key[name] = [hashlib.sha256(Path(f).read_bytes()).hexdigest() for f in files]
        else:
            key[name] = value
    return key


def _job_key(job: TrainJob) -> dict[str, Any]:
    """What a training's result depends on: model, data, training and tokenizer (not the
    device, nor the folders)."""
    key = {
        "model": job.model,
        "data": _data_key(job.data),
        "optim": job.optim,
        "tokenizer": job.tokenizer or {"kind": "word"},
    }
    return json.loads(json.dumps(key))


def _kept(job: TrainJob, key: dict[str, Any]) -> dict[str, Any] | None:
    stale = f"holds another training's score; training {job.name} again"
    return common.read_kept(job.out / job.name / SCORED, "job", key, stale)


def scored_trainings(
    jobs: list[TrainJob], score: Callable[[Trained], dict[str, Any]]
) -> list[dict[str, Any]]:
    """Train every job and score each model as soon as it has trained: per job
    ``{"training": Trained.record(), "score": score(trained)}``, in the order of ``jobs``.

    Each is kept in the training's folder (``scored.json``, with what the training
    depends on: model, data by content, training section, tokenizer), so that a job
    whose folder holds one is neither trained nor loaded again: that file alone, copied
    to another machine, stands for the finished training. A full run that cannot finish
    in one sitting keeps every training that did.
    """
    jobs = _on_device(jobs)
    keys = [_job_key(job) for job in jobs]
    scored = {i: k for i, job in enumerate(jobs) if (k := _kept(job, keys[i])) is not None}
    todo = [i for i in range(len(jobs)) if i not in scored]

    def keep(k: int) -> None:
        i = todo[k]
        trained = train_model(jobs[i])
        doc = {"job": keys[i], "training": trained.record(), "score": score(trained)}
        scored[i] = common.write_kept(jobs[i].out / jobs[i].name / SCORED, doc)

    _train_each([jobs[i] for i in todo], keep)
    return [scored[i] for i in range(len(jobs))]


def by_model(trained: list[Trained], names, seeds) -> dict[str, list[Trained]]:
    """The models that :func:`train_models` trained for jobs made name after name, seed
    after seed: ``name -> [one per seed]``."""
    it = iter(trained)
    return {name: [next(it) for _ in seeds] for name in names}


def train_model(job: TrainJob) -> Trained:
    """Train ``job`` with :func:`qkv.train.loop.train`, continuing what its folder holds;
    load the best evaluation's checkpoint."""
    recipe = job.recipe()
    log.info("training %s", job.name)
    with training_bars({job.name: recipe.out_dir}):
        result = _continue(recipe)
    best = recipe.out_dir / "best.safetensors"
    ckpt = load_checkpoint(best if best.is_file() else recipe.out_dir / "last.safetensors")
    ckpt.model.eval()
    n = sum(p.numel() for p in ckpt.model.parameters())
    return Trained(
        ckpt.model,
        tokenizer_from_json(ckpt.tokenizers["src"]),
        tokenizer_from_json(ckpt.tokenizers["tgt"]),
        result.steps,
        result.trained_seconds,
        n,
        best_step=result.best_step,
        stopped=_why_stopped(result, recipe.train.patience),
        curve=read_curve(recipe.out_dir / "log.jsonl"),
    )
