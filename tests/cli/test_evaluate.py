"""``qkv evaluate``: BLEU and chrF of a checkpoint on two files, stdin (``-``) or the
held-out split of its training recipe (``--split``), sacreBLEU's tokenizers, and bad
input as one line and exit code 2."""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
import threading
from pathlib import Path

import pytest

from qkv.cli import main
from qkv.cli.evaluate import _paths_from
from qkv.data.prepare import load_pairs
from qkv.data.tokenizers import tokenizer_from_json
from qkv.models.checkpoint import load_checkpoint, save_checkpoint
from qkv.train.loop import train
from qkv.train.recipe import recipe_from_dict
from qkv.translate.evaluate import bleu, translate_texts
from tests.cli.helpers import one_line_error, run_main
from tests.train.helpers import SENTENCES, run_cli, tiny_dict, tiny_recipe


def test_translate_and_evaluate_cli(tmp_path):
    train(tiny_recipe(tmp_path, steps=4), progress=False)
    ckpt = tmp_path / "last.safetensors"
    proc = run_cli(
        "translate",
        str(ckpt),
        "--beam",
        "3",
        "--n-best",
        "2",
        stdin="고양이가 쥐를 잡았다\n개가 잤다\n",
    )
    assert proc.returncode == 0, proc.stderr
    rows = [line.split("\t") for line in proc.stdout.strip().splitlines()]
    assert [r[:2] for r in rows] == [["1", "1"], ["1", "2"], ["2", "1"], ["2", "2"]]
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not a checkpoint")
    proc = run_cli("translate", str(bad), stdin="x\n")
    assert proc.returncode == 2 and "not a safetensors checkpoint" in proc.stderr
    src, ref = tmp_path / "s.txt", tmp_path / "r.txt"
    src.write_text("고양이가 쥐를 잡았다\n")
    ref.write_text("the cat caught the mouse\n")
    proc = run_cli("evaluate", str(ckpt), "--src", str(src), "--ref", str(ref), "--beam", "2")
    assert proc.returncode == 0, proc.stderr
    assert "BLEU = " in proc.stdout and "nrefs:1" in proc.stdout and "chrF = " in proc.stdout
    _check_evaluate_split(tmp_path, ckpt)


def _check_evaluate_split(tmp_path: Path, ckpt: Path) -> None:
    """``--split test`` scores the recipe's own held-out pairs: same as giving them as files."""
    test = load_pairs(tiny_recipe(tmp_path).data)[2]
    src, ref = tmp_path / "test.ko", tmp_path / "test.en"
    src.write_text("".join(s + "\n" for s, _ in test))
    ref.write_text("".join(t + "\n" for _, t in test))
    by_files = run_cli("evaluate", str(ckpt), "--src", str(src), "--ref", str(ref))
    by_split = run_cli("evaluate", str(ckpt), "--split", "test")
    assert by_split.returncode == 0, by_split.stderr
    assert f"{len(test)} sentences" in by_split.stderr
    assert by_split.stdout == by_files.stdout and "BLEU = " in by_split.stdout
    both = run_cli("evaluate", str(ckpt), "--split", "test", "--src", str(src))
    neither = run_cli("evaluate", str(ckpt))
    for proc in (both, neither):
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1


def test_evaluate_refuses_empty_files(ckpt, tmp_path, monkeypatch, capsys):
    full, empty, blank = tmp_path / "full.txt", tmp_path / "empty.txt", tmp_path / "blank.txt"
    full.write_text(SENTENCES)
    empty.write_text("")
    blank.write_text("\n\n")
    for src, ref, named in ((empty, empty, empty), (full, blank, blank)):
        code, _, err = run_main(monkeypatch, capsys, "evaluate", ckpt, "--src", src, "--ref", ref)
        one_line_error(code, err, f"{named}: is empty")


def test_evaluate_tokenize_option(ckpt, tmp_path, monkeypatch, capsys):
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text(SENTENCES)
    ref.write_text("The cat caught the mouse.\nthe dog slept\n")
    c = load_checkpoint(ckpt)
    tok = {side: tokenizer_from_json(c.tokenizers[side]) for side in ("src", "tgt")}
    nbest = translate_texts(c.model, tok["src"], tok["tgt"], SENTENCES.split("\n")[:2], beam=5)
    hyps = [n[0].text for n in nbest]
    code, out, _ = run_main(
        monkeypatch, capsys, "evaluate", ckpt, "--src", src, "--ref", ref, "--tokenize", "char"
    )
    assert code == 0
    score = bleu(hyps, ref.read_text().splitlines(), tokenize="char")
    assert out.splitlines()[0].startswith(f"{score}  decoding: beam 5")
    assert "tok:char" in out
    bad = [("nope", "--tokenize: unknown tokenizer 'nope'; one of none, zh")]
    if importlib.util.find_spec("MeCab") is None:  # sacreBLEU's ja-mecab needs mecab-python3
        bad.append(("ja-mecab", "--tokenize ja-mecab: Japanese tokenization requires"))
    for name, match in bad:
        monkeypatch.setattr("qkv.translate.translator.translate_texts", None)  # must not translate
        code, out, err = run_main(
            monkeypatch, capsys, "evaluate", ckpt, "--src", src, "--ref", ref, "--tokenize", name
        )
        one_line_error(code, err, match)
        assert out == ""


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


def test_evaluate_split_of_a_files_corpus_reads_only_that_split(tmp_path, monkeypatch):
    """``--split test`` of a ``files`` corpus read the training files too (and failed
    once they were moved away after training); it now reads the test files alone."""
    monkeypatch.chdir(tmp_path)  # trained here: the recipe's absolute paths lie under it
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


SOURCES = "고양이가 쥐를 잡았다\n개가 잤다\n고양이가 잤다\n"


REFERENCES = "the cat caught the mouse\nthe dog slept\nthe cat slept\n"


def _files(tmp_path):
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text(SOURCES, encoding="utf-8")
    ref.write_text(REFERENCES, encoding="utf-8")
    return src, ref


@pytest.mark.parametrize("side", ["--src", "--ref"])
def test_a_dash_reads_those_lines_from_stdin(ckpt, tmp_path, monkeypatch, capsys, side):
    src, ref = _files(tmp_path)
    code, from_files, err = run_main(
        monkeypatch, capsys, "evaluate", ckpt, "--beam", 1, "--src", src, "--ref", ref
    )
    assert code == 0, err
    files = {"--src": src, "--ref": ref}
    stdin = (SOURCES if side == "--src" else REFERENCES).encode()
    args = [x for option, path in files.items() for x in (option, "-" if option == side else path)]
    code, from_stdin, err = run_main(
        monkeypatch, capsys, "evaluate", ckpt, "--beam", 1, *args, stdin=stdin
    )
    assert code == 0, err
    assert "BLEU = " in from_stdin and "chrF = " in from_stdin and from_stdin == from_files


def test_both_from_stdin_is_refused(ckpt, monkeypatch, capsys):
    stdin = SOURCES.encode()
    code, out, err = run_main(
        monkeypatch, capsys, "evaluate", ckpt, "--src", "-", "--ref", "-", stdin=stdin
    )
    one_line_error(code, err, "--src - and --ref -: only one of them can be read from stdin")
    assert out == ""


def test_stdin_problems_name_stdin(ckpt, tmp_path, monkeypatch, capsys):
    src, ref = _files(tmp_path)
    cases = [
        (("--src", "-", "--ref", ref), b"\n  \n", "stdin: is empty (no sentence to evaluate)"),
        (("--src", "-", "--ref", ref), b"a\nb\n", f"line counts differ: stdin has 2, {ref} has 3"),
        (("--src", src, "--ref", "-"), b"a\n\xff\n", "stdin: line 2, byte 1: not valid UTF-8"),
    ]
    for args, stdin, match in cases:
        code, out, err = run_main(monkeypatch, capsys, "evaluate", ckpt, *args, stdin=stdin)
        one_line_error(code, err, match)
        assert out == ""


def test_a_closed_stdin_names_the_lines_it_should_hold(ckpt, tmp_path, monkeypatch, capsys):
    src, ref = _files(tmp_path)
    monkeypatch.setattr(sys, "stdin", None)
    for args, wanted in (
        (["--src", "-", "--ref", str(ref)], "give the source sentences on stdin"),
        (["--src", str(src), "--ref", "-"], "give the reference translations on stdin"),
    ):
        code = main(["evaluate", str(ckpt), *args])
        out, err = capsys.readouterr()
        one_line_error(code, err, f"stdin: is closed; {wanted}")
        assert out == ""


def test_every_score_names_the_decoding_that_gave_it(ckpt, tmp_path, monkeypatch, capsys):
    """The demo's greedy BLEU (98.2) and ``qkv evaluate --split test``'s (98.41, beam 5 by
    default) differed with nothing printed to say why; each score now names its search."""
    src, ref = _files(tmp_path)
    length = "max length 1.5 × source + 10 (at most 16)"
    for beam, search in ((1, "greedy"), (3, "beam 3, length penalty 0.6")):
        code, out, err = run_main(
            monkeypatch, capsys, "evaluate", ckpt, "--src", src, "--ref", ref, "--beam", beam
        )
        assert code == 0, err
        lines = out.splitlines()
        assert [line.split(" = ")[0] for line in lines] == ["BLEU", "chrF"]
        assert all(line.endswith(f")  decoding: {search}, {length}") for line in lines), out


def test_tokens_outside_the_vocabulary_are_counted_once(
    ckpt, tmp_path, monkeypatch, capsys, caplog
):
    """An English test set given to the Korean model scored near zero with no word on
    why; one warning now counts the source tokens the model reads as <unk>."""
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text("the cat caught the mouse\n고양이가 쥐를 잡았다\n쥐를 잡았다😀\n")
    ref.write_text(REFERENCES)
    with caplog.at_level(logging.WARNING, logger="qkv.cli.evaluate"):
        code, out, _ = run_main(monkeypatch, capsys, "evaluate", ckpt, "--src", src, "--ref", ref)
    assert code == 0 and "BLEU = " in out
    assert [r.getMessage() for r in caplog.records] == [
        "6 of 10 source tokens (in 2 of 3 sentences) are outside the model's vocabulary "
        "and read as <unk>; their translations may be meaningless"
    ]


def _with_recipe_data(ckpt: Path, to: Path, data: dict, folder: Path) -> Path:
    """A copy of ``ckpt`` whose stored recipe reads ``data``, trained in ``folder``."""
    c = load_checkpoint(ckpt)
    extra = {**c.extra, "recipe": {**c.extra["recipe"], "data": data}, "folder": str(folder)}
    save_checkpoint(to, c.model, tokenizers=c.tokenizers, extra=extra)
    return to


class _Writer(threading.Thread):
    """Opens a FIFO for writing as soon as something opens it for reading, and writes one
    pair: a reader of the FIFO gets its lines instead of blocking forever."""

    def __init__(self, fifo: Path):
        super().__init__(daemon=True)
        self.fifo, self.stop = fifo, threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.05):
            try:
                fd = os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:  # ENXIO: no reader yet
                continue
            os.write(fd, "고양이가 잤다\tthe cat slept\n".encode())
            os.close(fd)
            return


def test_a_stored_recipe_reads_only_regular_files_under_its_folders(
    ckpt, tmp_path, monkeypatch, capsys
):
    """``qkv evaluate CKPT --split test`` read whatever file the checkpoint's recipe named:
    ``/etc/shadow`` gave its line count and a BLEU, a FIFO hung. Only regular files under
    the folder training ran in, the current folder or qkv's cache are read now; others are
    one line naming the checkpoint and the path, and --src/--ref still read any file."""
    trained, here, outside = tmp_path / "trained", tmp_path / "here", tmp_path / "outside"
    for folder in (trained, here, outside):
        folder.mkdir()
    secret = outside / "secret.tsv"
    secret.write_text("tab\tseparated\n" * 30)
    (here / "link.tsv").symlink_to(secret)
    os.mkfifo(here / "fifo.tsv")
    kept = "".join(f"고양이가 {n}\tthe cat {n}\n" for n in range(30))
    (trained / "kept.tsv").write_text(kept, encoding="utf-8")
    monkeypatch.chdir(here)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    tsv = {"kind": "tsv", "n_valid": 5, "n_test": 5, "src_column": 0, "tgt_column": 1}
    refused = {
        str(secret): "outside the folder it was trained in",
        "link.tsv": "outside the folder it was trained in",  # a link out of the folder
        "fifo.tsv": "not a regular file",
    }
    writer = _Writer(here / "fifo.tsv")
    writer.start()  # without the check, reading the FIFO gets a pair instead of blocking
    try:
        for number, (path, why) in enumerate(refused.items()):
            bad = _with_recipe_data(
                ckpt, tmp_path / f"bad{number}.safetensors", {**tsv, "path": path}, trained
            )
            code, out, err = run_main(monkeypatch, capsys, "evaluate", bad, "--split", "test")
            one_line_error(code, err, f"{bad}: its recipe's data.path names {path}")
            assert why in err and out == ""
    finally:
        writer.stop.set()
    good = _with_recipe_data(
        ckpt, tmp_path / "good.safetensors", {**tsv, "path": "kept.tsv"}, trained
    )
    code, out, err = run_main(monkeypatch, capsys, "evaluate", good, "--split", "test")
    assert code == 0 and "BLEU = " in out, err
    code, out, err = run_main(
        monkeypatch, capsys, "evaluate", good, "--src", secret, "--ref", secret
    )
    assert code == 0 and "BLEU = " in out, err
