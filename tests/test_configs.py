"""Every shipped config is valid, and the toy ones build their model."""

from __future__ import annotations

from pathlib import Path

import pytest

from qkv.recipe import load_yaml

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml"))


def test_the_expected_configs_exist():
    names = {p.stem for p in CONFIGS}
    for required in (
        "multi30k-transformer",
        "multi30k-rnn-bahdanau",
        "multi30k-rnn-luong",
        "multi30k-rnn-none",
        "tatoeba-ko-en-transformer",
        "toy-transformer",
        "toy-rnn-bahdanau",
        "toy-rnn-luong",
        "toy-rnn-none",
    ):
        assert required in names


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_config_is_valid(path):
    recipe = load_yaml(path)
    assert recipe.name == path.stem
    if recipe.data.kind == "files":
        assert all(f.startswith("../shared/data/") for f in recipe.data.train + recipe.data.valid)
