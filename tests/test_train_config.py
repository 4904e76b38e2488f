"""Recipes that cannot train are refused when the config is read, in one line."""

from __future__ import annotations

import json

import pytest
import torch

from qkv.cli import main
from qkv.train.recipe import ConfigError, load_yaml, recipe_from_dict
from tests.train_helpers import tiny_dict


def test_share_vocab_without_a_joint_tokenizer_is_refused_by_name(tmp_path, capsys):
    """It was a ValueError traceback (exit 1) from the model's config, once the two
    tokenizers were built (their vocabulary sizes differ)."""
    d = tiny_dict(tmp_path / "out")
    d["model"]["share_vocab"] = True
    with pytest.raises(ConfigError, match=r"^model.share_vocab: .*set tokenizer.joint: true$"):
        recipe_from_dict(d)
    config = tmp_path / "c.yaml"
    config.write_text(json.dumps(d))
    assert main(["train", str(config)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"qkv train: error: {config}: model.share_vocab")
    d["tokenizer"]["joint"] = True
    assert recipe_from_dict(d).model["share_vocab"] is True


def test_a_diverged_run_stops_at_the_first_nan_loss(tmp_path, capsys):
    """With a learning rate far too large the loss became NaN at step 2 and training went
    on to train.steps: every later row of log.jsonl held NaN (not JSON), and the NaN
    model was saved as last.safetensors and, at the first evaluation, as the best."""
    from tests.train_helpers import logged_rows

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
    from qkv.models.checkpoint import load_checkpoint

    last = load_checkpoint(tmp_path / "out" / "last.safetensors")
    assert last.extra["train"]["step"] == step - 1
    assert all(bool(p.isfinite().all()) for p in last.model.parameters())


def test_a_section_left_empty_takes_its_defaults(tmp_path):
    """``data:`` with every key commented out is YAML null: it was refused ('data:
    expected a mapping, got NoneType'), and ``--set data.kind=toy`` on it said 'data is
    not a section'. An empty section now means its defaults, as a missing one does."""
    from qkv.train.recipe import DataConfig, OptimConfig

    config = tmp_path / "c.yaml"
    config.write_text("data:\n  # kind: toy\ntrain:\n", encoding="utf-8")
    recipe = load_yaml(config)
    assert recipe.data == DataConfig() and recipe.train == OptimConfig()
    recipe = load_yaml(config, ["data.n_train=500", "train.steps=3"])
    assert recipe.data.n_train == 500 and recipe.train.steps == 3
    config.write_text("data: 5\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="data: expected a mapping, got int"):
        load_yaml(config)


@pytest.mark.parametrize(
    "content, sets, where",
    [
        ("train: {lr: 0.01}\n", ["train.lr=abc"], "--set train.lr=abc: train.lr: expected float"),
        (
            "train: {lr: 0.01}\n",
            ["train.steps=2", "train.betas=[a, 1]"],
            "--set train.betas=[a, 1]: train.betas[0]: expected float, got 'a'",
        ),
        (
            "model: {type: rnn}\n",
            ["model.dropout=2"],
            "--set model.dropout=2: model.dropout: must be in [0, 1), got 2",
        ),
        (
            "data: {kind: toy, max_len: 6}\n",
            ["data.min_len=7", "train.lr=1"],
            "--set data.min_len=7: data.min_len: the toy corpus needs",
        ),
        # another key's check that this --set fails: the file and every --set are named
        (
            "data: {kind: toy, min_len: 4}\n",
            ["data.max_len=3"],
            "c.yaml with --set data.max_len=3: data.min_len: the toy corpus needs",
        ),
        # the file alone is wrong: the --set of another key in its section is not blamed
        (
            "model: {type: transformer, num_heads: 3}\n",
            ["model.dropout=0.2"],
            "c.yaml: model.num_heads: must divide d_model=256, got 3",
        ),
        (
            "train: {lr: -1}\n",
            ["train.lr=-2", "train.lr=0.5", "train.steps=0"],
            "--set train.steps=0: train.steps: must be > 0",
        ),
    ],
    ids=[
        "value",
        "one-of-two",
        "model-field",
        "cross-key-own",
        "cross-key-other",
        "file-error",
        "last-set-wins",
    ],
)
def test_a_bad_value_given_by_set_is_named_as_the_set(tmp_path, content, sets, where):
    """Every error was prefixed with the YAML file's name, also for a value that came from
    --set: 'c.yaml: train.lr: expected float, got 'abc'' sent the user to a file whose
    train.lr was fine."""
    config = tmp_path / "c.yaml"
    config.write_text(content, encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        load_yaml(config, sets)
    message = str(err.value).replace(str(config), "c.yaml")
    assert message.startswith(where), message


@pytest.mark.parametrize("item", ["=3", "train..lr=1", "train.=1", ".lr=1", " =1"])
def test_a_set_without_a_key_is_named(tmp_path, item):
    """'--set =3' said 'c.yaml: : unknown key', '--set train..lr=1' 'train.: unknown key'."""
    config = tmp_path / "c.yaml"
    config.write_text("train: {lr: 0.01}\n", encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        load_yaml(config, ["train.steps=3", item])
    expected = f"--set {item!r}: expected SECTION.KEY=VALUE, e.g. train.lr=3e-4"
    assert str(err.value).endswith(expected)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_cuda_device_on_a_machine_without_one_is_named(tmp_path, capsys):
    d = tiny_dict(tmp_path / "out")
    d["train"]["device"] = "cuda"
    config = tmp_path / "c.yaml"
    config.write_text(json.dumps(d))
    assert main(["train", str(config)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "qkv train: error: train.device: 'cuda' was asked for but no CUDA device is available"
    ]
    assert not (tmp_path / "out" / "last.safetensors").exists()


def test_config_files_and_sets_that_cannot_be_read_are_named(tmp_path):
    good, bad = tmp_path / "c.yaml", tmp_path / "bad.yaml"
    good.write_text("train:\n  lr: 0.1\n")
    bad.write_bytes(b"train:\n  lr: 0.1 \xff\n")
    (tmp_path / "folder.yaml").mkdir()
    cases = [
        (tmp_path / "missing.yaml", [], "missing.yaml: no such config file"),
        (bad, [], "bad.yaml: not valid UTF-8 (byte 18)"),
        (tmp_path / "folder.yaml", [], "folder.yaml: is a directory, not a YAML config file"),
        (good, ["trainlr"], "c.yaml: --set 'trainlr': expected KEY=VALUE"),
        (good, ["train.lr.x=1"], "c.yaml: --set train.lr.x: lr is not a section"),
    ]
    for path, sets, message in cases:
        with pytest.raises(ConfigError) as err:
            load_yaml(path, sets)
        assert str(err.value) == f"{tmp_path}/{message}"


@pytest.mark.parametrize(
    ("section", "values", "message"),
    [
        ("data", {"path": "a.tsv"}, "data.path: read only with kind 'tsv', not 'toy'"),
        ("data", {"kind": "tsv"}, "data.path: a TSV file is needed for kind 'tsv'"),
        ("train", {"betas": 0.9}, "train.betas: expected a list, got 0.9"),
        ("train", {"clip_norm": -1}, "train.clip_norm: must be >= 0 (0: no clipping), got -1.0"),
        ("train", {"label_smoothing": 1.0}, "train.label_smoothing: must be in [0, 1), got 1.0"),
    ],
)
def test_values_that_cannot_train_name_their_key(section, values, message):
    with pytest.raises(ConfigError) as err:
        recipe_from_dict({section: values})
    assert str(err.value) == message
