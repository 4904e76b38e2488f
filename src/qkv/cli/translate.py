"""``qkv translate``: a checkpoint and sentences on stdin to translations on stdout.

What the user sees is decided here (rows, one-line errors, exit codes); the work is done
by :func:`qkv.translate.translator.load_translator` and
:func:`~qkv.translate.translator.translate_lines`, and stdin is read by
:func:`qkv.data.corpus.read_stdin`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from qkv.data.corpus import read_stdin
from qkv.data.text import utf8_problem
from qkv.errors import UserError
from qkv.train.progress import terminal_progress
from qkv.translate.evaluate import Translation
from qkv.translate.translator import (
    check_search_settings,
    load_translator,
    translate_lines,
    warn_unknown_tokens,
)
from qkv.viz.heatmap import IMAGE_SUFFIXES
from qkv.viz.html import HTML_SUFFIXES
from qkv.viz.translations import save_translations

__all__ = ["run_translate"]


def run_translate(args) -> int:
    """``qkv translate CHECKPOINT [SENTENCE ...]``: sentences to stdout, one per line.

    The sentences are the arguments after the checkpoint, else the lines of stdin. A
    pipe or file on stdin is read whole and translated in length-sorted batches; a
    terminal is read line by line, each line answered as soon as it is typed (Ctrl-D
    ends). A sentence with tokens outside the model's vocabulary gets a warning on stderr
    naming its line and how many tokens the model reads as ``<unk>``.

    With ``--n-best K`` every input line gives exactly K rows,
    ``LINE<TAB>RANK<TAB>SCORE<TAB>LOGPROB<TAB>TRANSLATION``: the 1-based input line and
    rank, the length-normalised score that ranks them, and the plain sum of
    log-probabilities. A blank line's first row is the empty translation (scores 0), and
    rows with no translation behind them have scores ``-inf`` and no text. The
    translation is escaped (:func:`_tsv_field`) so that each row has exactly five fields.
    Without it, each input line gives one output line (:func:`_one_line`).
    """
    check_search_settings(args.beam, args.n_best, args.batch_size)
    sentences = list(getattr(args, "sentences", None) or [])
    for number, text in enumerate(sentences, start=1):
        _check_argument(number, text)
    model, src_tok, tgt_tok, _ = load_translator(args.checkpoint)
    if args.show_attention:
        _check_attention_output(args.show_attention, model)
    if hasattr(sys.stdout, "reconfigure"):  # UTF-8 out as in, whatever the locale says
        sys.stdout.reconfigure(encoding="utf-8")
    if sentences or not _stdin_is_terminal():
        lines = sentences or read_stdin()
        warn_unknown_tokens(src_tok, lines, "sentence" if sentences else "line")
        out = _translate(model, src_tok, tgt_tok, lines, args)
        for number, nbest in enumerate(out, start=1):
            _print_rows(number, nbest, args.n_best)
    else:
        lines, out = [], []
        for number, line in _terminal_lines():
            warn_unknown_tokens(src_tok, [line], "line", first=number)
            (nbest,) = _translate(
                model, src_tok, tgt_tok, [line], args, first_line=number, bar=False
            )
            _print_rows(number, nbest, args.n_best)
            sys.stdout.flush()  # the answer shows before the next line is typed
            lines.append(line)
            out.append(nbest)
    if args.show_attention:
        written = _write_alignments(args.show_attention, lines, out, src_tok, model)
        print("attention: " + ", ".join(map(str, written)), file=sys.stderr)
    return 0


def _translate(
    model, src_tok, tgt_tok, lines: list[str], args, *, first_line: int = 1, bar: bool = True
) -> list[list[Translation]]:
    """:func:`~qkv.translate.translator.translate_lines` with the command's ``--beam``,
    ``--n-best`` and ``--batch-size``; ``bar``: a progress bar of sentences on a terminal's
    stderr (not for lines typed one at a time)."""
    with terminal_progress("translate", "sentences", len(lines) if bar else 0) as progress:
        return translate_lines(
            model,
            src_tok,
            tgt_tok,
            lines,
            beam=args.beam,
            n_best=args.n_best,
            batch_size=args.batch_size,
            first_line=first_line,
            progress=progress,
        )


def _check_argument(number: int, text: str) -> None:
    """Refuse a SENTENCE argument with bytes that are not UTF-8 (see
    :func:`qkv.data.text.utf8_problem`)."""
    problem = utf8_problem(text)
    if problem is not None:
        what, at = problem
        raise UserError(
            f"SENTENCE {number}: not valid UTF-8 ({what} at character {at + 1}); "
            "give the sentence in UTF-8"
        )


def _stdin_is_terminal() -> bool:
    isatty = getattr(sys.stdin, "isatty", None)
    return sys.stdin is not None and isatty is not None and isatty()


def _terminal_lines():
    """``(number, line)`` for each line typed on the terminal, as soon as it is typed;
    bytes that are not UTF-8 are an error naming the line and byte, as in a file."""
    stream = getattr(sys.stdin, "buffer", None)
    read = stream.readline if stream is not None else lambda: sys.stdin.readline().encode()
    for number, raw in enumerate(iter(read, b""), start=1):
        line = raw.rstrip(b"\n").removesuffix(b"\r")
        try:
            yield number, line.decode("utf-8")
        except UnicodeDecodeError as err:
            raise UserError(
                f"stdin: line {number}, byte {err.start + 1}: not valid UTF-8 "
                f"(byte 0x{line[err.start]:02x})"
            ) from None


def _print_rows(number: int, nbest: list, n_best: int) -> None:
    """The output of input line ``number``: one line, or ``n_best`` TSV rows."""
    if n_best == 1:
        print(_one_line(nbest[0].text))
        return
    for rank, t in enumerate(nbest, start=1):
        scores = f"{t.normalized_score:.4f}\t{t.score:.4f}"
        print(f"{number}\t{rank}\t{scores}\t{_tsv_field(t.text)}")


# Every character at which str.splitlines breaks a line (LF, CR, VT, FF, FS, GS, RS, NEL,
# LINE SEPARATOR, PARAGRAPH SEPARATOR); a character vocabulary can hold all but LF.
_LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
_AS_SPACES = str.maketrans(dict.fromkeys(_LINE_BREAKS, " "))
# A TSV field: the same spaces, except that backslash, tab, LF and CR are escaped (the
# field reads back exactly where it held only those).
_TSV_ESCAPES = {
    **_AS_SPACES,
    **str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"}),
}


def _one_line(text: str) -> str:
    """``text`` as one output line: line-break characters become spaces, so that output
    line N stays the translation of input line N for any reader of lines."""
    return text.translate(_AS_SPACES)


def _tsv_field(text: str) -> str:
    """``text`` as one TSV field: backslash, tab, LF and CR become ``\\\\``, ``\\t``,
    ``\\n``, ``\\r`` (a character or BPE vocabulary holds every character of the
    training text, tabs included, and a raw tab would add a column); the other line
    breaks of :data:`_LINE_BREAKS` become spaces, as in :func:`_one_line`, so that a
    reader of lines sees one row per line."""
    return text.translate(_TSV_ESCAPES)


def _check_attention_output(path: str, model) -> None:
    """Refuse, before translating, an ``--show-attention`` path that cannot be written."""

    where = f"--show-attention {path}"
    target = Path(path)
    if target.suffix.lower() not in HTML_SUFFIXES + IMAGE_SUFFIXES:
        raise UserError(
            f"{where}: the name must end in {', '.join(HTML_SUFFIXES + IMAGE_SUFFIXES)}"
        )
    if getattr(getattr(model, "config", None), "attention", None) == "none":
        raise UserError(f"{where}: this model has no attention to show")
    if target.is_dir():
        raise UserError(f"{where}: is a directory")
    if target.exists() and not os.access(target, os.W_OK):
        raise UserError(f"{where}: permission denied")
    folder = target.parent
    while not folder.exists():  # the page's folders are created when it is written
        folder = folder.parent
    if not folder.is_dir():
        raise UserError(f"{where}: {folder} is not a directory")
    if not os.access(folder, os.W_OK):
        raise UserError(f"{where}: {folder}: permission denied")


def _write_alignments(path: str, lines: list[str], out, src_tok, model) -> list:

    entries, numbers = [], []  # images are numbered by input line: blank lines leave gaps
    for number, (text, nbest) in enumerate(zip(lines, out), start=1):
        best = nbest[0]
        if best.alignment is not None:
            ids = src_tok.encode(text.strip())[: best.alignment.shape[-1]]  # a long line was cut
            entries.append((text, ids, [src_tok.id_to_token(i) for i in ids], best))
            numbers.append(number)
    if not entries:
        if not any(src_tok.encode(text.strip()) for text in lines):
            raise UserError("--show-attention: the input has no sentence to show")
        raise UserError("--show-attention: this model has no attention to show")
    try:
        return save_translations(model, entries, path, numbers=numbers)
    except ValueError as err:
        raise UserError(f"--show-attention {path}: {err}") from None
