"""Files: where qkv keeps them between runs, writing them so that an interruption never
leaves half of one, and reading JSON that another program wrote without trusting it (below
every layer, so any of them may ask)."""

from __future__ import annotations

import contextlib
import errno
import itertools
import json
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "JSON_MAX_DEPTH",
    "UnsafeJSONError",
    "cache_root",
    "naming",
    "parse_json",
    "quoted",
    "replacing",
    "write_text_atomic",
    "writing",
]

JSON_MAX_DEPTH = 100  # configs and headers nest a few levels; Python's parser recurses per level
QUOTED_CHARS = 80  # the longest value an error message quotes


def cache_root() -> Path:
    """``$XDG_CACHE_HOME/qkv`` if set, else ``~/.cache/qkv``."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "qkv"


def naming(err: OSError, path: str | os.PathLike[str]) -> OSError:
    """``err`` again, of the same type, naming ``path`` (the file the user knows of) in
    place of a temporary or staged file; raise it ``from None``."""
    return type(err)(err.errno, err.strerror, str(path))


@contextlib.contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """A temporary path beside ``path`` that replaces it when the block ends without error.

    An interrupted write (Ctrl-C, a full disk) leaves the previous file whole and no
    temporary file behind; a reader never sees half a file. An ``OSError`` about the
    temporary file is raised again naming ``path``, the file the user knows of.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    except OSError as err:
        if err.filename not in (str(tmp), tmp):
            raise
        raise naming(err, path) from None
    finally:
        tmp.unlink(missing_ok=True)


def write_text_atomic(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` as UTF-8 (whatever the locale), atomically."""
    path = Path(path)
    with replacing(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return path


@contextlib.contextmanager
def writing(path: str | os.PathLike[str]) -> Iterator[Path]:
    """:func:`replacing` for a file the user named (a page, an image, a lab result): its
    folders are made first, and a folder at ``path`` is an :class:`IsADirectoryError`
    naming ``path``."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    with replacing(path) as tmp:
        yield tmp


class UnsafeJSONError(ValueError):
    """JSON that :func:`parse_json` refuses to parse: nested too deep, or an integer with
    more digits than Python converts (syntax errors are plain ``ValueError`` s)."""


_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def parse_json(text: str | bytes, *, max_depth: int = JSON_MAX_DEPTH) -> Any:
    """``json.loads`` for text that another program wrote: every failure is one short line.

    The nesting is measured before parsing (brackets outside strings), so that ten thousand
    nested ``[`` are refused instead of raising ``RecursionError``; an integer longer than
    Python converts (``sys.get_int_max_str_digits()``) is refused by its length.

    Args:
        text: the JSON document (bytes are read as UTF-8).
        max_depth: the deepest nesting of arrays and objects accepted.

    Returns:
        The parsed value.

    Raises:
        UnsafeJSONError: nested deeper than ``max_depth``, or an integer too long to
            convert (a ``ValueError``).
        ValueError: not UTF-8, or not JSON. Every message is one line that quotes at most
            a short prefix of the text.
    """
    if isinstance(text, bytes | bytearray):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as err:
            raise ValueError(f"not UTF-8 (byte {err.start})") from None
    brackets = _NOT_BRACKET.sub("", _JSON_STRING.sub("", text))
    depth = max(itertools.accumulate(_STEP[c] for c in brackets), default=0)
    if depth > max_depth:
        raise UnsafeJSONError(
            f"not JSON that qkv reads: nested {depth} levels deep (at most {max_depth})"
        )
    try:
        return json.loads(text, parse_int=_integer)
    except json.JSONDecodeError as err:
        raise ValueError(
            f"not valid JSON ({err.msg} at line {err.lineno} column {err.colno})"
        ) from None
    except RecursionError:  # a deep stack already, below max_depth
        raise UnsafeJSONError(
            f"not JSON that qkv reads: nested too deep ({depth} levels)"
        ) from None


def _integer(digits: str) -> int:
    limit = sys.get_int_max_str_digits()
    if limit and len(digits.lstrip("-")) > limit:
        raise UnsafeJSONError(
            f"not JSON that qkv reads: an integer of {len(digits.lstrip('-')):,} digits "
            f"({quoted(digits, 24)}; at most {limit})"
        )
    return int(digits)


def quoted(value: Any, limit: int = QUOTED_CHARS) -> str:
    """``repr(value)`` cut to ``limit`` characters (``…`` marks a cut), for error messages
    that quote a value read from a file: a 5,000-digit number or a megabyte of text stays a
    short line (an integer too long for ``repr`` is shown by its first digits)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 4 * limit:
        return f"{_leading_digits(value, limit)}… ({value.bit_length():,} bits)"
    text = (
        repr(value)
        if not isinstance(value, str) or len(value) <= 4 * limit
        else repr(value[: 4 * limit])
    )
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _leading_digits(value: int, count: int) -> str:
    """The first ``count`` decimal digits of a huge integer (``str`` refuses long ones)."""
    sign, value = ("-", -value) if value < 0 else ("", value)
    excess = max(0, int(value.bit_length() * 0.30103) - count)
    return sign + str(value // 10**excess)[:count]
