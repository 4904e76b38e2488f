"""Which checkpoint is the best one: the highest validation BLEU, or without BLEU
(``train.valid_bleu_sentences: 0``) the lowest validation loss."""

from __future__ import annotations

import json

import pytest

from qkv.models.checkpoint import load_checkpoint
from qkv.train.loop import train
from tests.train_helpers import logged_rows, tiny_recipe


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


def test_a_checkpoint_without_best_loss_still_resumes(tmp_path):
    """Checkpoints written before best_loss was kept have no such entry."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    train(tiny_recipe(tmp_path, steps=4), progress=False)
    path = tmp_path / "last.safetensors"
    with safe_open(str(path), "pt") as f:
        header, tensors = json.loads(f.metadata()["qkv"]), {k: f.get_tensor(k) for k in f.keys()}
    del header["extra"]["train"]["best_loss"]
    save_file(tensors, str(path), metadata={"qkv": json.dumps(header)})
    assert train(tiny_recipe(tmp_path, steps=6), resume=True, progress=False).steps == 6


def test_the_summary_line_names_what_picked_the_best(tmp_path, capsys):
    """Without BLEU sentences the last line said 'best valid BLEU 0.00 at step N'."""
    from qkv.cli import main
    from tests.train_helpers import tiny_dict

    config = tmp_path / "tiny.yaml"
    out = tmp_path / "run"
    config.write_text(json.dumps(tiny_dict(out, steps=4, eval_every=2, valid_bleu_sentences=0)))
    assert main(["train", str(config)]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    best = load_checkpoint(out / "best.safetensors").extra["train"]["step"]
    assert f"; lowest valid loss at step {best}; checkpoints in {out}" in line
    assert "BLEU" not in line
