"""The tiny training recipes and helpers that the training, translation and command-line
tests share."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from unittest import mock

import qkv.train.loop
from qkv.train.loop import train
from qkv.train.recipe import recipe_from_dict

REPOSITORY = Path(__file__).resolve().parents[2]
CONFIG_FOLDER = REPOSITORY / "configs"  # the shipped YAML recipes

# Korean sentences of the toy corpus, one per line: what the tiny translator reads
SENTENCES = "고양이가 쥐를 잡았다\n개가 잤다\n"

TINY = {
    "name": "tiny",
    "data": {"kind": "toy", "n_train": 400, "n_valid": 20, "n_test": 20, "max_len": 6},
    "tokenizer": {"kind": "word"},
    "model": {
        "type": "transformer",
        "d_model": 32,
        "num_heads": 2,
        "num_encoder_layers": 1,
        "num_decoder_layers": 1,
        "ff_dim": 64,
        "dropout": 0.1,
    },
    "train": {
        "steps": 12,
        "max_tokens": 300,
        "lr": 0.003,
        "warmup": 4,
        "eval_every": 100,
        "save_every": 4,
        "valid_bleu_sentences": 10,
        "threads": 1,
    },
}


def tiny_dict(out: Path, **train_overrides) -> dict:
    """TINY as a dict writing to ``out``, with ``train`` keys replaced."""
    d = json.loads(json.dumps(TINY))
    d["out"] = str(out)
    d["train"].update(train_overrides)
    return d


def tiny_recipe(out: Path, **train_overrides):
    return recipe_from_dict(tiny_dict(out, **train_overrides))


def logged_losses(out: Path) -> dict[int, float]:
    """Step -> training loss, from a run's log.jsonl."""
    rows = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


def run_cli(*args, stdin: str = ""):
    """``python -m qkv ARGS`` in a fresh interpreter."""
    return subprocess.run(
        [sys.executable, "-m", "qkv", *args], input=stdin, capture_output=True, text=True
    )


def logged_rows(out: Path) -> list[dict]:
    """Every row of a run's log.jsonl, without the timing fields that differ run to run."""
    rows = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in ("tokens_per_s", "seconds")} for r in rows]


class Interrupted(Exception):
    """Raised inside the training loop, as a Ctrl-C or a kill would stop it."""


def train_until_interrupted(recipe, step: int) -> None:
    """Train ``recipe`` and stop it right after ``step`` (its checkpoints left as they are)."""
    after_step = qkv.train.loop._Loop.after_step

    def stop_after(loop):
        verdict = after_step(loop)
        if loop.state.step == step:
            raise Interrupted
        return verdict

    with mock.patch.object(qkv.train.loop._Loop, "after_step", stop_after):
        try:
            qkv.train.loop.train(recipe, progress=False)
        except Interrupted:
            return
    raise AssertionError(f"the run ended before step {step}")


def translator_dict(out: Path, **model) -> dict:
    """A Transformer of width 16 on the toy corpus, trained for two steps into ``out``
    (``model`` keys replace or add to its model section)."""
    return {
        "name": "tiny",
        "out": str(out),
        "data": {"kind": "toy", "n_train": 200, "n_valid": 10, "n_test": 10, "max_len": 6},
        "model": {
            "type": "transformer",
            "d_model": 16,
            "num_heads": 2,
            "ff_dim": 32,
            "num_encoder_layers": 1,
            "num_decoder_layers": 1,
            **model,
        },
        "train": {
            "steps": 2,
            "max_tokens": 300,
            "warmup": 1,
            "eval_every": 2,
            "valid_bleu_sentences": 4,
            "threads": 1,
        },
    }


def trained_translator(out: Path) -> Path:
    """The checkpoint of :func:`translator_dict` with 16 positions, trained into ``out``."""
    train(recipe_from_dict(translator_dict(out, max_len=16)), progress=False)
    return out / "last.safetensors"
