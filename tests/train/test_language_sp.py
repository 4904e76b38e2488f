"""Sequence-parallel language-model training (``train.sequence_parallel``): under torchrun
the processes of a sequence group split every window and attend through the ring, and the
training gives the per-step losses, validation losses and weights of one process holding
whole windows; the settings a split cannot take are refused in one line with exit code 2;
a recipe's ``train.attention_budget_mb`` refuses, in one line, a window whose attention does
not fit one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from qkv.models.checkpoint import load_checkpoint
from qkv.train.recipe import load_yaml
from tests.cli.helpers import one_line_error, run_main
from tests.train.helpers import CONFIG_FOLDER, logged_losses, tiny_dict
from tests.train.test_language import tiny_lm


def _sp_recipe(tmp_path, model: str, **train) -> dict:
    """A tiny LM on a few hundred characters: windows of 16 tokens (4 zig-zag chunks of 4
    for 2 processes), fp32, no dropout (one process and two draw other masks)."""
    d = tiny_lm(tmp_path, model, **{"sequence_parallel": 2, "bf16": False, **train})
    d["data"]["block_size"] = 16
    if model == "gpt":
        d["model"]["dropout"] = 0.0
    return d


def _launch(
    config, out, processes: int, *sets: str, resume: bool = False
) -> subprocess.CompletedProcess:
    launch = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"]
    cmd = [sys.executable, *(launch if processes > 1 else []), "-m", "qkv", "train"]
    cmd += [str(config), "--out", str(out), *(a for s in sets for a in ("--set", s))]
    cmd += ["--resume"] if resume else []
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


def _rows(out, key: str) -> dict[int, float]:
    rows = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    return {r["step"]: r[key] for r in rows if key in r}


@pytest.mark.slow
@pytest.mark.parametrize("model", ["gpt", "llama"])
def test_two_sequence_parts_train_as_one_process(tmp_path, model):
    """30 steps: the ring of 2 gives one process's training losses within 1e-5 at every
    step, the same validation losses, and (rank 0 writes it) the same weights; (Llama) a
    run stopped at step 15 and resumed on the ring continues with the same losses."""
    config = tmp_path / "lm.yaml"
    d = _sp_recipe(tmp_path, model, steps=30, eval_every=10, save_every=100, sample_tokens=4)
    config.write_text(yaml.safe_dump(d))
    for name, processes in (("one", 1), ("two", 2)):
        proc = _launch(config, tmp_path / name, processes)
        assert proc.returncode == 0, proc.stderr[-3000:]
    one, two = logged_losses(tmp_path / "one"), logged_losses(tmp_path / "two")
    assert sorted(one) == sorted(two) == list(range(1, 31))
    assert one[30] < one[1] - 0.3  # it learns: the comparison is not of a stalled run
    for step in one:
        assert two[step] == pytest.approx(one[step], abs=1e-5), step
    valid_one, valid_two = (
        _rows(tmp_path / "one", "valid_loss"),
        _rows(tmp_path / "two", "valid_loss"),
    )
    assert sorted(valid_one) == sorted(valid_two) == [10, 20, 30]
    for step in valid_one:
        assert valid_two[step] == pytest.approx(valid_one[step], abs=1e-5), step
    assert len(_rows(tmp_path / "two", "sample")) == 3  # drawn on rank 0 without the ring
    weights = [
        load_checkpoint(tmp_path / name / "last.safetensors").model.state_dict()
        for name in ("one", "two")
    ]
    for key, value in weights[0].items():
        assert (weights[1][key] - value).abs().max() < 1e-4, key
    if model == "llama":
        for sets in (("train.steps=15",), ()):
            proc = _launch(config, tmp_path / "resumed", 2, *sets, resume=bool(not sets))
            assert proc.returncode == 0, proc.stderr[-3000:]
        assert logged_losses(tmp_path / "resumed") == two


@pytest.mark.slow
def test_a_world_that_sp_does_not_divide_is_one_line(tmp_path):
    config = tmp_path / "lm.yaml"
    config.write_text(yaml.safe_dump(_sp_recipe(tmp_path, "gpt", sequence_parallel=4)))
    proc = _launch(config, tmp_path / "run", 2)
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if "qkv train: error:" in line]
    assert lines and "train.sequence_parallel" in lines[0] and "divides the 2" in lines[0]


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda d: d["data"].update(block_size=10), "into 4 equal chunks"),
        (lambda d: d["train"].update(sequence_parallel=0), "train.sequence_parallel: must be > 0"),
        (lambda d: d["train"].update(attention_budget_mb=-1), "train.attention_budget_mb: must"),
        (lambda d: d["model"].update(rope_scaling={"type": "dynamic"}), "model.rope_scaling"),
    ],
    ids=["block-not-4-chunks", "zero", "negative-budget", "dynamic-rope"],
)
def test_what_a_split_cannot_take_is_one_line(tmp_path, monkeypatch, capsys, change, match):
    d = _sp_recipe(tmp_path, "llama")
    change(d)
    config = tmp_path / "bad.yaml"
    config.write_text(yaml.safe_dump(d))
    code, _, err = run_main(monkeypatch, capsys, "train", config)
    one_line_error(code, err, match)


def test_only_language_models_split_sequences(tmp_path, monkeypatch, capsys):
    config = tmp_path / "bad.yaml"
    config.write_text(yaml.safe_dump(tiny_dict(tmp_path, sequence_parallel=2)))
    code, _, err = run_main(monkeypatch, capsys, "train", config)
    one_line_error(code, err, "train.sequence_parallel: read only with language models")


def test_a_window_over_the_budget_is_one_line_in_one_process(tmp_path, monkeypatch, capsys):
    """B x H x T x T float32 scores = 4 x 2 x 16 x 16 x 4 bytes = 8 KiB, over 0.005 MiB."""
    monkeypatch.delenv("QKV_ATTENTION_BUDGET_MB", raising=False)
    config = tmp_path / "lm.yaml"
    config.write_text(yaml.safe_dump(_sp_recipe(tmp_path, "gpt", attention_budget_mb=0.005)))
    code, _, err = run_main(monkeypatch, capsys, "train", config)
    one_line_error(code, err, "over the budget QKV_ATTENTION_BUDGET_MB=0.005 MiB")
    assert "QKV_ATTENTION_BUDGET_MB" not in os.environ  # set while it trains only


@pytest.mark.slow
def test_two_data_shards_of_two_sequence_parts_train_as_one_process(tmp_path):
    """4 processes = 2 data shards (2 of the 4 windows of a batch each) x 2 sequence parts:
    one process's losses within 1e-5 at each of 10 steps."""
    config = tmp_path / "lm.yaml"
    d = _sp_recipe(tmp_path, "gpt", steps=10, eval_every=5, save_every=100, sample_tokens=0)
    config.write_text(yaml.safe_dump(d))
    for name, processes in (("one", 1), ("four", 4)):
        proc = _launch(config, tmp_path / name, processes)
        assert proc.returncode == 0, proc.stderr[-3000:]
    one, four = logged_losses(tmp_path / "one"), logged_losses(tmp_path / "four")
    assert sorted(one) == sorted(four) == list(range(1, 11))
    for step in one:
        assert four[step] == pytest.approx(one[step], abs=1e-5), step
    valid_one, valid_four = (_rows(tmp_path / n, "valid_loss") for n in ("one", "four"))
    assert valid_four == pytest.approx(valid_one, abs=1e-5)


def test_the_long_recipe_fits_two_processes_and_not_one():
    """configs/shakespeare-char-long.yaml: one process's B x H x T x T float32 scores pass
    the recipe's budget, the ring's T/2 x T/2 blocks fit it."""
    recipe = load_yaml(CONFIG_FOLDER / "shakespeare-char-long.yaml")
    sp, budget = recipe.train.sequence_parallel, recipe.train.attention_budget_mb
    b, h, t = recipe.train.batch_size, recipe.model["num_heads"], recipe.data.block_size
    assert sp == 2 and recipe.language and recipe.model["type"] == "llama"
    assert b * h * t * t * 4 / 2**20 > budget >= b * h * (t // sp) ** 2 * 4 / 2**20
