"""qkv.data.prepare: what preparing a recipe's corpus tells the user about the pairs its
filters dropped, an empty training set, and a data path that cannot be read."""

from __future__ import annotations

import logging
import random
from pathlib import Path

import pytest
import yaml

from qkv.cli import main
from qkv.data.corpus import CorpusError
from qkv.data.prepare import load_pairs
from qkv.train.recipe import ConfigError, DataConfig, recipe_from_dict
from tests.train.helpers import CONFIG_FOLDER, run_cli, tiny_dict


def _files(tmp_path, pairs) -> DataConfig:
    for name, side in (("s.txt", 0), ("t.txt", 1)):
        (tmp_path / name).write_text("".join(p[side] + "\n" for p in pairs), encoding="utf-8")
    train = (str(tmp_path / "s.txt"), str(tmp_path / "t.txt"))
    return DataConfig(kind="files", train=train, valid=train)


@pytest.mark.parametrize("outliers, warned", [(0, False), (1, False), (3, True)])
def test_a_filter_that_drops_many_pairs_is_a_warning(tmp_path, caplog, outliers, warned):
    """Words are counted between spaces: each Chinese sentence below is one word beside
    eleven English ones, a length-ratio outlier. A corpus that lost most of its pairs
    this way trained on the rest with no word unless run with --verbose."""
    long = (
        "我昨天在公园里看到了一只很大的黑猫。",
        "Yesterday I saw a very big black cat in the park.",
    )
    pairs = [long] * outliers + [("我喜欢猫。", "I like cats.")] * (10 - outliers)
    random.shuffle(pairs)
    with caplog.at_level(logging.WARNING, logger="qkv.data.prepare"):
        train, _, _ = load_pairs(_files(tmp_path, pairs))
    assert len(train) == 10 - outliers
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    if not warned:
        assert warnings == []
        return
    assert warnings == [
        f"data.train: {tmp_path / 's.txt'} + {tmp_path / 't.txt'}: kept {10 - outliers} of 10 "
        f"pairs (dropped 0 empty, 0 too long, {outliers} length-ratio outliers); "
        "data.max_tokens (100 words) and data.max_ratio (3) decide what is dropped"
    ]


def test_an_empty_training_set_names_the_files_and_the_filter(tmp_path):
    for name, text in (
        ("e.de", ""),
        ("e.en", ""),
        ("v.de", "a b\n"),
        ("v.en", "c d\n"),
        ("l.de", "a b c d\n"),
        ("l.en", "c d e f\n"),
    ):
        (tmp_path / name).write_text(text)
    d = tiny_dict(tmp_path / "out")
    files = {"kind": "files", "valid": [str(tmp_path / "v.de"), str(tmp_path / "v.en")]}
    config = tmp_path / "c.yaml"
    for train_files, sets, match in (
        (["e.de", "e.en"], [], "e.de + " + str(tmp_path / "e.en") + ": no sentence pairs"),
        (["l.de", "l.en"], ["data.max_tokens=2"], "1 more than data.max_tokens (2) words"),
    ):
        d["data"] = {**files, "train": [str(tmp_path / f) for f in train_files]}
        config.write_text(yaml.safe_dump(d))
        proc = run_cli("train", str(config), *[a for s in sets for a in ("--set", s)])
        assert proc.returncode == 2 and "data.train: " in proc.stderr and match in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and proc.stdout == "", proc.stderr
    assert not (tmp_path / "out").exists()


def test_a_data_path_that_cannot_be_read_is_named_by_its_key(tmp_path):
    """A folder (or a missing file) given as data.train, data.valid or data.path: the one
    line names the key as well as the path (it said only 'd: cannot read: Is a directory')."""
    good = [tmp_path / "g.de", tmp_path / "g.en"]
    for path in good:
        path.write_text("a b\n")
    folder = tmp_path / "d"
    folder.mkdir()
    d = tiny_dict(tmp_path / "out")
    pair = [str(p) for p in good]
    for data, key in (
        ({"kind": "files", "train": [str(folder), pair[1]], "valid": pair}, "data.train"),
        ({"kind": "files", "train": pair, "valid": [pair[0], str(tmp_path / "no")]}, "data.valid"),
        ({"kind": "tsv", "path": str(folder)}, "data.path"),
    ):
        recipe = recipe_from_dict({**d, "data": data})
        with pytest.raises(CorpusError) as err:
            load_pairs(recipe.data)
        why = "no such file" if key == "data.valid" else "cannot read: Is a directory"
        assert str(err.value).startswith(f"{key}: {tmp_path}") and why in str(err.value)


@pytest.mark.parametrize(
    "config, corpus, missing",
    [
        ("multi30k-transformer", "multi30k", "train.de"),
        ("tatoeba-ko-en-transformer", "tatoeba-ko-en", "kor.txt"),
    ],
)
def test_a_missing_corpus_names_the_command_that_fetches_it(
    tmp_path, monkeypatch, capsys, config, corpus, missing
):
    """The error named the file alone ('cannot read: No such file or directory'), and
    reading the downloaded copy meant editing six paths: one ``--set data.root`` now reads
    it, and the error says which command fetches it and where."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    empty = tmp_path / "empty"
    empty.mkdir()
    path = CONFIG_FOLDER / f"{config}.yaml"
    args = ["train", str(path), "--set", f"data.root={empty}", "--out", str(tmp_path / "run")]
    assert main(args) == 2
    folder = tmp_path / "cache" / "qkv" / corpus
    key = "data.train" if corpus == "multi30k" else "data.path"
    assert capsys.readouterr().err == (
        f"qkv train: error: {key}: {empty / missing}: no such file; `qkv data download "
        f"{corpus}` fetches the corpus into {folder}, then give --set data.root={folder}\n"
    )


def test_data_root_is_joined_to_relative_file_names(tmp_path):
    src, tgt = tmp_path / "a.de", tmp_path / "b.en"
    src.write_text("ein Hund\nzwei Katzen\n", encoding="utf-8")
    tgt.write_text("a dog\ntwo cats\n", encoding="utf-8")
    data = {"kind": "files", "root": str(tmp_path), "train": ["a.de", "b.en"]}
    data["valid"] = [str(src), "b.en"]  # an absolute name stays as it is
    recipe = recipe_from_dict({"data": data})
    assert recipe.data.train == (str(src), str(tgt)) and recipe.data.valid == (str(src), str(tgt))
    train, valid, test = load_pairs(recipe.data)
    assert train == valid == [("ein Hund", "a dog"), ("zwei Katzen", "two cats")] and test == []
    home = recipe_from_dict({"data": {**data, "root": "~/corpus"}}).data.train[0]
    assert home == str(Path.home() / "corpus" / "a.de")
    with pytest.raises(ConfigError, match=r"^data.root: read only with kind 'files' or 'tsv'"):
        recipe_from_dict({"data": {"kind": "toy", "root": str(tmp_path)}})
    with pytest.raises(ConfigError, match=r"^data.root: expected a folder, got 3$"):
        recipe_from_dict({"data": {**data, "root": 3}})
