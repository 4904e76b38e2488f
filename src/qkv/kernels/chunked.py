"""The ``chunked`` backend: exact attention with an online softmax over key blocks.

Keys are visited one block at a time; each query row keeps a running maximum ``m``, a
running normaliser ``l`` and a running weighted sum ``acc`` (Milakov & Gimelshein 2018;
Rabe & Staats 2021; Dao et al. 2022):

.. math::
    m' = \\max(m, \\max_j s_j),\\quad
    l' = e^{m - m'} l + \\sum_j e^{s_j - m'},\\quad
    acc' = e^{m - m'} acc + \\sum_j e^{s_j - m'} v_j

and at the end ``out = acc / l`` and ``lse = m + log l``. Only a tile of scores exists at a
time, so memory is ``O(Tq * block)`` instead of ``O(Tq * Tk)``.

That loop (:func:`_query_block`) is the readable reference, and it is what runs when the
log-sum-exp is asked for. What makes the backend fast on a CPU, with no compile step:

- **Visible key ranges.** Before any arithmetic, the mask (causal, sliding window, key
  padding, documents, any boolean or ``-inf`` pattern) is reduced to one key range
  ``[lo, hi)`` per block of queries (:mod:`qkv.kernels.ranges`); keys outside it are never
  touched. A banded mask therefore costs what its visible area costs, as with
  FlexAttention's block masks. A mask that differs per sequence gets ranges per sequence.
- **A fused kernel inside each range.** Without the lse, every query block hands its range
  to torch's fused SDPA kernel (:func:`fused_blocks`), whose mask temporaries are then one
  block in size instead of ``Tq x Tk``. Where a mask must go along (:func:`_masked_run`):
  in float32, whole rows of scores with the mask read by one C softmax pass
  (:mod:`qkv.kernels.rows`); else calls of about 224 x 512 scores to torch's CPU flash
  kernel, merged in place by the lse each returns, each call's bias in one reused buffer
  (rows whose lse float32 cannot hold precisely enough, such as rows at
  ``torch.finfo(float32).min``, again through the online softmax).
- **Big tiles, masks as biases.** In the online loop a query block takes as many keys at
  once as fit in :data:`TILE_ELEMENTS` scores (usually the whole range: no rescaling),
  adds masks as ``0 / -inf`` biases, and applies the causal mask to diagonal columns only.

Weights, when asked for, are recomputed block by block
(:func:`qkv.kernels.weights.attention_weights`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from qkv.kernels import rows as rows_path
from qkv.kernels.base import (
    AttentionRequest,
    AttentionResult,
    Backend,
    Scratch,
    kernel_bias,
    restrict,
    visible_rows,
)
from qkv.kernels.ranges import BLOCK_Q, KeyRanges, key_ranges
from qkv.kernels.sdpa import SDPABackend
from qkv.kernels.tiles import (
    RunningMerge,
    grouped,
    grouped_mask,
    lse_limit,
    masked_scores,
    weighted_values,
)
from qkv.kernels.weights import attention_weights

__all__ = ["ChunkedBackend", "KeyRanges", "chunked_attention", "key_ranges"]

TILE_ELEMENTS = 1 << 20  # scores per tile (4 MiB in float32) before a range is split
# Most query rows per SDPA call: longer calls are faster, up to about this many (measured:
# BENCHMARKS.md, 'Chunked backend').
FUSED_ROWS = 512
# Masked calls: the float copy of the mask is most of the memory beside the output. A split
# call of this many scores keeps the peak memory within a quarter of SDPA's at about SDPA's
# time; larger calls pass that memory, smaller or other shapes are slower (measured:
# BENCHMARKS.md, 'Chunked backend'). torch's kernel takes 64-row query tiles from 192 rows
# on (32 below) and 512-key tiles.
SPLIT_ROWS, SPLIT_KEYS = 224, 512
# Most bytes of bias per unsplit masked call (autograd, grouped heads): 2^17 float32 scores,
# twice as many in bf16, so that calls have enough rows for torch's kernel to take 64-row
# tiles (from 192 rows on), which is faster (measured: BENCHMARKS.md, 'Chunked backend').
FUSED_MASK_BYTES = 512 << 10
MIN_TILE_KEYS = 64  # however many rows a block has, a tile takes at least this many keys
EXP_FLOOR = -87.0  # exp(-87) ~ 1.6e-38: the smallest input before float32 underflow


def _softmax_tile(s: Tensor, v: Tensor, state, inplace: bool):
    """One online-softmax step: fold the tile ``s`` and values ``v`` into ``(m, l, acc)``.

    ``inplace`` (no autograd) overwrites ``s`` and the state instead of allocating.
    """
    m_tile = s.amax(dim=-1, keepdim=True)
    m_new = m_tile if state is None else torch.maximum(state[0], m_tile)
    m_safe = torch.nan_to_num(m_new, neginf=0.0)  # rows that have seen nothing yet
    # exp is slow on inputs far below its range; clamping makes hidden keys 1e-38, not 0,
    # which no sum can see (the row maximum contributes 1), and `seen` below uses m, not l.
    if inplace:
        p = s.sub_(m_safe).clamp_min_(EXP_FLOOR).exp_()
    else:
        p = torch.exp((s - m_safe).clamp_min(EXP_FLOOR))
    pv = weighted_values(p, v)
    if state is None:
        return m_new, p.sum(dim=-1, keepdim=True), pv
    m, l, acc = state
    alpha = torch.exp(m - m_safe)
    if inplace:
        return m_new, l.mul_(alpha).add_(p.sum(dim=-1, keepdim=True)), acc.mul_(alpha).add_(pv)
    return m_new, l * alpha + p.sum(dim=-1, keepdim=True), acc * alpha + pv


def _query_block(req, q, k, v, user, qs, qe, lo, hi, dense, compute):
    """Output and lse of queries [qs, qe) over their visible keys [lo, hi)."""
    shift = k.shape[-2] - q.shape[-2]
    qb = q[..., qs:qe, :]
    rows = qb.shape[:-2].numel() * (qe - qs)
    step = max(TILE_ELEMENTS // max(rows, 1), MIN_TILE_KEYS)
    inplace = not req.requires_grad
    state = None
    for ks in range(lo, hi, step):
        ke = min(ks + step, hi)
        s = masked_scores(req, qb, k[..., ks:ke, :], user, qs, qe, ks, ke, shift, compute, dense)
        state = _softmax_tile(s, v[..., ks:ke, :].to(compute), state, inplace)
    if state is None:  # no visible key for the whole block
        shape = qb.shape[:-1] + (1,)
        m = torch.full(shape, float("-inf"), dtype=compute, device=q.device)
        return torch.zeros(qb.shape[:-1] + (v.shape[-1],), dtype=compute, device=q.device), m
    m, l, acc = state
    empty = m == float("-inf")  # not `m > -inf`: a NaN row must stay NaN, not look empty
    out = torch.where(empty, 0.0, acc / torch.where(empty, 1.0, l))
    lse = torch.where(empty, float("-inf"), m + torch.log(torch.where(empty, 1.0, l)))
    return out, lse


def chunked_attention(
    req: AttentionRequest, ranges: KeyRanges | None = None, block_q: int = BLOCK_Q
) -> AttentionResult:
    """Exact attention, one query block and its visible keys at a time (module docstring).

    Without ``need_lse`` each block runs torch's fused kernel on its key range
    (:func:`fused_blocks`); with it, the online softmax below, which yields the lse.
    """
    ranges = ranges if ranges is not None else key_ranges(req, block_q)
    if not req.need_lse:
        weights = None
        if req.need_weights:
            weights = attention_weights(req, None, req.weight_heads, req.weight_rows)
        return AttentionResult(out=_in_graph(req, fused_blocks(req, ranges)), weights=weights)
    hkv = req.k.shape[1]
    q, k, v = grouped(req.q, hkv), req.k.unsqueeze(2), req.v.unsqueeze(2)  # 5-d
    user = grouped_mask(req.mask, hkv)
    compute = torch.float64 if q.dtype == torch.float64 else torch.float32
    per_sequence = len(ranges.lo) > 1
    outs, lses = [], []
    for g in range(len(ranges.lo)):
        sel = slice(g, g + 1) if per_sequence else slice(None)
        qg, kg, vg = q[sel], k[sel], v[sel]
        ug = user[sel] if per_sequence else user
        o_rows, l_rows = [], []
        for i, (lo, hi) in enumerate(zip(ranges.lo[g], ranges.hi[g])):
            qs, qe = i * ranges.block_q, min((i + 1) * ranges.block_q, q.shape[-2])
            o, lse = _query_block(req, qg, kg, vg, ug, qs, qe, lo, hi, ranges.dense[g][i], compute)
            o_rows.append(o)
            l_rows.append(lse)
        if not o_rows:  # Tq = 0: no block of queries
            o_rows = [qg.new_zeros(qg.shape[:-1] + v.shape[-1:], dtype=compute)]
            l_rows = [qg.new_zeros(qg.shape[:-1] + (1,), dtype=compute)]
        outs.append(torch.cat(o_rows, dim=-2))
        lses.append(torch.cat(l_rows, dim=-2))
    b, h, tq = req.q.shape[:3]
    out = torch.cat(outs, dim=0).reshape(b, h, tq, req.v.shape[-1]).to(req.q.dtype)
    lse = torch.cat(lses, dim=0).reshape(b, h, tq)  # float32 (float64 for float64 inputs)
    weights = None
    if req.need_weights:
        weights = attention_weights(req, lse, req.weight_heads, req.weight_rows)
    out, lse = _in_graph(req, out), _in_graph(req, lse)
    return AttentionResult(out=out, weights=weights, lse=lse if req.need_lse else None)


def _in_graph(req: AttentionRequest, t: Tensor) -> Tensor:
    """``t`` joined to the autograd graph of the inputs where no block put it there (no
    row sees a key, or there are none): backward then gives zero gradients, as for the
    formula, instead of failing on an output without ``grad_fn``."""
    if t.requires_grad or not req.requires_grad:
        return t
    inputs = [x for x in (req.q, req.k, req.v, req.mask) if x is not None and x.requires_grad]
    return t + sum(x[..., :0].sum() for x in inputs).to(t.dtype)  # an empty sum: exactly 0


def fused_blocks(req: AttentionRequest, ranges: KeyRanges) -> Tensor:
    """The output alone: every query block calls torch SDPA on its visible keys only.

    SDPA's CPU kernel computes every score it is given and masks afterwards; handing it
    one query block and just the keys of its range skips what the mask hides in whole
    blocks, and its mask temporaries shrink to one block.
    """
    tq = req.q.shape[-2]
    per_sequence = len(ranges.lo) > 1
    # Every row is written below (zeros for blocks without keys), so the output starts
    # empty: a zero fill of fresh pages costs time for nothing (measured: BENCHMARKS.md,
    # 'Chunked backend').
    out = req.q.new_empty(req.q.shape[:-1] + req.v.shape[-1:])
    scratch = Scratch()  # every masked call's bias in one buffer
    for g in range(len(ranges.lo)):
        sel = slice(g, g + 1) if per_sequence else slice(None)
        # split calls cut runs themselves: longer runs leave fewer short remainders
        for run in _runs(ranges, g, tq, tq if _splittable(req) else FUSED_ROWS):
            qs, qe, lo, hi, dense = run
            if hi <= lo:  # the block sees no key at all
                out[sel, :, qs:qe] = 0
                continue
            if _carries_mask(req, qs, hi, dense):
                _masked_run(req, sel, run, out, scratch)
            else:
                out[sel, :, qs:qe] = _fused_call(req, sel, qs, qe, run)
    return out


def _runs(
    ranges: KeyRanges, g: int, tq: int, most_rows: int = FUSED_ROWS
) -> list[tuple[int, int, int, int, bool]]:
    """``(qs, qe, lo, hi, dense)``: consecutive query blocks with the same key range merged,
    up to ``most_rows`` rows (SDPA's CPU kernel is slower on short calls)."""
    runs: list[tuple[int, int, int, int, bool]] = []
    for i, key in enumerate(zip(ranges.lo[g], ranges.hi[g], ranges.dense[g])):
        qs, qe = i * ranges.block_q, min((i + 1) * ranges.block_q, tq)
        if runs and runs[-1][2:] == key and qe - runs[-1][0] <= most_rows:
            runs[-1] = (runs[-1][0], qe, *key)
        else:
            runs.append((qs, qe, *key))
    return runs


def _masked_run(
    req: AttentionRequest, sel: slice, run: tuple, out: Tensor, scratch: Scratch
) -> None:
    """A run whose tiles carry a mask, in calls whose masks stay small.

    SDPA copies a boolean mask into a float bias of the call's size. Where it can, the run
    goes in calls of about :data:`SPLIT_ROWS` x :data:`SPLIT_KEYS` scores
    (:func:`_split_calls`); else (autograd, grouped heads) in calls of whole key ranges and
    at most :data:`FUSED_MASK_BYTES` of bias.
    """
    qs, qe, lo, hi, dense = run
    if rows_path.serves(req):  # float32 without autograd: whole rows, one C softmax pass
        rows_path.masked_rows(req, sel, run, out, scratch)
        return
    if _splittable(req):
        _split_calls(req, sel, run, out, scratch)
        return
    rows = max(1, FUSED_MASK_BYTES // ((hi - lo) * req.q.element_size()))
    for a in range(qs, qe, rows):
        b = min(a + rows, qe)
        out[sel, :, a:b] = _fused_call(req, sel, a, b, run)


def _split_calls(
    req: AttentionRequest, sel: slice, run: tuple, out: Tensor, scratch: Scratch
) -> None:
    """A masked run in calls of :data:`SPLIT_ROWS` x :data:`SPLIT_KEYS` scores to torch's
    CPU flash kernel, merged in place by their log-sum-exp (:class:`~.tiles.RunningMerge`).

    Half types get the same bytes of bias per call (twice the keys, or more rows over a
    shorter range) and merge in float32. Each merged call's output was rounded once to its
    dtype by the kernel, and the merge averages them, which costs at most half an ulp of
    max |v| more than one fused call, and is faster than SDPA (measured: BENCHMARKS.md,
    'Chunked backend').

    The merge weighs each call by its lse, which the kernel rounds to float32: rows whose
    lse lies beyond :func:`~.tiles.lse_limit` (scores all near a huge negative fill
    such as ``torch.finfo(float32).min``, where ``m + log l`` rounds to ``m``) are computed
    again by the online softmax, which keeps the maximum and the sum apart
    (:func:`_exact_rows`).
    """
    qs, qe, lo, hi, dense = run
    size = req.q.element_size()
    keys = SPLIT_KEYS * max(1, 4 // size)
    rows = max(SPLIT_ROWS, SPLIT_ROWS * SPLIT_KEYS * 4 // (min(hi - lo, keys) * size))
    step = -(-(qe - qs) // max(1, (qe - qs) // rows))  # >= rows rows, if it can
    wide = torch.promote_types(out.dtype, torch.float32)  # half types merge in float32
    single = hi - lo <= keys  # one call per block of rows: no lse, no merge
    for a in range(qs, qe, step):
        b = min(a + step, qe)
        dst = out[sel, :, a:b]
        acc = dst if dst.dtype == wide or single else torch.empty(dst.shape, dtype=wide)
        merge = RunningMerge(acc)
        for ks in range(lo, hi, keys):
            ke = min(ks + keys, hi)
            o, lse = _flash_with_lse(req, sel, a, b, ks, ke, dense, not single, scratch)
            merge.add(o, lse)
            del o  # before the next call makes its own
        merge.finish()
        if not single:
            _exact_rows(req, sel, (a, b, lo, hi, dense), merge.lse(), acc)
        if acc is not dst:
            dst.copy_(acc)


def _exact_rows(req: AttentionRequest, sel: slice, run: tuple, lse: Tensor, acc: Tensor):
    """Rows of a merged run whose lse is too large in magnitude to have weighed its calls
    (:func:`~.tiles.lse_limit`), written into ``acc`` ``(B, H, rows, Dv)`` again by
    the online softmax, from the first such row to the last.

    Such rows are rare (a padded row under a float mask, a fill such as ``-1e6``), and
    finding them costs one comparison per row: nothing is read twice where there are none.
    """
    qs, _, lo, hi, dense = run
    far = torch.isfinite(lse) & (lse.abs() > lse_limit(req.q.dtype))  # (B, H, rows)
    rows = far.flatten(0, -2).any(dim=0).nonzero()
    if len(rows) == 0:
        return
    r0, r1 = int(rows[0]), int(rows[-1]) + 1
    hkv = req.k.shape[1]
    q, k, v = grouped(req.q[sel], hkv), req.k[sel].unsqueeze(2), req.v[sel].unsqueeze(2)
    user = grouped_mask(req.mask, hkv)
    user = user[sel] if user is not None and user.shape[0] > 1 else user
    compute = torch.float64 if q.dtype == torch.float64 else torch.float32
    o, _ = _query_block(req, q, k, v, user, qs + r0, qs + r1, lo, hi, dense, compute)
    acc[:, :, r0:r1] = o.flatten(1, 2)  # (B, Hkv, G, rows, Dv) -> (B, H, rows, Dv)


def _splittable(req: AttentionRequest) -> bool:
    return (
        not req.requires_grad
        and req.groups == 1
        and req.q.device.type == "cpu"
        and req.q.dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16)
        and hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu")
    )


def _flash_with_lse(
    req, sel, qs, qe, ks, ke, dense, exact_lse=True, scratch=None
) -> tuple[Tensor, Tensor]:
    """Output and lse of queries [qs, qe) over keys [ks, ke) from torch's CPU flash kernel;
    without ``exact_lse``, rows that see no key keep the kernel's lse of 0. A boolean
    mask's bias goes in ``scratch`` when given."""
    mask = _block_mask(req, sel, qs, qe, ks, ke, dense)
    bias = None if mask is None else kernel_bias(mask, req.q, scratch)
    q, k, v = req.remember("flash_inputs", lambda: _flash_inputs(req))
    q, k, v = q[sel, :, qs:qe], k[sel, :, ks:ke], v[sel, :, ks:ke]
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    out, lse = flash(q, k, v, attn_mask=bias, scale=req.scale)
    out = out[..., : req.v.shape[-1]]  # the columns of zeros padded onto v, if any
    if bias is not None and exact_lse:  # the kernel reports lse 0 (and out 0) for a row
        seen = visible_rows(mask)  # that sees nothing: make it -inf (None: every row sees)
        if seen is not None:
            lse.masked_fill_(~seen.squeeze(-1), float("-inf"))
    return out, lse


def _flash_inputs(req: AttentionRequest) -> tuple[Tensor, Tensor, Tensor]:
    """q, k, v as torch's CPU flash kernel takes them, copied once per request if needed.

    The kernel reads a last dimension of stride other than 1 wrongly without a word (a
    transposed key: errors of order 1), and wants one head size: zeros padded onto q and
    k (to Dv) change no score, and zeros padded onto v (to D) only add output columns,
    which :func:`_flash_with_lse` drops.
    """
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (req.q, req.k, req.v))
    d, dv = q.shape[-1], v.shape[-1]
    if dv > d:
        q, k = F.pad(q, (0, dv - d)), F.pad(k, (0, dv - d))
    elif dv < d:
        v = F.pad(v, (0, d - dv))
    return q, k, v


def _fused_call(req: AttentionRequest, sel: slice, qs: int, qe: int, run: tuple) -> Tensor:
    """SDPA (qkv's backend) on queries [qs, qe) and the run's keys.

    Under autograd in half precision, the calls' parts of dk and dv add up in float32
    (:class:`_WideSum`), and each query head of a group gets a call of its own: torch's CPU
    kernel adds the heads of a group in half precision.
    """
    lo, hi, dense = run[2:]
    mask = _block_mask(req, sel, qs, qe, lo, hi, dense)
    q = req.q[sel, :, qs:qe]
    half = req.q.dtype in (torch.float16, torch.bfloat16)
    if not (req.requires_grad and half):
        return _sdpa_call(req, q, req.k[sel, :, lo:hi], req.v[sel, :, lo:hi], mask)
    sums = req.remember("wide_sums", lambda: (_WideSum.apply(req.k), _WideSum.apply(req.v)))
    where = (sel, slice(None), slice(lo, hi))
    g = req.groups
    heads = q.unflatten(1, (-1, g))  # (B, Hkv, G, rows, D)
    outs = []
    for i in range(g):  # keys and values of their own per call: one tensor that several
        # calls read would get its gradient parts added in its own dtype first
        k, v = (_WidePart.apply(s, x.detach(), where) for s, x in zip(sums, (req.k, req.v)))
        outs.append(_sdpa_call(req, heads[:, :, i], k, v, _group_member(mask, i, g)))
    if g == 1:
        return outs[0]
    return torch.stack(outs, dim=2).flatten(1, 2)  # (B, Hkv, G, rows, Dv) -> (B, H, rows, Dv)


def _sdpa_call(req: AttentionRequest, q: Tensor, k: Tensor, v: Tensor, mask) -> Tensor:
    block = AttentionRequest(q, k, v, mask, False, req.scale, 0.0, False, False)
    return SDPABackend()(block).out


def _group_member(mask: Tensor | None, i: int, groups: int) -> Tensor | None:
    """The heads of a 4-d per-head ``mask`` that are the ``i``-th of their group."""
    if mask is None or mask.dim() < 4 or mask.shape[1] == 1:
        return mask
    return mask.unflatten(1, (-1, groups))[:, :, i]


class _WideSum(torch.autograd.Function):
    """Stands for a half-precision ``x`` whose gradient arrives in parts: autograd adds the
    parts in float32 (:class:`_WidePart` hands them over in float32), and the sum is
    rounded to ``x``'s dtype once.

    Every fused call of a key range returns its own part of dk and dv, rounded once to
    half precision; added in half precision, each sum was rounded again. With the heads of
    a group in one call, torch's CPU kernel added them in half precision as well: fp16, one
    key/value head for 16 query heads, 1023 x 1024, D = 224, causal put dk or dv at 3.6 to
    4.7 times the error of the plain math in fp16 (both against float64; 1.0 to 1.4 times
    now), where FlashAttention's rule allows 3.

    The stand-in holds no data: a float32 scalar expanded to ``x``'s shape.
    """

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        ctx.dtype = x.dtype
        return torch.empty((), dtype=torch.float32, device=x.device).expand(x.shape)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        return grad.to(ctx.dtype)


class _WidePart(torch.autograd.Function):
    """``x[where]`` (a view: nothing is copied), whose gradient goes to the stand-in
    ``wide`` of x (:class:`_WideSum`) in float32."""

    @staticmethod
    def forward(ctx, wide: Tensor, x: Tensor, where: tuple) -> Tensor:
        ctx.shape, ctx.where = wide.shape, where
        return x[where]

    @staticmethod
    def backward(ctx, grad: Tensor):
        full = grad.new_zeros(ctx.shape, dtype=torch.float32)
        full[ctx.where] = grad
        return full, None, None


def _carries_mask(req: AttentionRequest, qs: int, hi: int, dense: bool) -> bool:
    """Whether queries from ``qs`` over keys up to ``hi`` need a mask: the user's hides some
    key in range, or some key is in some row's future."""
    return not dense or _causal_cut(req, qs, hi)


def _causal_cut(req: AttentionRequest, qs: int, hi: int) -> bool:
    return req.causal and hi > qs + req.k.shape[-2] - req.q.shape[-2] + 1


def _block_mask(req: AttentionRequest, sel: slice, qs: int, qe: int, lo: int, hi: int, dense):
    """The user mask of queries [qs, qe) and keys [lo, hi), with the causal part folded in."""
    mask = None
    if req.mask is not None and not dense:
        m = req.mask
        m = m[sel] if m.shape[0] > 1 else m
        m = m[:, :, qs:qe] if m.shape[2] > 1 else m
        mask = m[..., lo:hi] if m.shape[3] > 1 else m
    if _causal_cut(req, qs, hi):  # some key of the range is in some row's future
        shift = req.k.shape[-2] - req.q.shape[-2]
        rows = torch.arange(qs, qe, device=req.q.device).unsqueeze(1)
        cols = torch.arange(lo, hi, device=req.q.device).unsqueeze(0)
        mask = restrict(mask, cols <= rows + shift)
    return mask


class ChunkedBackend(Backend):
    """Online softmax over visible key ranges: O(Tq * block) memory, any mask, the lse."""

    name = "chunked"

    def why_not(self, req: AttentionRequest) -> list[str]:
        if req.dropout_p > 0:
            return ["does not implement attention dropout"]
        return []

    def __call__(self, req: AttentionRequest) -> AttentionResult:
        return chunked_attention(req, req.remember("key_ranges", lambda: key_ranges(req)))
