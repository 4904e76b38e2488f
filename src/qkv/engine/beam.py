"""Beam search for a causal language model, by the rules of transformers' ``generate``.

Every prompt keeps ``N = num_beams`` running continuations. Each step extends all of them
by every token and keeps the best candidates by total log-probability (``K = N`` times
``max(2, 1 + number of end ids)`` of them, so that ``N`` remain after some end):

- a candidate that ends (an end token, or the last allowed step) may enter the prompt's
  pool of ``N`` finished continuations, ranked by ``log P / length ** length_penalty``
  (``length`` counts the new tokens, the end token included), but only if it ranks among
  the ``N`` best candidates of the step;
- the ``N`` best candidates that did not end run on.

A prompt is done once its pool is full and its best running continuation, normalised by
its current length, cannot beat the worst finished one (the estimate that transformers
uses with ``early_stopping=False``; ``True`` stops as soon as the pool is full, and
``"never"`` estimates with the longest allowed length when ``length_penalty > 0``).
The log-probabilities pass through the rules of :class:`DecodingRules` first.
"""

from __future__ import annotations

import torch
from torch import Tensor

from qkv.engine.loop import next_logits
from qkv.engine.sampling import DecodingRules, adjust_logits

__all__ = ["beam_decode"]


class _Pool:
    """The finished continuations of every prompt: ``(B, N, length)`` tokens and scores."""

    def __init__(self, b: int, n: int, pad: int, device: torch.device):
        self.tokens = torch.full((b, n, 0), pad, dtype=torch.long, device=device)
        self.scores = torch.full((b, n), float("-inf"), device=device)
        self.lengths = torch.zeros(b, n, dtype=torch.long, device=device)
        self.pad = pad

    @property
    def full(self) -> Tensor:
        """``(B,)``: every slot holds a finished continuation."""
        return torch.isfinite(self.scores).all(1)

    def add(self, tokens: Tensor, scores: Tensor) -> None:
        """Merge candidates ``(B, K, width + 1)`` (score -inf: not finished) into the pool."""
        wider = torch.nn.functional.pad(self.tokens, (0, 1), value=self.pad)
        merged_tokens = torch.cat([wider, tokens], 1)  # (B, N + K, width + 1)
        merged = torch.cat([self.scores, scores], 1)  # (B, N + K)
        lengths = torch.cat([self.lengths, self.lengths.new_full(scores.shape, tokens.shape[2])], 1)
        self.scores, best = merged.topk(self.scores.shape[1], dim=1)
        self.tokens = merged_tokens.gather(1, best[..., None].expand(-1, -1, tokens.shape[2]))
        self.lengths = lengths.gather(1, best)


@torch.no_grad()
def beam_decode(
    model,
    input_ids: Tensor,
    max_new_tokens: int,
    num_beams: int,
    rules: DecodingRules,
    *,
    length_penalty: float = 1.0,
    early_stopping: bool | str = False,
    num_return_sequences: int = 1,
    attention_mask: Tensor | None = None,
    runner: str = "auto",
) -> Tensor:
    """The best continuations of each prompt: ``(B * num_return_sequences, T + N)``.

    Each step is the generation loop's forward pass (:func:`~qkv.engine.loop.next_logits`,
    through ``runner``), always with a cache, which must have ``reorder(index)``. Rows are
    the prompts' continuations, best first; shorter ones end with padding
    (``rules.padding``; transformers 5 pads with the first end id instead when
    ``pad_token_id`` is 0), and ``N`` is the longest one returned.
    """
    _check(max_new_tokens, num_beams, num_return_sequences, early_stopping, rules)
    if max_new_tokens == 0:  # nothing to search: the prompts, as greedy decoding gives
        return input_ids.repeat_interleave(num_return_sequences, 0)
    b, t = input_ids.shape
    n, device = num_beams, input_ids.device
    ends = torch.tensor(rules.end_ids, dtype=torch.long, device=device)
    k = max(2, 1 + len(ends)) * n
    pool = _Pool(b, n, 0 if rules.padding is None else rules.padding, device)
    running = input_ids.repeat_interleave(n, 0).view(b, n, t)
    run_scores = torch.zeros(b, n, device=device)
    run_scores[:, 1:] = float("-inf")  # at first all beams are the same prompt: keep one
    mask = None if attention_mask is None else attention_mask.bool().repeat_interleave(n, 0)
    cache, step_ids = model.new_cache(), running
    open_rows = torch.ones(b, dtype=torch.bool, device=device)
    for step in range(max_new_tokens):
        flat = running.reshape(b * n, -1)
        logits, _ = next_logits(model, step_ids.reshape(b * n, -1), mask, cache, runner=runner)
        logp = adjust_logits(torch.log_softmax(logits.float(), -1), flat, step, rules, mask)
        top, source, token, cand = _candidates(running, logp.view(b, n, -1), run_scores, k)
        last = step + 1 == max_new_tokens
        ended = torch.isin(token, ends) | last  # (B, K)
        eligible = ended & open_rows[:, None] & (torch.arange(k, device=device) < n)
        if early_stopping is True:
            eligible &= ~pool.full[:, None]
        normalised = top / (step + 1) ** length_penalty
        pool.add(cand[:, :, t:], torch.where(eligible, normalised, float("-inf")))
        run_scores, keep = top.masked_fill(ended, float("-inf")).topk(n, dim=1)
        running = cand.gather(1, keep[..., None].expand(-1, -1, cand.shape[2]))
        chosen = source.gather(1, keep)  # (B, N): the beam each survivor came from
        cache.reorder((chosen + torch.arange(b, device=device)[:, None] * n).view(-1))
        step_ids = running[:, :, -1:]
        if mask is not None:
            mask = torch.cat([mask, mask.new_ones(b * n, 1)], 1)
        open_rows &= _may_improve(
            pool, run_scores, step + 1, max_new_tokens, length_penalty, early_stopping
        )
        if last or not open_rows.any() or (early_stopping is True and pool.full.all()):
            break
    width = int(pool.lengths[:, :num_return_sequences].max())
    best = pool.tokens[:, :num_return_sequences, :width]  # (B, R, width)
    prompts = input_ids.repeat_interleave(num_return_sequences, 0)
    return torch.cat([prompts, best.reshape(b * num_return_sequences, width)], 1)


def _candidates(running: Tensor, logp: Tensor, run_scores: Tensor, k: int):
    """The ``k`` best extensions of the running beams ``(B, N, L)`` by one token.

    Returns their total log-probabilities ``(B, K)``, source beams and tokens ``(B, K)``,
    and their sequences ``(B, K, L + 1)``.
    """
    vocab = logp.shape[2]
    total = (logp + run_scores[..., None]).flatten(1)  # (B, N * V), beam-major
    top, index = total.topk(k, dim=1)
    source, token = index // vocab, index % vocab
    prefix = running.gather(1, source[..., None].expand(-1, -1, running.shape[2]))
    return top, source, token, torch.cat([prefix, token[..., None]], 2)


def _may_improve(
    pool: _Pool,
    run_scores: Tensor,
    length: int,
    most: int,
    alpha: float,
    early_stopping: bool | str,
) -> Tensor:
    """``(B,)``: a running continuation may still beat the worst finished one."""
    if early_stopping == "never" and alpha > 0.0:
        length = most  # a positive penalty favours long continuations: assume the longest
    best_running = run_scores[:, 0] / length**alpha
    return ~pool.full | (best_running > pool.scores.min(1).values)


def _check(max_new_tokens, num_beams, num_return_sequences, early_stopping, rules) -> None:
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if num_beams < 1 or not 1 <= num_return_sequences <= num_beams:
        raise ValueError(
            f"need 1 <= num_return_sequences ({num_return_sequences}) <= num_beams ({num_beams})"
        )
    if early_stopping not in (True, False, "never"):
        raise ValueError(f"early_stopping must be True, False or 'never', got {early_stopping!r}")
    if rules.temperature > 0:
        raise ValueError("beam search here is deterministic: give temperature 0 with num_beams")
