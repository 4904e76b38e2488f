"""What a runner of a language model's forward pass is, and the one that runs the model.

A decoder-only model's ``forward`` is its equations
(:class:`~qkv.models.pretrained.causal_lm.CausalLM`). A *runner* computes the same pass
another way, faster for the calls it can serve: the prompt's small steps in C
(:mod:`~qkv.engine.c_prompt`), one token through each layer in one C call
(:mod:`~qkv.engine.c_token`). Each says in words why it cannot serve a call
(:meth:`Runner.why_not`), as attention's backends do (:mod:`qkv.kernels.dispatch`), and
:mod:`qkv.engine.dispatch` takes the first that can; :class:`ForwardRunner`, the model's
own ``forward``, serves every call. A runner is tested against that ``forward``.

A model here is anything with the parts of
:class:`~qkv.models.pretrained.causal_lm.CausalLM` (``tok_emb``, ``rope``, ``layers`` of
:class:`~qkv.modules.DecoderBlock`, ``final_norm``, ``lm_head``, ``embed``, ``rotary``,
``inputs``): the engine sits below the models and knows them by those names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch
from torch import Tensor, nn

from qkv.modules.cache import KVCache
from qkv.modules.decoder import CausalLMOutput
from qkv.modules.feedforward import SwiGLU
from qkv.modules.norms import RMSNorm

__all__ = ["ForwardCall", "ForwardRunner", "Runner", "llama_block_refusals", "inference_refusals"]


@dataclass
class ForwardCall:
    """One forward pass asked of a model: ``model(input_ids, attention_mask, cache=...,
    need_weights=..., position_ids=..., logits_to_keep=...)``."""

    model: nn.Module
    input_ids: Tensor
    attention_mask: Tensor | None = None
    cache: KVCache | None = None
    need_weights: bool | Sequence[int] = False
    position_ids: Tensor | None = None
    logits_to_keep: int = 0

    @cached_property
    def inputs(self) -> Any:
        """The key mask and positions, checked by the model
        (:meth:`~qkv.models.pretrained.causal_lm.CausalLM.inputs`)."""
        return self.model.inputs(self.input_ids, self.attention_mask, self.cache, self.position_ids)

    @property
    def padded(self) -> bool:
        """Whether some key is masked (padding)."""
        mask = self.attention_mask
        return mask is not None and not bool(mask.bool().all())


class Runner:
    """A way to compute a forward pass. ``why_not`` lists in words what keeps it from
    serving a call (empty: it can); calling it runs the pass and returns what the model's
    ``forward`` returns."""

    name = ""

    def why_not(self, call: ForwardCall) -> list[str]:
        raise NotImplementedError

    def __call__(self, call: ForwardCall) -> CausalLMOutput:
        raise NotImplementedError


class ForwardRunner(Runner):
    """The model's own ``forward``: the equations, for every call."""

    name = "forward"

    def why_not(self, call: ForwardCall) -> list[str]:
        return []

    def __call__(self, call: ForwardCall) -> CausalLMOutput:
        return call.model(
            call.input_ids,
            call.attention_mask,
            cache=call.cache,
            need_weights=call.need_weights,
            position_ids=call.position_ids,
            logits_to_keep=call.logits_to_keep,
        )


def inference_refusals(call: ForwardCall) -> list[str]:
    """What keeps a fused inference runner from a call: gradients, training mode,
    autocast, attention weights wanted, padding."""
    device = call.input_ids.device.type
    refused = [
        (torch.is_grad_enabled(), "gradients are on (run under torch.no_grad())"),
        (call.model.training, "the model is in training mode"),
        (torch.is_autocast_enabled(device), "autocast is on"),
        (bool(call.need_weights), "the attention weights are wanted"),
        (call.padded, "some keys are padding"),
    ]
    return [why for bad, why in refused if bad]


def llama_block_refusals(model: nn.Module) -> list[str]:
    """What keeps a C runner of LLaMA-family blocks from ``model``: blocks other than
    RMSNorm, rotary attention and SwiGLU with SiLU, learned positions, sequence
    parallelism."""
    refused = []
    if getattr(model, "rope", None) is None or getattr(model, "pos_emb", None) is not None:
        refused.append("the model's positions are not rotary (learned positions)")
    layers = list(getattr(model, "layers", ()))
    if not all(isinstance(b.attn_norm, RMSNorm) and isinstance(b.ff_norm, RMSNorm) for b in layers):
        refused.append("the blocks normalise with LayerNorm, not RMSNorm")
    if not all(isinstance(b.ff, SwiGLU) and isinstance(b.ff.activation, nn.SiLU) for b in layers):
        refused.append("the feed-forward blocks are not SwiGLU with SiLU")
    if any(b.self_attn.sequence_group is not None for b in layers):
        refused.append("the sequence is split across processes (sequence_group)")
    return refused
