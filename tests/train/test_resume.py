"""qkv.train.resume: a resumed run continues exactly (also after SIGKILL), only with the
same model and data, refuses a corrupt saved state in one line, takes the config's
optimiser settings, and trains nothing when the run it resumes had finished."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
import yaml
from safetensors import safe_open
from safetensors.torch import save_file

from qkv.cli import main
from qkv.models.checkpoint import CheckpointError, load_checkpoint, saved_extra
from qkv.train.loop import _State, train
from qkv.train.recipe import recipe_from_dict
from qkv.train.resume import LOOP_STATE
from tests.train.helpers import (
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


KILLED_WRITING = """
import os, signal, sys
import safetensors.torch
from tests.train.helpers import tiny_recipe
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


KILLED_SAVING = """
import os, signal, sys
from tests.train.helpers import tiny_recipe
from qkv.train.loop import train

out, when, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
replace, done = os.replace, []

def killed_around(src, dst, *args, **kwargs):  # a checkpoint's file takes its name here
    if not str(dst).endswith(".safetensors"):
        return replace(src, dst, *args, **kwargs)
    done.append(dst)
    if when == "before" and len(done) == count:
        os.kill(os.getpid(), signal.SIGKILL)
    replace(src, dst, *args, **kwargs)
    if when == "after" and len(done) == count:
        os.kill(os.getpid(), signal.SIGKILL)

os.replace = killed_around
train(tiny_recipe(out, **SETTINGS), progress=False)
"""

# evaluations at steps 4, 8 and 12, each a new best, saved then; patience 1
SAVING = {"steps": 12, "eval_every": 4, "save_every": 4, "patience": 1}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("uninterrupted")
    result = train(tiny_recipe(out, **SAVING), progress=False)
    evaluations = [r for r in logged_rows(out) if "valid_loss" in r]
    assert [r["step"] for r in evaluations] == [4, 8, 12]  # else the test shows nothing
    assert result.steps == 12 and result.best_step == 12
    return out


def _final(out) -> dict:
    """What a run ends with: its log (no timings), and each checkpoint's weights and
    saved loop state (no training seconds)."""
    final = {"log": logged_rows(out)}
    for name in ("last", "best"):
        ckpt = load_checkpoint(out / f"{name}.safetensors")
        final[name] = {k: v.tolist() for k, v in ckpt.model.state_dict().items()}
        final[f"{name}.train"] = {k: v for k, v in ckpt.extra["train"].items() if k != "seconds"}
    return final


@pytest.mark.parametrize(
    ("when", "count"),
    [("after", 1), ("before", 3), ("after", 3), ("before", 4), ("after", 4)],
    ids=[
        "first-evaluation-between-the-two-files",
        "before-last-takes-its-name",
        "between-the-two-files",
        "before-best-takes-its-name",
        "after-both",
    ],
)
def test_a_kill_in_any_window_of_saving_an_evaluation_resumes_to_the_same_run(
    uninterrupted, tmp_path, when, count
):
    """A new best evaluation is two files, last.safetensors and best.safetensors. best was
    written first: killed before last, the resumed run evaluated that step again, scored a
    tie with the best it had taken from best.safetensors, counted a bad evaluation and
    (train.patience 1) stopped at step 8 where the uninterrupted run trains to step 12;
    killed at the first evaluation, the folder held only best and --resume refused it.
    Killed (SIGKILL) before or after each file of the evaluations at steps 4 and 8 takes
    its name, then resumed: the same log, checkpoints and best as never killed."""
    killed = tmp_path / "killed"
    script = KILLED_SAVING.replace("**SETTINGS", ", ".join(f"{k}={v}" for k, v in SAVING.items()))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.run([sys.executable, "-c", script, str(killed), when, str(count)], env=env)
    assert proc.returncode == -signal.SIGKILL
    config = tmp_path / "c.yaml"
    config.write_text(json.dumps(tiny_dict(killed, **SAVING)))
    assert main(["train", str(config), "--resume"]) == 0
    assert _final(killed) == _final(uninterrupted)
    assert not list(killed.glob(".*.tmp"))


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


def test_resuming_a_run_that_stopped_early_trains_nothing(tmp_path):
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


def test_resume_uses_the_configs_optimiser_settings(tmp_path):
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


def test_a_checkpoint_without_best_loss_still_resumes(tmp_path):
    """Checkpoints written before best_loss was kept have no such entry."""
    train(tiny_recipe(tmp_path, steps=4), progress=False)
    path = tmp_path / "last.safetensors"
    with safe_open(str(path), "pt") as f:
        header, tensors = json.loads(f.metadata()["qkv"]), {k: f.get_tensor(k) for k in f.keys()}
    del header["extra"]["train"]["best_loss"]
    save_file(tensors, str(path), metadata={"qkv": json.dumps(header)})
    assert train(tiny_recipe(tmp_path, steps=6), resume=True, progress=False).steps == 6


def _an_earlier_qkvs_folder(out, recipe, older, best_at: int, last_at: int) -> None:
    """What an earlier qkv, which saved best.safetensors before last.safetensors, left when
    killed between the two: ``recipe`` trained to ``best_at`` in ``out``, and ``older``
    (the same run to ``last_at``, trained elsewhere) as its last.safetensors."""
    train_until_interrupted(recipe, step=best_at)
    train(older, progress=False)
    shutil.copy(older.out_dir / "last.safetensors", out / "last.safetensors")
    assert saved_extra(out / "last.safetensors")["train"]["step"] == last_at
    best = saved_extra(out / "best.safetensors")["train"]
    assert best["step"] == best_at == best["best_step"]


def test_a_resume_keeps_a_best_checkpoint_saved_after_its_last(tmp_path, caplog):
    """Killed between saves (best at step 6, last at step 4), the resumed run took the best
    of step 4's state, older than the file: with the lr near 0 (the weights of step 4) it
    said 'best at step 4' while best.safetensors held step 6's model."""
    out = tmp_path / "run"
    recipe = tiny_recipe(out, steps=10, eval_every=2, save_every=4)
    older = tiny_recipe(tmp_path / "older", steps=4, eval_every=2, save_every=4)
    _an_earlier_qkvs_folder(out, recipe, older, best_at=6, last_at=4)
    frozen = tiny_recipe(out, steps=10, eval_every=2, save_every=4, lr=1e-12)
    with caplog.at_level("WARNING", logger="qkv.train.resume"):
        result = train(frozen, resume=True, progress=False)
    assert "best.safetensors holds step 6, after the resumed step 4" in caplog.text
    kept = saved_extra(out / "best.safetensors")["train"]
    assert result.best_step == kept["best_step"] == 6 and result.best_bleu == kept["best_bleu"]


def test_the_best_evaluation_made_again_is_not_a_bad_one(uninterrupted, tmp_path):
    """From a folder where best.safetensors is later than last.safetensors (an earlier
    qkv killed between its saves), the resumed run evaluates best's step again and scores
    what that file holds: a tie, counted as an evaluation without a better BLEU, so with
    train.patience 1 it stopped at step 8 where the uninterrupted run trains to 12."""
    out = tmp_path / "run"
    older = tiny_recipe(tmp_path / "older", **{**SAVING, "steps": 4})
    _an_earlier_qkvs_folder(out, tiny_recipe(out, **SAVING), older, best_at=8, last_at=4)
    assert train(tiny_recipe(out, **SAVING), resume=True, progress=False).steps == 12
    assert _final(out) == _final(uninterrupted)


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
    with caplog.at_level("WARNING", logger="qkv.train.resume"):
        train(tiny_recipe(tmp_path, steps=5, **changes), resume=True, progress=False)
    warned = [r.getMessage() for r in caplog.records if "batch order" in r.getMessage()]
    if named is None:
        assert warned == []
    else:
        assert len(warned) == 1 and named in warned[0] and "repeat" in warned[0]


def _with_param_groups(src, dst, change) -> None:
    """A copy of checkpoint ``src`` at ``dst`` whose saved optimiser ``param_groups`` (the
    JSON list of the header) are replaced by what ``change`` returns for them."""
    with safe_open(str(src), "pt") as f:
        header, tensors = json.loads(f.metadata()["qkv"]), {k: f.get_tensor(k) for k in f.keys()}
    header["optimizer"]["param_groups"] = change(header["optimizer"]["param_groups"])
    dst.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(dst), metadata={"qkv": json.dumps(header)})


def _setting(key, value):
    return lambda groups: [{**group, key: value} for group in groups]


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (_setting("amsgrad", True), r"param_groups\[0\]\.amsgrad is true, but qkv trains with"),
        (_setting("differentiable", True), r"param_groups\[0\]\.differentiable is true, but"),
        (_setting("maximize", True), r"param_groups\[0\]\.maximize is true, but qkv trains"),
        (_setting("eps", "abc"), r'param_groups\[0\]\.eps is "abc", not a finite number'),
        (_setting("lr", "x"), r'param_groups\[0\]\.lr is "x", not a finite number'),
        (_setting("momentum", 0.9), r"param_groups\[0\]\.momentum: not a setting of the AdamW"),
        (lambda groups: groups * 2, r"param_groups has 2 groups, AdamW here 1"),
    ],
    ids=[
        "amsgrad",
        "differentiable",
        "maximize",
        "eps-string",
        "lr-string",
        "unknown-key",
        "two-groups",
    ],
)
def test_tampered_optimiser_settings_are_one_line_naming_the_file_and_key(
    trained, tmp_path, capsys, change, named
):
    """torch loads a parameter group's settings as they are: amsgrad true failed at the
    first step on a missing moment (a KeyError traceback), differentiable true and eps
    "abc" in the step (tracebacks), maximize true climbed the loss without a word."""
    path = tmp_path / "last.safetensors"
    _with_param_groups(trained, path, change)
    before = path.read_bytes()
    config = tmp_path / "c.yaml"
    config.write_text(json.dumps(tiny_dict(tmp_path, steps=8)))
    capsys.readouterr()
    assert main(["train", str(config), "--resume"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("qkv train: error: "), err
    assert f"{path}: cannot resume: corrupt training state (optimizer." in err
    assert re.search(named, err), err
    assert path.read_bytes() == before  # nothing overwritten
    assert not (tmp_path / "log.jsonl").exists()


def test_untampered_optimiser_settings_resume(trained, tmp_path, capsys):
    """The same header written again (its settings as qkv saved them) resumes."""
    _with_param_groups(trained, tmp_path / "last.safetensors", lambda groups: groups)
    config = tmp_path / "c.yaml"
    config.write_text(json.dumps(tiny_dict(tmp_path, steps=5)))
    assert main(["train", str(config), "--resume"]) == 0, capsys.readouterr().err
    assert load_checkpoint(tmp_path / "last.safetensors").extra["train"]["step"] == 5
