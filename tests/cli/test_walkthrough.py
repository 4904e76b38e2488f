"""The walkthrough command: its numbers are qkv's attention, and it shows word order."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

from qkv.cli import main
from qkv.cli.walkthrough import check_against_library, walkthrough


@pytest.mark.parametrize("heads, dim", [(1, 8), (2, 8), (4, 16)])
def test_steps_equal_library_attention(heads, dim):
    result = walkthrough("the cat that caught the mouse slept", heads=heads, dim=dim, seed=3)
    assert check_against_library(result, heads, dim, seed=3) < 1e-12
    weights = [s.value for s in result.steps if s.title.startswith("weights")]
    assert len(weights) == heads
    for w in weights:
        torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[0], dtype=w.dtype))


def test_without_positions_same_word_same_vector_in_either_order():
    a = walkthrough("Sally likes Sam", positions=False, heads=2)
    b = walkthrough("Sam likes Sally", positions=False, heads=2)
    for i, tok in enumerate(a.tokens):
        j = b.tokens.index(tok)
        torch.testing.assert_close(a.output[i], b.output[j], atol=1e-12, rtol=0)
    assert max(a.reorder_diff) < 1e-12


def test_with_positions_the_vectors_differ():
    a = walkthrough("Sally likes Sam", positions=True)
    b = walkthrough("Sam likes Sally", positions=True)
    assert (a.output[0] - b.output[2]).abs().max() > 1e-3
    assert max(a.reorder_diff) > 1e-3


def test_cli_prints_shapes_and_hangul(capsys):
    assert main(["walkthrough", "고양이가 쥐를 잡았다", "--heads", "2", "--dim", "8"]) == 0
    out = capsys.readouterr().out
    for text in ("고양이가", "shape (3x8)", "scores Q K^T (head 2/2)", "concat W_o", "sums to 1"):
        assert text in out


def test_repeated_words_are_each_counted(capsys):
    result = walkthrough("Sally Sally Sam", positions=False)
    assert len(result.reorder_diff) == 3  # one per position, not one per distinct word
    assert main(["walkthrough", "Sally Sally Sam", "--no-positions"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "(3 of 3 words" in out
    # 'exactly the same output vector ... max change 2e-16' contradicted itself
    exact = max(result.reorder_diff) == 0
    assert ("exactly" in out) == exact and ("up to rounding: max change" in out) != exact
    assert main(["walkthrough", "Sam Sally Sam likes", "--seed", "2"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "of 4 words" in out


@pytest.mark.parametrize(
    "args, match",
    [
        (["   "], "empty"),
        (["a b", "--dim", "6", "--heads", "4"], "multiple"),
        (["a b", "--dim", "100000"], "--dim 100000: must be between 1 and 1024"),
        (["a b", "--heads", "100", "--dim", "100"], "--heads 100: must be between 1 and 64"),
        (["a b", "--seed", str(2**70)], "--seed"),
        (["a b\udcff"], "not valid UTF-8 (byte 0xff in word 2)"),  # argv bytes b"a b\xff"
        (["w " * 1025], "the sentence has 1025 words: at most 1024"),
    ],
    ids=["blank", "indivisible", "huge-dim", "many-heads", "huge-seed", "not-utf8", "long"],
)
def test_cli_bad_input_exits_2_without_traceback(args, match):
    proc = subprocess.run(
        [sys.executable, "-m", "qkv", "walkthrough", *args], capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("qkv walkthrough: error:") and match in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_step_titles_are_whole_lines_even_over_narrow_tables(capsys):
    """A 3 x 3 table is narrower than its title: the title is a line of its own, not
    wrapped to the table's width."""
    assert main(["walkthrough", "나는 학교에 간다", "--heads", "2", "--dim", "4"]) == 0
    lines = [line.strip() for line in capsys.readouterr().out.splitlines()]
    for title in (
        "scaled scores / sqrt(2) (head 1/2)  shape (3x3)",
        "weights = softmax(rows) (head 2/2)  shape (3x3)",
    ):
        assert title in lines


def test_words_that_look_like_rich_markup_print_as_typed(capsys):
    """Words are text: '[/x]' was a MarkupError traceback (exit 1), and '[b]w[/b]' or
    '[red]r' lost their brackets in the token line and the row labels."""
    words = ["[/x]", "[b]w[/b]", "[red]r", "a\\"]
    assert main(["walkthrough", " ".join(words), "--dim", "4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert f"tokens (4): {' | '.join(words)}" in lines
    labels = [line.split()[0] for line in lines if line.split() and line.split()[0] in words]
    assert labels.count("[b]w[/b]") == 8  # rows of X, Q, K, V, scores, scaled, weights, output
    assert sum(line.split() == words for line in lines) == 3  # columns of the (T, T) steps


def test_a_long_word_leaves_room_for_the_numbers(capsys):
    """A 150-letter word as a row label pushed every number out of an 80-column table:
    its rows printed the label alone. Labels are cut to 12 cells."""
    word = "x" * 150
    assert main(["walkthrough", f"{word} short 고양이가고양이가", "--dim", "4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [line for line in lines if re.match(r" ?x{11}.*…", line)]  # rows, cut
    assert len(rows) >= 8  # X, Q, K, V, scores, scaled, weights, output
    for row in rows:
        numbers = re.findall(r"[+-]\d+\.\d\d", row)
        assert len(numbers) in (3, 4), row  # (T, T) steps have 3 columns, the others 4


@pytest.mark.parametrize(
    "args",
    [
        ["the cat sat on the mat", "--dim", "16", "--heads", "2"],
        [" ".join(f"word{i:02d}abcdefgh" for i in range(12)), "--dim", "4"],
    ],
    ids=["dim-16", "twelve-long-words"],
)
def test_tables_fit_80_columns_with_whole_numbers(capsys, monkeypatch, args):
    """At 80 columns, ten number columns did not fit: rich cut the numbers ('-0.…',
    a last column of '+1') and the row labels ('t…' for 'the'). Fewer columns are shown
    (the rest as '...'), each number whole."""
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["walkthrough", *args]) == 0
    lines = capsys.readouterr().out.splitlines()
    items = [i for line in lines for i in line.split() if i[0] in "+-" and len(i) > 1]
    assert len(items) > 100
    assert [i for i in items if not re.fullmatch(r"[+-]\d+\.\d\d", i)] == []
    assert all(len(line) <= 80 for line in lines)
    assert not [line for line in lines if re.match(r" \w…", line)]  # no label cut to a letter


@pytest.mark.parametrize("encoding", ["ascii", "latin-1"])
def test_hangul_prints_whatever_the_locale(encoding):
    """Under an ASCII or Latin-1 stdout the Korean words ended in a UnicodeEncodeError
    traceback (exit 1) after the work was done; the output is UTF-8 as the input is."""
    env = {**os.environ, "PYTHONIOENCODING": encoding}
    proc = subprocess.run(
        [sys.executable, "-m", "qkv", "walkthrough", "학교에 간다"], capture_output=True, env=env
    )
    assert proc.returncode == 0 and b"Traceback" not in proc.stderr
    assert "tokens (2): 학교에 | 간다" in proc.stdout.decode("utf-8")


def test_a_reader_that_stops_early_is_exit_141_as_for_the_other_commands():
    """'qkv walkthrough LONG | head -1': rich ended the process with exit status 1 when the
    pipe closed, which reads as a failure (set -o pipefail); the command line's own rule is
    141, as for qkv translate, with nothing on stderr."""
    sentence = " ".join(f"w{i}" for i in range(300))  # 130 kB of tables: more than a pipe holds
    proc = subprocess.Popen(
        [sys.executable, "-m", "qkv", "walkthrough", sentence, "--dim", "4"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout.readline().startswith(b"tokens (300): w0 | w1")
    proc.stdout.close()
    assert proc.wait(timeout=120) == 141
    assert proc.stderr.read() == b""
