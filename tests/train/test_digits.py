"""qkv.train.classify and qkv.data.digits: the digits split is stratified and fixed by its
seed, an image classifier trains through the same loop as the translators, and a run
stopped mid-way resumes to the losses of the uninterrupted run."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import yaml

from qkv.data.digits import load_digit_splits
from qkv.errors import ConfigError
from qkv.models.checkpoint import load_checkpoint
from qkv.train.checks import finished
from qkv.train.classify import ImageTask, confusion_matrix
from qkv.train.loop import train
from qkv.train.recipe import load_yaml, recipe_from_dict
from tests.cli.helpers import one_line_error, run_main
from tests.train.helpers import CONFIG_FOLDER, logged_losses, run_cli, train_until_interrupted

TINY_VIT = {
    "name": "tiny-digits",
    "data": {"kind": "digits", "seed": 3},
    "model": {
        "type": "vit",
        "patch_size": 2,
        "hidden_size": 16,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "intermediate_size": 32,
        "hidden_dropout_prob": 0.1,
    },
    "train": {
        "steps": 6,
        "batch_size": 16,
        "lr": 0.003,
        "warmup": 2,
        "eval_every": 3,
        "save_every": 2,
        "threads": 1,
    },
}


def tiny_vit(out, **train) -> dict:
    d = json.loads(json.dumps(TINY_VIT))
    d["out"] = str(out)
    d["train"].update(train)
    return d


def test_the_split_is_stratified_disjoint_and_fixed_by_the_seed():
    splits, again, other = load_digit_splits(0), load_digit_splits(0), load_digit_splits(1)
    total = torch.cat([s.labels for s in splits.values()]).bincount(minlength=10)
    counts = {name: s.labels.bincount(minlength=10) for name, s in splits.items()}
    assert counts["test"].tolist() == [round(0.2 * int(n)) for n in total]  # every class 20 %
    rest = total - counts["test"]
    assert counts["valid"].tolist() == [round(0.1 * int(n)) for n in rest]
    images = torch.cat([s.images.flatten(1) for s in splits.values()])
    assert len(images) == 1797 and images.min() == 0 and images.max() == 1
    for name in splits:
        assert torch.equal(splits[name].images, again[name].images)
        assert torch.equal(splits[name].labels, again[name].labels)
    assert not torch.equal(splits["test"].images, other["test"].images)


def test_confusion_matrix_counts_true_rows_and_predicted_columns():
    labels, predicted = torch.tensor([0, 0, 1, 2, 2, 2]), torch.tensor([0, 1, 1, 2, 0, 2])
    matrix = confusion_matrix(predicted, labels, 3)
    expected = np.zeros((3, 3), dtype=np.int64)
    for t, p in zip(labels.tolist(), predicted.tolist()):
        expected[t, p] += 1
    assert matrix.tolist() == expected.tolist()


def test_a_stopped_run_resumes_to_the_uninterrupted_losses(tmp_path):
    full, stopped = tmp_path / "full", tmp_path / "stopped"
    train(recipe_from_dict(tiny_vit(full)), progress=False)
    train_until_interrupted(recipe_from_dict(tiny_vit(stopped)), 5)  # last saved: step 4
    saved = load_checkpoint(stopped / "last.safetensors")
    assert saved.extra["train"]["step"] == 4
    train(recipe_from_dict(tiny_vit(stopped)), resume=True, progress=False)
    assert logged_losses(stopped) == logged_losses(full)
    rows = [json.loads(x) for x in (full / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "valid_accuracy" in r] == [3, 6]
    weights = [
        load_checkpoint(out / "last.safetensors").model.state_dict() for out in (full, stopped)
    ]
    assert all(torch.equal(weights[1][k], v) for k, v in weights[0].items())


@pytest.mark.parametrize("name", ["digits-vit", "digits-cnn"])
def test_shipped_digits_recipes_read(name):
    recipe = load_yaml(CONFIG_FOLDER / f"{name}.yaml")
    assert recipe.images and recipe.model["type"] == name.split("-")[1]


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda d: d["model"].update(num_labels=3), "model.num_labels: set from the images"),
        (lambda d: d["model"].update(d_model=3), "model.d_model: unknown key for type vit"),
        (lambda d: d["model"].update(type="rnn"), "model.type: must be 'vit' or 'cnn'"),
        (lambda d: d["data"].update(n_test=5), "data.n_test: not read with kind 'digits'"),
        (lambda d: d["train"].update(max_tokens=5), "train.max_tokens: images are batched"),
        (lambda d: d.update(tokenizer={"kind": "char"}), "tokenizer: images have no tokenizer"),
    ],
    ids=["reserved", "unknown", "translator", "text-split", "tokens", "tokenizer"],
)
def test_a_bad_digits_recipe_is_one_line_exit_2(tmp_path, monkeypatch, capsys, change, match):
    d = tiny_vit(tmp_path / "run")
    change(d)
    with pytest.raises(ConfigError, match=match):
        recipe_from_dict(d)
    config = tmp_path / "bad.yaml"
    config.write_text(yaml.safe_dump(d))
    code, _, err = run_main(monkeypatch, capsys, "train", config)
    one_line_error(code, err, match)
    assert not (tmp_path / "run").exists()


def test_the_bar_of_an_image_run_counts_images(tmp_path):
    """The training bar of an image run said "tok/s" for a rate of images."""
    steps = 2
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(tiny_vit(tmp_path / "out", steps=steps, eval_every=2)))
    proc = run_cli("train", str(config))
    assert proc.returncode == 0, proc.stderr
    assert f"{steps}/{steps}" in proc.stderr
    assert "img/s" in proc.stderr and "tok/s" not in proc.stderr


def test_a_run_stopped_by_patience_names_the_accuracy(tmp_path):
    """A resumed image run that patience had stopped said it saw no better BLEU."""
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(tiny_vit(tmp_path / "out", steps=4, eval_every=1, patience=1)))
    recipe = load_yaml(config)
    stopped = SimpleNamespace(step=3, bad_evals=1, seconds=1.0)
    message = finished(stopped, recipe.train, ImageTask.score_name)
    assert "without a better accuracy" in message and "BLEU" not in message
