"""The ``reference`` backend: :func:`qkv.attention.attention`, the formula itself.

It materialises the full ``(B, H, Tq, Tk)`` score matrix, serves every request (any mask,
dropout, weights, log-sum-exp, every dtype and device) and is what every fast path is
tested against. Nothing here but picking the heads and rows of the weights asked for.
"""

from __future__ import annotations

from qkv.attention import attention
from qkv.kernels.base import AttentionRequest, AttentionResult, Backend

__all__ = ["ReferenceBackend", "reference_attention"]


def reference_attention(req: AttentionRequest) -> AttentionResult:
    """Run :func:`qkv.attention.attention` on a request."""
    out, weights, lse = attention(
        req.q,
        req.k,
        req.v,
        req.mask,
        req.causal,
        req.scale,
        dropout_p=req.dropout_p,
        need_weights=True,
        need_lse=req.need_lse,
    )
    if not req.need_weights:
        return AttentionResult(out=out, lse=lse)
    if req.weight_heads is not None:
        weights = weights[:, list(req.weight_heads)]
    if req.weight_rows is not None:
        weights = weights[:, :, req.weight_rows[0] : req.weight_rows[1]]
    return AttentionResult(out=out, weights=weights, lse=lse)


class ReferenceBackend(Backend):
    """The formula; serves every request."""

    name = "reference"

    def why_not(self, req: AttentionRequest) -> list[str]:
        return []

    def __call__(self, req: AttentionRequest) -> AttentionResult:
        return reference_attention(req)
