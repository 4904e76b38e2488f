"""``qkv evaluate --split``: the held-out pairs of a checkpoint's training recipe."""

from __future__ import annotations

from pathlib import Path

from qkv.data.prepare import load_pairs
from qkv.train.loop import train
from qkv.train.recipe import recipe_from_dict
from tests.train_helpers import run_cli, tiny_dict, tiny_recipe


def _files_corpus(folder: Path, prefix: str) -> tuple[dict, list]:
    """The tiny recipe's three splits written as ``files`` (named ``PREFIX/SPLIT.ko|en``,
    relative to ``folder``), and the test pairs; the test split gets one pair with a length
    ratio of 11, which training's filter would drop and evaluation must keep."""
    train_pairs, valid, test = load_pairs(tiny_recipe(folder).data)
    test = [*test, ("개", "the dog that we saw in the park slept all day")]
    files = {}
    for name, split in zip(("train", "valid", "test"), (train_pairs, valid, test)):
        files[name] = [f"{prefix}/{name}.{lang}" for lang in ("ko", "en")]
        for side, path in enumerate(files[name]):
            text = "".join(pair[side] + "\n" for pair in split)
            (folder / path).write_text(text, encoding="utf-8")
    return files, test


def _train_on(files: dict, out: Path) -> str:
    recipe = tiny_dict(out, steps=2)
    recipe["data"] = {"kind": "files", **files}
    train(recipe_from_dict(recipe), progress=False)
    return str(out / "last.safetensors")


def test_evaluate_split_of_a_files_corpus_reads_only_that_split(tmp_path):
    """``--split test`` of a ``files`` corpus read the training files too (and failed
    once they were moved away after training); it now reads the test files alone."""
    files, test = _files_corpus(tmp_path, str(tmp_path))
    ckpt = _train_on(files, tmp_path / "run")
    by_files = run_cli("evaluate", ckpt, "--src", files["test"][0], "--ref", files["test"][1])
    for path in files["train"]:
        Path(path).unlink()
    by_split = run_cli("evaluate", ckpt, "--split", "test")
    assert by_split.returncode == 0, by_split.stderr
    assert by_split.stdout == by_files.stdout and "BLEU = " in by_split.stdout
    assert f"{len(test)} sentences" in by_split.stderr
    Path(files["test"][0]).unlink()
    gone = run_cli("evaluate", ckpt, "--split", "test")
    assert gone.returncode == 2 and "data.test" in gone.stderr and "Traceback" not in gone.stderr


def test_evaluate_split_finds_relative_paths_from_the_training_folder(tmp_path, monkeypatch):
    """Relative corpus paths in a recipe were read from the current folder, so ``--split``
    from any other folder could not find them; the checkpoint now names the folder that
    training ran in, and a path missing here is read from there."""
    (tmp_path / "corpus").mkdir()
    files, test = _files_corpus(tmp_path, "corpus")
    monkeypatch.chdir(tmp_path)
    ckpt = _train_on(files, tmp_path / "run")
    by_files = run_cli("evaluate", ckpt, "--src", files["test"][0], "--ref", files["test"][1])
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    by_split = run_cli("evaluate", ckpt, "--split", "test")
    assert by_split.returncode == 0, by_split.stderr
    assert by_split.stdout == by_files.stdout and "BLEU = " in by_split.stdout
    assert f"{len(test)} sentences" in by_split.stderr
    (tmp_path / files["test"][0]).unlink()
    gone = run_cli("evaluate", ckpt, "--split", "test")
    assert gone.returncode == 2 and "corpus/test.ko" in gone.stderr


def test_recipe_paths_are_read_from_the_training_folder_only_when_missing_here(
    tmp_path, monkeypatch
):
    from qkv.cli.translate import _paths_from

    there, here = tmp_path / "there", tmp_path / "here"
    for folder, names in ((there, ["a.tsv", "b.ko", "both.en"]), (here, ["both.en"])):
        folder.mkdir()
        for name in names:
            (folder / name).write_text("x\ty\n", encoding="utf-8")
    monkeypatch.chdir(here)
    absolute = str(there / "b.ko")
    data = {
        "kind": "files",
        "train": ["b.ko", "both.en"],
        "valid": [absolute, "gone.en"],
        "test": [],
        "path": "a.tsv",
        "max_tokens": 5,
    }
    got = _paths_from(str(there), data)
    assert got == {**data, "train": [str(there / "b.ko"), "both.en"], "path": str(there / "a.tsv")}
    assert _paths_from(None, data) == data  # a checkpoint from before the folder was saved
