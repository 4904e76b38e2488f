"""Resuming refuses, in one line, a checkpoint whose saved loop state is corrupt."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from qkv.models.checkpoint import CheckpointError
from qkv.train.loop import _State, train
from tests.train_helpers import tiny_recipe


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    train(tiny_recipe(out, steps=4), progress=False)
    return out / "last.safetensors"


def _with_loop_state(src, dst, tensors=None, **changes) -> None:
    """A copy of checkpoint ``src`` at ``dst`` with entries of its saved loop state
    replaced, and ``tensors`` (name: tensor, or None to leave it out) too."""
    with safe_open(str(src), "pt") as f:
        header, saved = json.loads(f.metadata()["qkv"]), {k: f.get_tensor(k) for k in f.keys()}
    header["extra"]["train"].update(changes)
    saved.update(tensors or {})
    tensors = {k: v for k, v in saved.items() if v is not None}
    dst.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(dst), metadata={"qkv": json.dumps(header)})


def test_the_checked_entries_are_the_loops_state():
    from qkv.train.checks import LOOP_STATE

    assert set(LOOP_STATE) == {f.name for f in dataclasses.fields(_State)}


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        ("step", "3", "step is '3', not an integer"),
        ("epoch", -1, "epoch is -1, not >= 0"),
        ("batch_in_epoch", 2.5, "batch_in_epoch is 2.5, not an integer"),
        ("bad_evals", True, "bad_evals is True, not an integer"),
        ("best_bleu", None, "best_bleu is None, not a number"),
        ("seconds", "1", "seconds is '1', not a number"),
    ],
    ids=[
        "step-string",
        "epoch-negative",
        "batch-float",
        "bad-evals-bool",
        "bleu-null",
        "seconds-string",
    ],
)
def test_a_corrupt_loop_state_is_named_not_a_traceback(trained, tmp_path, key, value, why):
    """Such entries ended in a TypeError traceback (exit 1) from the first comparison
    that used them, or (a negative epoch) were taken as they were."""
    _with_loop_state(trained, tmp_path / "last.safetensors", **{key: value})
    before = (tmp_path / "last.safetensors").read_bytes()
    with pytest.raises(CheckpointError, match=rf"cannot resume: corrupt training state \({why}\)"):
        train(tiny_recipe(tmp_path, steps=8), resume=True, progress=False)
    assert (tmp_path / "last.safetensors").read_bytes() == before


def test_a_sound_loop_state_still_resumes(trained, tmp_path):
    shutil.copy(trained, tmp_path / "last.safetensors")
    assert train(tiny_recipe(tmp_path, steps=5), resume=True, progress=False).steps == 5


@pytest.mark.parametrize(
    ("tensors", "why"),
    [
        ({"optim.0.exp_avg": None}, "optim.0: AdamW's state .* differs in exp_avg"),
        ({"optim.0.exp_avg": torch.randn(3)}, r"optim.0.exp_avg is \(3,\), its parameter's is"),
        ({"optim.1.step": torch.ones(2)}, r"optim.1.step is \(2,\), its parameter's is \(\)"),
        ({"optim.999.step": torch.ones(())}, r"optim.999: the model has \d+ parameters"),
    ],
    ids=["moment-missing", "moment-too-small", "step-not-scalar", "no-such-parameter"],
)
def test_an_optimiser_state_that_does_not_fit_is_named(trained, tmp_path, tensors, why):
    """torch loads any optimiser state: a missing moment ended in a KeyError traceback at
    the first step, and a moment too small was used as it was by the fused AdamW step."""
    _with_loop_state(trained, tmp_path / "last.safetensors", tensors)
    with pytest.raises(CheckpointError, match=rf"cannot resume: corrupt training state \({why}"):
        train(tiny_recipe(tmp_path, steps=8), resume=True, progress=False)


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"seed": 7}, "train.seed differs"),
        ({"max_tokens": 200}, "train.max_tokens differs"),
        ({"seed": 7, "max_tokens": 200}, "train.seed and train.max_tokens differ"),
        ({"lr": 0.001}, None),
    ],
    ids=["seed", "max-tokens", "both", "lr-only"],
)
def test_resuming_with_another_batch_order_warns(trained, tmp_path, caplog, changes, named):
    """A resumed run continues at the saved position of the epoch's batch order; another
    train.seed or train.max_tokens makes another order, and resumed without a word."""
    shutil.copy(trained, tmp_path / "last.safetensors")
    with caplog.at_level("WARNING", logger="qkv.train.checks"):
        train(tiny_recipe(tmp_path, steps=5, **changes), resume=True, progress=False)
    warned = [r.getMessage() for r in caplog.records if "batch order" in r.getMessage()]
    if named is None:
        assert warned == []
    else:
        assert len(warned) == 1 and named in warned[0] and "repeat" in warned[0]


def test_an_interrupt_while_the_log_is_cut_back_keeps_the_log(tmp_path, monkeypatch):
    """On resume the log is rewritten without the rows after the checkpoint's step; it
    was rewritten in place, so an interrupt (Ctrl-C, a kill) between the truncation and
    the write left log.jsonl empty: the whole run's history was lost."""
    from pathlib import Path

    from qkv.train.run_folder import trim_log

    log = tmp_path / "log.jsonl"
    before = "".join(json.dumps({"step": s, "loss": 1.0 / s}) + "\n" for s in range(1, 7))
    log.write_text(before, encoding="utf-8")
    real = Path.write_text

    def interrupted(self, data, *args, **kwargs):
        real(self, "", *args, **kwargs)  # opened for writing (truncated), then Ctrl-C
        raise KeyboardInterrupt

    monkeypatch.setattr(Path, "write_text", interrupted)
    with pytest.raises(KeyboardInterrupt):
        trim_log(log, 3)
    monkeypatch.undo()
    assert log.read_text(encoding="utf-8") == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.jsonl"]
    trim_log(log, 3)
    assert [json.loads(r)["step"] for r in log.read_text().splitlines()] == [1, 2, 3]


def test_a_log_row_whose_step_is_not_a_number_is_kept(tmp_path):
    """A row added by hand or by another tool ({"step": "3"}, {"step": null}) ended the
    resume in a TypeError traceback (exit 1) while the log was cut back."""
    from qkv.train.run_folder import trim_log

    log = tmp_path / "log.jsonl"
    rows = [{"step": 2}, {"step": "3", "note": "by hand"}, {"step": None}, {"step": 5}, [1]]
    log.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    trim_log(log, 3)
    assert [json.loads(r) for r in log.read_text().splitlines()] == rows[:3]
