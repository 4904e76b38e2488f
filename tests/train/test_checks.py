"""qkv.train.checks: what is refused before training (a model larger than the free memory,
pairs longer than the model's positions, no validation pair), a diverged loss, and the
summary line at the end of a run."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from qkv.cli import main
from qkv.models.checkpoint import build_model, load_checkpoint
from qkv.models.memory import free_memory
from qkv.train import checks as train_checks
from qkv.train.checks import check_lengths, check_memory
from qkv.train.loop import train
from qkv.train.recipe import ConfigError, recipe_from_dict
from tests.train.helpers import CONFIG_FOLDER, logged_rows, run_cli, tiny_dict


def test_a_model_too_large_to_train_is_refused_before_it_is_allocated(monkeypatch):
    made_on = []

    def build():
        made_on.append(torch.empty(1).device.type)
        return nn.Sequential(nn.Linear(10, 10), nn.Embedding(7, 3, dtype=torch.float64))

    need = 4 * (110 * 4 + 21 * 8)  # weights, gradients and two moments, in bytes
    for free, fits in ((need, True), (need - 1, False), (None, True)):
        monkeypatch.setattr(train_checks, "free_memory", lambda device, free=free: free)
        if fits:
            check_memory(build, torch.device("cpu"))
        else:
            with pytest.raises(ConfigError, match=r"^model: 131 parameters need 0\.0 GiB"):
                check_memory(build, torch.device("cpu"))
    assert made_on == ["meta"] * 3


def test_a_positional_table_too_large_for_memory_is_refused(monkeypatch):
    """model.max_len: 100000000 with sinusoidal positions: the table is a buffer, not a
    parameter, so the check passed and building it asked for 12.8 GB (MemoryError or
    the OOM killer instead of a line naming the setting)."""
    config = {
        "src_vocab_size": 8,
        "tgt_vocab_size": 8,
        "d_model": 16,
        "num_heads": 2,
        "num_encoder_layers": 1,
        "num_decoder_layers": 1,
        "ff_dim": 16,
        "max_len": 10**8,
    }
    monkeypatch.setattr(train_checks, "free_memory", lambda device: 2**30)
    with pytest.raises(ConfigError, match=r"and 11\.9 GiB of tables \(positional"):
        check_memory(lambda: build_model("transformer", config), torch.device("cpu"))
    config["max_len"] = 512
    check_memory(lambda: build_model("transformer", config), torch.device("cpu"))


@pytest.mark.skipif(not Path("/proc/meminfo").exists(), reason="needs Linux's /proc/meminfo")
def test_free_memory_of_the_cpu_is_what_the_kernel_reports():
    total = int(Path("/proc/meminfo").read_text().split()[1]) * 1024  # MemTotal, kB
    assert 0 < free_memory(torch.device("cpu")) <= total
    assert free_memory(torch.device("meta")) is None


def test_train_cli_refuses_a_model_larger_than_memory_in_one_line(tmp_path):
    config = CONFIG_FOLDER / "toy-rnn-luong.yaml"
    out = tmp_path / "run"
    proc = run_cli("train", str(config), "--set", "model.embed_dim=2000000000", "--out", str(out))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "parameters need" in proc.stderr and "GiB free on cpu" in proc.stderr
    assert not (out / "last.safetensors").exists()


def test_sentences_longer_than_the_models_positions_are_refused(tmp_path):
    d = tiny_dict(tmp_path)
    d["model"]["max_len"] = 4
    with pytest.raises(ConfigError, match=r"model.max_len: 4 positions, but \d+ of \d+ training"):
        train(recipe_from_dict(d), progress=False)
    assert not tmp_path.exists() or not list(tmp_path.iterdir())
    d["model"] = {
        "type": "rnn",
        "attention": "luong",
        "score": "location",
        "max_src_len": 3,
        "embed_dim": 8,
        "hidden_dim": 8,
    }
    with pytest.raises(ConfigError, match="model.max_src_len: 3 positions, but .* longer source"):
        train(recipe_from_dict(d), progress=False)


def test_too_long_validation_pairs_are_not_sent_to_data_max_tokens():
    """data.max_tokens filters only the training files: for long validation pairs the
    message says to shorten that file, for long training pairs it names the setting."""
    model = SimpleNamespace(config=SimpleNamespace(max_source_len=4, max_target_len=9))
    short, long = ([1, 2], [3, 4]), ([1, 2, 3, 4, 5, 6], [3, 4])
    for train_pairs, valid_pairs, split, hint in (
        ([short], [long], "validation", "a shorter validation file"),
        ([long], [short], "training", "data.max_tokens for files"),
    ):
        data = SimpleNamespace(train_examples=train_pairs, valid_examples=valid_pairs)
        with pytest.raises(ConfigError) as err:
            check_lengths(model, data)
        message = str(err.value)
        assert f"1 of 1 {split} pairs have a longer source" in message and hint in message
        assert ("max_tokens" in message) == (split == "training")


def test_a_run_without_validation_pairs_is_refused(tmp_path):
    """Validation picks the best checkpoint and early stopping: with no validation pair it
    logged a loss of 0.0 and BLEU 0, and 'best' was the first checkpoint evaluated."""
    for name, text in (("t.de", "a b\nc d\n"), ("t.en", "e f\ng h\n"), ("v.de", ""), ("v.en", "")):
        (tmp_path / name).write_text(text)
    d = tiny_dict(tmp_path / "out")
    with pytest.raises(ConfigError, match=r"^data.n_valid: must be > 0, got 0$"):
        recipe_from_dict({**d, "data": {**d["data"], "n_valid": 0}})
    files = [str(tmp_path / n) for n in ("t.de", "t.en", "v.de", "v.en")]
    d["data"] = {"kind": "files", "train": files[:2], "valid": files[2:]}
    with pytest.raises(ConfigError, match=r"^data.valid: no validation pair to read"):
        train(recipe_from_dict(d), progress=False)
    assert not (tmp_path / "out").exists()


def test_a_diverged_run_stops_at_the_first_nan_loss(tmp_path, capsys):
    """With a learning rate far too large the loss became NaN at step 2 and training went
    on to train.steps: every later row of log.jsonl held NaN (not JSON), and the NaN
    model was saved as last.safetensors and, at the first evaluation, as the best."""
    d = tiny_dict(tmp_path / "out", lr=1e12, clip_norm=0.0, warmup=0, save_every=1, eval_every=3)
    config = tmp_path / "c.yaml"
    config.write_text(json.dumps(d))
    assert main(["train", str(config)]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]  # after the progress bar
    assert line.startswith("qkv train: error: train: the loss is nan at step "), line
    step = int(line.split("at step ")[1].split(",")[0])
    rows = logged_rows(tmp_path / "out")
    assert [r["step"] for r in rows] == list(range(1, step))
    assert not (tmp_path / "out" / "best.safetensors").exists() or step > 3
    last = load_checkpoint(tmp_path / "out" / "last.safetensors")
    assert last.extra["train"]["step"] == step - 1
    assert all(bool(p.isfinite().all()) for p in last.model.parameters())


def test_the_summary_line_names_what_picked_the_best(tmp_path, capsys):
    """Without BLEU sentences the last line said 'best valid BLEU 0.00 at step N'."""
    config = tmp_path / "tiny.yaml"
    out = tmp_path / "run"
    config.write_text(json.dumps(tiny_dict(out, steps=4, eval_every=2, valid_bleu_sentences=0)))
    assert main(["train", str(config)]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    best = load_checkpoint(out / "best.safetensors").extra["train"]["step"]
    assert f"; lowest valid loss at step {best}; checkpoints in {out}" in line
    assert "BLEU" not in line


def _summary(capsys, config, *flags) -> str:
    assert main(["train", str(config), *flags]) == 0
    return capsys.readouterr().out.strip().splitlines()[-1]


def test_the_summary_after_a_resume_counts_the_steps_this_run_trained(tmp_path, capsys):
    """Resumed at step 4 to step 6, the last line said 'trained 6 steps in S s' with the
    seconds and tokens/s of the 2 steps this process trained (and '1 steps' for one)."""
    config = tmp_path / "c.yaml"
    config.write_text(json.dumps(tiny_dict(tmp_path / "run", steps=4)))
    assert _summary(capsys, config).startswith("trained 4 steps in ")
    config.write_text(json.dumps(tiny_dict(tmp_path / "run", steps=6)))
    line = _summary(capsys, config, "--resume")
    assert line.startswith("trained 2 steps (from step 4 to 6) in "), line
    config.write_text(json.dumps(tiny_dict(tmp_path / "run", steps=7)))
    line = _summary(capsys, config, "--resume")
    assert line.startswith("trained 1 step (from step 6 to 7) in "), line


def test_the_summary_says_why_a_run_stopped_before_train_steps(tmp_path, capsys):
    """A run stopped by train.patience or train.max_seconds said only 'trained N steps',
    as if train.steps were N."""
    config = tmp_path / "c.yaml"
    config.write_text(json.dumps(tiny_dict(tmp_path / "run", steps=400, max_seconds=0.5)))
    line = _summary(capsys, config)
    steps = int(line.split()[1])
    assert steps < 400, "the run was not stopped by its time budget: the test shows nothing"
    assert f"; stopped at step {steps} after " in line and "train.max_seconds is 0.5" in line
    config.write_text(json.dumps(tiny_dict(tmp_path / "run", steps=4)))
    assert "stopped" not in _summary(capsys, config, "--overwrite")
