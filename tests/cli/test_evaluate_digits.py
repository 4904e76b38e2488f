"""qkv evaluate on an image classifier's checkpoint: accuracy and a confusion matrix on
its recipe's split, after a tiny ``qkv train`` of a digits recipe."""

from __future__ import annotations

import pytest

from qkv.data.digits import load_digit_splits
from tests.cli.helpers import one_line_error, run_main
from tests.train.helpers import CONFIG_FOLDER


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A CNN trained for 3 steps by ``qkv train configs/digits-cnn.yaml --set ...``."""
    out = tmp_path_factory.mktemp("digits") / "cnn"
    sets = [
        "model.channels=[4,8]",
        "train.steps=3",
        "train.eval_every=3",
        "train.warmup=1",
        "train.threads=1",
        "data.seed=5",
    ]
    args = ["train", CONFIG_FOLDER / "digits-cnn.yaml", "--out", out]
    return out, args + [a for s in sets for a in ("--set", s)]


def test_train_then_evaluate_reports_accuracy_and_confusion(trained, monkeypatch, capsys):
    out, args = trained
    code, said, err = run_main(monkeypatch, capsys, *args)
    assert code == 0, err
    assert "best valid accuracy" in said and "images/s" in said
    for split in ("test", "valid"):
        code, said, err = run_main(
            monkeypatch, capsys, "evaluate", out / "best.safetensors", "--split", split
        )
        assert code == 0, err
        lines = said.splitlines()
        accuracy = next(line for line in lines if line.startswith("accuracy "))
        rows = [line.split() for line in lines[lines.index("true \\ predicted") + 2 :]]
        matrix = [[int(v) for v in row[1:-1]] for row in rows]
        assert [row[0] for row in rows] == [str(d) for d in range(10)]
        labels = load_digit_splits(5)[split].labels
        assert [sum(r) for r in matrix] == labels.bincount(minlength=10).tolist()
        assert [int(row[-1]) for row in rows] == [sum(r) for r in matrix]
        correct = sum(matrix[i][i] for i in range(10))
        assert f"({correct} of {len(labels)})" in accuracy


def test_evaluate_of_images_refuses_src_and_ref(trained, monkeypatch, capsys):
    out, args = trained
    if not (out / "best.safetensors").exists():
        assert run_main(monkeypatch, capsys, *args)[0] == 0
    code, _, err = run_main(
        monkeypatch, capsys, "evaluate", out / "best.safetensors", "--src", "a", "--ref", "b"
    )
    one_line_error(code, err, "not on --src/--ref")
