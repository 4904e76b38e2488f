"""``qkv train``: bad input is one line and exit code 2, and ``--out`` is a folder name
as typed."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import qkv.cli.train
from qkv.cli import main
from tests.train.helpers import TINY, run_cli


@pytest.mark.parametrize(
    "content, match",
    [
        ("train: [1, 2", "not valid YAML"),
        ("train: {lrr: 1}", "train.lrr: unknown key"),
        ("data: {kind: files, train: [a.de, a.en], valid: [b.de, b.en]}", "a.de"),
    ],
    ids=["yaml", "unknown-key", "missing-corpus"],
)
def test_train_cli_bad_input_exits_2(tmp_path, content, match):
    config = tmp_path / "bad.yaml"
    config.write_text(content)
    proc = run_cli("train", str(config), "--out", str(tmp_path / "o"))
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and match in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("out", ["2024", "run #2", "'quoted'", "a: b", "~", "yes"])
def test_out_is_a_folder_name_as_typed(tmp_path, monkeypatch, out):
    """--out went through the YAML of --set: "2024" was refused as not a string, and
    "run #2" trained into "run" (the rest read as a comment), over another run."""
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(TINY))
    seen = []

    def record(recipe, **_):
        seen.append(recipe.out_dir)
        raise KeyboardInterrupt  # stop before training: the folder is all this test checks

    monkeypatch.setattr(qkv.cli.train, "train", record)  # the name the command calls
    assert main(["train", str(config), "--out", out]) == 130
    assert seen == [Path(out)]
