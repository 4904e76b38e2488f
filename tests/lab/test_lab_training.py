"""Training helpers of the translation experiments: progress shown while a model trains."""

from __future__ import annotations

import random

from qkv.lab.training import (
    MODEL_FAMILIES,
    progress_bars,
    train_model,
    write_toy_corpus,
)


def _train(tmp_path, steps: int):
    data = tmp_path / "data"
    write_toy_corpus(data, (60, 10, 10), 2, 5, seed=0)
    model = MODEL_FAMILIES["rnn-none"](16, 8)
    optim = {"steps": steps, "max_tokens": 200, "lr": 1e-3, "warmup": 1, "seed": 0}
    return train_model("rnn-none", model, data, tmp_path / "models", optim)


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
    import qkv.lab
    from qkv.cli import main
    from qkv.lab import training
    from qkv.lab.common import LabRun

    seen = []

    def fake(name, out, *, quick):
        seen.append(training._SHOW["bars"])
        return LabRun("gradients", True, {}, [0], {}, verdict="v")

    monkeypatch.setattr(qkv.lab, "run_experiment", fake)
    monkeypatch.setattr(qkv.lab, "table", lambda run: qkv.lab.Table("t", ["a"], []))
    assert main(["lab", "gradients", "--quick", "--out", str(tmp_path)]) == 0
    assert seen == [True] and training._SHOW["bars"] is False
