"""``qkv evaluate``: sacreBLEU and chrF of a checkpoint on files, stdin or its recipe's split;
the accuracy and confusion matrix of an image classifier on its recipe's test (or valid) split.

What the user sees is decided here (scores, one-line errors, exit codes); translating is
:func:`qkv.translate.translator.translate_lines`, scoring :func:`qkv.translate.evaluate.bleu`
and :func:`~qkv.translate.evaluate.chrf`.
"""

from __future__ import annotations

import logging
import os
import stat
import sys
from pathlib import Path

from qkv.data.corpus import read_lines, read_stdin
from qkv.data.prepare import held_out_pairs
from qkv.errors import CheckpointError, ConfigError, CorpusError, UserError
from qkv.files import cache_root
from qkv.models.checkpoint import load_checkpoint, saved_extra
from qkv.train.classify import confusion_matrix, image_splits, predict
from qkv.train.progress import terminal_progress
from qkv.train.recipe import IMAGE_DATA, recipe_from_dict
from qkv.translate.evaluate import bleu, chrf, decoding_settings, unknown_tokens
from qkv.translate.translator import check_search_settings, load_translator, translate_lines

__all__ = ["run_evaluate"]

log = logging.getLogger(__name__)


def run_evaluate(args) -> int:
    """``qkv evaluate CHECKPOINT (--src FILE --ref FILE | --split test)``: BLEU and chrF.

    ``-`` as ``--src`` or ``--ref`` (not both) reads those lines from stdin, as
    ``qkv translate`` reads its sentences. A checkpoint of an image classifier (its
    recipe's ``data.kind`` holds images) is evaluated on its recipe's split instead
    (:func:`evaluate_images`).
    """
    recipe = (saved_extra(args.checkpoint) or {}).get("recipe")
    if isinstance(recipe, dict) and (recipe.get("data") or {}).get("kind") in IMAGE_DATA:
        return evaluate_images(args)
    check_search_settings(args.beam)
    if args.src == "-" and args.ref == "-":
        raise UserError("--src - and --ref -: only one of them can be read from stdin")
    tokenize = getattr(args, "tokenize", None)
    _check_tokenize(tokenize)
    model, src_tok, tgt_tok, extra = load_translator(args.checkpoint)
    src, ref = _evaluation_texts(args, extra)
    _warn_unknown_tokens(src_tok, src)
    with terminal_progress("translate", "sentences", len(src)) as progress:
        nbest = translate_lines(model, src_tok, tgt_tok, src, beam=args.beam, progress=progress)
    hyps = [n[0].text for n in nbest]
    # the same checkpoint scores differently under greedy and beam search: say which ran
    decoding = f"decoding: {decoding_settings(model, args.beam)}"
    print(f"{bleu(hyps, ref, tokenize=tokenize)}  {decoding}")
    print(f"{chrf(hyps, ref)}  {decoding}")
    return 0


def _warn_unknown_tokens(src_tok, lines: list[str]) -> None:
    """One warning for the whole test set: how many source tokens the model reads as
    ``<unk>`` (a test set in another language than training scores near zero)."""
    counts = [unknown_tokens(src_tok, line)[:2] for line in lines]
    unknown = sum(u for u, _ in counts)
    if unknown:
        log.warning(
            "%d of %d source tokens (in %d of %d sentences) are outside the model's "
            "vocabulary and read as <unk>; their translations may be meaningless",
            unknown,
            sum(t for _, t in counts),
            sum(1 for u, _ in counts if u),
            len(lines),
        )


def _check_tokenize(name: str | None) -> None:
    """Refuse, before translating, a ``--tokenize`` that sacreBLEU does not have or cannot
    load (``ja-mecab`` and ``ko-mecab`` need MeCab, ``spm`` and ``flores*`` sentencepiece)."""
    import sacrebleu

    if name is None:
        return
    if name not in sacrebleu.metrics.BLEU.TOKENIZERS:
        names = ", ".join(sacrebleu.metrics.BLEU.TOKENIZERS)
        raise UserError(f"--tokenize: unknown tokenizer {name!r}; one of {names}")
    try:
        sacrebleu.metrics.BLEU(tokenize=name)
    except (ImportError, RuntimeError) as err:  # sacreBLEU's messages span several lines
        raise UserError(f"--tokenize {name}: {' '.join(str(err).split())}") from None


def _evaluation_texts(args, extra: dict) -> tuple[list[str], list[str]]:
    """Source and reference lines: two files, or a split of the recipe stored at training."""

    split = getattr(args, "split", None)
    if split is not None:
        if args.src or args.ref:
            raise UserError("give either --split or --src and --ref, not both")
        return _recipe_split(args.checkpoint, extra, split)
    if not (args.src and args.ref):
        raise UserError("give --src FILE and --ref FILE, or --split valid|test")
    src = _read_text(args.src, "the source sentences")
    ref = _read_text(args.ref, "the reference translations")
    src_name, ref_name = _text_name(args.src), _text_name(args.ref)
    for name, lines in ((src_name, src), (ref_name, ref)):
        if not any(line.strip() for line in lines):
            raise UserError(f"{name}: is empty (no sentence to evaluate)")
    if len(src) != len(ref):
        raise UserError(f"line counts differ: {src_name} has {len(src)}, {ref_name} has {len(ref)}")
    return src, ref


def _read_text(path: str, what: str) -> list[str]:
    """The lines of file ``path``, or of stdin for ``-`` (``what`` they are: for errors)."""
    if path == "-":
        return read_stdin(what)
    try:
        return read_lines(path)
    except CorpusError as err:
        raise UserError(str(err)) from None


def _text_name(path: str) -> str:
    return "stdin" if path == "-" else path


def _recipe_split(checkpoint: str, extra: dict, split: str) -> tuple[list[str], list[str]]:
    """The held-out pairs the checkpoint's training recipe defines (same seed, same filter).

    The recipe comes from the checkpoint, so the files it names are read only when they
    are regular files under the folder training ran in (``extra["folder"]``), the current
    folder or qkv's download cache: a checkpoint naming ``/etc/shadow`` or a FIFO is
    refused before anything is read. Files elsewhere are read when the user names them
    (``--src`` and ``--ref``).
    """
    if "recipe" not in extra:
        raise UserError(f"{checkpoint}: holds no training recipe; give --src and --ref")
    folder = extra.get("folder")
    try:
        recipe = dict(extra["recipe"])
        recipe["data"] = _paths_from(folder, recipe.get("data") or {})
        data = recipe_from_dict(recipe).data
    except (ConfigError, CorpusError, OSError) as err:
        raise UserError(f"{checkpoint}: its recipe's data cannot be read: {err}") from None
    files = _split_files(data, split)
    for key, path in files:
        _check_recipe_file(checkpoint, folder, key, path)
    try:
        pairs = held_out_pairs(data, split)
    except (CorpusError, OSError) as err:
        raise UserError(f"{checkpoint}: its recipe's data cannot be read: {err}") from None
    if not pairs:
        raise UserError(f"{checkpoint}: its recipe has no {split} split")
    read = f" from {' and '.join(path for _, path in files)}" if files else ""
    print(f"{split} split of the training recipe: {len(pairs)} sentences{read}", file=sys.stderr)
    return [s for s, _ in pairs], [t for _, t in pairs]


def _split_files(data, split: str) -> list[tuple[str, str]]:
    """``(recipe key, path)`` of each file that reading ``split`` of ``data`` opens."""
    if data.kind == "files":
        return [(f"data.{split}", path) for path in getattr(data, split)]
    if data.kind == "tsv":
        return [("data.path", data.path)]
    return []  # the toy corpus is generated


def _check_recipe_file(checkpoint: str, folder, key: str, path: str) -> None:
    """Refuse a file of the stored recipe outside the folders it may read, or one that is
    not a regular file (a FIFO blocks forever, a device never ends)."""
    where = f"{checkpoint}: its recipe's {key} names {path}"
    target = Path(path).resolve()  # links followed: a link out of the folder points out
    roots = [Path.cwd().resolve(), cache_root().resolve()]
    if isinstance(folder, str) and Path(folder).is_absolute():
        roots.insert(0, Path(folder).resolve())
    if not any(target.is_relative_to(root) for root in roots):
        trained = f"the folder it was trained in ({folder}), " if len(roots) == 3 else ""
        raise UserError(
            f"{where}, outside {trained}the current folder and qkv's cache; "
            "give the files as --src and --ref to read them"
        )
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        return  # the reader names the missing file with its recipe key
    except OSError as err:
        raise UserError(f"{where}: {err.strerror or err}") from None
    if not stat.S_ISREG(mode):
        raise UserError(f"{where}: not a regular file; only regular files are read as a corpus")


def _paths_from(folder: str | None, data: dict) -> dict:
    """The recipe's data section, each relative corpus path that the current folder lacks
    read from ``folder`` (where training read it) when it is there: ``--split`` works
    from any folder, while a corpus copied beside the current folder still comes first."""
    if not isinstance(folder, str) or not isinstance(data, dict):
        return data

    def found(path):
        if not isinstance(path, str) or not path or Path(path).is_absolute():
            return path
        there = Path(folder) / path
        return str(there) if not Path(path).exists() and there.exists() else path

    moved = dict(data)
    for key in ("train", "valid", "test"):
        if isinstance(moved.get(key), list):
            moved[key] = [found(p) for p in moved[key]]
    if "path" in moved:
        moved["path"] = found(moved["path"])
    return moved


def evaluate_images(args) -> int:
    """Accuracy and confusion matrix of an image classifier on its recipe's ``--split``
    (``test`` by default; the images come from the recipe, so ``--src``/``--ref`` do not
    apply)."""
    if args.src or args.ref:
        raise UserError(
            f"{args.checkpoint}: an image classifier is evaluated on its recipe's "
            "split (--split test|valid), not on --src/--ref"
        )
    split = getattr(args, "split", None) or "test"
    try:
        ckpt = load_checkpoint(args.checkpoint, training_state=False)
        recipe = recipe_from_dict(ckpt.extra["recipe"])
    except CheckpointError as err:
        raise UserError(str(err)) from None
    except ConfigError as err:
        raise UserError(f"{args.checkpoint}: its recipe cannot be read: {err}") from None
    data = image_splits(recipe)
    names = data.tgt_tok.names
    images = getattr(data, split)
    predicted = predict(ckpt.model, images.images)
    matrix = confusion_matrix(predicted, images.labels, len(names))
    correct = int(matrix.diagonal().sum())
    print(f"{split} split of the training recipe: {len(images)} images")
    print(f"accuracy {100 * correct / len(images):.2f}% ({correct} of {len(images)})")
    print(confusion_table(matrix.tolist(), list(names)))
    return 0


def confusion_table(matrix: list[list[int]], names: list[str]) -> str:
    """The confusion matrix as text: a row per true class, a column per predicted class,
    and each row's total."""
    width = max(len(str(max(max(row) for row in matrix))), *map(len, names), 5)
    head = " " * (width + 1) + " ".join(n.rjust(width) for n in names) + " " + "total".rjust(width)
    lines = ["true \\ predicted", head]
    for name, row in zip(names, matrix):
        cells = " ".join(str(v).rjust(width) for v in row)
        lines.append(f"{name.rjust(width)} {cells} {str(sum(row)).rjust(width)}")
    return "\n".join(lines)
