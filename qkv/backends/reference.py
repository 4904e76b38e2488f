"""The reference backend: attention written out as the formula, step by step.

.. math::
    \\mathrm{Attention}(Q, K, V) = \\mathrm{softmax}\\left(\\frac{QK^\\top}{\\sqrt{d}} + M\\right) V

This is the backend the documentation walks through and the one every fast path is
tested against. It materialises the full ``(B, H, Tq, Tk)`` score matrix, supports every
feature (any mask, dropout, weights, log-sum-exp, every dtype and device) and is not fast.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from qkv.backends.base import (
    AttentionRequest,
    AttentionResult,
    Backend,
    as_bias,
    visible_rows,
)
from qkv.backends.tiles import prescaled

__all__ = ["ReferenceBackend", "reference_attention"]


def reference_attention(req: AttentionRequest) -> AttentionResult:
    """Compute attention with explicit matrices (see the module docstring)."""
    q, k, v = req.q, req.k, req.v
    # 0) GQA/MQA: every key/value head serves `groups` consecutive query heads.
    if req.groups > 1:
        k = k.repeat_interleave(req.groups, dim=1)  # (B, H, Tk, D)
        v = v.repeat_interleave(req.groups, dim=1)  # (B, H, Tk, Dv)

    # 1) compare every query with every key: (B, H, Tq, D) @ (B, H, D, Tk) -> (B, H, Tq, Tk).
    #    Scaled after the product, the order Hugging Face uses, which keeps pretrained
    #    models bit-exact (a power-of-two scale goes on the queries: the same bits, see
    #    `prescaled`); the in-place multiply adds no allocation. Half types score in
    #    float32, as torch's fused kernels do: a product past 65504 stays finite in
    #    float16, and so does a float32 mask's torch.finfo(float32).min (as -inf in half,
    #    it would hide a row that the mask only penalises).
    compute = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
    q, post = prescaled(q.to(compute), req.scale)
    scores = torch.matmul(q, k.to(compute).transpose(-2, -1)).to(compute)  # (autocast)
    if post is not None:
        scores = scores.mul_(post)

    # 2) hide what may not be seen: a boolean mask becomes a bias of 0 (keep) or -inf
    #    (remove), which is added like a float mask (an add is one vectorised pass, and
    #    its backward none; a masked_fill is neither).
    mask = req.full_mask()
    visible = visible_rows(mask)  # (B?, H?, Tq, 1): rows that see some key; None: all do
    if mask is not None:
        scores = scores + as_bias(mask, scores.dtype)
    if visible is not None:
        # A row that sees nothing gets finite scores here and zero weights below, so that
        # neither the output nor any gradient becomes NaN.
        scores = torch.where(visible, scores, torch.zeros((), dtype=scores.dtype))

    # 3) turn each row of scores into a probability distribution (float32 for half types).
    weights = torch.softmax(scores, dim=-1)
    lse = torch.logsumexp(scores, dim=-1) if req.need_lse else None
    if visible is not None:
        weights = torch.where(visible, weights, torch.zeros((), dtype=weights.dtype))
        if lse is not None:
            lse = lse.masked_fill(~visible.squeeze(-1), float("-inf"))
    weights = weights.to(req.q.dtype)

    # 4) dropout acts on the weights, as in the Transformer paper.
    dropped = F.dropout(weights, p=req.dropout_p) if req.dropout_p > 0 else weights

    # 5) the output is the weighted sum of the values: (B, H, Tq, Tk) @ (B, H, Tk, Dv)
    out = torch.matmul(dropped, v)
    return AttentionResult(out=out, weights=_selected(req, weights), lse=lse)


def _selected(req: AttentionRequest, weights):
    """The weights the request asked for: all, or some heads and query rows."""
    if not req.need_weights:
        return None
    if req.weight_heads is not None:
        weights = weights[:, list(req.weight_heads)]
    if req.weight_rows is not None:
        weights = weights[:, :, req.weight_rows[0] : req.weight_rows[1]]
    return weights


class ReferenceBackend(Backend):
    """Explicit math; serves every request."""

    name = "reference"

    def why_not(self, req: AttentionRequest) -> list[str]:
        return []

    def __call__(self, req: AttentionRequest) -> AttentionResult:
        return reference_attention(req)
