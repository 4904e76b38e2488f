"""The ``sdpa`` backend: ``torch.nn.functional.scaled_dot_product_attention``.

PyTorch picks its own fused kernel (flash, memory-efficient, cuDNN or a C++ CPU kernel).
qkv adds what SDPA does not do by itself: bottom-right causal alignment when ``Tq != Tk``,
zeros (not NaN) for query rows that see no key, and attention weights, recomputed beside
the fused output for only the heads and rows asked for (:mod:`qkv.kernels.weights`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from qkv.kernels.base import (
    AttentionRequest,
    AttentionResult,
    Backend,
    kernel_bias,
    visible_rows,
)
from qkv.kernels.weights import attention_weights

__all__ = ["SDPABackend", "computes_in_float32"]


def computes_in_float32(q: torch.Tensor) -> bool:
    """Whether SDPA runs this request in float32 (its inputs cast, its output cast back):
    one query row in half precision on the CPU, the query of decoding one token, where
    SDPA's half-precision kernel takes 3-5x the time of the float32 one with the casts
    (measured: BENCHMARKS.md, 'LLaMA-family decoding')."""
    return (
        q.device.type == "cpu" and q.dtype in (torch.bfloat16, torch.float16) and q.shape[-2] == 1
    )


class SDPABackend(Backend):
    """PyTorch's fused attention; weights recomputed beside it; no log-sum-exp."""

    name = "sdpa"

    def why_not(self, req: AttentionRequest) -> list[str]:
        reasons = []
        if req.need_weights and req.dropout_p > 0:
            reasons.append("cannot return weights that match its own dropout mask")
        if req.need_lse:
            reasons.append("does not return the log-sum-exp")
        return reasons

    def why_not_auto(self, req: AttentionRequest) -> list[str]:
        reasons = self.why_not(req)
        if req.need_weights and req.requires_grad and req.dropout_p == 0:
            # SDPA and the weights beside it cost more than the reference's one softmax
            # (measured: BENCHMARKS.md, 'Dispatch thresholds')
            reasons.insert(0, "weights under autograd: one explicit softmax is cheaper to train")
        return reasons

    def __call__(self, req: AttentionRequest) -> AttentionResult:
        if req.need_weights and req.weight_heads is None and req.weight_rows is None:
            weights, out = attention_weights(req, with_output=True)  # out follows from them
            return AttentionResult(out=out, weights=weights)
        q, k, v = req.q, req.k, req.v
        if computes_in_float32(q):
            q, k, v = q.float(), k.float(), v.float()
        tq, tk = q.shape[-2], k.shape[-2]
        # SDPA's own causal flag is top-left aligned; it agrees with ours only when Tq == Tk.
        use_flag = req.causal and req.mask is None and tq == tk
        mask = None if use_flag else req.full_mask()
        visible = visible_rows(mask)
        if visible is not None:  # let empty rows attend to everything; zeroed afterwards
            if mask.dtype == torch.bool:
                mask = mask | ~visible
            else:
                mask = torch.where(visible, mask, torch.zeros((), dtype=mask.dtype))
        if mask is not None:
            mask = kernel_bias(mask, q)  # what SDPA would do, in fewer passes
        out = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            dropout_p=req.dropout_p,
            is_causal=use_flag,
            scale=req.scale,
            enable_gqa=req.groups > 1,
        ).to(req.q.dtype)
        if visible is not None:
            out = torch.where(visible, out, torch.zeros((), dtype=out.dtype))
        weights = None
        if req.need_weights:
            weights = attention_weights(req, None, req.weight_heads, req.weight_rows)
        return AttentionResult(out=out, weights=weights)
