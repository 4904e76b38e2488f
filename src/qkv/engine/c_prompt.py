"""A float32 prompt through LLaMA-family blocks with the small steps between the products
in C: a runner of the forward pass.

Over a prompt, a block's projections are matrix products (torch's, at the core's rate) and
what lies between them is a few small steps, two RMSNorms, the rotation of queries and
keys, SwiGLU's gate, on which torch spends several passes over the rows each (about a
ninth of a float32 prompt of 1,024 tokens on one thread: BENCHMARKS.md, 'LLaMA-family
decoding'). :func:`prompt_block` is :meth:`DecoderBlock.forward
<qkv.modules.DecoderBlock.forward>` with each of those steps one pass in C
(:mod:`qkv.kernels.layer_steps`), each residual sum inside its product (``addmm_``), and,
in the last block, queries, attention and the rest only for the positions whose logits
are kept. Tested against the model's own forward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qkv.engine.runner import ForwardCall, Runner, inference_refusals, llama_block_refusals
from qkv.functional import scaled_dot_product_attention
from qkv.kernels import layer_steps, matvec
from qkv.modules.cache import LayerKV
from qkv.modules.decoder import CausalLMOutput, DecoderBlock

__all__ = ["PromptStepsRunner", "prompt_block"]


class PromptStepsRunner(Runner):
    """Float32 inference of LLaMA-family blocks on the CPU, the steps between the products
    in C (:func:`prompt_block`)."""

    name = "c_prompt"

    def why_not(self, call: ForwardCall) -> list[str]:
        refused = inference_refusals(call) + llama_block_refusals(call.model)
        if refused:
            return refused
        model = call.model
        tk = call.input_ids.shape[1] + (call.cache.length if call.cache is not None else 0)
        windows = [b.self_attn.window for b in model.layers if b.self_attn.window is not None]
        if windows and tk > min(windows):
            refused.append(f"{tk} keys pass the sliding window of {min(windows)}")
        if any(b.self_attn.scale is not None for b in model.layers):
            refused.append("the attention scale is not 1/sqrt(D)")
        if not all(w.dtype == torch.float32 and w.device.type == "cpu" for w in model.parameters()):
            refused.append("the weights are not all float32 on the CPU")
        elif matvec.why_unavailable() is not None:
            refused.append(f"the C kernel is unavailable: {matvec.why_unavailable()}")
        elif not all(w.is_contiguous() for w in _gains(model)):
            refused.append("the norms' gains are not contiguous")
        return refused

    def __call__(self, call: ForwardCall) -> CausalLMOutput:
        model, cache, keep = call.model, call.cache, call.logits_to_keep
        _, positions = call.inputs
        x = model.embed(call.input_ids, positions)  # (B, T, E): a new tensor, updated in place
        cos, sin = (c.squeeze(1).contiguous() for c in model.rotary(positions, x))  # (B, T, D)
        last = len(model.layers) - 1
        for i, block in enumerate(model.layers):
            kept = keep if i == last and keep else None
            x = prompt_block(block, x, cos, sin, None if cache is None else cache[i], kept)
        x = x[:, -keep:] if keep else x  # (B, T or logits_to_keep, E)
        logits = model.lm_head(model.final_norm(x))  # (B, T, V)
        return CausalLMOutput(logits=logits, attentions=[], cache=cache)


def prompt_block(
    block: DecoderBlock,
    x: Tensor,
    cos: Tensor,
    sin: Tensor,
    cache: LayerKV | None,
    keep: int | None = None,
) -> Tensor:
    """:meth:`DecoderBlock.forward <qkv.modules.DecoderBlock.forward>` of a float32
    LLaMA-family block at inference, without padding: the same products and attention,
    the norms, rotations and gate in C (one pass each), each residual sum inside its
    product. ``x`` is updated in place and returned.

    With ``keep``, only the last ``keep`` positions come out (the last block, when only
    their logits are wanted): the keys and values of every position are still made (and
    cached), the queries, attention, output product and feed-forward only of those
    positions, the others' outputs being used nowhere.

    Shape:
        x ``(B, T, E)``, contiguous; cos and sin ``(B or 1, T, D)``. Returns ``(B, T, E)``
        (``x``), or ``(B, keep, E)`` with ``keep``.
    """
    a, ff = block.self_attn, block.ff
    b, t, e = x.shape
    h, hkv, d = a.num_heads, a.num_kv_heads, a.head_dim

    def product(inputs: Tensor, linear: nn.Linear) -> Tensor:  # (rows, in) -> (rows, out)
        return F.linear(inputs, linear.weight, linear.bias)

    def add_product(rows: Tensor, inputs: Tensor, linear: nn.Linear) -> None:
        rows.addmm_(inputs, linear.weight.t())  # rows += inputs W^T + b
        if linear.bias is not None:
            rows.add_(linear.bias)

    def norm(rows: Tensor, gain: nn.Module, out: Tensor) -> Tensor:
        return layer_steps.rms_norm_rows(rows, gain.weight, gain.eps, out)

    # 1) attention: the keys and values of every position, the rest of those kept
    n = norm(x.view(b * t, e), block.attn_norm, x.new_empty(b * t, e))
    k = layer_steps.rotate_rows(product(n, a.k_proj).view(b, t, hkv, d), cos, sin)
    v = product(n, a.v_proj).view(b, t, hkv, d)
    if keep is not None and keep < t:  # from here on, the last `keep` positions only
        x, t = x[:, -keep:].contiguous(), keep
        n = n.view(b, -1, e)[:, -keep:].contiguous().view(b * t, e)
        cos, sin = (c[:, -keep:].contiguous() for c in (cos, sin))
    rows = x.view(b * t, e)  # the residual stream, updated in place
    q = layer_steps.rotate_rows(product(n, a.q_proj).view(b, t, h, d), cos, sin)
    k, v = k.transpose(1, 2), v.transpose(1, 2)
    if cache is not None:
        k, v = cache.append(k, v)
    out = scaled_dot_product_attention(q.transpose(1, 2), k, v, causal=True)  # (B, H, T, D)
    add_product(rows, out.transpose(1, 2).reshape(b * t, h * d), a.out_proj)

    # 2) feed-forward: rows + down(silu(gate(n)) * up(n))
    n = norm(rows, block.ff_norm, n)
    gate = layer_steps.silu_times(product(n, ff.gate_proj), product(n, ff.up_proj))
    add_product(rows, gate, ff.down_proj)
    return x


def _gains(model: nn.Module) -> list[Tensor]:
    """The RMSNorm gains of every block."""
    return [norm.weight for b in model.layers for norm in (b.attn_norm, b.ff_norm)]
