"""What a run records and carries across a resume: the logged learning rates, the
optimiser settings of the config, early stopping and the time budget."""

from __future__ import annotations

import json
import math
import random

import pytest

from qkv.train.loop import train
from tests.train_helpers import logged_rows, tiny_recipe, train_until_interrupted


def _formula(schedule: str, step: int, steps: int, warmup: int, lr: float, min_lr: float):
    """The rate of update ``step`` (1-based), as the schedule's docstring writes it."""
    if step <= warmup:
        return lr * step / warmup
    if schedule == "inverse_sqrt":
        return lr * math.sqrt(warmup / step)
    if schedule == "cosine":
        progress = (step - warmup) / (steps - warmup)
        return min_lr + (lr - min_lr) * 0.5 * (1 + math.cos(math.pi * progress))
    return lr


@pytest.mark.parametrize("schedule", ["inverse_sqrt", "cosine", "constant"])
def test_the_logged_lr_is_the_rate_of_that_steps_update(tmp_path, schedule):
    rng = random.Random()
    warmup, steps = rng.randint(2, 5), rng.randint(7, 9)
    lr, min_lr = rng.uniform(1e-3, 5e-3), rng.uniform(0, 1e-3)
    recipe = tiny_recipe(
        tmp_path, steps=steps, warmup=warmup, lr=lr, min_lr=min_lr, schedule=schedule, save_every=3
    )
    train_until_interrupted(recipe, step=rng.randint(3, 5))  # resumed from step 3
    train(recipe, resume=True, progress=False)
    logged = {r["step"]: r["lr"] for r in logged_rows(tmp_path) if "lr" in r}
    assert sorted(logged) == list(range(1, steps + 1))
    for step, rate in logged.items():
        assert rate == pytest.approx(_formula(schedule, step, steps, warmup, lr, min_lr))


def test_resume_uses_the_configs_optimiser_settings(tmp_path):
    from qkv.models.checkpoint import load_checkpoint

    rng = random.Random()
    first = {"lr": rng.uniform(2e-3, 4e-3), "betas": [0.9, 0.98], "weight_decay": 0.0}
    then = {
        "lr": rng.uniform(1e-4, 1e-3),
        "betas": [rng.uniform(0.5, 0.8), 0.95],
        "weight_decay": rng.uniform(0.01, 0.1),
    }
    common = {"warmup": 0, "schedule": "constant", "save_every": 100}
    train(tiny_recipe(tmp_path, steps=3, **common, **first), progress=False)
    train(tiny_recipe(tmp_path, steps=6, **common, **then), resume=True, progress=False)
    logged = {r["step"]: r["lr"] for r in logged_rows(tmp_path) if "lr" in r}
    assert [logged[s] for s in (1, 2, 3)] == [first["lr"]] * 3
    assert [logged[s] for s in (4, 5, 6)] == [then["lr"]] * 3
    group = load_checkpoint(tmp_path / "last.safetensors").optimizer_state["param_groups"][0]
    assert group["lr"] == then["lr"] and group["weight_decay"] == then["weight_decay"]
    assert list(group["betas"]) == then["betas"]  # what AdamW's step read


def test_resuming_a_run_that_stopped_early_trains_nothing(tmp_path):
    from tests.train_helpers import run_cli, tiny_dict

    patience = random.randint(1, 2)
    # lr 1e-12: steps below float32's resolution leave the weights as they are, so every
    # validation gives the same loss and BLEU, and patience stops the run early
    recipe = tiny_recipe(tmp_path, steps=40, eval_every=2, patience=patience, lr=1e-12)
    stopped = train(recipe, progress=False)
    assert stopped.steps < 40
    log, ckpt = (tmp_path / "log.jsonl").read_text(), (tmp_path / "last.safetensors").read_bytes()
    again = train(recipe, resume=True, progress=False)
    assert again.already_done and again.steps == stopped.steps
    assert "train.patience" in again.done_because
    assert (tmp_path / "log.jsonl").read_text() == log
    assert (tmp_path / "last.safetensors").read_bytes() == ckpt
    config = tmp_path / "c.yaml"
    config.write_text(
        json.dumps(tiny_dict(tmp_path, steps=40, eval_every=2, lr=1e-12, patience=patience))
    )
    proc = run_cli("train", str(config), "--resume")
    assert proc.returncode == 0 and "nothing to do" in proc.stdout, proc.stderr
    assert f"stopped early at step {stopped.steps}" in proc.stdout
    more = train(
        tiny_recipe(tmp_path, steps=40, eval_every=2, patience=patience + 5, lr=1e-12),
        resume=True,
        progress=False,
    )
    assert not more.already_done and more.steps > stopped.steps


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
    from qkv.models.checkpoint import load_checkpoint

    spent = load_checkpoint(tmp_path / "last.safetensors").extra["train"]["seconds"]
    assert spent >= seconds[-1]  # the final validation counts too
    more = tiny_recipe(
        tmp_path, steps=10_000, eval_every=10_000, save_every=2, max_seconds=spent + 0.1
    )
    assert train(more, resume=True, progress=False).steps > stopped.steps


def _rows_with_times(out):
    return [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
