"""The decoder-only language model that GPT-2 and the LLaMA family share: the stack of
:class:`~qkv.modules.DecoderBlock` s between the token embedding and the logits, and
``generate`` (as transformers' ``generate``) over it.

.. math::
    h_0 = E[x]\\ (+\\, P[p]),\\quad
    h_l = \\mathrm{Block}_l(h_{l-1}, p),\\quad
    \\mathrm{logits} = \\mathrm{Norm}(h_L)\\, W_{out}^\\top

Positions ``p`` are learned vectors added to the embeddings (GPT-2: ``pos_emb``) or
rotations of queries and keys inside attention (LLaMA: ``rope``); a subclass
(:class:`~qkv.models.GPT`, :class:`~qkv.models.Llama`) builds the parts from its config.
``forward`` is the model and nothing else; the generation loop
(:mod:`qkv.engine.loop`) may run a pass through a faster runner instead
(:func:`qkv.engine.explain_runner` says which and why).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qkv.engine import DecodingRules, generate_ids
from qkv.models.inputs import check_position_ids, check_token_ids
from qkv.models.pretrained.gen_defaults import GenerationDefaults, with_defaults
from qkv.modules.cache import KVCache
from qkv.modules.decoder import CausalLMOutput, Rotary
from qkv.modules.positional import (
    DynamicRopeScaling,
    LearnedPositionalEncoding,
    RotaryPositionalEncoding,
)

__all__ = ["CausalLM", "ForwardInputs", "real_token_positions"]

_NO_LIMIT = 2**62  # rotary positions have no table to run off


class ForwardInputs(NamedTuple):
    """The checked inputs of one forward pass: the key mask ``(B, Tk)`` (``None``: no
    padding) and each new token's position ``(B, T)`` or ``(1, T)``."""

    key_mask: Tensor | None
    position_ids: Tensor


class CausalLM(nn.Module):
    """A decoder-only language model: token embedding, decoder blocks, final norm, logits.

    A subclass sets the parts in ``__init__``:

    - ``tok_emb``: ``nn.Embedding(V, E)``;
    - ``pos_emb``: a :class:`~qkv.modules.LearnedPositionalEncoding` added to the
      embeddings, or ``None``; ``rope``: a :class:`~qkv.modules.RotaryPositionalEncoding`
      whose angles every layer's attention turns queries and keys by, or ``None``;
    - ``drop``: dropout on the embeddings;
    - ``layers``: an ``nn.ModuleList`` of :class:`~qkv.modules.DecoderBlock`;
    - ``final_norm`` and ``lm_head`` (``E -> V``).

    Attributes:
        generation_defaults: the end and pad tokens that :meth:`generate` takes when given
            none (a :class:`~qkv.models.GenerationDefaults`): the folder's after
            ``from_pretrained``, ``None`` (no end token) for a model built from a config;
            may be set.

    Shape:
        input_ids ``(B, T)``; attention_mask ``(B, Tk)`` with ``Tk = cache.length + T``,
        1/True for real tokens. Returns :class:`~qkv.modules.decoder.CausalLMOutput`.
    """

    tok_emb: nn.Embedding
    pos_emb: LearnedPositionalEncoding | None
    rope: RotaryPositionalEncoding | None
    drop: nn.Module
    layers: nn.ModuleList
    final_norm: nn.Module
    lm_head: nn.Linear

    def __init__(self):
        super().__init__()
        self.pos_emb = self.rope = None  # a subclass sets the kind of positions it has
        self.generation_defaults: GenerationDefaults | None = None  # set by from_pretrained

    @property
    def max_positions(self) -> int | None:
        """The most positions the model has: the learned table's length, ``None`` (no
        limit) for rotary positions."""
        return None if self.pos_emb is None else self.pos_emb.weight.shape[0]

    def new_cache(self) -> KVCache:
        """An empty key/value cache for incremental decoding (one entry per layer)."""
        return KVCache(len(self.layers))

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        cache: KVCache | None = None,
        need_weights: bool | Sequence[int] = False,
        position_ids: Tensor | None = None,
        logits_to_keep: int = 0,
    ) -> CausalLMOutput:
        """Next-token logits for every position.

        Positions, unless ``position_ids`` gives them, count real tokens only: with
        ``attention_mask``, token ``t`` of a row is at position ``(number of real tokens up
        to t) - 1``, so a left-padded prompt starts at position 0 (as Hugging Face
        ``generate`` does); without it, positions are ``cache.length + arange(T)``.

        Args:
            input_ids: token ids ``(B, T)`` (only the new ones when ``cache`` is given).
            attention_mask: ``(B, cache.length + T)``, 1/True for real tokens.
            cache: from :meth:`new_cache`; updated in place and returned.
            need_weights: also return every layer's attention weights.
            position_ids: ``(B, T)`` or ``(1, T)`` (shared by the rows), the position of
                each token (``0 .. max_positions - 1`` for learned positions). With
                sequence parallelism (the attention's ``sequence_group``), the global
                positions of this process's part: :func:`qkv.distributed.sequence_shard`
                gives both.
            logits_to_keep: the logits of the last this many positions only (0: all), as
                in transformers; generation needs the last one.
        """
        key_mask, position_ids = self.inputs(input_ids, attention_mask, cache, position_ids)
        x = self.embed(input_ids, position_ids)  # (B, T, E)
        rotary = self.rotary(position_ids, x)  # (cos, sin), each (B, 1, T, D): or None
        attentions = []
        for i, layer in enumerate(self.layers):
            x, weights = layer(
                x,
                rotary,
                key_mask=key_mask,
                cache=None if cache is None else cache[i],
                need_weights=need_weights,
            )
            if need_weights:
                attentions.append(weights)
        x = x[:, -logits_to_keep:] if logits_to_keep else x  # (B, T or logits_to_keep, E)
        logits = self.lm_head(self.final_norm(x))  # (B, T, V)
        return CausalLMOutput(logits=logits, attentions=attentions, cache=cache)

    def embed(self, input_ids: Tensor, position_ids: Tensor) -> Tensor:
        """``(B, T, E)``: the tokens' embeddings, plus their learned positions if any."""
        x = self.tok_emb(input_ids)
        if self.pos_emb is not None:
            x = x + F.embedding(position_ids, self.pos_emb.weight)
        return self.drop(x)

    def rotary(self, position_ids: Tensor, x: Tensor) -> Rotary | None:
        """The angles ``(cos, sin)`` of the positions, each ``(B, 1, T, D)``, in the type
        of the queries and keys they turn (under autocast, the type autocast gives the
        projections); ``None`` for a model without rotary positions."""
        if self.rope is None:
            return None
        dtype = x.dtype
        if torch.is_autocast_enabled(x.device.type):
            dtype = torch.get_autocast_dtype(x.device.type)
        return self.rope.cos_sin(position_ids, dtype)

    def inputs(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None,
        cache: KVCache | None,
        position_ids: Tensor | None,
    ) -> ForwardInputs:
        """The key mask and positions of a forward pass (see :meth:`forward`), after
        checking every input against the model; ``ValueError`` naming what is wrong."""
        b, t = input_ids.shape
        past = cache.length if cache is not None else 0
        key_mask = None
        if attention_mask is not None:
            if attention_mask.shape != (b, past + t):
                raise ValueError(
                    f"attention_mask must be (B, cache length + T) = {(b, past + t)}, "
                    f"got {tuple(attention_mask.shape)}"
                )
            key_mask = attention_mask.bool()  # (B, Tk)
        limit = self.max_positions
        if position_ids is None:
            if limit is not None and past + t > limit:
                raise ValueError(f"sequence length {past + t} exceeds max_len {limit}")
            position_ids = real_token_positions(key_mask, past, b, t, input_ids.device)
        else:
            check_position_ids(position_ids, b, t, _NO_LIMIT if limit is None else limit)
        check_token_ids(input_ids, self.tok_emb.num_embeddings)
        split = any(layer.self_attn.sequence_group is not None for layer in self.layers)
        if split and isinstance(getattr(self.rope, "scaling", None), DynamicRopeScaling):
            raise ValueError(
                "dynamic RoPE scaling chooses its base from the last position a call holds, "
                "which differs between the parts of a split sequence (sequence_group): "
                "train without it, or in one process"
            )
        return ForwardInputs(key_mask, position_ids)

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
        """Continue each prompt by ``max_new_tokens`` tokens (as transformers' ``generate``),
        through the engine's generation loop (:func:`qkv.engine.generate_ids`).

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
                transformers (:func:`~qkv.engine.sampling.prompt_mask`).
            eos_token_id: token id(s) that end a row; ``None``: the loaded folder's, as in
                transformers (none for a model built from its config); ``[]``: no
                end token. A finished row continues with ``pad_token_id`` (``None``: the
                folder's, else the first end id); generation stops once every row finished.
            repetition_penalty, no_repeat_ngram_size, min_new_tokens: the rules of
                :class:`~qkv.engine.sampling.DecodingRules`, applied as transformers does.
            num_beams, length_penalty, early_stopping, num_return_sequences: beam search
                (:mod:`qkv.engine.beam`) when ``num_beams > 1``: the best
                ``num_return_sequences`` continuations of each prompt, best first (always
                with the cache). Sampling can also return several (independent) draws.

        Returns:
            ``(B * num_return_sequences, T + N)``: the prompts followed by the new tokens,
            ``N = max_new_tokens`` unless every row ended earlier.
        """
        eos_token_id, pad_token_id = with_defaults(
            self.generation_defaults, eos_token_id, pad_token_id
        )
        rules = DecodingRules(
            temperature,
            top_k,
            top_p,
            repetition_penalty,
            no_repeat_ngram_size,
            min_new_tokens,
            eos_token_id,
            pad_token_id,
        )
        search = dict(num_beams=num_beams, length_penalty=length_penalty)
        search.update(early_stopping=early_stopping, num_return_sequences=num_return_sequences)
        return generate_ids(
            self,
            input_ids,
            max_new_tokens,
            rules,
            seed=seed,
            use_cache=use_cache,
            attention_mask=attention_mask,
            **search,
        )


def real_token_positions(
    key_mask: Tensor | None, past: int, b: int, t: int, device: torch.device
) -> Tensor:
    """``(B, T)``: the positions of the new tokens, counting the real tokens of ``key_mask``
    ``(B, past + T)`` (padding at 0), or ``past + arange(T)`` without a mask."""
    if key_mask is None:
        return torch.arange(past, past + t, device=device).expand(b, t)
    return (key_mask.long().cumsum(-1) - 1).masked_fill(~key_mask, 0)[:, past:]
