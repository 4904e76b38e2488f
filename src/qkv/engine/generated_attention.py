"""The attention of generated tokens: greedy decoding that keeps every step's weights.

A decoder with a KV cache computes the prompt's attention rows in one prefill pass and
then one row per new token. Kept and stacked, these rows are the whole causal map over
prompt + generated tokens, with no second model run:

.. math::
    A^{(l,h)}_{i,:} = \\mathrm{softmax}\\big(q_i K_{\\le i}^\\top / \\sqrt{D}\\big),\\quad
    A^{(l,h)}_{i,j} = 0 \\text{ for } j > i

Two numbers per head read such a map: the share of attention on the first token (the
"attention sink", Xiao et al. 2023, "Efficient Streaming Language Models with Attention
Sinks") and on the previous token, each a mean over the rows from the third on, where the
two are different keys (so the two shares of a head add up to at most 1).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from qkv.engine.loop import steps
from qkv.engine.sampling import DecodingRules

__all__ = ["generate_with_attention", "sink_and_previous_shares"]


def generate_with_attention(
    model: nn.Module,
    input_ids: Tensor,
    max_new_tokens: int,
    eos_token_id: Sequence[int] = (),
) -> tuple[list[int], Tensor]:
    """Greedy decoding with the KV cache (:func:`qkv.engine.loop.steps`), keeping the
    attention weights of every pass: the prompt's rows, then one row per new token (the
    last one fed once more for its own row).

    Args:
        model: a decoder-only language model (:class:`qkv.models.Llama`,
            :class:`qkv.models.GPT`).
        input_ids: the prompt ``(1, T)``.
        max_new_tokens: N >= 1.
        eos_token_id: tokens that end the generation (kept as the last new token).

    Shape:
        input_ids ``(1, T)``; maps ``(L, H, T + n, T + n)`` with ``n <= N`` new tokens.

    Returns:
        ``(new_ids, maps)``: the new token ids and float32 maps, lower triangular (rows
        are queries, each a distribution over the keys up to itself).

    Raises:
        ValueError: a batch of more than one prompt, an empty prompt, or N < 1.
    """
    if input_ids.dim() != 2 or input_ids.shape[0] != 1 or input_ids.shape[1] == 0:
        raise ValueError(f"input_ids must be one prompt (1, T >= 1), got {tuple(input_ids.shape)}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    rules = DecodingRules(eos_token_id=list(eos_token_id) or None)
    new_ids: list[int] = []
    rows: list[list[Tensor]] = []  # per pass, per layer: (H, t, Tk)
    for step in steps(model, input_ids, max_new_tokens, rules, need_weights=True):
        new_ids += step.tokens.tolist()
        rows.append([a[0].float() for a in step.attentions])
    total = input_ids.shape[1] + len(new_ids)
    layers, heads = len(rows[0]), rows[0][0].shape[0]
    maps = torch.zeros(layers, heads, total, total)  # (L, H, T, T)
    start = 0
    for passed in rows:  # each pass's rows start..start+t over keys 0..Tk
        t, tk = passed[0].shape[1], passed[0].shape[2]
        for layer, a in enumerate(passed):
            maps[layer, :, start : start + t, :tk] = a
        start += t
    return new_ids, maps


def sink_and_previous_shares(maps: Tensor) -> tuple[Tensor, Tensor]:
    """Per layer and head, the mean share of attention on the first and previous token.

    .. math::
        \\mathrm{sink}_{l,h} = \\frac{1}{T-2}\\sum_{i=2}^{T-1} A^{(l,h)}_{i,0},\\quad
        \\mathrm{prev}_{l,h} = \\frac{1}{T-2}\\sum_{i=2}^{T-1} A^{(l,h)}_{i,i-1}

    The first two rows are left out: the first can only attend to itself, and for the
    second the previous token is the first. From the third row on the two keys differ,
    so a head's two shares add up to at most 1.

    Args:
        maps: causal attention ``(L, H, T, T)`` with ``T >= 3``.

    Returns:
        ``(sink, previous)``, each ``(L, H)`` in ``[0, 1]``.

    Raises:
        ValueError: maps that are not ``(L, H, T, T)`` with ``T >= 3``.
    """
    if maps.dim() != 4 or maps.shape[-1] != maps.shape[-2] or maps.shape[-1] < 3:
        raise ValueError(f"maps must be (L, H, T, T) with T >= 3, got {tuple(maps.shape)}")
    rows = torch.arange(2, maps.shape[-1], device=maps.device)
    sink = maps[..., rows, 0].mean(-1)  # (L, H)
    previous = maps[..., rows, rows - 1].mean(-1)  # (L, H)
    return sink, previous
