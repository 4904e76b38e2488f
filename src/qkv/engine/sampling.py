"""How each new token is chosen, by the rules of Hugging Face ``generate``.

Each step of :mod:`qkv.engine.loop` turns the logits of every row's last position into
one new token. First the rules that look at the row so far change the logits, in the
order transformers applies them:

1. **repetition penalty** (Keskar et al. 2019, CTRL): every token already in the row
   (the prompt's too, but not its padding) has its logit divided by the penalty when
   positive, multiplied when negative, so that ``penalty > 1`` makes it less likely;
2. **no repeated n-grams** (Paulus et al. 2018): a token that would complete an n-gram
   that already occurs in the row is banned;
3. **minimum new tokens**: the end tokens are banned until the row has that many new ones;
4. **suppressed tokens** are never chosen (a tokenizer's padding or unknown-word ids).

Then greedy decoding takes the most likely token; sampling divides the logits by the
temperature, keeps the ``top_k`` most likely tokens and the smallest set whose
probability reaches ``top_p`` (Holtzman et al. 2020), and draws from what is left. A row
that produced an end token is finished: it continues with padding, and decoding stops
once every row has finished.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["DecodingRules", "adjust_logits", "filter_logits", "prompt_mask", "sample_next"]


@dataclass(frozen=True)
class DecodingRules:
    """How the generation loop (:func:`qkv.engine.loop.steps`) picks each token (see the
    module docstring).

    Args:
        temperature: 0 picks the most likely token (greedy); otherwise logits are divided
            by it before sampling.
        top_k, top_p: sample among the k most likely tokens / the smallest set whose
            probability reaches p.
        repetition_penalty: 1 (off) or the penalty (> 0) of tokens already in the row.
        no_repeat_ngram_size: 0 (off) or n: no n-gram occurs twice in a row.
        min_new_tokens: end tokens are banned before this many new tokens.
        eos_token_id: token id(s) that end a row; ``None`` or an empty list: none.
        pad_token_id: what a finished row continues with (default: the first end id).
        suppress_tokens: tokens never chosen (their logits set to ``-inf``, as
            transformers' ``suppress_tokens``): a tokenizer's padding and unknown-word ids.
    """

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    min_new_tokens: int = 0
    eos_token_id: int | Sequence[int] | None = None
    pad_token_id: int | None = None
    suppress_tokens: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.temperature >= 0:  # also NaN; a negative one would silently mean greedy
            raise ValueError(f"temperature must be >= 0 (0: greedy), got {self.temperature}")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if self.no_repeat_ngram_size < 0 or self.min_new_tokens < 0:
            raise ValueError("no_repeat_ngram_size and min_new_tokens must be >= 0")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def end_ids(self) -> list[int]:
        """The end-of-sequence ids (empty: none)."""
        eos = self.eos_token_id
        return [] if eos is None else [eos] if isinstance(eos, int) else list(eos)

    @property
    def padding(self) -> int | None:
        """The id of a finished row's later tokens."""
        ends = self.end_ids
        return self.pad_token_id if self.pad_token_id is not None or not ends else ends[0]


def prompt_mask(input_ids: Tensor, rules: DecodingRules) -> Tensor | None:
    """The attention mask of prompts given without one, by transformers' ``generate`` rule.

    When the pad token (:attr:`DecodingRules.padding`: ``pad_token_id``, else the first
    end id) occurs in the prompts and is not an end token, the prompts' pad tokens are
    masked; otherwise every token is real (``None``: no mask needed).

    Shape:
        input_ids ``(B, T)``; returns ``(B, T)`` boolean, ``True`` on real tokens, or ``None``.
    """
    pad = rules.padding
    if pad is None or pad in rules.end_ids:
        return None
    mask = input_ids != pad  # (B, T)
    return None if bool(mask.all()) else mask


def adjust_logits(
    logits: Tensor,
    ids: Tensor,
    new_tokens: int,
    rules: DecodingRules,
    real: Tensor | None = None,
) -> Tensor:
    """Apply the repetition, n-gram and minimum-length rules and the suppressed tokens to
    ``logits`` ``(B, V)``.

    Args:
        logits: the next-token logits (not changed; a new tensor is returned).
        ids: ``(B, L)`` every token of each row so far, prompt (and its padding) included.
        new_tokens: how many of them were generated.
        real: ``(B, L)`` boolean, ``False`` on the prompt's padding, which the repetition
            penalty ignores (the n-gram rule sees the padding, as in transformers).
    """
    n = rules.no_repeat_ngram_size
    short = new_tokens < rules.min_new_tokens and rules.end_ids
    rules_apply = rules.repetition_penalty != 1.0 or (n and ids.shape[1] >= n) or short
    if not rules_apply and not rules.suppress_tokens:
        return logits  # no rule applies
    logits = logits.float().clone()
    if rules.repetition_penalty != 1.0:
        b, v = logits.shape
        counted = ids if real is None else ids.masked_fill(~real, v)  # padding -> column V
        seen = torch.zeros(b, v + 1, dtype=torch.bool, device=ids.device)
        seen = seen.scatter_(1, counted, True)[:, :v]  # (B, V): tokens in the row
        p = rules.repetition_penalty
        logits = torch.where(seen, torch.where(logits < 0, logits * p, logits / p), logits)
    if n and ids.shape[1] >= n:
        logits.masked_fill_(_repeating(ids, n, logits.shape[1]), float("-inf"))
    if short:
        logits[:, rules.end_ids] = float("-inf")
    if rules.suppress_tokens:
        logits[:, list(rules.suppress_tokens)] = float("-inf")
    return logits


def _repeating(ids: Tensor, n: int, vocab: int) -> Tensor:
    """``(B, V)``: the tokens that would complete an n-gram already in the row."""
    grams = ids.unfold(1, n, 1)  # (B, L - n + 1, n): every n-gram of each row
    prefix = ids[:, ids.shape[1] - (n - 1) :]  # (B, n - 1): the row's last n - 1 tokens
    same = (grams[:, :, :-1] == prefix[:, None, :]).all(-1)  # (B, L - n + 1)
    hits = torch.zeros(ids.shape[0], vocab, device=ids.device)
    return hits.scatter_add_(1, grams[:, :, -1], same.float()) > 0


def filter_logits(
    logits: Tensor, temperature: float, top_k: int | None = None, top_p: float | None = None
) -> Tensor:
    """The float32 logits ``(B, V)`` that sampling draws from: scaled, then filtered.

    Divides by ``temperature``, then sets to ``-inf`` all but the ``top_k`` largest and
    then the tokens outside the smallest set whose probability reaches ``top_p`` (the most
    likely token is always kept; ``top_p = 1`` keeps every token). The operations are
    transformers' own, in its order, so that the same tokens survive to the last bit.
    """
    logits = logits.float() / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        rising, order = logits.sort(dim=-1)  # least likely first
        below = rising.softmax(-1).cumsum(-1) <= 1 - top_p  # (B, V): the unlikely tail
        below[:, -1] = False  # the most likely token stays
        logits = logits.masked_fill(below.scatter(-1, order, below), float("-inf"))
    return logits


def sample_next(
    logits: Tensor,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Pick one token per row of ``logits`` ``(B, V)``: argmax, or a sample from
    :func:`filter_logits`.

    Returns:
        ``(B,)`` token ids.
    """
    if temperature <= 0.0:
        return logits.argmax(-1)
    probs = filter_logits(logits, temperature, top_k, top_p).softmax(-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
