"""The ``chunked`` backend: exact attention with an online softmax over key blocks.

Keys are visited one block at a time; each query row keeps a running maximum ``m``, a
running normaliser ``l`` and a running weighted sum ``acc`` (Milakov & Gimelshein 2018;
Rabe & Staats 2021; Dao et al. 2022):

.. math::
    m' = \\max(m, \\max_j s_j),\\quad
    l' = e^{m - m'} l + \\sum_j e^{s_j - m'},\\quad
    acc' = e^{m - m'} acc + \\sum_j e^{s_j - m'} v_j

and at the end ``out = acc / l`` and ``lse = m + log l``. Only a ``(block_q, block_k)``
tile of scores exists at a time, so memory is ``O(Tq * block)`` instead of ``O(Tq * Tk)``.
Key blocks that the causal structure hides from a whole query block are skipped.
Weights, when asked for, are recomputed block by block from the log-sum-exp.
"""

from __future__ import annotations

import torch
from torch import Tensor

from qkv.backends.base import AttentionRequest, AttentionResult, Backend

__all__ = ["ChunkedBackend", "chunked_attention"]

BLOCK_Q = 512
BLOCK_K = 512


def _grouped(x: Tensor, hkv: int) -> Tensor:
    """(B, H, T, D) -> (B, Hkv, G, T, D): the query heads that share one key/value head."""
    b, h, t, d = x.shape
    return x.view(b, hkv, h // hkv, t, d)


def _grouped_mask(mask: Tensor | None, hkv: int) -> Tensor | None:
    """A 4-d broadcastable mask (B?, H?, Tq?, Tk?) -> 5-d (B?, Hkv?, G?, Tq?, Tk?)."""
    if mask is None:
        return None
    b, h, tq, tk = mask.shape
    if h == 1:
        return mask.unsqueeze(2)
    return mask.view(b, hkv, h // hkv, tq, tk)


def _tile(mask: Tensor | None, qs: int, qe: int, ks: int, ke: int) -> Tensor | None:
    """The part of a broadcastable mask for queries [qs, qe) and keys [ks, ke)."""
    if mask is None:
        return None
    if mask.shape[-2] != 1:
        mask = mask[..., qs:qe, :]
    if mask.shape[-1] != 1:
        mask = mask[..., ks:ke]
    return mask


def _masked_scores(req, qb, kb, user, qs, qe, ks, ke, shift, compute) -> Tensor:
    """Scaled scores of one tile with the user mask and the causal mask applied."""
    s = torch.matmul(qb.to(compute), kb.to(compute).transpose(-2, -1)) * req.scale
    tile = _tile(user, qs, qe, ks, ke)
    if tile is not None:
        if tile.dtype == torch.bool:
            s = s.masked_fill(~tile, float("-inf"))
        else:
            s = s + tile.to(compute)
    if req.causal and ke - 1 > qs + shift:  # some key in this tile is in some query's future
        rows = torch.arange(qs, qe, device=s.device).unsqueeze(1)
        cols = torch.arange(ks, ke, device=s.device).unsqueeze(0)
        s = s.masked_fill(cols > rows + shift, float("-inf"))
    return s


def chunked_attention(
    req: AttentionRequest, block_q: int = BLOCK_Q, block_k: int = BLOCK_K
) -> AttentionResult:
    """Exact attention in ``(block_q, block_k)`` tiles (see the module docstring)."""
    hkv = req.k.shape[1]
    q, k, v = _grouped(req.q, hkv), req.k.unsqueeze(2), req.v.unsqueeze(2)  # 5-d
    user = _grouped_mask(req.mask, hkv)
    tq, tk = q.shape[-2], k.shape[-2]
    shift = tk - tq  # bottom-right alignment: query i sees keys j <= i + shift
    compute = torch.float64 if q.dtype == torch.float64 else torch.float32
    outs, lses = [], []
    for qs in range(0, tq, block_q):
        qe = min(qs + block_q, tq)
        qb = q[..., qs:qe, :]
        m = l = acc = None
        last_key = min(tk, qe + shift) if req.causal else tk  # keys past this are hidden
        for ks in range(0, max(last_key, 0), block_k):
            ke = min(ks + block_k, tk)
            s = _masked_scores(req, qb, k[..., ks:ke, :], user, qs, qe, ks, ke, shift, compute)
            m_new = s.amax(dim=-1, keepdim=True)
            if m is not None:
                m_new = torch.maximum(m, m_new)
            m_safe = torch.nan_to_num(m_new, neginf=0.0)  # rows with nothing seen yet
            p = torch.exp(s - m_safe)
            pv = torch.matmul(p, v[..., ks:ke, :].to(compute))
            if m is None:
                l, acc = p.sum(dim=-1, keepdim=True), pv
            else:
                alpha = torch.exp(m - m_safe)
                l = l * alpha + p.sum(dim=-1, keepdim=True)
                acc = acc * alpha + pv
            m = m_new
        if m is None:  # causal with no visible key at all for this block
            shape = qb.shape[:-1] + (1,)
            m = torch.full(shape, float("-inf"), dtype=compute, device=q.device)
            l = torch.zeros(shape, dtype=compute, device=q.device)
            acc = torch.zeros(qb.shape[:-1] + (v.shape[-1],), dtype=compute, device=q.device)
        seen = l > 0
        outs.append(torch.where(seen, acc / torch.where(seen, l, 1.0), 0.0))
        lses.append(torch.where(seen, m + torch.log(torch.where(seen, l, 1.0)), float("-inf")))
    b, h = req.q.shape[:2]
    out = torch.cat(outs, dim=-2).reshape(b, h, tq, -1).to(req.q.dtype)
    lse = torch.cat(lses, dim=-2).reshape(b, h, tq)  # float32 (float64 for float64 inputs)
    weights = weights_from_lse(req, lse, block_k) if req.need_weights else None
    return AttentionResult(out=out, weights=weights, lse=lse if req.need_lse else None)


def weights_from_lse(req: AttentionRequest, lse: Tensor, block_k: int = BLOCK_K) -> Tensor:
    """Attention weights recomputed from the log-sum-exp: ``exp(QK^T * scale + M - lse)``.

    Shape: lse ``(B, H, Tq)`` -> weights ``(B, H, Tq, Tk)``. Rows with ``lse = -inf``
    (no visible key) get zeros.
    """
    hkv = req.k.shape[1]
    q, k = _grouped(req.q, hkv), req.k.unsqueeze(2)
    user = _grouped_mask(req.mask, hkv)
    tq, tk = q.shape[-2], k.shape[-2]
    compute = torch.float64 if q.dtype == torch.float64 else torch.float32
    lse5 = _grouped(lse.unsqueeze(-1), hkv).to(compute)  # (B, Hkv, G, Tq, 1)
    lse5 = torch.where(torch.isinf(lse5), float("inf"), lse5)  # exp(s - inf) = 0
    tiles = []
    for ks in range(0, tk, block_k):
        ke = min(ks + block_k, tk)
        s = _masked_scores(req, q, k[..., ks:ke, :], user, 0, tq, ks, ke, tk - tq, compute)
        tiles.append(torch.exp(s - lse5))
    b, h = req.q.shape[:2]
    return torch.cat(tiles, dim=-1).reshape(b, h, tq, tk).to(req.q.dtype)


class ChunkedBackend(Backend):
    """Online softmax over key blocks: O(Tq * block) memory, any mask, returns the lse."""

    name = "chunked"

    def why_not(self, req: AttentionRequest) -> list[str]:
        if req.dropout_p > 0:
            return ["does not implement attention dropout"]
        return []

    def __call__(self, req: AttentionRequest) -> AttentionResult:
        return chunked_attention(req)
