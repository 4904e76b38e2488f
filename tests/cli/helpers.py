"""Helpers of the command-line tests: run ``qkv`` in this process with bytes on stdin."""

from __future__ import annotations

import io
import sys

from qkv.cli import main


def run_main(monkeypatch, capsys, *args, stdin: bytes = b""):
    """``qkv ARGS`` (each made a string) with ``stdin``: the exit code, stdout and stderr."""
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(code: int, err: str, match: str) -> None:
    """Exit code 2 and one line on stderr that holds ``match``."""
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and match in err, err
