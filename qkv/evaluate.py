"""Translation and evaluation: batched search over texts, sacreBLEU and chrF.

BLEU is computed by sacreBLEU on detokenised text (the tokenizers decode exactly), so the
numbers are comparable with published ones; :func:`bleu` returns the score with its
sacreBLEU signature.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field

import torch
from torch import nn

__all__ = [
    "Score",
    "Translation",
    "bleu",
    "chrf",
    "translate_texts",
    "run_translate",
    "run_evaluate",
]

log = logging.getLogger(__name__)


@dataclass
class Score:
    """A corpus-level metric and the sacreBLEU signature that makes it reproducible."""

    name: str
    score: float
    signature: str

    def __str__(self) -> str:
        return f"{self.name} = {self.score:.2f}  ({self.signature})"


def bleu(
    hypotheses: list[str],
    references: list[str],
    *,
    tokenize: str | None = None,
    lowercase: bool = False,
) -> Score:
    """Corpus BLEU (Papineni et al. 2002) by sacreBLEU, with its defaults (13a, cased).

    Args:
        hypotheses: detokenised system outputs, one per sentence.
        references: one reference per sentence.
        tokenize: a sacreBLEU tokenizer (``13a``, ``intl``, ``zh``, ``char``, ``none``,
            ``ja-mecab``, ...); None: sacreBLEU's default, ``13a``.
        lowercase: case-insensitive BLEU.

    Raises:
        ValueError: no sentences, a text that is not a list of strings, different
            lengths, or an unknown ``tokenize``.
    """
    import sacrebleu

    _check_corpus(hypotheses, references)
    tokenizers = sacrebleu.metrics.BLEU.TOKENIZERS
    if tokenize is not None and tokenize not in tokenizers:
        raise ValueError(f"unknown BLEU tokenize {tokenize!r}; one of {', '.join(tokenizers)}")
    metric = sacrebleu.metrics.BLEU(tokenize=tokenize, lowercase=lowercase)
    result = metric.corpus_score(hypotheses, [references])
    return Score("BLEU", result.score, str(metric.get_signature()))


def chrf(hypotheses: list[str], references: list[str], *, word_order: int = 0) -> Score:
    """Corpus chrF (Popović 2015) by sacreBLEU, with its defaults; ``word_order=2``: chrF++."""
    import sacrebleu

    _check_corpus(hypotheses, references)
    metric = sacrebleu.metrics.CHRF(word_order=word_order)
    result = metric.corpus_score(hypotheses, [references])
    return Score("chrF", result.score, str(metric.get_signature()))


def _check_corpus(hyps: list[str], refs: list[str]) -> None:
    for name, texts in (("hypotheses", hyps), ("references", refs)):
        if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
            raise ValueError(f"{name}: expected a list of strings, one per sentence")
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses but {len(refs)} references")
    if not hyps:
        raise ValueError("no sentences to score")


@dataclass
class Translation:
    """One n-best entry: detokenised text, token strings, scores and alignment.

    ``score`` is the sum of the log-probabilities of the generated tokens (EOS included);
    ``normalized_score`` is that sum divided by the length penalty, what beam search ranks
    by (equal to ``score`` for greedy search).
    """

    text: str
    tokens: list[str]
    score: float
    alignment: torch.Tensor | None  # (target tokens incl. a final EOS, source tokens)
    eos: bool = True  # False when the hypothesis stopped at the maximum length
    normalized_score: float | None = None  # None: the same as score
    ids: list[int] = field(default_factory=list)  # the tokens' ids (no BOS, no EOS)

    def __post_init__(self) -> None:
        if self.normalized_score is None:
            self.normalized_score = self.score

    @property
    def target_labels(self) -> list[str]:
        """One label per alignment row: the tokens, and ``</s>`` when the output ended."""
        return self.tokens + (["</s>"] if self.eos else [])


@torch.no_grad()
def translate_texts(
    model: nn.Module,
    src_tokenizer,
    tgt_tokenizer,
    texts: list[str],
    *,
    beam: int = 1,
    n_best: int = 1,
    batch_size: int = 64,
    length_penalty: float = 0.6,
) -> list[list[Translation]]:
    """Translate ``texts`` with greedy (``beam=1``) or beam search, in length-sorted batches.

    Texts are stripped first, as training strips its sentences. A text with no tokens
    (an empty or blank line) translates to the empty translation (score 0) without running
    the model, so that outputs stay line-aligned with their inputs. A text longer than the
    model reads (``config.max_source_len``, e.g. the Transformer's ``max_len`` positions) is
    cut to that many tokens, with a warning logged.
    When fewer than ``n_best`` translations exist (a blank text has only one), the list is
    filled up with empty translations of score ``-inf``.

    Returns:
        For each input text, ``n_best`` translations, best first.
    """
    from qkv.search import beam as beam_search
    from qkv.search import greedy

    if beam < 1 or not 1 <= n_best <= beam or batch_size < 1:
        raise ValueError(
            f"need beam >= 1, 1 <= n_best <= beam and batch_size >= 1, "
            f"got beam={beam}, n_best={n_best}, batch_size={batch_size}"
        )
    model.eval()
    device = next(model.parameters()).device
    config = getattr(model, "config", None)
    ids = _fit_sources([src_tokenizer.encode(t.strip()) for t in texts], config)
    results: list[list[Translation]] = [
        [] if i else [Translation("", [], 0.0, None, eos=True)] for i in ids
    ]
    order = sorted((i for i in range(len(ids)) if ids[i]), key=lambda i: len(ids[i]))
    pad, max_len = model.pad_id, getattr(config, "max_target_len", None)
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        longest = max(len(ids[i]) for i in chunk)
        src = torch.full((len(chunk), longest), pad, dtype=torch.long)
        for row, i in enumerate(chunk):
            src[row, : len(ids[i])] = torch.tensor(ids[i])
        src = src.to(device)
        if beam == 1 and n_best == 1:
            hyps = [[h] for h in greedy(model, src, max_len=max_len)]
        else:
            hyps = beam_search(
                model, src, beam_size=beam, n_best=n_best, length_penalty=length_penalty,
                max_len=max_len,
            )  # fmt: skip
        for i, nbest in zip(chunk, hyps):
            results[i] = [
                Translation(
                    tgt_tokenizer.decode(h.tokens),
                    [tgt_tokenizer.id_to_token(t) for t in h.tokens],
                    h.score,
                    h.alignment,
                    h.eos,
                    h.normalized_score,
                    list(h.tokens),
                )
                for h in nbest
            ]
    filler = Translation("", [], float("-inf"), None, eos=False)
    return [r + [filler] * (n_best - len(r)) for r in results]


def _fit_sources(ids: list[list[int]], config) -> list[list[int]]:
    """Cut sources to the longest the model reads, with one warning for all cut lines."""
    limit = getattr(config, "max_source_len", None)
    long = [n for n, x in enumerate(ids, start=1) if limit is not None and len(x) > limit]
    if not long:
        return ids
    if len(long) == 1:
        n = long[0]
        log.warning(
            "line %d: %d source tokens, more than the %d the model reads (its max_len); "
            "translating its first %d", n, len(ids[n - 1]), limit, limit,
        )  # fmt: skip
    else:
        shown = ", ".join(map(str, long[:10])) + (", ..." if len(long) > 10 else "")
        log.warning(
            "%d lines have more than the %d source tokens the model reads (its max_len): "
            "lines %s; each is translated from its first %d", len(long), limit, shown, limit,
        )  # fmt: skip
    return [x[:limit] for x in ids]


def _load(path: str):
    from qkv.cli import UserError
    from qkv.data.tokenizers import tokenizer_from_json
    from qkv.models.checkpoint import CheckpointError, load_checkpoint

    try:
        ckpt = load_checkpoint(path)
    except CheckpointError as err:
        raise UserError(str(err)) from None
    if set(ckpt.tokenizers) != {"src", "tgt"}:
        raise UserError(f"{path}: the checkpoint holds no tokenizers")
    tokenizers = {}
    for side in ("src", "tgt"):
        try:
            tokenizers[side] = tokenizer_from_json(ckpt.tokenizers[side])
        except ValueError as err:
            raise UserError(f"{path}: its {side} tokenizer cannot be read: {err}") from None
    return ckpt.model, tokenizers["src"], tokenizers["tgt"], ckpt.extra


def _check_search_args(args) -> None:
    """``--beam``, ``--n-best`` and ``--batch-size`` (those the command has) are usable."""
    from qkv.cli import UserError

    if args.beam < 1:
        raise UserError(f"--beam: must be >= 1, got {args.beam}")
    n_best = getattr(args, "n_best", 1)
    if not 1 <= n_best <= args.beam:
        raise UserError(f"need 1 <= --n-best <= --beam, got --n-best {n_best} --beam {args.beam}")
    if getattr(args, "batch_size", 1) < 1:
        raise UserError(f"--batch-size: must be >= 1, got {args.batch_size}")


def _read_stdin() -> list[str]:
    """stdin as UTF-8 lines; bytes that are not UTF-8 are an error naming line and byte."""
    from qkv.cli import UserError
    from qkv.data.corpus import CorpusError, decode_lines

    stream = getattr(sys.stdin, "buffer", None)  # None when stdin was replaced by a text stream
    data = stream.read() if stream is not None else sys.stdin.read().encode("utf-8")
    try:
        return decode_lines(data, "stdin")
    except CorpusError as err:
        raise UserError(str(err)) from None


def run_translate(args) -> int:
    """``qkv translate CHECKPOINT``: stdin to stdout, one sentence per line.

    With ``--n-best K`` every input line gives exactly K rows,
    ``LINE<TAB>RANK<TAB>SCORE<TAB>LOGPROB<TAB>TRANSLATION``: the 1-based input line and
    rank, the length-normalised score that ranks them, and the plain sum of
    log-probabilities. A blank line's first row is the empty translation (scores 0), and
    rows with no translation behind them have scores ``-inf`` and no text. The
    translation is escaped (:func:`_tsv_field`) so that each row has exactly five fields.
    """
    _check_search_args(args)
    model, src_tok, tgt_tok, _ = _load(args.checkpoint)
    if args.show_attention:
        _check_attention_output(args.show_attention, model)
    lines = _read_stdin()
    out = translate_texts(
        model,
        src_tok,
        tgt_tok,
        lines,
        beam=args.beam,
        n_best=args.n_best,
        batch_size=args.batch_size,
    )
    for number, nbest in enumerate(out, start=1):
        if args.n_best == 1:
            print(nbest[0].text)
        else:
            for rank, t in enumerate(nbest, start=1):
                scores = f"{t.normalized_score:.4f}\t{t.score:.4f}"
                print(f"{number}\t{rank}\t{scores}\t{_tsv_field(t.text)}")
    if args.show_attention:
        written = _write_alignments(args.show_attention, lines, out, src_tok, model)
        print("attention: " + ", ".join(map(str, written)), file=sys.stderr)
    return 0


_TSV_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def _tsv_field(text: str) -> str:
    """``text`` as one TSV field: backslash, tab, LF and CR become ``\\\\``, ``\\t``,
    ``\\n``, ``\\r`` (a character or BPE vocabulary holds every character of the
    training text, tabs included, and a raw tab would add a column)."""
    return text.translate(_TSV_ESCAPES)


def _check_attention_output(path: str, model) -> None:
    """Refuse, before translating, an ``--show-attention`` path that cannot be written."""
    import os
    from pathlib import Path

    from qkv.cli import UserError
    from qkv.viz.alignments import _HTML, _IMAGES

    where = f"--show-attention {path}"
    target = Path(path)
    if target.suffix.lower() not in _HTML + _IMAGES:
        raise UserError(f"{where}: the name must end in {', '.join(_HTML + _IMAGES)}")
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
    from qkv.cli import UserError
    from qkv.viz.translations import save_translations

    entries = []
    for text, nbest in zip(lines, out):
        best = nbest[0]
        if best.alignment is not None:
            ids = src_tok.encode(text.strip())[: best.alignment.shape[-1]]  # a long line was cut
            entries.append((text, ids, [src_tok.id_to_token(i) for i in ids], best))
    if not entries:
        if not any(src_tok.encode(text.strip()) for text in lines):
            raise UserError("--show-attention: the input has no sentence to show")
        raise UserError("--show-attention: this model has no attention to show")
    try:
        return save_translations(model, entries, path)
    except ValueError as err:
        raise UserError(f"--show-attention {path}: {err}") from None


def run_evaluate(args) -> int:
    """``qkv evaluate CHECKPOINT (--src FILE --ref FILE | --split test)``: BLEU and chrF."""
    _check_search_args(args)
    tokenize = getattr(args, "tokenize", None)
    _check_tokenize(tokenize)
    model, src_tok, tgt_tok, extra = _load(args.checkpoint)
    src, ref = _evaluation_texts(args, extra)
    hyps = [n[0].text for n in translate_texts(model, src_tok, tgt_tok, src, beam=args.beam)]
    print(bleu(hyps, ref, tokenize=tokenize))
    print(chrf(hyps, ref))
    return 0


def _check_tokenize(name: str | None) -> None:
    """Refuse, before translating, a ``--tokenize`` that sacreBLEU does not have or cannot
    load (``ja-mecab`` and ``ko-mecab`` need MeCab, ``spm`` and ``flores*`` sentencepiece)."""
    import sacrebleu

    from qkv.cli import UserError

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
    from qkv.cli import UserError
    from qkv.data.corpus import CorpusError, read_lines

    split = getattr(args, "split", None)
    if split is not None:
        if args.src or args.ref:
            raise UserError("give either --split or --src and --ref, not both")
        return _recipe_split(args.checkpoint, extra, split)
    if not (args.src and args.ref):
        raise UserError("give --src FILE and --ref FILE, or --split valid|test")
    try:
        src, ref = read_lines(args.src), read_lines(args.ref)
    except CorpusError as err:
        raise UserError(str(err)) from None
    for path, lines in ((args.src, src), (args.ref, ref)):
        if not any(line.strip() for line in lines):
            raise UserError(f"{path}: is empty (no sentence to evaluate)")
    if len(src) != len(ref):
        raise UserError(f"line counts differ: {args.src} has {len(src)}, {args.ref} has {len(ref)}")
    return src, ref


def _recipe_split(checkpoint: str, extra: dict, split: str) -> tuple[list[str], list[str]]:
    """The held-out pairs the checkpoint's training recipe defines (same seed, same filter)."""
    from qkv.cli import UserError
    from qkv.data.corpus import CorpusError
    from qkv.data.prepare import load_pairs
    from qkv.recipe import ConfigError, recipe_from_dict

    if "recipe" not in extra:
        raise UserError(f"{checkpoint}: holds no training recipe; give --src and --ref")
    try:
        _, valid, test = load_pairs(recipe_from_dict(extra["recipe"]).data)
    except (ConfigError, CorpusError, OSError) as err:
        raise UserError(f"{checkpoint}: its recipe's data cannot be read: {err}") from None
    pairs = {"valid": valid, "test": test}[split]
    if not pairs:
        raise UserError(f"{checkpoint}: its recipe has no {split} split")
    print(f"{split} split of the training recipe: {len(pairs)} sentences", file=sys.stderr)
    return [s for s, _ in pairs], [t for _, t in pairs]
