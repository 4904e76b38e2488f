"""What ``qkv translate`` writes: one line per input line (1-best), or rows of exactly
five tab-separated fields (``--n-best``), whatever characters a translation holds."""

from __future__ import annotations

import io
import re
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from qkv.cli.translate import run_translate
from qkv.translate.evaluate import Translation


def _written(nbest: list[list[Translation]], n_best: int) -> str:
    """What run_translate prints for these translations (model and stdin mocked)."""
    args = mock.Mock(beam=max(n_best, 1), n_best=n_best, batch_size=1, show_attention=None)
    out = io.StringIO()
    with (
        mock.patch("qkv.cli.translate.load_translator", return_value=(None, None, None, {})),
        mock.patch("qkv.cli.translate._check_search_memory"),
        mock.patch("qkv.cli.translate.read_stdin", return_value=["x"] * len(nbest)),
        mock.patch("qkv.cli.translate.translate_texts", return_value=nbest),
        mock.patch("sys.stdout", out),
    ):
        assert run_translate(args) == 0
    return out.getvalue()


def _unescape(field: str) -> str:
    return re.sub(r"\\(.)", lambda m: {"t": "\t", "n": "\n", "r": "\r"}.get(m[1], m[1]), field)


@settings(max_examples=20, deadline=None)
@given(
    texts=st.lists(st.text(st.sampled_from("ab \t\\\r\ntn"), max_size=8), min_size=2, max_size=3)
)
def test_n_best_rows_escape_tabs_and_line_breaks_in_the_translation(texts):
    """A character or BPE vocabulary holds every character of the training text, tabs
    and backslashes too: the TRANSLATION column escapes them (``\\t``, ``\\\\``), and line
    breaks (``\\n``, ``\\r``), so each row splits into exactly five fields at its tabs."""
    written = _written([[Translation(t, list(t), -1.5, None) for t in texts]], len(texts))
    rows = written.split("\n")
    assert rows.pop() == ""  # one line end per row, none inside
    assert len(rows) == len(texts)
    for rank, (row, text) in enumerate(zip(rows, texts), start=1):
        fields = row.split("\t")
        assert fields[:4] == ["1", str(rank), "-1.5000", "-1.5000"]
        assert len(fields) == 5 and "\r" not in fields[4]
        assert _unescape(fields[4]) == text


@settings(max_examples=20, deadline=None)
@given(
    texts=st.lists(
        st.text(st.sampled_from("ab \r\x0b\x0c\x1c\x85\u2028\u2029"), max_size=6),
        min_size=1,
        max_size=3,
    )
)
def test_one_best_lines_stay_one_line_per_input(texts):
    """A character vocabulary can hold a CR (text inside an LF line) or another character
    at which readers break lines: a 1-best translation holding one was written as it is,
    so the output had more lines than the input and line N was no longer the translation
    of input line N. Such characters are now spaces."""
    written = _written([[Translation(t, list(t), -1.0, None)] for t in texts], 1)
    lines = written.splitlines()
    assert len(lines) == len(texts)
    for line, text in zip(lines, texts):
        assert line == "".join(c if c in "ab " else " " for c in text)


@settings(max_examples=20, deadline=None)
@given(
    texts=st.lists(
        st.text(st.sampled_from("ab\t\\\r\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"), max_size=8),
        min_size=2,
        max_size=3,
    )
)
def test_n_best_rows_stay_one_line_for_every_line_break(texts):
    """VT, FF, FS, GS, RS, NEL, U+2028 and U+2029 were left raw in the TRANSLATION
    column, so a reader that splits lines (Python's ``splitlines``, most editors) saw a
    row broken in two. They are now spaces there, as in the 1-best output; tab,
    backslash, CR and LF stay escaped."""
    written = _written([[Translation(t, list(t), -1.5, None) for t in texts]], len(texts))
    rows = written.splitlines()
    assert len(rows) == len(texts)
    for row, text in zip(rows, texts):
        fields = row.split("\t")
        assert len(fields) == 5
        spaced = "".join(c if c in "ab\t\\\r\n" else " " for c in text)
        assert _unescape(fields[4]) == spaced
