"""qkv.train.schedule: warmup then inverse square root or cosine (by steps or by the time
budget), the same rates after a resume, and each logged rate is its step's update's."""

from __future__ import annotations

import math
import random

import pytest
import torch

from qkv.train.loop import train
from qkv.train.recipe import OptimConfig
from qkv.train.schedule import make_schedule
from tests.train.helpers import logged_rows, tiny_recipe, train_until_interrupted


def _lrs(schedule: str, steps: int = 100, warmup: int = 10, elapsed=None, start: int = 0, **kw):
    cfg = OptimConfig(steps=steps, warmup=warmup, lr=1e-3, schedule=schedule, **kw)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=cfg.lr)
    sched = make_schedule(opt, cfg, start, elapsed)
    out = []
    for _ in range(steps - start):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def test_schedules_warm_up_then_decay_as_documented():
    inv = _lrs("inverse_sqrt")
    assert inv[0] == pytest.approx(1e-4) and inv[9] == pytest.approx(1e-3)  # linear warmup
    assert inv[39] == pytest.approx(1e-3 * (10 / 40) ** 0.5)
    cos = _lrs("cosine", min_lr=1e-5)
    assert cos[9] == pytest.approx(1e-3) and cos[-1] == pytest.approx(1e-5, rel=1e-2)
    assert all(a >= b for a, b in zip(cos[9:], cos[10:]))  # never rises after warmup
    assert _lrs("cosine", start=40, min_lr=1e-5) == pytest.approx(cos[40:])  # resume: same lrs


def test_cosine_follows_the_time_budget_when_it_runs_out_first():
    half_time = _lrs("cosine", steps=1000, elapsed=lambda: 50.0, max_seconds=100)
    assert half_time[20] == pytest.approx(0.5e-3)  # half the seconds spent: half way down
    by_steps = _lrs("cosine", steps=1000, elapsed=lambda: 0.0, max_seconds=100)
    assert by_steps[20] > 0.99e-3  # no time spent: the steps decide
    ignored = _lrs("cosine", steps=1000, elapsed=lambda: 50.0, max_seconds=0)
    assert ignored[20] > 0.99e-3  # without a time budget the clock is not used


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
