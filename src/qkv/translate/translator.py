"""A trained translator: its checkpoint read with its two tokenizers, and lines translated
with it in batches.

:func:`load_translator` refuses, each in one line (:class:`~qkv.errors.CheckpointError`),
a checkpoint that is not a translator, holds no tokenizers, or holds tokenizers that do
not fit its model. :func:`translate_lines` is
:func:`~qkv.translate.evaluate.translate_texts` with the refusals a command needs
(:class:`~qkv.errors.SearchError`): a search whose scores alone exceed the free memory is
refused before it starts, and running out of memory mid-search is one line that names
the settings to change. :func:`check_search_settings` checks beam, n-best and batch size
before any work. ``qkv translate`` and ``qkv evaluate`` call them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch import nn

from qkv.data.tokenizers import Tokenizer
from qkv.errors import CheckpointError, SearchError
from qkv.models.load import TRANSLATOR, load_trained
from qkv.models.memory import free_memory
from qkv.translate.evaluate import Translation, translate_texts, unknown_tokens

__all__ = ["check_search_settings", "load_translator", "translate_lines", "warn_unknown_tokens"]

log = logging.getLogger(__name__)

_BATCH = 64  # sentences per batch when the caller gives no batch size (``qkv evaluate``)
_UNKNOWN_LINES_NAMED = 10  # lines with unknown tokens named one by one; then one summary


def load_translator(path: str) -> tuple[nn.Module, Tokenizer, Tokenizer, dict]:
    """A translator checkpoint: ``(model, source tokenizer, target tokenizer, extra)``, read
    by :func:`qkv.models.load.load_trained`.

    Raises:
        CheckpointError: an unreadable checkpoint, one of another kind of model (a
            language model's names ``qkv sample``), no tokenizers, a tokenizer that cannot
            be read, or tokenizers of another run.
    """
    loaded = load_trained(path)
    if loaded.kind != TRANSLATOR:
        reader = {"gpt": "qkv sample", "llama": "qkv sample"}.get(loaded.model_type)
        hint = f"; `{reader} {path}` reads it" if reader else ""
        raise CheckpointError(f"{path}: a {loaded.model_type} checkpoint, not a translator{hint}")
    return loaded.model, loaded.source_tokenizer, loaded.tokenizer, loaded.extra


def check_search_settings(beam: int, n_best: int = 1, batch_size: int = 1) -> None:
    """Refuse a beam, n-best or batch size that no search can run with (the messages
    name the options of ``qkv translate`` and ``qkv evaluate``).

    Raises:
        SearchError: ``beam < 1``, ``n_best`` outside ``1 .. beam``, or ``batch_size < 1``.
    """
    if beam < 1:
        raise SearchError(f"--beam: must be >= 1, got {beam}")
    if not 1 <= n_best <= beam:
        raise SearchError(f"need 1 <= --n-best <= --beam, got --n-best {n_best} --beam {beam}")
    if batch_size < 1:
        raise SearchError(f"--batch-size: must be >= 1, got {batch_size}")


def warn_unknown_tokens(src_tok: Tokenizer, lines: list[str], what: str, first: int = 1) -> None:
    """Warn, per line, how many of its tokens the source vocabulary lacks: the model reads
    each as ``<unk>``, and an unknown word (English to a Korean model, an emoji) silently
    turns into words of the training text. After ``_UNKNOWN_LINES_NAMED`` lines one more
    warning counts the rest, so a file in the wrong language does not flood stderr.

    Args:
        src_tok: the source tokenizer.
        lines: the source texts.
        what: what a text is called in the warnings (``"line"``, ``"sentence"``).
        first: the number of ``lines[0]``.
    """
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
    model: nn.Module,
    src_tok: Tokenizer,
    tgt_tok: Tokenizer,
    lines: list[str],
    *,
    beam: int = 1,
    n_best: int = 1,
    batch_size: int | None = None,
    first_line: int = 1,
    progress: Callable[[int], None] | None = None,
) -> list[list[Translation]]:
    """:func:`~qkv.translate.evaluate.translate_texts` with a memory check first; a search
    too large for memory is one line, not a traceback.

    Args:
        model, src_tok, tgt_tok: the translator (:func:`load_translator`).
        lines: the source texts.
        beam, n_best: the search (``beam=1``: greedy).
        batch_size: sentences at a time; None: 64, a size the caller does not let the
            user choose (the refusals then suggest a smaller beam only).
        first_line: the number of ``lines[0]`` in warnings.
        progress: called after each batch with the number of lines translated so far.

    Returns:
        For each line, ``n_best`` translations, best first.

    Raises:
        SearchError: the float32 scores of ``beam x batch`` hypotheses over the target
            vocabulary exceed the free memory, or the search ran out of memory.
    """
    hint = "use a smaller --beam" + " or --batch-size" * (batch_size is not None)
    batch_size = _BATCH if batch_size is None else batch_size
    at_once = min(batch_size, max(len(lines), 1))
    sizes = f"--beam {beam} over {at_once} sentence{'s' * (at_once > 1)} at a time"
    _check_search_memory(model, beam * at_once, f"{sizes}: the scores alone", hint)
    try:
        return translate_texts(
            model,
            src_tok,
            tgt_tok,
            lines,
            beam=beam,
            n_best=n_best,
            batch_size=batch_size,
            progress=progress,
            first_line=first_line,
        )
    except RuntimeError as err:  # torch.OutOfMemoryError too
        if not _out_of_memory(err):
            raise
        raise SearchError(f"{sizes}: out of memory; {hint}") from None


def _check_search_memory(model: nn.Module, rows: int, what: str, hint: str) -> None:
    """Refuse ``rows`` hypotheses at a time whose float32 logits and log-probabilities over
    the target vocabulary (a lower bound of what the search holds) exceed free memory."""

    need = rows * model.config.tgt_vocab_size * 4 * 2
    free = free_memory(next(model.parameters()).device)
    if free is not None and need > free:
        raise SearchError(
            f"{what} need {need / 2**30:,.1f} GiB, more than the "
            f"{free / 2**30:,.1f} GiB free; {hint}"
        )


def _out_of_memory(err: RuntimeError) -> bool:
    return isinstance(err, torch.OutOfMemoryError) or "can't allocate memory" in str(err)
