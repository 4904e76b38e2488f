"""What every causal language model here shares: ``generate`` (as transformers'
``generate``) over the model's ``forward`` and KV cache, and the positions of new tokens
in a left-padded batch.

A subclass (:class:`~qkv.models.GPT`, :class:`~qkv.models.Llama`) gives ``forward(ids,
attention_mask, cache=...)`` returning ``.logits``, ``new_cache()``, and
``max_positions`` (``None`` when positions are rotary and unbounded).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from qkv.kernels.cpu.memory import reuse_freed_memory
from qkv.models.pretrained.gen_defaults import GenerationDefaults, with_defaults
from qkv.models.pretrained.generation import DecodingRules, decode, prompt_mask
from qkv.models.pretrained.lm_beam import beam_decode

__all__ = ["CausalLM", "real_token_positions"]


class CausalLM(nn.Module):
    """A decoder-only language model's generation.

    Attributes:
        generation_defaults: the end and pad tokens that :meth:`generate` takes when given
            none (a :class:`~qkv.models.GenerationDefaults`): the folder's after
            ``from_pretrained``, ``None`` (no end token) for a model built from a config;
            may be set.
        max_positions: the most positions the model has (``None``: no limit).
    """

    max_positions: int | None = None

    def __init__(self):
        super().__init__()
        self.generation_defaults: GenerationDefaults | None = None  # set by from_pretrained

    def generate(
        self,
        input_ids: Tensor,
        max_new_tokens: int,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        use_cache: bool = True,
        attention_mask: Tensor | None = None,
        eos_token_id: int | Sequence[int] | None = None,
        pad_token_id: int | None = None,
        repetition_penalty: float = 1.0,
        no_repeat_ngram_size: int = 0,
        min_new_tokens: int = 0,
        num_beams: int = 1,
        length_penalty: float = 1.0,
        early_stopping: bool | str = False,
        num_return_sequences: int = 1,
    ) -> Tensor:
        """Continue each prompt by ``max_new_tokens`` tokens (as transformers' ``generate``).

        Args:
            input_ids: prompts ``(B, T)``; pad batches on the left.
            max_new_tokens: tokens to add.
            temperature: 0: the most likely token (greedy); else sample from logits / it.
            top_k, top_p: sample only among the k most likely tokens / the smallest set
                whose probability reaches p (Holtzman et al. 2020).
            seed: seed of a private random generator (reproducible sampling).
            use_cache: reuse cached keys/values (``False`` recomputes: same tokens, slower).
            attention_mask: ``(B, T)``, 0 on the prompts' padding; ``None``: 0 on the
                prompts' pad tokens when the pad token (below) is not an end token, as in
                transformers (:func:`~qkv.models.pretrained.generation.prompt_mask`).
            eos_token_id: token id(s) that end a row; ``None``: the loaded folder's, as in
                transformers (none for a model built from its config); ``[]``: no
                end token. A finished row continues with ``pad_token_id`` (``None``: the
                folder's, else the first end id); generation stops once every row finished.
            repetition_penalty, no_repeat_ngram_size, min_new_tokens: the rules of
                :class:`~qkv.models.pretrained.generation.DecodingRules`, applied as
                transformers does.
            num_beams, length_penalty, early_stopping, num_return_sequences: beam search
                (:mod:`qkv.models.pretrained.lm_beam`) when ``num_beams > 1``: the best
                ``num_return_sequences`` continuations of each prompt, best first (always
                with the cache). Sampling can also return several (independent) draws.

        Returns:
            ``(B * num_return_sequences, T + N)``: the prompts followed by the new tokens,
            ``N = max_new_tokens`` unless every row ended earlier.
        """
        if input_ids.ndim != 2:
            raise ValueError(f"input_ids must be (B, T), got {tuple(input_ids.shape)}")
        if attention_mask is not None and attention_mask.shape != input_ids.shape:
            raise ValueError(
                f"attention_mask must have the prompts' shape {tuple(input_ids.shape)}, "
                f"got {tuple(attention_mask.shape)}"
            )
        longest = input_ids.shape[1] + max_new_tokens
        if self.max_positions is not None and longest > self.max_positions:
            raise ValueError(
                f"prompt length {input_ids.shape[1]} + max_new_tokens {max_new_tokens} = "
                f"{longest} exceeds the model's {self.max_positions} positions (max_len)"
            )
        rules = DecodingRules(
            temperature,
            top_k,
            top_p,
            repetition_penalty,
            no_repeat_ngram_size,
            min_new_tokens,
            *with_defaults(self.generation_defaults, eos_token_id, pad_token_id),
        )
        if attention_mask is None:
            attention_mask = prompt_mask(input_ids, rules)
        generator = None
        if seed is not None:
            generator = torch.Generator(device=input_ids.device).manual_seed(seed)
        # A long prompt's activations (MiBs each) are freed and allocated again layer after
        # layer: kept in the heap, their pages are not faulted in afresh each time (a
        # 1,024-token prompt about 10% faster: BENCHMARKS.md, 'LLaMA-family decoding')
        with reuse_freed_memory():
            if num_beams != 1:
                return beam_decode(
                    self,
                    input_ids,
                    max_new_tokens,
                    num_beams,
                    rules,
                    length_penalty=length_penalty,
                    early_stopping=early_stopping,
                    num_return_sequences=num_return_sequences,
                    attention_mask=attention_mask,
                )
            return decode(
                self,
                input_ids,
                max_new_tokens,
                rules,
                attention_mask=attention_mask,
                use_cache=use_cache,
                generator=generator,
                num_return_sequences=num_return_sequences,
            )


def real_token_positions(
    key_mask: Tensor | None, past: int, b: int, t: int, device: torch.device
) -> Tensor:
    """``(B, T)``: the positions of the new tokens, counting the real tokens of ``key_mask``
    ``(B, past + T)`` (padding at 0), or ``past + arange(T)`` without a mask."""
    if key_mask is None:
        return torch.arange(past, past + t, device=device).expand(b, t)
    return (key_mask.long().cumsum(-1) - 1).masked_fill(~key_mask, 0)[:, past:]
