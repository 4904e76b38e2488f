"""Resuming a training run: exactly (also after SIGKILL), and only with the same model and data."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
import torch
import yaml

from qkv.models.checkpoint import CheckpointError, load_checkpoint
from qkv.train.loop import train
from qkv.train.recipe import recipe_from_dict
from tests.train_helpers import (
    TINY,
    logged_losses,
    logged_rows,
    run_cli,
    tiny_dict,
    tiny_recipe,
    train_until_interrupted,
)


def test_resume_continues_with_identical_losses(tmp_path):
    full, part = tmp_path / "full", tmp_path / "part"
    train(tiny_recipe(full), progress=False)
    train(tiny_recipe(part, steps=8), progress=False)  # stops (and saves) at step 8
    train(tiny_recipe(part), resume=True, progress=False)
    assert logged_losses(part) == logged_losses(full)


def test_resume_with_another_model_names_what_changed(tmp_path):
    train(tiny_recipe(tmp_path, steps=4), progress=False)
    before = (tmp_path / "last.safetensors").read_bytes()
    d = json.loads(json.dumps(TINY))
    d.update(out=str(tmp_path))
    d["model"]["ff_dim"] = 48
    with pytest.raises(CheckpointError, match=r"cannot resume: .*\(ff_dim\)"):
        train(recipe_from_dict(d), resume=True, progress=False)
    d["model"] = {"type": "rnn", "hidden_dim": 32, "embed_dim": 16}
    with pytest.raises(CheckpointError, match=r"cannot resume: .*\(type\)"):
        train(recipe_from_dict(d), resume=True, progress=False)
    assert (tmp_path / "last.safetensors").read_bytes() == before  # nothing overwritten


def test_resume_after_sigkill_between_checkpoints(tmp_path):
    full, killed = tmp_path / "full", tmp_path / "killed"
    train(tiny_recipe(full, steps=16), progress=False)
    config = tmp_path / "tiny.yaml"
    d = json.loads(json.dumps(TINY))
    d["train"]["steps"] = 16
    config.write_text(yaml.safe_dump(d))
    cmd = [sys.executable, "-m", "qkv", "train", str(config), "--out", str(killed)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline:  # wait until step 6 is logged: past checkpoint 4, before 8
        log = killed / "log.jsonl"
        if log.exists() and any(
            json.loads(x).get("step", 0) >= 6 for x in log.read_text().split("\n") if x.strip()
        ):
            break
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    step = load_checkpoint(killed / "last.safetensors").extra["train"]["step"]
    assert step % 4 == 0 and step < 16
    done = subprocess.run([*cmd, "--resume"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert logged_losses(killed) == logged_losses(full)


@pytest.mark.parametrize("key, value", [("seed", 1), ("n_train", 390), ("max_len", 5)])
def test_resume_with_other_data_names_what_changed(tmp_path, key, value):
    train(tiny_recipe(tmp_path, steps=2), progress=False)
    before = (tmp_path / "last.safetensors").read_bytes()
    d = tiny_dict(tmp_path, steps=4)
    d["data"][key] = value
    with pytest.raises(
        CheckpointError, match=rf"cannot resume: the config's data .*\(data.{key}\)"
    ):
        train(recipe_from_dict(d), resume=True, progress=False)
    assert (tmp_path / "last.safetensors").read_bytes() == before


def test_resume_compares_the_tokenizers_when_the_recipe_is_not_stored(tmp_path):
    from safetensors import safe_open
    from safetensors.torch import save_file

    train(tiny_recipe(tmp_path, steps=2), progress=False)
    path = tmp_path / "last.safetensors"
    with safe_open(str(path), "pt") as f:  # an older checkpoint: no recipe in its header
        header, tensors = json.loads(f.metadata()["qkv"]), {k: f.get_tensor(k) for k in f.keys()}
    del header["extra"]["recipe"]
    save_file(tensors, path, metadata={"qkv": json.dumps(header)})
    d = tiny_dict(tmp_path, steps=4)
    d["data"]["seed"] = 1  # same vocabulary sizes, other words behind the ids
    with pytest.raises(CheckpointError, match="the src tokenizer trained on them has other"):
        train(recipe_from_dict(d), resume=True, progress=False)
    assert train(tiny_recipe(tmp_path, steps=4), resume=True, progress=False).steps == 4


def test_resume_after_the_corpus_moved_but_not_after_it_changed(tmp_path):
    rng = random.Random(0)
    words = "a b c d e f g h".split()
    pairs = [
        (" ".join(rng.choices(words, k=4)), " ".join(rng.choices(words, k=4))) for _ in range(60)
    ]
    for folder in ("old", "moved", "changed"):
        (tmp_path / folder).mkdir()
        for side, lines in (("de", [p[0] for p in pairs]), ("en", [p[1] for p in pairs])):
            if folder == "changed" and side == "en":
                lines = [line.replace("a", "z") for line in lines]  # a new word
            (tmp_path / folder / f"t.{side}").write_text("\n".join(lines) + "\n")

    def recipe(folder: str, steps: int):
        d = tiny_dict(tmp_path / "out", steps=steps)
        files = [str(tmp_path / folder / f"t.{side}") for side in ("de", "en")]
        d["data"] = {"kind": "files", "train": files, "valid": files}
        return recipe_from_dict(d)

    train(recipe("old", 2), progress=False)
    with pytest.raises(CheckpointError, match="the tgt tokenizer trained on them has other"):
        train(recipe("changed", 4), resume=True, progress=False)
    assert train(recipe("moved", 4), resume=True, progress=False).steps == 4


def test_resume_past_train_steps_trains_nothing_and_says_so(tmp_path):
    train(tiny_recipe(tmp_path, steps=4), progress=False)
    log, ckpt = (tmp_path / "log.jsonl").read_text(), (tmp_path / "last.safetensors").read_bytes()
    result = train(tiny_recipe(tmp_path, steps=2), resume=True, progress=False)
    assert result.already_done and result.steps == 4
    assert (tmp_path / "log.jsonl").read_text() == log
    assert (tmp_path / "last.safetensors").read_bytes() == ckpt
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(tiny_dict(tmp_path, steps=4)))
    proc = run_cli("train", str(config), "--resume")
    assert proc.returncode == 0, proc.stderr
    assert "nothing to do" in proc.stdout and "already at step 4" in proc.stdout
    assert "nan" not in proc.stdout + proc.stderr and "tok/s" not in proc.stdout + proc.stderr


KILLED_WRITING = """
import os, signal, sys
import safetensors.torch
from tests.train_helpers import tiny_recipe
from qkv.train.loop import train

save_file, saves = safetensors.torch.save_file, []

def half_then_killed(tensors, filename, metadata=None):
    saves.append(filename)
    if len(saves) == 2:  # the checkpoint of step 8: half written, then SIGKILL
        save_file(tensors, filename, metadata=metadata)
        size = os.path.getsize(filename)
        os.truncate(filename, size // 2)
        os.kill(os.getpid(), signal.SIGKILL)
    save_file(tensors, filename, metadata=metadata)

safetensors.torch.save_file = half_then_killed
train(tiny_recipe(sys.argv[1]), progress=False)
"""


def test_resume_after_sigkill_in_the_middle_of_writing_a_checkpoint(tmp_path):
    full, killed = tmp_path / "full", tmp_path / "killed"
    train(tiny_recipe(full), progress=False)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.run([sys.executable, "-c", KILLED_WRITING, str(killed)], env=env)
    assert proc.returncode == -signal.SIGKILL
    assert list(killed.glob(".last.safetensors.*.tmp"))  # what the kill left
    assert load_checkpoint(killed / "last.safetensors").extra["train"]["step"] == 4
    train(tiny_recipe(killed), resume=True, progress=False)
    assert logged_losses(killed) == logged_losses(full)
    assert not list(killed.glob(".*.tmp"))
    last = {
        name: load_checkpoint(out / "last.safetensors").model.state_dict()
        for name, out in (("full", full), ("killed", killed))
    }
    assert all(torch.equal(last["killed"][k], v) for k, v in last["full"].items())


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
    from qkv.cli import main

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
    from qkv.cli import main

    config = tmp_path / "c.yaml"
    config.write_text(json.dumps(tiny_dict(tmp_path / "out", steps=2, eval_every=2)))
    assert main(["train", str(config), "--resume"]) == 0
    assert (tmp_path / "out" / "last.safetensors").exists()
