"""Read and validate parallel corpora: two aligned files, or one tab-separated file.

Validation fails loudly on what makes a corpus unusable (files of different lengths,
bytes that are not UTF-8, a missing TSV column) with a :class:`CorpusError` whose one-line
message names the file and line; it filters what is merely noisy (empty lines, pairs over
the maximum length, pairs whose length ratio is implausible) and counts what it dropped
in a :class:`CorpusReport`.

Files are read with a bound: only regular files (a device such as ``/dev/zero`` never
ends), at most :data:`MAX_CORPUS_BYTES`, and the first chunk is checked for text (NUL
bytes, bytes that are not UTF-8, gzip data) before the rest is read; a stream (stdin) is
read by :func:`read_stream` under the same bound (stdin's lines: :func:`read_stdin`).

Lines are split on ``"\\n"`` only (a trailing ``"\\r"`` is dropped), never with
``str.splitlines``, which would also split on characters such as U+2028 that occur in
real sentences and would break the alignment of the two sides.
"""

from __future__ import annotations

import io
import logging
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

from qkv.errors import CorpusError

__all__ = ["CorpusError", "CorpusReport", "ParallelCorpus", "read_lines", "read_parallel"]
__all__ += ["read_tsv", "filter_pairs", "decode_lines", "read_stream", "read_stdin"]
__all__ += ["MAX_CORPUS_BYTES"]

log = logging.getLogger(__name__)


MAX_CORPUS_BYTES = 2**30
"""The most bytes read from one corpus file or stream (1 GiB; Multi30k's sides are 4 MB)."""
_FIRST_CHUNK = 2**16  # checked for text before the rest is read
_CHUNK = 2**22

CHARS_PER_WORD = 20
"""With ``max_len`` words, a side may hold at most this many times as many characters."""


@dataclass(frozen=True)
class CorpusReport:
    """What reading a corpus kept and dropped.

    Attributes:
        source: the file(s) read, for messages.
        total: pairs read.
        kept: pairs kept.
        empty: pairs dropped because a side was empty.
        too_long: pairs dropped because a side had more than ``max_len`` words (or more
            than ``CHARS_PER_WORD`` times as many characters).
        ratio: pairs dropped because their word-count ratio exceeded ``max_ratio``.
    """

    source: str
    total: int
    kept: int
    empty: int = 0
    too_long: int = 0
    ratio: int = 0

    def summary(self) -> str:
        """One line: how many pairs were kept and why the others were dropped."""
        return (
            f"{self.source}: kept {self.kept} of {self.total} pairs "
            f"(dropped {self.empty} empty, {self.too_long} too long, "
            f"{self.ratio} length-ratio outliers)"
        )


@dataclass(frozen=True)
class ParallelCorpus:
    """Aligned source and target sentences with the report of how they were read."""

    src: list[str]
    tgt: list[str]
    report: CorpusReport

    def __len__(self) -> int:
        return len(self.src)

    def pairs(self) -> list[tuple[str, str]]:
        """The corpus as a list of (source, target) pairs."""
        return list(zip(self.src, self.tgt))


def read_lines(path: str | Path, *, max_bytes: int = MAX_CORPUS_BYTES) -> list[str]:
    """Read a UTF-8 text file as a list of lines (without line ends).

    Args:
        path: the file; a regular file (a device or a pipe is refused).
        max_bytes: the most bytes read (a larger file is refused before it is read).

    Returns:
        The lines; a final line end does not make an extra empty line.

    Raises:
        CorpusError: the file is missing, not a regular file, larger than ``max_bytes``,
            or not text (NUL bytes, not valid UTF-8: the message gives the line).
    """
    path = Path(path)
    try:
        mode, size = (info := path.stat()).st_mode, info.st_size
        if stat.S_ISREG(mode) and size > max_bytes:
            raise CorpusError(f"{path}: {_size(size)}, {_limit(max_bytes)}")
        if not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):  # a directory: EISDIR below
            raise CorpusError(
                f"{path}: not a regular file (a device, pipe or socket); "
                "give a text file with one sentence per line"
            )
        with path.open("rb") as f:
            data = read_stream(f, str(path), max_bytes=max_bytes)
    except OSError as err:
        raise CorpusError(f"{path}: cannot read: {err.strerror or err}") from None
    return decode_lines(data, str(path))


def read_stream(stream, name: str, *, max_bytes: int = MAX_CORPUS_BYTES) -> bytes:
    """The bytes of a binary stream (stdin's ``buffer``, an open file), read with a bound.

    The first chunk is checked for text before the rest is read, so that ``/dev/zero``
    or ``/dev/urandom`` piped in is refused at once; at most ``max_bytes`` are read.
    :func:`decode_lines` then turns the bytes into lines.

    Args:
        stream: a binary stream with ``read(n)``.
        name: what the stream is, for messages (``"stdin"``).
        max_bytes: the most bytes read.

    Returns:
        The bytes read.

    Raises:
        CorpusError: more than ``max_bytes``, or a first chunk that is not text.
    """
    first = stream.read(min(_FIRST_CHUNK, max_bytes + 1))
    _check_text(first, name, first_chunk=True)
    chunks, total = [first], len(first)
    while total <= max_bytes:
        chunk = stream.read(min(_CHUNK, max_bytes + 1 - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    if total > max_bytes:
        raise CorpusError(f"{name}: more than {_limit(max_bytes)}")
    return b"".join(chunks)


def _limit(max_bytes: int) -> str:
    return f"more than the {_size(max_bytes)} qkv reads from one corpus (cut it first)"


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} bytes"


def _check_text(data: bytes, name: str, *, first_chunk: bool = False) -> None:
    """Refuse bytes that are not text: gzip data, NUL bytes, bytes that are not UTF-8
    (in a ``first_chunk``, a multi-byte character cut at its end is not an error)."""
    if data.startswith(b"\x1f\x8b"):  # the gzip magic: not UTF-8 at byte 2
        raise CorpusError(f"{name}: is gzip-compressed; decompress it (gunzip) first")
    nul = data.find(b"\0")
    if nul >= 0:
        raise CorpusError(f"{name}: not text: a NUL byte at {_where(data, nul)}")
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as err:
        if not first_chunk or err.end < len(data) or err.reason != "unexpected end of data":
            raise CorpusError(
                f"{name}: {_where(data, err.start)}: not valid UTF-8 (byte 0x{data[err.start]:02x})"
            ) from None


def _where(data: bytes, at: int) -> str:
    """``line L, byte B`` of the byte at offset ``at`` (both from 1)."""
    line = data.count(b"\n", 0, at) + 1
    column = at - (data.rfind(b"\n", 0, at) + 1) + 1
    return f"line {line}, byte {column}"


def decode_lines(data: bytes, name: str) -> list[str]:
    """Decode UTF-8 bytes into lines as :func:`read_lines` does (``name`` for messages).

    Raises:
        CorpusError: ``"NAME: line N, byte M: not valid UTF-8 (byte 0x..)"``, gzip data,
            NUL bytes (``"NAME: not text: ..."``) or lines that end in CR alone.
    """
    _check_text(data, name)
    text = data.decode("utf-8")
    if text.startswith("\ufeff"):
        text = text[1:]
    if "\n" not in text and "\r" in text.rstrip("\r"):  # else it reads as one line
        raise CorpusError(f"{name}: lines end in CR only (classic Mac OS); convert them to LF")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def read_stdin(what: str = "the sentences") -> list[str]:
    """stdin as UTF-8 lines, read with the corpus bound (:func:`read_stream`): endless or
    binary input (``< /dev/zero``) is refused from its first chunk; bytes that are not
    UTF-8 are an error naming line and byte.

    Args:
        what: what the lines are, for the message when stdin is closed.

    Raises:
        CorpusError: stdin closed (``<&-``), or what :func:`read_stream` and
            :func:`decode_lines` refuse.
    """
    if sys.stdin is None:  # started with stdin closed (<&-)
        raise CorpusError(f"stdin: is closed; give {what} on stdin, one per line")
    stream = getattr(sys.stdin, "buffer", None)  # None when stdin was replaced by a text stream
    if stream is None:
        stream = io.BytesIO(sys.stdin.read().encode("utf-8"))
    return decode_lines(read_stream(stream, "stdin"), "stdin")


def filter_pairs(
    src: list[str],
    tgt: list[str],
    *,
    source: str,
    max_len: int | None = None,
    max_ratio: float | None = 3.0,
) -> ParallelCorpus:
    """Strip sentences and drop empty, over-long and length-ratio outlier pairs.

    Lengths are counted in whitespace-separated words. A side with few spaces (a URL, a
    run of junk, an unsegmented paragraph) is one long "word", so a side is also too long
    when it has more than ``CHARS_PER_WORD × max_len`` characters: such a line would
    otherwise pass, then take minutes in BPE training and make a batch of its own. The
    bound is loose enough for Chinese or Japanese sentences (one "word" each).

    The ratio test compares the smoothed ratio ``(max(a, b) + 1) / (min(a, b) + 1)`` of
    the two word counts, so that short pairs of an agglutinative language ("없다." /
    "I don't have any.") survive while misaligned pairs ("@@" / a whole sentence) do not.

    Args:
        src: source sentences.
        tgt: target sentences, aligned with ``src``.
        source: name of the input, for the report.
        max_len: drop pairs with a side longer than this many words, or than
            ``CHARS_PER_WORD`` times this many characters (None: no limit).
        max_ratio: drop pairs whose word-count ratio exceeds this (None: no test).

    Returns:
        The filtered :class:`ParallelCorpus`.
    """
    if len(src) != len(tgt):
        raise CorpusError(f"{source}: {len(src)} source but {len(tgt)} target sentences")
    kept_src: list[str] = []
    kept_tgt: list[str] = []
    empty = too_long = ratio = 0
    for s, t in zip(src, tgt):
        s, t = s.strip(), t.strip()
        if not s or not t:
            empty += 1
            continue
        ns, nt = len(s.split()), len(t.split())
        if max_len is not None and (
            max(ns, nt) > max_len or max(len(s), len(t)) > CHARS_PER_WORD * max_len
        ):
            too_long += 1
            continue
        if max_ratio is not None and (max(ns, nt) + 1) / (min(ns, nt) + 1) > max_ratio:
            ratio += 1
            continue
        kept_src.append(s)
        kept_tgt.append(t)
    report = CorpusReport(source, len(src), len(kept_src), empty, too_long, ratio)
    log.info(report.summary())
    return ParallelCorpus(kept_src, kept_tgt, report)


def read_parallel(
    src_path: str | Path,
    tgt_path: str | Path,
    *,
    max_len: int | None = None,
    max_ratio: float | None = 3.0,
) -> ParallelCorpus:
    """Read a parallel corpus from two line-aligned files.

    Args:
        src_path: source-language file, one sentence per line.
        tgt_path: target-language file with the same number of lines.
        max_len: drop pairs with a side longer than this many words, or than
            ``CHARS_PER_WORD`` times this many characters (None: no limit).
        max_ratio: drop pairs whose word-count ratio exceeds this (None: no test).

    Returns:
        The :class:`ParallelCorpus`; its ``report`` counts what was dropped.

    Raises:
        CorpusError: a file is missing or not UTF-8, or the line counts differ.
    """
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    if len(src) != len(tgt):
        raise CorpusError(
            f"line counts differ: {src_path} has {len(src)} lines, {tgt_path} has {len(tgt)}"
        )
    return filter_pairs(
        src, tgt, source=f"{src_path} + {tgt_path}", max_len=max_len, max_ratio=max_ratio
    )


def read_tsv(
    path: str | Path,
    *,
    src_column: int = 0,
    tgt_column: int = 1,
    max_len: int | None = None,
    max_ratio: float | None = 3.0,
) -> ParallelCorpus:
    """Read a parallel corpus from one tab-separated file.

    Tatoeba's ``kor.txt`` (``English<TAB>Korean<TAB>attribution``) read Korean→English is
    ``read_tsv(path, src_column=1, tgt_column=0)``; extra columns are ignored.

    Args:
        path: the TSV file.
        src_column: 0-based column of the source sentence.
        tgt_column: 0-based column of the target sentence.
        max_len: drop pairs with a side longer than this many words, or than
            ``CHARS_PER_WORD`` times this many characters (None: no limit).
        max_ratio: drop pairs whose word-count ratio exceeds this (None: no test).

    Returns:
        The :class:`ParallelCorpus`.

    Raises:
        CorpusError: the file is missing or not UTF-8, or a non-empty line lacks a column.
    """
    if src_column == tgt_column or min(src_column, tgt_column) < 0:
        raise CorpusError(
            f"{path}: need two different columns >= 0, not {src_column}, {tgt_column}"
        )
    need = max(src_column, tgt_column) + 1
    src: list[str] = []
    tgt: list[str] = []
    for number, line in enumerate(read_lines(path), start=1):
        if not line.strip():
            src.append("")
            tgt.append("")
            continue
        cells = line.split("\t")
        if len(cells) < need:
            raise CorpusError(
                f"{path}: line {number} has {len(cells)} tab-separated columns, need {need}"
            )
        src.append(cells[src_column])
        tgt.append(cells[tgt_column])
    return filter_pairs(src, tgt, source=str(path), max_len=max_len, max_ratio=max_ratio)
