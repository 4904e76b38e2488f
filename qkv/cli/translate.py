"""``qkv translate``: a checkpoint and sentences on stdin to translations on stdout.

What the user sees is decided here (rows, one-line errors, exit codes); the work is done
by :func:`qkv.translate.evaluate.translate_texts`, :func:`~qkv.translate.evaluate.bleu` and
:func:`~qkv.translate.evaluate.chrf`.
"""

from __future__ import annotations

import io
import logging
import os
import sys
from pathlib import Path

import torch

from qkv.data.corpus import decode_lines, read_stream
from qkv.data.text import utf8_problem
from qkv.data.tokenizers import tokenizer_from_json
from qkv.errors import CheckpointError, CorpusError, UserError
from qkv.models.checkpoint import load_checkpoint
from qkv.train.checks import free_memory
from qkv.train.progress import stderr_bar
from qkv.translate.evaluate import translate_texts, unknown_tokens
from qkv.viz.heatmap import IMAGE_SUFFIXES
from qkv.viz.html import HTML_SUFFIXES
from qkv.viz.translations import save_translations

__all__ = ["check_search_args", "load_translator", "read_stdin", "run_translate", "translate_lines"]
__all__ += ["warn_unknown_tokens"]

log = logging.getLogger(__name__)


def load_translator(path: str):
    try:
        ckpt = load_checkpoint(path)
    except CheckpointError as err:
        raise UserError(str(err)) from None
    if ckpt.model_type not in ("transformer", "rnn"):
        reader = {"gpt": "qkv sample", "llama": "qkv sample"}.get(ckpt.model_type)
        hint = f"; `{reader} {path}` reads it" if reader else ""
        raise UserError(f"{path}: a {ckpt.model_type} checkpoint, not a translator{hint}")
    if set(ckpt.tokenizers) != {"src", "tgt"}:
        raise UserError(f"{path}: the checkpoint holds no tokenizers")
    tokenizers = {}
    for side in ("src", "tgt"):
        try:
            tokenizers[side] = tokenizer_from_json(ckpt.tokenizers[side])
        except ValueError as err:
            raise UserError(f"{path}: its {side} tokenizer cannot be read: {err}") from None
    _check_vocab_sizes(path, ckpt.model, tokenizers)
    return ckpt.model, tokenizers["src"], tokenizers["tgt"], ckpt.extra


def _check_vocab_sizes(path: str, model, tokenizers: dict) -> None:
    """The source tokenizer gives no id the model lacks; the model outputs no id that the
    target tokenizer lacks (tokenizers of another run would fail mid-translation)."""

    config = model.config
    src, tgt = tokenizers["src"].vocab_size, tokenizers["tgt"].vocab_size
    if src > config.src_vocab_size:
        raise UserError(
            f"{path}: its src tokenizer has {src} tokens, more than the model's "
            f"src_vocab_size {config.src_vocab_size}"
        )
    if tgt < config.tgt_vocab_size:
        raise UserError(
            f"{path}: its tgt tokenizer has {tgt} tokens, fewer than the model's "
            f"tgt_vocab_size {config.tgt_vocab_size}"
        )


def check_search_args(args) -> None:
    """``--beam``, ``--n-best`` and ``--batch-size`` (those the command has) are usable."""

    if args.beam < 1:
        raise UserError(f"--beam: must be >= 1, got {args.beam}")
    n_best = getattr(args, "n_best", 1)
    if not 1 <= n_best <= args.beam:
        raise UserError(f"need 1 <= --n-best <= --beam, got --n-best {n_best} --beam {args.beam}")
    if getattr(args, "batch_size", 1) < 1:
        raise UserError(f"--batch-size: must be >= 1, got {args.batch_size}")


def read_stdin(what: str = "the sentences") -> list[str]:
    """stdin as UTF-8 lines, read with the corpus bound (:func:`read_stream`): endless or
    binary input (``< /dev/zero``) is refused from its first chunk; bytes that are not
    UTF-8 are an error naming line and byte."""
    if sys.stdin is None:  # started with stdin closed (<&-)
        raise UserError(f"stdin: is closed; give {what} on stdin, one per line")
    stream = getattr(sys.stdin, "buffer", None)  # None when stdin was replaced by a text stream
    if stream is None:
        stream = io.BytesIO(sys.stdin.read().encode("utf-8"))
    try:
        return decode_lines(read_stream(stream, "stdin"), "stdin")
    except CorpusError as err:
        raise UserError(str(err)) from None


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
    check_search_args(args)
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
        out = translate_lines(model, src_tok, tgt_tok, lines, args)
        for number, nbest in enumerate(out, start=1):
            _print_rows(number, nbest, args.n_best)
    else:
        lines, out = [], []
        for number, line in _terminal_lines():
            warn_unknown_tokens(src_tok, [line], "line", first=number)
            (nbest,) = translate_lines(
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


_UNKNOWN_LINES_NAMED = 10  # lines with unknown tokens named one by one; then one summary


def warn_unknown_tokens(src_tok, lines: list[str], what: str, first: int = 1) -> None:
    """Warn, per line, how many of its tokens the source vocabulary lacks: the model reads
    each as ``<unk>``, and an unknown word (English to a Korean model, an emoji) silently
    turns into words of the training text. After ``_UNKNOWN_LINES_NAMED`` lines one more
    warning counts the rest, so a file in the wrong language does not flood stderr."""
    named = more_lines = more_tokens = 0
    for number, text in enumerate(lines, start=first):
        unknown, total, pieces = unknown_tokens(src_tok, text)
        if not unknown:
            continue
        if named == _UNKNOWN_LINES_NAMED:
            more_lines, more_tokens = more_lines + 1, more_tokens + unknown
            continue
        named += 1
        shown = ", ".join(map(repr, pieces[:5])) + ", ..." * (len(pieces) > 5)
        log.warning(
            "%s %d: %d of %d source tokens %s outside the model's vocabulary%s and read as "
            "<unk>; the translation may be meaningless",
            what,
            number,
            unknown,
            total,
            "is" if unknown == 1 else "are",
            f" ({shown})" if shown else "",
        )
    if more_lines:
        log.warning(
            "%d more %ss hold tokens outside the model's vocabulary (%d tokens in all)",
            more_lines,
            what,
            more_tokens,
        )


def translate_lines(
    model, src_tok, tgt_tok, lines: list[str], args, *, first_line: int = 1, bar: bool = True
) -> list:
    """:func:`~qkv.translate.evaluate.translate_texts` with the command's ``--beam``, ``--n-best``
    and ``--batch-size``; a search too large for memory is one line, not a traceback.
    ``first_line``: the number of ``lines[0]`` in warnings; ``bar``: a progress bar of
    sentences on a terminal's stderr (not for lines typed one at a time)."""

    n_best, batch_size = getattr(args, "n_best", 1), getattr(args, "batch_size", _BATCH)
    at_once = min(batch_size, max(len(lines), 1))
    sizes = f"--beam {args.beam} over {at_once} sentence{'s' * (at_once > 1)} at a time"
    hint = "use a smaller --beam" + " or --batch-size" * hasattr(args, "batch_size")
    _check_search_memory(model, args.beam * at_once, f"{sizes}: the scores alone", hint)
    try:
        with _SentenceBar(len(lines) if bar else 0) as progress:
            return translate_texts(
                model,
                src_tok,
                tgt_tok,
                lines,
                beam=args.beam,
                n_best=n_best,
                batch_size=batch_size,
                progress=progress.update,
                first_line=first_line,
            )
    except RuntimeError as err:  # torch.OutOfMemoryError too
        if not _out_of_memory(err):
            raise
        raise UserError(f"{sizes}: out of memory; {hint}") from None


def _check_search_memory(model, rows: int, what: str, hint: str) -> None:
    """Refuse ``rows`` hypotheses at a time whose float32 logits and log-probabilities over
    the target vocabulary (a lower bound of what the search holds) exceed free memory."""

    need = rows * model.config.tgt_vocab_size * 4 * 2
    free = free_memory(next(model.parameters()).device)
    if free is not None and need > free:
        raise UserError(
            f"{what} need {need / 2**30:,.1f} GiB, more than the "
            f"{free / 2**30:,.1f} GiB free; {hint}"
        )


class _SentenceBar:
    """A progress bar of sentences translated, with rate and ETA, on stderr when stderr is
    a terminal (a log file of stderr gets no bar; stdout holds only the results)."""

    def __init__(self, total: int):
        self.total, self._progress = total, None

    def __enter__(self) -> _SentenceBar:
        if sys.stderr is not None and sys.stderr.isatty() and self.total:
            self._progress = stderr_bar("sentences")
            self._progress.start()
            self._task = self._progress.add_task("translate", total=self.total)
        return self

    def update(self, done: int) -> None:
        if self._progress is not None:
            self._progress.update(self._task, completed=done)

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.stop()


_BATCH = 64  # sentences per batch of ``qkv evaluate`` (it has no --batch-size)


def _out_of_memory(err: RuntimeError) -> bool:
    return isinstance(err, torch.OutOfMemoryError) or "can't allocate memory" in str(err)


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
