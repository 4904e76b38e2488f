"""``qkv evaluate --src -`` or ``--ref -`` reads those lines from stdin, as ``qkv translate``
reads its sentences; both from stdin is one line and exit code 2."""

from __future__ import annotations

import pytest

from tests.test_evaluate import _cli, _one_line_error, ckpt  # noqa: F401 (ckpt: a fixture)

SOURCES = "고양이가 쥐를 잡았다\n개가 잤다\n고양이가 잤다\n"
REFERENCES = "the cat caught the mouse\nthe dog slept\nthe cat slept\n"


def _files(tmp_path):
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text(SOURCES, encoding="utf-8")
    ref.write_text(REFERENCES, encoding="utf-8")
    return src, ref


@pytest.mark.parametrize("side", ["--src", "--ref"])
def test_a_dash_reads_those_lines_from_stdin(ckpt, tmp_path, monkeypatch, capsys, side):  # noqa: F811
    src, ref = _files(tmp_path)
    code, from_files, err = _cli(
        monkeypatch, capsys, "evaluate", ckpt, "--beam", 1, "--src", src, "--ref", ref
    )
    assert code == 0, err
    files = {"--src": src, "--ref": ref}
    stdin = (SOURCES if side == "--src" else REFERENCES).encode()
    args = [x for option, path in files.items() for x in (option, "-" if option == side else path)]
    code, from_stdin, err = _cli(
        monkeypatch, capsys, "evaluate", ckpt, "--beam", 1, *args, stdin=stdin
    )
    assert code == 0, err
    assert "BLEU = " in from_stdin and "chrF = " in from_stdin and from_stdin == from_files


def test_both_from_stdin_is_refused(ckpt, monkeypatch, capsys):  # noqa: F811
    stdin = SOURCES.encode()
    code, out, err = _cli(
        monkeypatch, capsys, "evaluate", ckpt, "--src", "-", "--ref", "-", stdin=stdin
    )
    _one_line_error(code, err, "--src - and --ref -: only one of them can be read from stdin")
    assert out == ""


def test_stdin_problems_name_stdin(ckpt, tmp_path, monkeypatch, capsys):  # noqa: F811
    src, ref = _files(tmp_path)
    cases = [
        (("--src", "-", "--ref", ref), b"\n  \n", "stdin: is empty (no sentence to evaluate)"),
        (("--src", "-", "--ref", ref), b"a\nb\n", f"line counts differ: stdin has 2, {ref} has 3"),
        (("--src", src, "--ref", "-"), b"a\n\xff\n", "stdin: line 2, byte 1: not valid UTF-8"),
    ]
    for args, stdin, match in cases:
        code, out, err = _cli(monkeypatch, capsys, "evaluate", ckpt, *args, stdin=stdin)
        _one_line_error(code, err, match)
        assert out == ""


def test_a_closed_stdin_names_the_lines_it_should_hold(ckpt, tmp_path, monkeypatch, capsys):  # noqa: F811
    import sys

    from qkv.cli import main

    src, ref = _files(tmp_path)
    monkeypatch.setattr(sys, "stdin", None)
    for args, wanted in (
        (["--src", "-", "--ref", str(ref)], "give the source sentences on stdin"),
        (["--src", str(src), "--ref", "-"], "give the reference translations on stdin"),
    ):
        code = main(["evaluate", str(ckpt), *args])
        out, err = capsys.readouterr()
        _one_line_error(code, err, f"stdin: is closed; {wanted}")
        assert out == ""
