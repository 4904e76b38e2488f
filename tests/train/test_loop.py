"""qkv.train.loop: training lowers the loss and writes safetensors checkpoints, the best
checkpoint is the best evaluation, torch's threads and the heap are left as they were,
bf16 autocast, the time budget over a resume, SIGINT and SIGTERM save the step they
finish, and a step far slower than the others is named."""

from __future__ import annotations

import contextlib
import functools
import json
import random
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import qkv.train.distributed
import qkv.train.loop
import qkv.train.progress
from qkv.models.checkpoint import CheckpointError, load_checkpoint
from qkv.train.loop import automatic_threads, train
from qkv.train.progress import StepTimes
from qkv.train.recipe import ConfigError, recipe_from_dict
from tests.train.helpers import (
    logged_losses,
    logged_rows,
    tiny_dict,
    tiny_recipe,
    train_until_interrupted,
)


def test_training_reduces_loss_and_checkpoint_round_trips(tmp_path):
    result = train(tiny_recipe(tmp_path, steps=30, eval_every=30), progress=False)
    losses = logged_losses(tmp_path)
    assert losses[30] < 0.8 * losses[1]
    assert result.best_step == 30
    ckpt = load_checkpoint(tmp_path / "last.safetensors")
    assert ckpt.extra["train"]["step"] == 30 and set(ckpt.tokenizers) == {"src", "tgt"}
    assert ckpt.optimizer_state is not None and ckpt.rng is not None
    assert not list(tmp_path.glob(".*.tmp"))  # no temporary files left behind
    with open(tmp_path / "last.safetensors", "rb") as f:  # safetensors, not a pickle/zip
        n = int.from_bytes(f.read(8), "little")
        assert json.loads(f.read(n))["__metadata__"]["qkv"]


def test_loading_a_checkpoint_with_wrong_weights_fails_clearly(tmp_path):
    train(tiny_recipe(tmp_path, steps=2), progress=False)
    path = tmp_path / "last.safetensors"
    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
    tensors = load_file(path)
    tensors.pop(next(k for k in tensors if k.startswith("model.")))
    save_file(tensors, tmp_path / "broken.safetensors", metadata=meta)
    with pytest.raises(CheckpointError, match="broken.safetensors: weights do not fit"):
        load_checkpoint(tmp_path / "broken.safetensors")
    assert torch.load is not None  # the loader never calls torch.load (no pickle)


def test_train_threads_hold_only_while_training(tmp_path):
    before = torch.get_num_threads()
    seen = []
    try:
        torch.set_num_threads(2)
        recipe = tiny_recipe(tmp_path, steps=2, threads=1)
        result = train(recipe, progress=False)
        seen.append(torch.get_num_threads())
    finally:
        torch.set_num_threads(before)
    assert result.steps == 2 and seen == [2]


@pytest.mark.parametrize(
    ("load", "cores", "most", "threads"),
    [
        (0.0, 2, 2, 2),
        (0.4, 2, 2, 2),
        (0.6, 2, 2, 1),
        (1.28, 2, 2, 1),
        (9.2, 2, 2, 1),
        (0.0, 2, 1, 1),
        (10.6, 16, 16, 5),
        (0.0, 16, 8, 8),
    ],
)
def test_automatic_threads_are_the_idle_cores(load, cores, most, threads):
    assert automatic_threads(load, cores, most) == threads


@pytest.mark.skipif(torch.get_num_threads() < 2, reason="torch takes one thread here anyway")
@pytest.mark.parametrize("loaded", [True, False], ids=["loaded", "idle"])
def test_train_threads_0_trains_on_the_idle_cores(tmp_path, monkeypatch, caplog, loaded):
    """On two loaded cores, 60 toy Transformer steps took 103 s with torch's default
    threads (train.threads 0 kept torch's 2) and 20 s with one. The load average is
    what the operating system reports, set here: every core busy, or none."""
    most, cores = torch.get_num_threads(), qkv.train.progress.usable_cores()
    load = float(cores) if loaded else 0.0
    monkeypatch.setattr(qkv.train.loop.os, "getloadavg", lambda: (load, load, load))
    seen, after_step = [], qkv.train.loop._Loop.after_step

    def noting_threads(loop):
        seen.append(torch.get_num_threads())
        return after_step(loop)

    monkeypatch.setattr(qkv.train.loop._Loop, "after_step", noting_threads)
    with caplog.at_level("INFO", logger="qkv.train.loop"):
        train(tiny_recipe(tmp_path, steps=2, threads=0), progress=False)
    want = 1 if loaded else min(most, cores)
    assert seen == [want, want] and torch.get_num_threads() == most
    told = [r for r in caplog.records if "train.threads 0" in r.getMessage()]
    assert len(told) == 1 and told[0].levelname == "INFO"
    assert told[0].getMessage().startswith(f"train.threads 0: {want} torch thread")
    assert f"load average {load:.2f} on {cores} cores" in told[0].getMessage()


def test_heap_reuse_changes_no_loss(tmp_path, monkeypatch):
    train(tiny_recipe(tmp_path / "reuse", steps=6), progress=False)
    monkeypatch.setattr(qkv.train.loop, "reuse_freed_memory", lambda: contextlib.nullcontext())
    train(tiny_recipe(tmp_path / "plain", steps=6), progress=False)
    assert logged_losses(tmp_path / "reuse") == logged_losses(tmp_path / "plain")


def test_bf16_autocast_true_false_or_auto(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="train.bf16: must be true, false or 'auto'"):
        recipe_from_dict({"train": {"bf16": "yes"}})
    fp32 = train(tiny_recipe(tmp_path / "fp32", steps=3), progress=False)
    bf16 = train(tiny_recipe(tmp_path / "bf16", steps=3, bf16=True), progress=False)
    assert not fp32.bf16 and bf16.bf16
    a, b = logged_losses(tmp_path / "fp32"), logged_losses(tmp_path / "bf16")
    assert a[1] != b[1]  # the matrix products really ran in bf16 ...
    assert b[1] == pytest.approx(a[1], rel=2e-2)  # ... to bf16's precision
    for native, same_as in ((True, b), (False, a)):  # "auto" follows the hardware
        monkeypatch.setattr(
            qkv.train.distributed, "native_bf16", lambda device, native=native: native
        )
        out = tmp_path / f"auto-{native}"
        assert train(tiny_recipe(out, steps=3, bf16="auto"), progress=False).bf16 is native
        assert logged_losses(out) == same_as


def _evaluations(out) -> list[dict]:
    return [r for r in logged_rows(out) if "valid_loss" in r]


def test_without_bleu_the_best_checkpoint_has_the_lowest_validation_loss(tmp_path):
    """Every BLEU was 0 then, so the first evaluation stayed 'best' for the whole run:
    best.safetensors was the least trained model and patience stopped any run."""
    recipe = tiny_recipe(tmp_path, steps=12, eval_every=4, valid_bleu_sentences=0, warmup=2)
    result = train(recipe, progress=False)
    rows = _evaluations(tmp_path)
    assert [r["step"] for r in rows] == [4, 8, 12]
    lowest = min(rows, key=lambda r: r["valid_loss"])
    assert lowest["step"] != 4, "training did not lower the loss: the test shows nothing"
    assert result.best_step == lowest["step"]
    best = load_checkpoint(tmp_path / "best.safetensors").extra["train"]
    assert best["step"] == lowest["step"]
    assert best["best_loss"] == pytest.approx(lowest["valid_loss"])


def test_without_bleu_patience_counts_evaluations_without_a_lower_loss(tmp_path):
    recipe = tiny_recipe(
        tmp_path, steps=12, eval_every=2, valid_bleu_sentences=0, patience=1, warmup=2
    )
    result = train(recipe, progress=False)
    losses = [r["valid_loss"] for r in _evaluations(tmp_path)]
    stops = [i for i in range(1, len(losses)) if losses[i] >= min(losses[:i])]
    assert result.steps == (2 * (stops[0] + 1) if stops else 12)
    again = train(recipe, resume=True, progress=False)
    if stops:
        assert again.already_done and "without a better validation loss" in again.done_because


def test_at_equal_bleu_the_lower_validation_loss_is_better(tmp_path, monkeypatch):
    """Early in a run every greedy BLEU is 0.00: the first evaluation stayed the best
    checkpoint (the least trained model) and train.patience stopped the run while its
    validation loss still fell. Validations scripted: (loss, BLEU) at steps 2, 4, ..."""
    scores = iter([(3.0, 0.0), (2.5, 0.0), (2.9, 1.0), (2.8, 1.0), (2.85, 1.0), (2.9, 1.0)])
    monkeypatch.setattr(qkv.train.loop, "validate", lambda *args: next(scores))
    recipe = tiny_recipe(tmp_path, steps=14, eval_every=2, patience=2)
    result = train(recipe, progress=False)
    assert (result.steps, result.best_step, result.best_bleu) == (12, 8, 1.0)
    assert "2 evaluations without a better BLEU" in result.done_because
    best = load_checkpoint(tmp_path / "best.safetensors").extra["train"]
    assert (best["step"], best["best_loss"]) == (8, 2.8)


def test_the_time_budget_and_the_logged_seconds_run_on_across_a_resume(tmp_path):
    first = tiny_recipe(tmp_path, steps=10_000, eval_every=10_000, save_every=2)
    train_until_interrupted(first, step=5)  # resumed from step 4, whatever the machine's speed
    spent = next(r["seconds"] for r in _rows_with_times(tmp_path) if r.get("step") == 4)
    budget = spent + random.uniform(0.2, 0.4)
    recipe = tiny_recipe(
        tmp_path, steps=10_000, eval_every=10_000, save_every=2, max_seconds=budget
    )
    assert train(recipe, resume=True, progress=False).steps < 10_000  # the time ran out
    seconds = [r["seconds"] for r in _rows_with_times(tmp_path) if "seconds" in r]
    assert seconds == sorted(seconds)  # one clock over both processes
    assert seconds[-2] <= budget  # the step before the last was still within the budget
    stopped = train(recipe, resume=True, progress=False)  # its budget is spent
    assert stopped.already_done and "train.max_seconds" in stopped.done_because
    spent = load_checkpoint(tmp_path / "last.safetensors").extra["train"]["seconds"]
    assert spent >= seconds[-1]  # the final validation counts too
    more = tiny_recipe(
        tmp_path, steps=10_000, eval_every=10_000, save_every=2, max_seconds=spent + 0.1
    )
    assert train(more, resume=True, progress=False).steps > stopped.steps


def _rows_with_times(out):
    return [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]


def _logged_steps(out) -> list[int]:
    log = out / "log.jsonl"
    rows = log.read_text().splitlines() if log.exists() else []
    return [json.loads(r)["step"] for r in rows if r.strip() and "loss" in json.loads(r)]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_saves_the_step_it_finishes_and_resume_continues_from_it(tmp_path, sig):
    """Ctrl-C saved nothing unless a periodic save had happened: with train.steps 300 and
    save_every 400 an interrupted run started again from step 0 (SIGTERM: killed, no
    word). Now the step under way is finished and saved, the exit code is 130 with the
    line that says how to resume, and the resumed run is the uninterrupted one."""
    out, config = tmp_path / "run", tmp_path / "c.yaml"
    never = {"save_every": 400, "eval_every": 400}
    config.write_text(json.dumps(tiny_dict(out, steps=300, **never)))
    proc = subprocess.Popen(
        [sys.executable, "-m", "qkv", "train", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 300
    while len(_logged_steps(out)) < 3 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err
    step = load_checkpoint(out / "last.safetensors").extra["train"]["step"]
    assert 3 <= step < 300 and _logged_steps(out) == list(range(1, step + 1))
    assert "Traceback" not in err
    assert err.strip().splitlines()[-2:] == [
        f"qkv train: {out / 'last.safetensors'} holds step {step}; --resume continues from it",
        "interrupted",
    ]
    assert not list(out.glob(".*.tmp"))
    train(tiny_recipe(out, steps=step + 3, **never), resume=True, progress=False)
    full = tmp_path / "full"
    train(tiny_recipe(full, steps=step + 3, **never), progress=False)
    assert logged_rows(out) == logged_rows(full)
    weights = [load_checkpoint(o / "last.safetensors").model.state_dict() for o in (out, full)]
    assert all(torch.equal(weights[0][k], v) for k, v in weights[1].items())


def test_a_step_far_slower_than_the_last_ones_is_named_once(tmp_path, monkeypatch, caplog):
    """On two loaded cores, 60 toy steps took 103 s with torch's default threads and 20 s
    with one; steps swung from 0.11 s to 4.4 s without a word about why. The clock of the
    step times is scripted: steps of 0.1 s, step 22 of 2 s and step 25 of 3 s."""
    durations = iter([0.1] * 21 + [2.0] + [0.1] * 2 + [3.0] + [0.1] * 10)
    now, calls = [0.0], [0]

    def clock() -> float:
        calls[0] += 1
        if calls[0] % 2 == 0:  # each step asks at its start and at its end
            now[0] += next(durations)
        return now[0]

    monkeypatch.setattr(qkv.train.loop, "StepTimes", functools.partial(StepTimes, clock=clock))
    with caplog.at_level("WARNING", logger="qkv.train.progress"):
        train(tiny_recipe(tmp_path, steps=26, eval_every=100, save_every=100), progress=False)
    warned = [r.getMessage() for r in caplog.records if r.name == "qkv.train.progress"]
    assert len(warned) == 1, warned
    assert warned[0].startswith("step 22 took 2.00 s, 20x the median 0.100 s")
    assert "1 thread (train.threads)" in warned[0]
