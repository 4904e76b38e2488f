"""Translation and evaluation: batched search over texts, sacreBLEU and chrF.

BLEU is computed by sacreBLEU on detokenised text (the tokenizers decode exactly), so the
numbers are comparable with published ones; :func:`bleu` returns the score with its
sacreBLEU signature.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

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


@dataclass
class Score:
    """A corpus-level metric and the sacreBLEU signature that makes it reproducible."""

    name: str
    score: float
    signature: str

    def __str__(self) -> str:
        return f"{self.name} = {self.score:.2f}  ({self.signature})"


def bleu(hypotheses: list[str], references: list[str]) -> Score:
    """Corpus BLEU (Papineni et al. 2002) with sacreBLEU's defaults (13a, cased).

    Args:
        hypotheses: detokenised system outputs, one per sentence.
        references: one reference per sentence.
    """
    import sacrebleu

    _same_length(hypotheses, references)
    metric = sacrebleu.metrics.BLEU()
    result = metric.corpus_score(hypotheses, [references])
    return Score("BLEU", result.score, str(metric.get_signature()))


def chrf(hypotheses: list[str], references: list[str]) -> Score:
    """Corpus chrF (Popović 2015) with sacreBLEU's defaults."""
    import sacrebleu

    _same_length(hypotheses, references)
    metric = sacrebleu.metrics.CHRF()
    result = metric.corpus_score(hypotheses, [references])
    return Score("chrF", result.score, str(metric.get_signature()))


def _same_length(hyps: list[str], refs: list[str]) -> None:
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses but {len(refs)} references")


@dataclass
class Translation:
    """One n-best entry: detokenised text, token strings, score and alignment."""

    text: str
    tokens: list[str]
    score: float
    alignment: torch.Tensor | None  # (target tokens incl. a final EOS, source tokens)
    eos: bool = True  # False when the hypothesis stopped at the maximum length

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

    A text with no tokens (an empty or blank line) translates to one empty translation
    without running the model, so that outputs stay line-aligned with their inputs.

    Returns:
        For each input text, ``n_best`` translations, best first.
    """
    from qkv.search import beam as beam_search
    from qkv.search import greedy

    model.eval()
    device = next(model.parameters()).device
    ids = [src_tokenizer.encode(t) for t in texts]
    results: list[list[Translation]] = [
        [] if i else [Translation("", [], 0.0, None, eos=True)] for i in ids
    ]
    order = sorted((i for i in range(len(ids)) if ids[i]), key=lambda i: len(ids[i]))
    pad = model.pad_id
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        longest = max(len(ids[i]) for i in chunk)
        src = torch.full((len(chunk), longest), pad, dtype=torch.long)
        for row, i in enumerate(chunk):
            src[row, : len(ids[i])] = torch.tensor(ids[i])
        src = src.to(device)
        if beam == 1 and n_best == 1:
            hyps = [[h] for h in greedy(model, src)]
        else:
            hyps = beam_search(
                model, src, beam_size=beam, n_best=n_best, length_penalty=length_penalty
            )
        for i, nbest in zip(chunk, hyps):
            results[i] = [
                Translation(
                    tgt_tokenizer.decode(h.tokens),
                    [tgt_tokenizer.id_to_token(t) for t in h.tokens],
                    h.score,
                    h.alignment,
                    h.eos,
                )
                for h in nbest
            ]
    return results


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
    return (
        ckpt.model,
        tokenizer_from_json(ckpt.tokenizers["src"]),
        tokenizer_from_json(ckpt.tokenizers["tgt"]),
        ckpt.extra,
    )


def run_translate(args) -> int:
    """``qkv translate CHECKPOINT``: stdin to stdout, one sentence per line."""
    from qkv.cli import UserError

    if args.beam < 1 or args.n_best < 1 or args.n_best > args.beam:
        raise UserError(
            f"need 1 <= --n-best <= --beam, got --n-best {args.n_best} --beam {args.beam}"
        )
    model, src_tok, tgt_tok, _ = _load(args.checkpoint)
    lines = [line.rstrip("\n") for line in sys.stdin]
    out = translate_texts(
        model,
        src_tok,
        tgt_tok,
        lines,
        beam=args.beam,
        n_best=args.n_best,
        batch_size=args.batch_size,
    )
    for nbest in out:
        if args.n_best == 1:
            print(nbest[0].text)
        else:
            for rank, t in enumerate(nbest):
                print(f"{rank}\t{t.score:.4f}\t{t.text}")
    if args.show_attention:
        written = _write_alignments(args.show_attention, lines, out, src_tok)
        print("attention: " + ", ".join(map(str, written)), file=sys.stderr)
    return 0


def _write_alignments(path: str, lines: list[str], out, src_tok) -> list:
    from qkv.cli import UserError
    from qkv.viz import save_alignments

    items = []
    for text, nbest in zip(lines, out):
        best = nbest[0]
        if best.alignment is not None:
            src_tokens = [src_tok.id_to_token(i) for i in src_tok.encode(text)]
            items.append((best.alignment, src_tokens, best.target_labels, text))
    if not items:
        if not any(src_tok.encode(text) for text in lines):
            raise UserError("--show-attention: the input has no sentence to show")
        raise UserError("--show-attention: this model has no attention to show")
    try:
        return save_alignments(items, path)
    except ValueError as err:
        raise UserError(f"--show-attention {path}: {err}") from None


def run_evaluate(args) -> int:
    """``qkv evaluate CHECKPOINT (--src FILE --ref FILE | --split test)``: BLEU and chrF."""
    model, src_tok, tgt_tok, extra = _load(args.checkpoint)
    src, ref = _evaluation_texts(args, extra)
    hyps = [n[0].text for n in translate_texts(model, src_tok, tgt_tok, src, beam=args.beam)]
    print(bleu(hyps, ref))
    print(chrf(hyps, ref))
    return 0


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
