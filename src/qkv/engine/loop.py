"""The generation loop: a language model continues its prompts, one token a step.

Every way qkv generates text runs this loop: ``model.generate`` (as transformers'), the
text stream of :func:`qkv.generate`, ``qkv generate``, ``qkv sample``, ``qkv show
--generate``, the lab and the samples drawn while training. A step is

1. one forward pass (:func:`next_logits`): the prompt at the first step, then only the
   new tokens, their keys and values appended to the cache; the pass goes through the
   runner that serves it best (:func:`qkv.engine.dispatch.run`);
2. the rules that look at the row so far change the logits, and greedy decoding or
   sampling picks each row's token (:mod:`qkv.engine.sampling`);
3. a row that produced an end token is finished and continues with padding; the loop
   stops once every row has finished, or after ``max_new_tokens``.

Beam search (:mod:`qkv.engine.beam`) takes the same first two steps with ``N`` running
continuations a prompt. :func:`steps` yields each step's tokens as soon as they are
chosen (and, when asked, the attention weights of its forward pass).

What happens when the model's positions run out is the *context policy*: ``"error"``
refuses to start (transformers' rule), ``"crop"`` feeds the latest ``max_positions``
tokens afresh each step once the cache is full (nanoGPT's ``generate``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from qkv.engine.dispatch import run
from qkv.engine.sampling import DecodingRules, adjust_logits, sample_next
from qkv.kernels.cpu.memory import reuse_freed_memory
from qkv.modules.cache import KVCache

__all__ = ["CONTEXT_POLICIES", "Step", "check_positions", "next_logits", "steps"]

CONTEXT_POLICIES = ("error", "crop")


@dataclass
class Step:
    """One step of generation.

    Attributes:
        tokens: ``(B,)`` the token each row chose (finished rows: padding).
        attentions: with ``need_weights``, the attention weights of the step's forward
            pass, one ``(B, H, t, Tk)`` per layer: the prompt's rows at the first step,
            then the row of the token fed at this step. Empty otherwise.
        done: ``(B,)`` the rows that have finished (an end token, now or before).
    """

    tokens: Tensor
    attentions: list[Tensor] = field(default_factory=list)
    done: Tensor | None = None


def check_positions(model: nn.Module, prompt: int, new: int) -> None:
    """``ValueError`` when a prompt of ``prompt`` tokens and ``new`` more pass the model's
    positions (``model.max_positions``; ``None``: no limit)."""
    limit = getattr(model, "max_positions", None)
    if limit is not None and prompt + new > limit:
        raise ValueError(
            f"prompt length {prompt} + max_new_tokens {new} = {prompt + new} exceeds the "
            f"model's {limit} positions (max_len)"
        )


def next_logits(
    model: nn.Module,
    input_ids: Tensor,
    mask: Tensor | None,
    cache: KVCache | None,
    *,
    need_weights: bool = False,
    runner: str = "auto",
) -> tuple[Tensor, list[Tensor]]:
    """One forward pass of the loop: the logits ``(B, V)`` of each row's last position
    and, with ``need_weights``, the pass's attention weights (one per layer)."""
    out = run(
        model,
        input_ids,
        mask,
        cache=cache,
        need_weights=need_weights,
        logits_to_keep=1,
        runner=runner,
    )
    return out.logits[:, -1], out.attentions


@torch.no_grad()
def steps(
    model: nn.Module,
    input_ids: Tensor,
    max_new_tokens: int,
    rules: DecodingRules | None = None,
    *,
    attention_mask: Tensor | None = None,
    use_cache: bool = True,
    generator: torch.Generator | None = None,
    need_weights: bool = False,
    context: str = "error",
    runner: str = "auto",
) -> Iterator[Step]:
    """Greedy or sampled decoding, one :class:`Step` at a time.

    Args:
        model: a decoder-only language model (:class:`~qkv.models.GPT`,
            :class:`~qkv.models.Llama`): ``forward(ids, attention_mask, cache=...,
            logits_to_keep=1)`` and ``new_cache()``.
        input_ids: prompts ``(B, T)``, padded on the left.
        max_new_tokens: at most this many steps.
        rules: how each token is chosen (:class:`~qkv.engine.sampling.DecodingRules`;
            default greedy with no end token).
        attention_mask: ``(B, T)``, 0 on padding; ``None``: every token is real.
        use_cache: feed only the new tokens (``False`` feeds the whole sequence each step:
            the same tokens, slower).
        generator: the random generator of sampling.
        need_weights: each step carries its pass's attention weights (through the model's
            own forward: the fused runners return none). The last token's own row comes
            from one more pass, after the last step: a final :class:`Step` with no
            tokens (``tokens.numel() == 0``).
        context: what to do when the model's positions (``model.max_positions``) run
            out: ``"error"`` refuses prompts that would pass them; ``"crop"`` (one row)
            keeps the latest ``max_positions`` tokens, recomputed without the cache
            once it is full.
        runner: the runner of every pass (``"auto"``: the fastest that serves it).

    Shape:
        input_ids ``(B, T)``; each step's ``tokens`` ``(B,)``.
    """
    rules = rules or DecodingRules()
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if context not in CONTEXT_POLICIES:
        raise ValueError(f"context must be one of {CONTEXT_POLICIES}, got {context!r}")
    limit = getattr(model, "max_positions", None)
    if context == "crop" and limit is not None:
        if input_ids.shape[0] != 1 or attention_mask is not None:
            raise ValueError("context='crop' continues one unpadded sequence")
        input_ids = input_ids[:, -limit:]
    else:
        check_positions(model, input_ids.shape[1], max_new_tokens)
    if need_weights and runner == "auto":
        runner = "forward"  # the fused runners compute no weights
    ends = torch.tensor(rules.end_ids, dtype=torch.long, device=input_ids.device)
    done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
    # Without padding no mask at all (the same positions and attention; each step then
    # skips building and checking an all-true one, ~15% of a cached step here).
    padded = attention_mask is not None and not bool(attention_mask.all())
    mask = attention_mask.bool() if padded else None
    cache = model.new_cache() if use_cache else None
    ids = fed = input_ids
    for step in range(max_new_tokens):
        # 1) the forward pass: the prompt, then the new tokens with the cache. A long
        # prompt's activations (MiBs each) are freed and allocated again layer after
        # layer: kept in the heap, their pages are not faulted in afresh each time (a
        # 1,024-token prompt about 10% faster: BENCHMARKS.md, 'LLaMA-family decoding')
        with reuse_freed_memory() if step == 0 else contextlib.nullcontext():
            logits, attentions = next_logits(
                model, fed, mask, cache, need_weights=need_weights, runner=runner
            )
        if step == 0 and len(ends) and not 0 <= rules.padding < logits.shape[-1]:
            raise ValueError(  # finished rows feed it to the model: say so before they do
                f"pad_token_id {rules.padding} is outside the vocabulary "
                f"(0..{logits.shape[-1] - 1}): finished rows continue with it"
            )
        # 2) the rules, then greedy or sampled choice
        logits = adjust_logits(logits, ids, step, rules, mask)
        token = sample_next(logits, rules.temperature, rules.top_k, rules.top_p, generator)
        # 3) finished rows continue with padding
        if len(ends):
            token = token.masked_fill(done, rules.padding)
            done |= torch.isin(token, ends)
        yield Step(token, attentions, done.clone())
        ids = torch.cat([ids, token[:, None]], dim=1)
        if mask is not None:
            mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)
        if len(ends) and bool(done.all()):
            break
        cache, fed = _next_input(ids, cache, limit)
    if need_weights and ids.shape[1] > input_ids.shape[1]:  # the last token's own row
        cache, fed = _next_input(ids, cache, limit)
        _, attentions = next_logits(model, fed, mask, cache, need_weights=True, runner=runner)
        yield Step(ids.new_zeros(0), attentions, done.clone())


def _next_input(ids: Tensor, cache: KVCache | None, limit: int | None):
    """``(cache, tokens)`` of the next pass: the newest token with the cache; without one,
    the whole rows; once the cache holds ``limit`` positions (the model's, with
    ``context="crop"``), the latest ``limit`` tokens afresh, without the cache."""
    if cache is not None and (limit is None or cache.length < limit):
        return cache, ids[:, -1:]
    return None, ids if limit is None else ids[:, -limit:]
