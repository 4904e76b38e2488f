"""One new token of one sequence through each LLaMA-family block in one C call: a runner of
the forward pass.

Decoding a token through a block is seven matrix-vector products and, between them, some
thirty small torch operations (two norms, the rotation, the cache write, attention over
the cache, the gate), each costing more in dispatch than in arithmetic at one token
(BENCHMARKS.md, 'LLaMA-family decoding'). :class:`TokenLayersRunner` hands each block to
:class:`~qkv.kernels.decode_layer.FusedLayer` (``qkv_llama_layer`` in ``matvec.c``) with
float32 or bfloat16 weights and cache; the residual stream between the blocks, the norms'
sums and the scores are float32. The embedding, positions, final norm and output layer are
the model's own. Tested against the model's own forward.
"""

from __future__ import annotations

import weakref

from torch import nn

from qkv.engine.runner import ForwardCall, Runner, inference_refusals, llama_block_refusals
from qkv.kernels import decode_layer
from qkv.modules.cache import KVCache
from qkv.modules.decoder import CausalLMOutput, DecoderBlock

__all__ = ["TokenLayersRunner", "block_weights"]


def block_weights(block: DecoderBlock) -> decode_layer.LayerWeights:
    """A LLaMA-family block's tensors as :class:`~qkv.kernels.decode_layer.FusedLayer`
    takes them."""
    a, ff = block.self_attn, block.ff
    return decode_layer.LayerWeights(
        *(block.attn_norm.weight, a.q_proj.weight, a.q_proj.bias, a.k_proj.weight),
        *(a.k_proj.bias, a.v_proj.weight, a.v_proj.bias, a.out_proj.weight, a.out_proj.bias),
        *(block.ff_norm.weight, ff.gate_proj.weight, ff.gate_proj.bias, ff.up_proj.weight),
        *(ff.up_proj.bias, ff.down_proj.weight, ff.down_proj.bias),
    )


class TokenLayersRunner(Runner):
    """One token of one sequence after cached ones, each block one C call.

    The blocks are prepared (:class:`~qkv.kernels.decode_layer.FusedLayer`: weights
    checked, their addresses taken) at a cache's first step and kept for that cache, one
    decoding run, where reading the blocks' tensors at every token took longer than the
    step's own small operations; a new cache prepares them again, so weights changed
    between runs are read afresh."""

    name = "c_token"

    def __init__(self) -> None:
        # cache -> (the model, its fused layers); the cache's lifetime is the run's
        self._prepared: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def why_not(self, call: ForwardCall) -> list[str]:
        cache = call.cache
        refused = []
        if tuple(call.input_ids.shape) != (1, 1):
            refused.append(f"{tuple(call.input_ids.shape)} tokens: one token of one sequence")
        if not isinstance(cache, KVCache) or not all(kv.in_place for kv in cache.layers):
            refused.append("no cache holding earlier tokens that is written in place")
        refused += inference_refusals(call)
        if refused:
            return refused
        prepared = self._prepared.get(cache)
        if prepared is None or prepared[0]() is not call.model:
            refused += self._structure_refusals(call.model)
        if not refused:
            weights = call.model.layers[0].self_attn.q_proj.weight.dtype
            kept = cache.layers[0].reserve(0)[0].dtype
            if kept != weights:
                refused.append(f"the cache is {kept}, the weights {weights}")
        return refused

    def _structure_refusals(self, model: nn.Module) -> list[str]:
        refused = llama_block_refusals(model)
        if refused:
            return refused
        if any(b.self_attn.scale is not None for b in model.layers):
            return ["the attention scale is not 1/sqrt(D)"]
        if not all(decode_layer.supports(block_weights(b)) for b in model.layers):
            return [
                "the weights are not all float32 or all bfloat16, contiguous, on the CPU, "
                "or the C kernel is unavailable"
            ]
        return []

    def __call__(self, call: ForwardCall) -> CausalLMOutput:
        model, cache = call.model, call.cache
        layers = self._layers(model, cache)
        _, positions = call.inputs
        x = model.embed(call.input_ids, positions).view(-1).float()  # (E,): updated in place
        cos, sin = (t.view(-1) for t in model.rotary(positions, x.view(1, 1, -1)))  # (D,)
        for layer, kv in zip(layers, cache.layers):
            layer(x, cos, sin, *kv.reserve(1), kv.length)  # caches (1, Hkv, capacity, D)
            kv.advance(1)
        x = x.to(model.tok_emb.weight.dtype).view(1, 1, -1)
        logits = model.lm_head(model.final_norm(x))  # (1, 1, V)
        return CausalLMOutput(logits=logits, attentions=[], cache=cache)

    def _layers(self, model: nn.Module, cache: KVCache) -> list[decode_layer.FusedLayer]:
        """The fused layers of ``model`` kept for ``cache`` (prepared at its first step)."""
        prepared = self._prepared.get(cache)
        if prepared is None or prepared[0]() is not model:
            layers = [
                decode_layer.FusedLayer(
                    block_weights(b), b.attn_norm.eps, b.self_attn.window, b.self_attn.num_heads
                )
                for b in model.layers
            ]
            prepared = self._prepared[cache] = (weakref.ref(model), layers)
        return prepared[1]
