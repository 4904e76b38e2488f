"""Training helpers of the translation experiments: progress shown while a model trains."""

from __future__ import annotations

import random

import pytest
import torch

from qkv.lab.training import (
    MODEL_FAMILIES,
    TrainJob,
    parallel_trainings,
    progress_bars,
    train_model,
    train_models,
    until_converged,
    write_toy_corpus,
)


def _train(tmp_path, steps: int):
    data = tmp_path / "data"
    write_toy_corpus(data, (60, 10, 10), 2, 5, seed=0)
    model = MODEL_FAMILIES["rnn-none"](16, 8)
    optim = {"steps": steps, "max_tokens": 200, "lr": 1e-3, "warmup": 1, "seed": 0}
    return train_model(TrainJob("rnn-none", model, data, tmp_path / "models", optim))


def _converging(tmp_path, name: str, step_cap: int, seed: int = 0, width: int = 16) -> TrainJob:
    data = tmp_path / "data"
    if not data.is_dir():
        write_toy_corpus(data, (60, 10, 10), 2, 5, seed=0)
    optim = {"max_tokens": 200, "lr": 3e-3, "warmup": 1, "seed": seed}
    optim |= until_converged(eval_every=2, patience=50, step_cap=step_cap, valid_bleu_sentences=5)
    return TrainJob(name, MODEL_FAMILIES["rnn-none"](width, 8), data, tmp_path / "models", optim)


def test_qkv_lab_shows_a_bar_per_trained_model(tmp_path, capsys):
    """The full bottleneck run trains eight models for about 45 minutes, and it printed
    nothing at all until the table (train_model trained with progress=False)."""
    steps = random.randint(2, 4)
    with progress_bars():
        trained = _train(tmp_path / "on", steps)
    err = capsys.readouterr().err
    assert trained.steps == steps
    assert "rnn-none" in err and f"step {steps:>5}" in err and "s trained" in err
    _train(tmp_path / "off", steps)  # a library call outside qkv lab stays quiet
    assert capsys.readouterr().err == ""


def test_the_command_line_turns_the_bars_on(monkeypatch, tmp_path):
    import qkv.cli.lab
    import qkv.lab
    from qkv.cli import main
    from qkv.lab import common, training
    from qkv.lab.common import LabRun

    seen = []

    def fake(name, out, *, quick):
        seen.append((common._SHOW["bars"], *training._PROCESSES.values()))
        return LabRun("gradients", True, {}, [0], {}, verdict="v")

    monkeypatch.setattr(qkv.cli.lab, "run_experiment", fake)  # the names the command calls
    monkeypatch.setattr(qkv.cli.lab, "table", lambda run: qkv.lab.Table("t", ["a"], []))
    assert main(["lab", "gradients", "--quick", "--out", str(tmp_path)]) == 0
    assert main(["lab", "gradients", "--quick", "--out", str(tmp_path), "--jobs", "2"]) == 0
    assert seen == [(True, 1, "cpu"), (True, 2, "cpu")] and common._SHOW["bars"] is False
    assert training._PROCESSES == {"trainings": 1, "device": "cpu"}
    assert main(["lab", "gradients", "--out", str(tmp_path), "--jobs", "0"]) == 2
    monkeypatch.setattr(qkv.cli.lab.torch.cuda, "is_available", lambda: True)
    assert main(["lab", "gradients", "--out", str(tmp_path), "--device", "cuda"]) == 0
    assert seen[-1] == (True, 1, "cuda") and training._PROCESSES["device"] == "cpu"


def test_lab_trainings_on_cuda_are_refused_in_one_line_where_torch_finds_no_gpu(
    monkeypatch, tmp_path, capsys
):
    import qkv.cli.lab
    from qkv.cli import main

    monkeypatch.setattr(qkv.cli.lab.torch.cuda, "is_available", lambda: False)
    assert main(["lab", "bottleneck", "--out", str(tmp_path), "--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"qkv lab: error: --device cuda: torch {torch.__version__} finds no CUDA device here"
    ]
    assert list(tmp_path.iterdir()) == []  # refused before anything was written
    with pytest.raises(ValueError, match="'cpu' or 'cuda'"), parallel_trainings(1, "mps"):
        pass


def test_train_models_sends_its_device_to_every_training(monkeypatch, tmp_path):
    """The jobs that train_models trains carry the device of parallel_trainings, which the
    recipe of each training takes (a lab training ran on the CPU whatever was asked)."""
    from qkv.lab import training

    recipes = []
    monkeypatch.setattr(training, "train_model", lambda job: recipes.append(job.recipe()))
    jobs = [_converging(tmp_path, f"seed{s}", step_cap=2, seed=s) for s in (0, 1)]
    with parallel_trainings(1, "cuda"):
        train_models(jobs)
    train_models(jobs)
    assert [r.train.device for r in recipes] == ["cuda", "cuda", "cpu", "cpu"]
    assert all(r.train.threads == 1 for r in recipes)


def test_the_long_measurements_show_a_bar_under_qkv_lab(capsys):
    """gradients, parallelism and heads ran their loops (minutes in the full settings:
    parallelism times lengths up to 1024) without a word; under qkv lab each shows a bar
    with its count of steps, and a library call stays quiet."""
    from qkv.lab import gradients, parallelism

    timing = parallelism.Setting(lengths=(2, 4, 8), batch=1, width=8, layers=1, heads=1, repeats=1)
    norms = gradients.Setting(
        steps=3, hidden=4, input_dim=2, input_scale=0.5, heads=1, seeds=(0, 1)
    )
    with progress_bars():
        parallelism.measure(timing, "cpu")
        gradients.measure(norms)
    err = capsys.readouterr().err
    assert "timing on cpu" in err and "6/6" in err
    assert "Jacobians" in err and f"{2 * len(gradients._models())}/" in err
    parallelism.measure(timing, "cpu")
    assert capsys.readouterr().err == ""


def test_a_lab_training_stops_on_the_validation_set_and_keeps_its_curve(tmp_path):
    """Lab trainings stopped at a wall-clock budget, unconverged; now they validate every
    eval_every steps, stop after `patience` evaluations without a better one, load the
    best checkpoint and report the curve that decided it."""
    from qkv.lab.training import curve_figure, read_curve, until_converged

    data = tmp_path / "data"
    write_toy_corpus(data, (60, 10, 10), 2, 5, seed=0)
    model = MODEL_FAMILIES["rnn-none"](16, 8)
    # lr 0: the model never improves after its first evaluation, so patience 2 stops at 3
    optim = {"max_tokens": 200, "lr": 1e-12, "warmup": 0, "seed": 0}
    optim |= until_converged(eval_every=2, patience=2, step_cap=1000, valid_bleu_sentences=5)
    trained = train_model(TrainJob("rnn-none", model, data, tmp_path / "models", optim))
    assert trained.steps == 6 and trained.best_step == 2
    assert trained.stopped == "patience: 2 evaluations without improvement"
    assert [r["step"] for r in trained.curve] == [2, 4, 6]
    assert trained.curve == read_curve(tmp_path / "models" / "rnn-none" / "log.jsonl")
    assert all(r["seconds"] > 0 and r["valid_loss"] > 0 for r in trained.curve)
    assert trained.record()["curve"] == trained.curve
    pytest.importorskip("matplotlib", reason="the curve figure needs matplotlib")
    path = curve_figure({"rnn-none": [trained.curve]}, tmp_path / "curve.png", "toy")
    assert (tmp_path / "curve.png").stat().st_size > 1000 and path.endswith("curve.png")


def _weights(trained) -> list:
    return [p.detach().clone() for p in trained.model.parameters()]


def test_a_lab_training_continues_what_its_folder_holds(tmp_path, caplog):
    """The converged runs take hours: run again, an experiment loads its finished trainings
    as they are and continues a stopped one from its last checkpoint, to the losses and
    weights of the training that was never stopped; a folder of another model (the
    setting changed) trains from the start, with a warning."""
    import torch

    straight = train_model(_converging(tmp_path, "straight", step_cap=8))
    first = train_model(_converging(tmp_path, "stopped", step_cap=4))
    assert first.steps == 4 and [r["step"] for r in first.curve] == [2, 4]
    went_on = train_model(_converging(tmp_path, "stopped", step_cap=8))
    assert went_on.steps == 8 and went_on.stopped == "step cap"
    assert [r["valid_loss"] for r in went_on.curve] == [r["valid_loss"] for r in straight.curve]
    for a, b in zip(_weights(went_on), _weights(straight), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert went_on.seconds > first.seconds  # the time of both processes
    again = train_model(_converging(tmp_path, "stopped", step_cap=8))  # finished: loaded
    assert (again.steps, again.seconds, again.curve) == (8, went_on.seconds, went_on.curve)
    with caplog.at_level("WARNING"):
        other = train_model(_converging(tmp_path, "stopped", step_cap=4, width=24))
    assert other.steps == 4 and "training stopped from the start" in caplog.text
    assert [r["step"] for r in other.curve] == [2, 4]


def test_trainings_in_parallel_processes_equal_one_after_the_other(tmp_path):
    """``qkv lab NAME --jobs 2``: each training in its own process, one thread each, gives
    the models of the same trainings run one after the other, in the order of the jobs."""
    import torch

    jobs = [_converging(tmp_path / "one", f"seed{s}", step_cap=4, seed=s) for s in (0, 1, 2)]
    alone = train_models(jobs)
    with parallel_trainings(2):
        together = train_models(
            [_converging(tmp_path / "two", f"seed{s}", step_cap=4, seed=s) for s in (0, 1, 2)]
        )
    assert [t.steps for t in together] == [4, 4, 4]
    for a, b in zip(alone, together, strict=True):
        assert [r["valid_loss"] for r in a.curve] == [r["valid_loss"] for r in b.curve]
        for x, y in zip(_weights(a), _weights(b), strict=True):
            torch.testing.assert_close(x, y, rtol=0, atol=0)
    assert _weights(alone[0])[0].ne(_weights(alone[1])[0]).any()  # the seeds differ
    with pytest.raises(ValueError, match="at least 1"), parallel_trainings(0):
        pass


def test_a_scored_training_stands_for_itself_on_another_machine(tmp_path, caplog):
    """scored_trainings keeps each training's record and score in its folder; a run whose
    folders hold only those files (no checkpoints, the data somewhere else with the same
    content) neither trains nor loads, and a training of another recipe trains again."""
    import shutil

    from qkv.lab.training import SCORED, scored_trainings

    scores = []

    def score(trained):
        scores.append(trained.steps)
        return {"weights": sum(float(w.double().sum()) for w in _weights(trained))}

    jobs = [_converging(tmp_path / "here", f"seed{s}", step_cap=4, seed=s) for s in (0, 1)]
    with parallel_trainings(2):
        first = scored_trainings(jobs, score)
    assert scores == [4, 4] and [r["training"]["steps"] for r in first] == [4, 4]
    assert first[0]["score"] != first[1]["score"]

    there = tmp_path / "there"
    shutil.copytree(tmp_path / "here" / "data", there / "data")
    for s in (0, 1):
        (there / "models" / f"seed{s}").mkdir(parents=True)
        shutil.copy(
            tmp_path / "here" / "models" / f"seed{s}" / SCORED, there / "models" / f"seed{s}"
        )
    moved = [_converging(there, f"seed{s}", step_cap=4, seed=s) for s in (0, 1)]
    assert scored_trainings(moved, score) == first and scores == [4, 4]
    assert sorted(p.name for p in (there / "models" / "seed0").iterdir()) == [SCORED]

    changed = [_converging(there, "seed0", step_cap=6, seed=0), moved[1]]
    with caplog.at_level("WARNING"):
        again = scored_trainings(changed, score)
    assert scores == [4, 4, 6] and again[1] == first[1]
    assert again[0]["training"]["steps"] == 6 and "another training's score" in caplog.text


_KILLED_LAB = """
import sys
from pathlib import Path
from tests.lab.test_training import _converging
from qkv.lab.training import parallel_trainings, train_models

folder = Path(sys.argv[1])
with parallel_trainings(2):
    train_models([_converging(folder, f"seed{s}", step_cap=100_000, seed=s) for s in (0, 1)])
"""


def test_killing_the_lab_stops_its_trainings_and_keeps_their_steps(tmp_path):
    """The lab process killed (``kill -9``) while two trainings run in their own processes:
    each notices, finishes its step, saves it and ends; none trains on unseen beside a new
    run, and the new run continues from the saved step."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import time

    from qkv.models.checkpoint import load_checkpoint

    lab = subprocess.Popen([sys.executable, "-c", _KILLED_LAB, str(tmp_path)], cwd=os.getcwd())
    logs = [tmp_path / "models" / f"seed{s}" / "log.jsonl" for s in (0, 1)]
    deadline = time.monotonic() + 120
    while not all(f.is_file() and f.read_text().count("\n") >= 5 for f in logs):
        assert time.monotonic() < deadline and lab.poll() is None, "the trainings never began"
        time.sleep(0.2)
    lab.send_signal(signal.SIGKILL)
    lab.wait()
    time.sleep(1.5)  # the children look for their parent every second
    sizes = [f.stat().st_size for f in logs]
    for _ in range(60):  # until both have saved and stopped (their logs stop growing)
        time.sleep(1.0)
        now = [f.stat().st_size for f in logs]
        if now == sizes:
            break
        sizes = now
    time.sleep(2.0)
    assert [f.stat().st_size for f in logs] == sizes, "a training went on after the lab died"
    for log_file in logs:
        last_step = json.loads(log_file.read_text().splitlines()[-1])["step"]
        saved = load_checkpoint(log_file.parent / "last.safetensors").extra["train"]["step"]
        assert saved == last_step >= 5
