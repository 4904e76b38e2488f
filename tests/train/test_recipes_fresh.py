"""The shipped recipes for a user who has only the repository: the Tiny Shakespeare
recipes failed on a fresh clone (``data.files: ../shared/data/tinyshakespeare/input.txt:
no such file``, and ``qkv data download tinyshakespeare`` was an unknown corpus). Their
data now comes from ``qkv data download``, into the cache folder the recipes read, and a
missing corpus names the command that fetches it. The download here is served from the
local copy of the corpora (``file://``), as a stand-in for the network."""

from __future__ import annotations

import pytest

from qkv.cli import main
from tests.train.helpers import CONFIG_FOLDER

RECIPES = ["shakespeare-char-gpt", "shakespeare-char-llama", "shakespeare-char-long"]
SHORT = ["train.steps=2", "train.eval_every=2", "train.save_every=2", "train.eval_batches=1"]
SHORT += ["train.sample_tokens=0", "train.threads=1", "train.batch_size=2"]


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A user's home with nothing in it: ~/.cache/qkv is where downloads go."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    (tmp_path / "home").mkdir()
    return tmp_path / "home"


@pytest.mark.parametrize("recipe", RECIPES)
def test_a_missing_corpus_names_the_command_that_fetches_it(home, tmp_path, capsys, recipe):
    args = ["train", str(CONFIG_FOLDER / f"{recipe}.yaml"), "--out", str(tmp_path / "run")]
    assert main(args) == 2
    folder = home / ".cache" / "qkv" / "tinyshakespeare"
    assert capsys.readouterr().err == (
        f"qkv train: error: data.files: {folder / 'input.txt'}: no such file; `qkv data "
        f"download tinyshakespeare` fetches the corpus into {folder}\n"
    )


def test_the_downloaded_corpus_trains_the_recipes(home, tmp_path, capsys, shared_data):
    mirror = (shared_data / "tinyshakespeare").as_uri() + "/"
    assert main(["data", "download", "tinyshakespeare", "--base-url", mirror]) == 0
    cached = home / ".cache" / "qkv" / "tinyshakespeare" / "input.txt"
    assert cached.read_bytes() == (shared_data / "tinyshakespeare" / "input.txt").read_bytes()
    for recipe in RECIPES[:2]:
        out = tmp_path / recipe
        sets = [word for s in SHORT for word in ("--set", s)]
        args = ["train", str(CONFIG_FOLDER / f"{recipe}.yaml"), *sets, "--out", str(out)]
        assert main(args) == 0, capsys.readouterr().err
        assert (out / "last.safetensors").is_file()
