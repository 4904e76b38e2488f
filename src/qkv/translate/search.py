"""Greedy and beam search over any encoder–decoder with the
:mod:`~qkv.models.translators.seq2seq` interface.

Both decode a batch of sentences at once, one target token per step, through
``model.encode`` and ``model.decode_step``: a Transformer carries its KV cache (the
source's cross-attention keys/values are computed once), an RNN its recurrent state.

Scores are sums of the model's log-probabilities (log-softmax over the whole target
vocabulary, EOS included). Beam search ranks finished hypotheses by the length-normalised
score of Wu et al. (2016), where ``|Y|`` counts the generated tokens, EOS included:

.. math::
    s(Y) = \\frac{\\log P(Y \\mid X)}{lp(Y)}, \\qquad
    lp(Y) = \\left(\\frac{5 + |Y|}{6}\\right)^{\\alpha}

The padding and BOS tokens are never generated. A hypothesis ends with EOS or when it
reaches its sentence's maximum length, ``int(max_len_ratio * S + max_len_offset)`` for a
source of ``S`` real tokens (capped by ``max_len`` and by the decoder's positions,
``model.config.max_target_len``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import Tensor

from qkv.models.translators.seq2seq import DecoderState, Seq2Seq, Seq2SeqAttention, source_mask

__all__ = ["MAX_LEN_OFFSET", "MAX_LEN_RATIO", "Hypothesis", "beam", "greedy", "length_penalty"]

logger = logging.getLogger(__name__)

# a sentence of S source tokens gets at most int(MAX_LEN_RATIO * S + MAX_LEN_OFFSET) target tokens
MAX_LEN_RATIO = 1.5
MAX_LEN_OFFSET = 10


@dataclass
class Hypothesis:
    """One decoded target sentence.

    Attributes:
        tokens: generated token ids, without BOS and without the final EOS.
        score: sum of the log-probabilities of every generated token (EOS included).
        normalized_score: ``score / lp(length)``, what beam search ranks by.
        alignment: ``(length, S)`` attention of each generated token (EOS included) over
            the ``S`` real source tokens, or ``None`` for a model without attention.
        eos: ``True`` when the hypothesis ended with EOS, ``False`` when it hit the
            maximum length.
    """

    tokens: list[int]
    score: float
    normalized_score: float
    alignment: Tensor | None
    eos: bool

    @property
    def length(self) -> int:
        """Generated tokens, EOS included: the ``|Y|`` of the length penalty."""
        return len(self.tokens) + int(self.eos)


def length_penalty(length: int, alpha: float) -> float:
    """Wu et al. (2016): :math:`((5 + |Y|) / 6)^\\alpha` (1 for ``alpha = 0``)."""
    return ((5.0 + length) / 6.0) ** alpha


@dataclass
class _Setup:
    """Everything a search derives from its arguments before the first step."""

    mask: Tensor  # (B, S) real source tokens
    limits: Tensor  # (B,) maximum target length per sentence
    banned: list[int]  # token ids never generated
    bos: int
    eos: int
    min_len: int


def _setup(model, src, src_mask, ratio, offset, max_len, min_len, bos_id, eos_id) -> _Setup:
    mask = source_mask(src, src_mask, model.pad_id)
    bos = model.bos_id if bos_id is None else bos_id
    eos = model.eos_id if eos_id is None else eos_id
    vocab = getattr(getattr(model, "config", None), "tgt_vocab_size", None)
    for name, index in (("bos_id", bos), ("eos_id", eos)):
        if vocab is not None and not 0 <= index < vocab:
            raise ValueError(f"{name} {index} is outside the target vocabulary 0..{vocab - 1}")
    limits = (ratio * mask.sum(-1).double() + offset).long().clamp(min=1)  # (B,)
    if max_len is not None:
        if max_len < 1:
            raise ValueError(f"max_len must be >= 1, got {max_len}")
        limits = limits.clamp(max=max_len)
    positions = getattr(getattr(model, "config", None), "max_target_len", None)
    if positions is not None:  # the decoder's positions: never decode past them
        limits = limits.clamp(max=positions)
    banned = sorted({model.pad_id, bos} - {eos})
    return _Setup(mask, limits, banned, bos, eos, min_len)


def _log_probs(logits: Tensor, step: int, setup: _Setup) -> Tensor:
    """Log-softmax over the vocabulary ``(N, V)``; banned tokens (and early EOS) get -inf."""
    logp = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), -1)
    logp[:, setup.banned] = float("-inf")
    if step < setup.min_len:
        logp[:, setup.eos] = float("-inf")
    return logp


def _step_alignment(attn: Seq2SeqAttention) -> Tensor | None:
    """This step's ``(N, S)`` alignment, or ``None``."""
    return None if attn.alignment is None else attn.alignment[:, -1]


@torch.no_grad()
def greedy(
    model: Seq2Seq,
    src: Tensor,
    src_mask: Tensor | None = None,
    *,
    max_len_ratio: float = MAX_LEN_RATIO,
    max_len_offset: int = MAX_LEN_OFFSET,
    max_len: int | None = None,
    min_len: int = 0,
    length_penalty: float = 0.0,
    bos_id: int | None = None,
    eos_id: int | None = None,
) -> list[Hypothesis]:
    """Greedy decoding: the most probable token at every step, for a batch of sources.

    Args:
        model: a :class:`~qkv.models.translators.seq2seq.Seq2Seq` (in eval mode).
        src: source token ids ``(B, S)``.
        src_mask: ``(B, S)``, ``True`` for real tokens (from ``model.pad_id`` when None).
        max_len_ratio, max_len_offset: maximum target length ``int(ratio * S + offset)``.
        max_len: an absolute cap on the target length.
        min_len: EOS is forbidden before this many tokens.
        length_penalty: alpha of the length penalty, as in :func:`beam`; only for the
            reported ``normalized_score`` (greedy picks tokens the same way whatever it is).
        bos_id, eos_id: defaults ``model.bos_id`` and ``model.eos_id``.

    Returns:
        One :class:`Hypothesis` per source sentence (an empty list for an empty batch).
    """
    setup = _setup(
        model, src, src_mask, max_len_ratio, max_len_offset, max_len, min_len, bos_id, eos_id
    )
    b = src.shape[0]
    if b == 0:
        return []
    state = model.encode(src, setup.mask)
    prev = torch.full((b,), setup.bos, dtype=torch.long, device=src.device)
    done = torch.zeros(b, dtype=torch.bool, device=src.device)
    scores = torch.zeros(b, dtype=torch.float64, device=src.device)
    tokens, aligns = [], []
    for t in range(int(setup.limits.max())):
        logits, state, attn = model.decode_step(state, prev)
        best, tok = _log_probs(logits, t, setup).max(-1)  # (B,), (B,)
        scores += torch.where(done, 0.0, best.double())
        tok = tok.masked_fill(done, model.pad_id)
        tokens.append(tok)
        aligns.append(_step_alignment(attn))
        done = done | (tok == setup.eos) | (t + 1 >= setup.limits)
        prev = tok
        if bool(done.all()):
            break
    return _greedy_hypotheses(torch.stack(tokens, 1), scores, aligns, setup, length_penalty)


def _greedy_hypotheses(
    tokens: Tensor, scores: Tensor, aligns: list, setup: _Setup, alpha: float
) -> list[Hypothesis]:
    """Cut each row ``(B, T)`` at its EOS or its maximum length."""
    align = None if aligns[0] is None else torch.stack(aligns, 1)  # (B, T, S)
    limits, src_lens = setup.limits.tolist(), setup.mask.sum(-1).tolist()
    scores_list = scores.tolist()
    out = []
    for i, row in enumerate(tokens.tolist()):
        row = row[: limits[i]]
        eos = setup.eos in row
        length = row.index(setup.eos) + 1 if eos else len(row)
        score = scores_list[i]
        out.append(
            Hypothesis(
                tokens=row[: length - int(eos)],
                score=score,
                normalized_score=score / length_penalty(length, alpha),
                alignment=None if align is None else align[i, :length, : src_lens[i]],
                eos=eos,
            )
        )
    return out


@torch.no_grad()
def beam(
    model: Seq2Seq,
    src: Tensor,
    beam_size: int = 5,
    length_penalty: float = 0.0,
    n_best: int = 1,
    src_mask: Tensor | None = None,
    *,
    max_len_ratio: float = MAX_LEN_RATIO,
    max_len_offset: int = MAX_LEN_OFFSET,
    max_len: int | None = None,
    min_len: int = 0,
    bos_id: int | None = None,
    eos_id: int | None = None,
) -> list[list[Hypothesis]]:
    """Beam search for a batch of sources (Sutskever et al. 2014; Wu et al. 2016).

    Each sentence keeps ``beam_size`` live prefixes. At every step the ``2 * beam_size``
    best extensions are taken; those among the best ``beam_size`` that end in EOS (or at
    the maximum length) join the sentence's finished list, and the best ``beam_size``
    extensions that do not end go on, so the beam never shrinks. A sentence stops when it
    has ``beam_size`` finished hypotheses, when no live prefix can still beat its
    ``n_best``-th finished one (log-probabilities only fall, so the bound
    :math:`s / \\max lp` is safe), or at its maximum length; the search stops early when
    every sentence has stopped.

    Args:
        model: a :class:`~qkv.models.translators.seq2seq.Seq2Seq` (in eval mode).
        src: source token ids ``(B, S)``.
        beam_size: live prefixes per sentence, K.
        length_penalty: alpha of the length penalty (0: rank by the plain sum).
        n_best: hypotheses returned per sentence (at most ``beam_size``).
        src_mask, max_len_ratio, max_len_offset, max_len, min_len, bos_id, eos_id: as
            :func:`greedy`.

    Returns:
        For each source sentence, its ``n_best`` hypotheses, best first.
    """
    for name, value in (("beam_size", beam_size), ("n_best", n_best)):
        if not isinstance(value, int):
            raise ValueError(f"{name} must be an int, got {value!r}")
    if beam_size < 1 or not 1 <= n_best <= beam_size:
        raise ValueError(
            f"need beam_size >= 1 and 1 <= n_best <= beam_size, "
            f"got beam_size={beam_size}, n_best={n_best}"
        )
    setup = _setup(
        model, src, src_mask, max_len_ratio, max_len_offset, max_len, min_len, bos_id, eos_id
    )
    if src.shape[0] == 0:
        return []
    search = _Beam(model, src, setup, beam_size, length_penalty, n_best)
    return search.run()


class _Beam:
    """The bookkeeping of one batched beam search (rows are ``sentence * K + beam``)."""

    def __init__(self, model, src: Tensor, setup: _Setup, k: int, alpha: float, n_best: int):
        self.model, self.setup, self.k, self.alpha, self.n_best = model, setup, k, alpha, n_best
        self.b = b = src.shape[0]
        self.device = src.device
        self.state: DecoderState = model.encode(src, setup.mask)
        self.state.reorder(torch.arange(b, device=self.device).repeat_interleave(k))
        self.scores = torch.full((b, k), float("-inf"), dtype=torch.float64, device=self.device)
        self.scores[:, 0] = 0.0  # all K rows start identical: only the first one is live
        self.prefix = torch.empty(b * k, 0, dtype=torch.long, device=self.device)  # (B*K, t)
        self.align: Tensor | None = None  # (B*K, t, S)
        self.finished: list[list[Hypothesis]] = [[] for _ in range(b)]
        self.done = torch.zeros(b, dtype=torch.bool, device=self.device)
        self.done_flags = [False] * b  # the same on the host, to avoid a sync per sentence
        self.limits, self.limit_t = setup.limits.tolist(), setup.limits
        self.src_lens = setup.mask.sum(-1).tolist()
        self.offsets = torch.arange(b, device=self.device).unsqueeze(1) * k  # (B, 1)
        self.ids = list(range(b))  # the input sentence of each sentence still in the batch

    def run(self) -> list[list[Hypothesis]]:
        prev = torch.full((self.b * self.k,), self.setup.bos, dtype=torch.long, device=self.device)
        longest = int(self.setup.limits.max())
        for t in range(longest):
            logits, self.state, attn = self.model.decode_step(self.state, prev)
            logp = _log_probs(logits, t, self.setup)  # (B*K, V)
            step_align = _step_alignment(attn)  # (B*K, S) or None
            prev = self._advance(t, logp, step_align)
            if all(self.done_flags):
                break
            prev = self._drop_stopped(prev)
        logger.debug(
            "beam search: %d sentences, %d of at most %d steps", len(self.finished), t + 1, longest
        )
        return [sorted(f, key=_rank)[: self.n_best] for f in self.finished]

    def _advance(self, t: int, logp: Tensor, step_align: Tensor | None) -> Tensor:
        """Extend every live prefix by one token; returns the new last tokens ``(B*K,)``."""
        b, k = self.b, self.k
        # A sentence's 2K best extensions are among each of its beams' own 2K best tokens
        # (a beam adds the same score to all its tokens): rank those, in float64.
        n = min(2 * k, logp.shape[-1])
        best, tokens = logp.topk(n, dim=1)  # (B*K, n)
        cand = (self.scores.view(-1, 1) + best.double()).view(b, k * n)  # (B, K*n)
        top, idx = cand.topk(min(2 * k, k * n), dim=1)  # (B, 2K), best first
        origin, token = idx // n, tokens.view(b, k * n).gather(1, idx)  # beam, token id
        ends = (token == self.setup.eos) | (t + 1 >= self.limit_t).unsqueeze(1)
        live = torch.isfinite(top) & ~self.done.unsqueeze(1)
        live[:, k:] = False  # an ending ranked below the K best would not have been in the beam
        self._collect(t, top, origin + self.offsets, token, ends & live, step_align)

        # the K best extensions that did not end go on
        new_scores, pick = top.masked_fill(ends, float("-inf")).topk(k, dim=1)  # (B, K)
        rows = (origin.gather(1, pick) + self.offsets).view(-1)  # (B*K,)
        new_tokens = token.gather(1, pick).view(-1)
        self.state.reorder(rows, same_source=True)  # beams never leave their sentence
        self.prefix = torch.cat([self.prefix[rows], new_tokens.unsqueeze(1)], 1)
        if step_align is not None:
            aligned = step_align[rows].unsqueeze(1)  # (B*K, 1, S)
            self.align = (
                aligned if self.align is None else torch.cat([self.align[rows], aligned], 1)
            )
        self.scores = new_scores
        self._update_done(t)
        self.scores = self.scores.masked_fill(self.done.unsqueeze(1), float("-inf"))
        return new_tokens

    def _drop_stopped(self, prev: Tensor) -> Tensor:
        """Once a quarter of the batch has stopped, carry on with the other sentences only.

        Stopped sentences would otherwise keep their K rows in every step, computed for
        nothing; one reorder of the caches is cheaper (measured: BENCHMARKS.md, 'search').
        """
        keep = [i for i, stopped in enumerate(self.done_flags) if not stopped]
        if len(keep) > 0.75 * len(self.done_flags):
            return prev
        pos = torch.tensor(keep, device=self.device)
        rows = (pos.unsqueeze(1) * self.k + torch.arange(self.k, device=self.device)).view(-1)
        self.state.reorder(rows)
        self.prefix, self.scores = self.prefix[rows], self.scores[pos]
        self.align = None if self.align is None else self.align[rows]
        self.ids, self.limits, self.src_lens = (
            [xs[i] for i in keep] for xs in (self.ids, self.limits, self.src_lens)
        )
        self.limit_t = self.limit_t[pos]
        self.b = len(keep)
        self.done_flags = [False] * self.b
        self.done = torch.zeros(self.b, dtype=torch.bool, device=self.device)
        self.offsets = torch.arange(self.b, device=self.device).unsqueeze(1) * self.k
        return prev[rows]

    def _collect(self, t, top, rows, token, ending, step_align) -> None:
        """Turn the candidates in ``ending`` ``(B, 2K)`` into finished hypotheses."""
        where = ending.nonzero().tolist()
        if not where:
            return
        top, rows, token = top.tolist(), rows.tolist(), token.tolist()  # one device sync
        for i, j in where:
            row, tok, score = rows[i][j], token[i][j], top[i][j]
            eos = tok == self.setup.eos
            align = None
            if step_align is not None:
                steps = [step_align[row].unsqueeze(0)]
                if self.align is not None:
                    steps.insert(0, self.align[row])
                align = torch.cat(steps, 0)[:, : self.src_lens[i]]  # (t+1, S_i)
            self.finished[self.ids[i]].append(
                Hypothesis(
                    tokens=self.prefix[row].tolist() + ([] if eos else [tok]),
                    score=score,
                    normalized_score=score / length_penalty(t + 1, self.alpha),
                    alignment=align,
                    eos=eos,
                )
            )

    def _update_done(self, t: int) -> None:
        """Mark sentences that no live prefix can improve any more."""
        best_live = self.scores[:, 0].tolist()  # sorted: column 0 is the best
        for i, limit in enumerate(self.limits):
            if self.done_flags[i]:
                continue
            found = self.finished[self.ids[i]]
            if t + 1 >= limit or len(found) >= self.k or best_live[i] == float("-inf"):
                self.done_flags[i] = True
            elif len(found) >= self.n_best:
                most = max(length_penalty(t + 2, self.alpha), length_penalty(limit, self.alpha))
                nth = sorted(h.normalized_score for h in found)[-self.n_best]
                self.done_flags[i] = nth >= best_live[i] / most
        self.done = torch.tensor(self.done_flags, device=self.device)


def _rank(h: Hypothesis) -> float:
    return -h.normalized_score
