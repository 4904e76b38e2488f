"""Translation and evaluation: batched search over texts, sacreBLEU and chrF.

BLEU is computed by sacreBLEU on detokenised text (the tokenizers decode exactly), so the
numbers are comparable with published ones; :func:`bleu` returns the score with its
sacreBLEU signature. The commands ``qkv translate`` and ``qkv evaluate`` are in
:mod:`qkv.cli.translate` and :mod:`qkv.cli.evaluate`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from qkv.translate.search import MAX_LEN_OFFSET, MAX_LEN_RATIO, greedy
from qkv.translate.search import beam as beam_search

__all__ = [
    "LENGTH_PENALTY",
    "Score",
    "Translation",
    "bleu",
    "chrf",
    "decoding_settings",
    "translate_texts",
    "unknown_tokens",
]

log = logging.getLogger(__name__)

LENGTH_PENALTY = 0.6  # alpha of Wu et al. (2016), with which beam search ranks its hypotheses


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
    length_penalty: float = LENGTH_PENALTY,
    progress: Callable[[int], None] | None = None,
    first_line: int = 1,
) -> list[list[Translation]]:
    """Translate ``texts`` with greedy (``beam=1``) or beam search, in length-sorted batches.

    Texts are stripped first, as training strips its sentences. A text with no tokens
    (an empty or blank line) translates to the empty translation (score 0) without running
    the model, so that outputs stay line-aligned with their inputs. A text longer than the
    model reads (``config.max_source_len``, e.g. the Transformer's ``max_len`` positions) is
    cut to that many tokens, with a warning logged.
    When fewer than ``n_best`` translations exist (a blank text has only one), the list is
    filled up with empty translations of score ``-inf``. ``progress``, if given, is called
    after each batch with the number of texts translated so far (blank ones included).
    ``first_line`` is the line number of ``texts[0]`` in warnings (a caller that
    translates a stream line by line passes each line's own number).

    Returns:
        For each input text, ``n_best`` translations, best first.
    """
    _check_search_sizes(beam, n_best, batch_size)
    model.eval()
    device = next(model.parameters()).device
    config = getattr(model, "config", None)
    ids = _fit_sources([src_tokenizer.encode(t.strip()) for t in texts], config, first_line)
    results: list[list[Translation]] = [
        [] if i else [Translation("", [], 0.0, None, eos=True)] for i in ids
    ]
    # shortest first, so that each batch pads little; blank texts need no search
    order = sorted((i for i in range(len(ids)) if ids[i]), key=lambda i: len(ids[i]))
    pad, max_len = model.pad_id, getattr(config, "max_target_len", None)
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        src = _padded([ids[i] for i in chunk], pad).to(device)
        hyps = _search_batch(model, src, beam, n_best, length_penalty, max_len)
        for i, nbest in zip(chunk, hyps):
            results[i] = [_translation(h, tgt_tokenizer) for h in nbest]
        if progress is not None:
            progress(len(texts) - len(order) + start + len(chunk))
    filler = Translation("", [], float("-inf"), None, eos=False)
    return [r + [filler] * (n_best - len(r)) for r in results]


def decoding_settings(model: nn.Module, beam: int, length_penalty: float = LENGTH_PENALTY) -> str:
    """The search :func:`translate_texts` runs with ``beam``, in words, for printing beside
    a score: the same checkpoint scores differently under greedy and beam search.

    Returns:
        e.g. ``"beam 5, length penalty 0.6, max length 1.5 × source + 10 (at most 16)"``
        or ``"greedy, max length 1.5 × source + 10"``: the search, the alpha of the length
        penalty that ranks beam hypotheses (Wu et al. 2016; greedy search ranks nothing),
        and the longest translation of a source of ``source`` tokens, capped by the
        decoder's positions (``config.max_target_len``) when it has a limit.
    """
    search = "greedy" if beam == 1 else f"beam {beam}, length penalty {length_penalty:g}"
    longest = f"max length {MAX_LEN_RATIO:g} × source + {MAX_LEN_OFFSET}"
    positions = getattr(getattr(model, "config", None), "max_target_len", None)
    if positions is not None:
        longest += f" (at most {positions})"
    return f"{search}, {longest}"


def unknown_tokens(tokenizer, text: str) -> tuple[int, int, list[str]]:
    """The tokens of ``text`` that the vocabulary lacks (each reads as ``<unk>``).

    Args:
        tokenizer: a source tokenizer (:mod:`qkv.data.tokenizers`).
        text: one source text, stripped as :func:`translate_texts` strips it.

    Returns:
        ``(unknown, total, pieces)``: how many of the ``total`` tokens are unknown, and
        the unknown words or characters themselves when the tokenizer splits text into
        whole words or characters (empty for BPE, whose pieces do not map back to text).
    """
    text = text.strip()
    ids = tokenizer.encode(text)
    unknown = [n for n, i in enumerate(ids) if i == tokenizer.unk_id]
    if not unknown:
        return 0, len(ids), []
    kind = getattr(tokenizer, "kind", "")
    pieces = {"word": [w for w in text.split(" ") if w], "char": list(text)}.get(kind, [])
    shown = [pieces[n] for n in unknown] if len(pieces) == len(ids) else []
    return len(unknown), len(ids), shown


def _check_search_sizes(beam: int, n_best: int, batch_size: int) -> None:
    if beam < 1 or not 1 <= n_best <= beam or batch_size < 1:
        raise ValueError(
            f"need beam >= 1, 1 <= n_best <= beam and batch_size >= 1, "
            f"got beam={beam}, n_best={n_best}, batch_size={batch_size}"
        )


def _padded(rows: list[list[int]], pad: int) -> torch.Tensor:
    """Token ids of several sources as one ``(B, Tk)`` batch, padded at the end with ``pad``."""
    src = torch.full((len(rows), max(map(len, rows))), pad, dtype=torch.long)  # (B, Tk)
    for row, tokens in enumerate(rows):
        src[row, : len(tokens)] = torch.tensor(tokens)
    return src


def _search_batch(
    model: nn.Module, src: torch.Tensor, beam: int, n_best: int, length_penalty: float, max_len
) -> list:
    """For each row of ``src`` ``(B, Tk)``, its ``n_best`` hypotheses: greedy search for one
    hypothesis of a beam of one, else beam search."""
    if beam == 1 and n_best == 1:
        return [[h] for h in greedy(model, src, max_len=max_len)]
    return beam_search(
        model,
        src,
        beam_size=beam,
        n_best=n_best,
        length_penalty=length_penalty,
        max_len=max_len,
    )


def _translation(hyp, tgt_tokenizer) -> Translation:
    """A search hypothesis as a :class:`Translation`, its tokens decoded."""
    return Translation(
        tgt_tokenizer.decode(hyp.tokens),
        [tgt_tokenizer.id_to_token(t) for t in hyp.tokens],
        hyp.score,
        hyp.alignment,
        hyp.eos,
        hyp.normalized_score,
        list(hyp.tokens),
    )


def _fit_sources(ids: list[list[int]], config, first_line: int = 1) -> list[list[int]]:
    """Cut sources to the longest the model reads, with one warning for all cut lines."""
    limit = getattr(config, "max_source_len", None)
    long = [n for n, x in enumerate(ids, start=first_line) if limit is not None and len(x) > limit]
    if not long:
        return ids
    if len(long) == 1:
        n = long[0]
        log.warning(
            "line %d: %d source tokens, more than the %d the model reads (its max_len); "
            "translating its first %d",
            n,
            len(ids[n - first_line]),
            limit,
            limit,
        )
    else:
        shown = ", ".join(map(str, long[:10])) + (", ..." if len(long) > 10 else "")
        log.warning(
            "%d lines have more than the %d source tokens the model reads (its max_len): "
            "lines %s; each is translated from its first %d",
            len(long),
            limit,
            shown,
            limit,
        )
    return [x[:limit] for x in ids]
