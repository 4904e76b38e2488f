"""qkv.train.run_folder: an output folder that is a file, a run that a new one would
replace, what a new or resumed run leaves there (the log cut back to the checkpoint's
step, no checkpoint of an earlier run), and what Ctrl-C says about resuming."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import yaml

import qkv.train.loop
from qkv.cli import main
from qkv.models.checkpoint import load_checkpoint
from qkv.train.loop import train
from qkv.train.recipe import ConfigError, recipe_from_dict
from qkv.train.run_folder import resume_note, trim_log
from tests.train.helpers import (
    TINY,
    logged_rows,
    run_cli,
    tiny_dict,
    tiny_recipe,
    train_until_interrupted,
)


def test_out_that_is_a_file_is_named_as_out(tmp_path):
    config, taken = tmp_path / "tiny.yaml", tmp_path / "taken.txt"
    config.write_text(yaml.safe_dump(TINY))
    taken.write_text("keep me")
    for out, match in (
        (taken, f"--out {taken}: is a file, not a folder"),
        (taken / "x", f"--out {taken / 'x'}: {taken} is a file"),
    ):
        proc = run_cli("train", str(config), "--out", str(out))
        assert proc.returncode == 2 and match in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
    with pytest.raises(ConfigError, match=f"out {taken}: is a file"):
        train(recipe_from_dict({**TINY, "out": str(taken)}), progress=False)
    assert taken.read_text() == "keep me"


def test_a_new_run_does_not_replace_one_without_being_asked(tmp_path):
    """Without --resume or --overwrite, qkv train into a folder that holds a run is one
    line, exit 2, and the run's files stay byte for byte; --overwrite starts again, and a
    new run leaves no best.safetensors of the old one behind."""
    config = tmp_path / "c.yaml"
    config.write_text(json.dumps(tiny_dict(tmp_path, steps=4, eval_every=2)))
    train(tiny_recipe(tmp_path, steps=4, eval_every=2), progress=False)
    (tmp_path / "best.safetensors").write_bytes(b"an older run's best")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    proc = run_cli("train", str(config))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"qkv train: error: out {tmp_path}: holds a run already (last.safetensors); --resume "
        "continues it, --overwrite starts again and replaces its checkpoints and log"
    ]
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before
    proc = run_cli("train", str(config), "--resume", "--overwrite")
    assert proc.returncode == 2 and "not allowed with argument" in proc.stderr
    proc = run_cli("train", str(config), "--set", "train.lr=1e-9", "--overwrite")
    assert proc.returncode == 0, proc.stderr
    best = tmp_path / "best.safetensors"  # gone, or this run's
    assert not best.exists() or best.read_bytes() != b"an older run's best"
    assert [r["step"] for r in logged_rows(tmp_path) if "loss" in r] == [1, 2, 3, 4]


@pytest.mark.parametrize("flags", [[], ["--resume"]], ids=["new-run", "resume"])
def test_a_best_checkpoint_without_a_last_one_is_not_deleted(tmp_path, capsys, flags):
    """A folder that kept only best.safetensors (last.safetensors deleted to save space):
    qkv train, with or without --resume, started a new run there and deleted that best
    model without a word. Now one line, exit 2, and the file stays."""
    config = tmp_path / "c.yaml"
    config.write_text(json.dumps(tiny_dict(tmp_path, steps=4)))
    best = tmp_path / "best.safetensors"
    best.write_bytes(b"the best model of a run")
    assert main(["train", str(config), *flags]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"qkv train: error: out {tmp_path}: holds a run's best.safetensors but no "
        "last.safetensors to resume from; --overwrite starts again and replaces it, or give "
        "another --out"
    ]
    assert best.read_bytes() == b"the best model of a run"
    assert not (tmp_path / "last.safetensors").exists()


def test_resume_in_an_empty_folder_starts_a_run(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(json.dumps(tiny_dict(tmp_path / "out", steps=2, eval_every=2)))
    assert main(["train", str(config), "--resume"]) == 0
    assert (tmp_path / "out" / "last.safetensors").exists()


def test_a_new_run_interrupted_before_its_first_checkpoint_leaves_no_old_one(tmp_path):
    """--overwrite (a new run in a folder that holds one) kept the old last.safetensors
    until its first save: interrupted before it, the folder held the new run's log beside
    the old run's checkpoint, and --resume then continued the run it was told to replace,
    its log holding rows of both runs."""
    train(tiny_recipe(tmp_path, steps=8, save_every=8), progress=False)
    train_until_interrupted(tiny_recipe(tmp_path, steps=8, save_every=8, lr=1e-4), step=2)
    assert not (tmp_path / "last.safetensors").exists()
    assert not (tmp_path / "best.safetensors").exists()
    assert [r["step"] for r in logged_rows(tmp_path)] == [1, 2]
    again = train(
        tiny_recipe(tmp_path, steps=3, save_every=8, lr=1e-4), resume=True, progress=False
    )
    assert again.steps == 3 and not again.already_done
    assert [r["step"] for r in logged_rows(tmp_path) if "loss" in r] == [1, 2, 3]


def test_resume_drops_a_log_row_that_a_crash_cut_short(tmp_path):
    full, cut = tmp_path / "full", tmp_path / "cut"
    train(tiny_recipe(full), progress=False)
    train_until_interrupted(tiny_recipe(cut), step=6)  # checkpoint at 4
    log = cut / "log.jsonl"
    last = log.read_text().splitlines()[-1]
    with open(log, "a", encoding="utf-8") as f:  # step 7's row, half written
        f.write(last.replace('"step": 6', '"step": 7')[: random.randint(1, len(last) - 2)])
    train(tiny_recipe(cut), resume=True, progress=False)
    assert logged_rows(cut) == logged_rows(full)


def test_an_interrupt_while_the_log_is_cut_back_keeps_the_log(tmp_path, monkeypatch):
    """On resume the log is rewritten without the rows after the checkpoint's step; it
    was rewritten in place, so an interrupt (Ctrl-C, a kill) between the truncation and
    the write left log.jsonl empty: the whole run's history was lost."""
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
    log = tmp_path / "log.jsonl"
    rows = [{"step": 2}, {"step": "3", "note": "by hand"}, {"step": None}, {"step": 5}, [1]]
    log.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    trim_log(log, 3)
    assert [json.loads(r) for r in log.read_text().splitlines()] == rows[:3]


def test_ctrl_c_says_which_step_resume_continues_from(tmp_path, monkeypatch, capsys):
    """Ctrl-C printed 'interrupted' alone: not which step last.safetensors holds, nor that
    --resume continues from it (or that nothing was saved yet)."""
    config = tmp_path / "c.yaml"
    out = tmp_path / "run"
    config.write_text(json.dumps(tiny_dict(out, steps=9, save_every=3)))
    after_step = qkv.train.loop._Loop.after_step

    def interrupt_after(at: int):
        def step(loop):
            verdict = after_step(loop)
            if loop.state.step == at:
                raise KeyboardInterrupt
            return verdict

        return step

    for at, flags in ((2, []), (5, ["--overwrite"])):  # before the first save, then after
        monkeypatch.setattr(qkv.train.loop._Loop, "after_step", interrupt_after(at))
        assert main(["train", str(config), *flags]) == 130
        err = capsys.readouterr().err.strip().splitlines()
        if at == 2:
            assert err[-2:] == [
                f"qkv train: no checkpoint in {out} yet: a new run starts from step 0",
                "interrupted",
            ]
        else:
            saved = load_checkpoint(out / "last.safetensors").extra["train"]["step"]
            assert saved == 3
            assert err[-2:] == [
                f"qkv train: {out / 'last.safetensors'} holds step 3; --resume continues from it",
                "interrupted",
            ]


def test_the_resume_note_of_a_folder_whose_checkpoint_is_unreadable(tmp_path):
    (tmp_path / "last.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}garbage")
    assert resume_note(tmp_path) == (
        f"{tmp_path / 'last.safetensors'} is not a qkv checkpoint that --resume can read"
    )
