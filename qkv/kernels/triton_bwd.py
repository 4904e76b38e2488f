"""Backward pass of the Triton FlashAttention-2 kernel.

FlashAttention-2 (Dao 2023, https://arxiv.org/abs/2307.08691, Algorithm 2) recomputes the
probabilities from the saved log-sum-exp instead of storing them:

.. math::
    P = \\exp(s\\,QK^\\top - L),\\quad dV = P^\\top dO,\\quad dP = dO\\,V^\\top,\\quad
    dS = P \\circ (dP - \\Delta),\\quad dQ = s\\,dS\\,K,\\quad dK = s\\,dS^\\top Q

with :math:`\\Delta_i = \\sum_d dO_{id} O_{id} - dL_i` (the second term carries the gradient
of the returned log-sum-exp, since :math:`\\partial L_i / \\partial S_{ij} = P_{ij}`).

Two kernels, no atomics, deterministic: one program per key block accumulates ``dK, dV``
over every query block and every query head of its GQA group (so grouped heads are summed in
registers, never materialised); one program per query block accumulates ``dQ``. Each key or
query range is split into blocks that need no mask (visited without any mask arithmetic) and
boundary blocks (causal diagonal, key padding, sequence ends) that do.

This module is imported by :mod:`qkv.kernels.triton_flash`; it is not a backend itself.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from qkv.kernels.triton_tiles import (
    LAUNCH_OPTIONS,
    LOG2E,
    _cast,
    _dot,
    _key_range,
    _load_tile,
    _store_tile,
    autotuned,
    hopper_configs,
)

__all__ = [
    "BWD_DKDV_CONFIGS",
    "BWD_DKDV_FLOAT32_CONFIGS",
    "BWD_DQ_CONFIGS",
    "BWD_DQ_FLOAT32_CONFIGS",
    "flash_backward",
]

_LOG2E = tl.constexpr(LOG2E)  # kernels may read only constexpr globals


# --- kernels --------------------------------------------------------------------------------


@triton.jit
def _bwd_delta_kernel(
    Out,
    DOut,
    DLse,
    Delta,
    s_ob,
    s_oh,
    s_ot,
    s_dob,
    s_doh,
    s_dot,
    H,
    Tq,
    HEAD_DV: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    PAD_DV: tl.constexpr,
    HAS_DLSE: tl.constexpr,
):
    """Delta_i = rowsum(dO * O) - dLse_i, in float32, one program per query block."""
    bh = tl.program_id(1)
    b, h = (bh // H).to(tl.int64), (bh % H).to(tl.int64)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_DV)
    o_ptrs = Out + b * s_ob + h * s_oh + rows[:, None] * s_ot + cols[None, :]
    do_ptrs = DOut + b * s_dob + h * s_doh + rows[:, None] * s_dot + cols[None, :]
    o = _load_tile(o_ptrs, rows, Tq, cols, HEAD_DV, True, PAD_DV)
    do = _load_tile(do_ptrs, rows, Tq, cols, HEAD_DV, True, PAD_DV)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    if HAS_DLSE:
        delta -= tl.load(DLse + bh * Tq + rows, mask=rows < Tq, other=0.0)
    tl.store(Delta + bh * Tq + rows, delta, mask=rows < Tq)


@triton.jit
def _dkdv_step(
    dk,
    dv,
    k,
    v,
    q_base,
    do_base,
    lse_base,
    delta_base,
    s_qh,
    s_qt,
    s_doh,
    s_dot,
    lo,
    hi,
    offs_n,
    offs_d,
    offs_dv,
    Tq,
    key_len,
    shift,
    qk_scale,
    GROUPS: tl.constexpr,
    HEAD_D: tl.constexpr,
    HEAD_DV: tl.constexpr,
    BLOCK_M: tl.constexpr,
    MASKED: tl.constexpr,
    CAUSAL: tl.constexpr,
    PAD_D: tl.constexpr,
    PAD_DV: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """Add the contribution of query rows [lo, hi) of the GROUPS query heads that share a
    key/value head (the first at ``q_base``, ``do_base``, ...) to one key block's dK and dV.

    One flat loop over (head, query block): a loop over the heads around the loop over the
    blocks kept more values alive and spilled registers on sm_90 at D = 128.
    """
    n_blocks = (hi - lo) // BLOCK_M  # lo and hi are multiples of BLOCK_M
    for i in range(0, GROUPS * n_blocks):
        g = 0
        if GROUPS > 1:
            g = i // n_blocks
        start_m = tl.multiple_of(lo + (i - g * n_blocks) * BLOCK_M, BLOCK_M)
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q_ptrs = q_base + g * s_qh + offs_m[:, None] * s_qt + offs_d[None, :]
        do_ptrs = do_base + g * s_doh + offs_m[:, None] * s_dot + offs_dv[None, :]
        q = _load_tile(q_ptrs, offs_m, Tq, offs_d, HEAD_D, MASKED, PAD_D)
        do = _load_tile(do_ptrs, offs_m, Tq, offs_dv, HEAD_DV, MASKED, PAD_DV)
        rows = g * Tq + offs_m  # lse and delta are (B, H, Tq), contiguous
        if MASKED:
            lse = tl.load(lse_base + rows, mask=offs_m < Tq, other=0.0)
            delta = tl.load(delta_base + rows, mask=offs_m < Tq, other=0.0)
        else:
            lse = tl.load(lse_base + rows)
            delta = tl.load(delta_base + rows)
        # Work on the transposed tile (keys x queries) so that no result needs a transpose.
        s_t = _dot(k, tl.trans(q), PRECISION) * qk_scale
        p_t = tl.math.exp2(s_t - lse[None, :] * _LOG2E)
        if MASKED:
            # where() rather than arithmetic: rows with lse = -inf give exp2(+inf) here.
            seen = (offs_n[:, None] < key_len) & (offs_m[None, :] < Tq)
            if CAUSAL:
                seen = seen & (offs_n[:, None] <= offs_m[None, :] + shift)
            p_t = tl.where(seen, p_t, 0.0)
        dv += _dot(_cast(p_t, do.dtype, PRECISION), do, PRECISION)
        dp_t = _dot(v, tl.trans(do), PRECISION)
        ds_t = p_t * (dp_t - delta[None, :])
        dk += _dot(_cast(ds_t, q.dtype, PRECISION), q, PRECISION)
    return dk, dv


@triton.jit
def _bwd_dkdv_kernel(
    Q,
    K,
    V,
    DO,
    Lse,
    Delta,
    DK,
    DV,
    KeyLen,
    s_qb,
    s_qh,
    s_qt,
    s_kb,
    s_kh,
    s_kt,
    s_vb,
    s_vh,
    s_vt,
    s_dob,
    s_doh,
    s_dot,
    s_dkb,
    s_dkh,
    s_dkt,
    s_dvb,
    s_dvh,
    s_dvt,
    H,
    Tq,
    Tk,
    qk_scale,
    sm_scale,
    tune_tq,
    tune_tk,
    GROUPS: tl.constexpr,
    HEAD_D: tl.constexpr,
    HEAD_DV: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAD_D: tl.constexpr,
    PAD_DV: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_LENGTHS: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """dK and dV of one key block of one key/value head, summed over its query heads."""
    start_n = tl.program_id(0) * BLOCK_N
    bhkv = tl.program_id(1)
    hkv_count = H // GROUPS
    b, hkv = (bhkv // hkv_count).to(tl.int64), (bhkv % hkv_count).to(tl.int64)
    key_len = Tk
    if HAS_LENGTHS:
        key_len = tl.load(KeyLen + b)
    shift = Tk - Tq  # bottom-right causal alignment: query i sees keys j <= i + shift

    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    k_ptrs = K + b * s_kb + hkv * s_kh + offs_n[:, None] * s_kt + offs_d[None, :]
    v_ptrs = V + b * s_vb + hkv * s_vh + offs_n[:, None] * s_vt + offs_dv[None, :]
    k = _load_tile(k_ptrs, offs_n, key_len, offs_d, HEAD_D, True, PAD_D)
    v = _load_tile(v_ptrs, offs_n, key_len, offs_dv, HEAD_DV, True, PAD_DV)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)

    # Query blocks: [lo, full_lo) and [full_hi, q_end) need masks, [full_lo, full_hi) do not.
    # Every bound is clamped at 0 before dividing: integer division of negatives differs
    # between the compiled kernel (truncation) and the interpreter (floor).
    q_end = tl.cdiv(Tq, BLOCK_M) * BLOCK_M
    lo = 0
    full_lo = 0
    if CAUSAL:
        lo = tl.maximum(start_n - shift, 0) // BLOCK_M * BLOCK_M
        full_lo = tl.cdiv(tl.maximum(start_n + BLOCK_N - 1 - shift, 0), BLOCK_M) * BLOCK_M
    lo = tl.where(start_n < key_len, tl.minimum(lo, q_end), q_end)  # no visible key: skip
    key_full = start_n + BLOCK_N <= key_len
    full_lo = tl.where(key_full, tl.minimum(tl.maximum(full_lo, lo), q_end), q_end)
    full_hi = tl.where(key_full, tl.maximum(full_lo, Tq // BLOCK_M * BLOCK_M), q_end)

    h0 = hkv * GROUPS  # the first query head that shares this key/value head
    heads = (
        Q + b * s_qb + h0 * s_qh,
        DO + b * s_dob + h0 * s_doh,
        Lse + (b * H + h0) * Tq,
        Delta + (b * H + h0) * Tq,
    )
    strides = (s_qh, s_qt, s_doh, s_dot)
    dk, dv = _dkdv_step(
        dk,
        dv,
        k,
        v,
        *heads,
        *strides,
        lo,
        full_lo,
        offs_n,
        offs_d,
        offs_dv,
        Tq,
        key_len,
        shift,
        qk_scale,
        GROUPS,
        HEAD_D,
        HEAD_DV,
        BLOCK_M,
        True,
        CAUSAL,
        PAD_D,
        PAD_DV,
        PRECISION,
    )
    dk, dv = _dkdv_step(
        dk,
        dv,
        k,
        v,
        *heads,
        *strides,
        full_lo,
        full_hi,
        offs_n,
        offs_d,
        offs_dv,
        Tq,
        key_len,
        shift,
        qk_scale,
        GROUPS,
        HEAD_D,
        HEAD_DV,
        BLOCK_M,
        False,
        CAUSAL,
        PAD_D,
        PAD_DV,
        PRECISION,
    )
    dk, dv = _dkdv_step(
        dk,
        dv,
        k,
        v,
        *heads,
        *strides,
        full_hi,
        q_end,
        offs_n,
        offs_d,
        offs_dv,
        Tq,
        key_len,
        shift,
        qk_scale,
        GROUPS,
        HEAD_D,
        HEAD_DV,
        BLOCK_M,
        True,
        CAUSAL,
        PAD_D,
        PAD_DV,
        PRECISION,
    )

    dk_ptrs = DK + b * s_dkb + hkv * s_dkh + offs_n[:, None] * s_dkt + offs_d[None, :]
    dv_ptrs = DV + b * s_dvb + hkv * s_dvh + offs_n[:, None] * s_dvt + offs_dv[None, :]
    _store_tile(
        dk_ptrs,
        _cast(dk * sm_scale, DK.dtype.element_ty, PRECISION),
        offs_n,
        Tk,
        offs_d,
        HEAD_D,
        PAD_D,
    )
    _store_tile(
        dv_ptrs, _cast(dv, DV.dtype.element_ty, PRECISION), offs_n, Tk, offs_dv, HEAD_DV, PAD_DV
    )


@triton.jit
def _dq_step(
    dq,
    q,
    do,
    lse,
    delta,
    k_base,
    v_base,
    s_kt,
    s_vt,
    lo,
    hi,
    offs_m,
    offs_d,
    offs_dv,
    key_len,
    shift,
    qk_scale,
    HEAD_D: tl.constexpr,
    HEAD_DV: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr,
    CAUSAL: tl.constexpr,
    PAD_D: tl.constexpr,
    PAD_DV: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """Add the contribution of keys [lo, hi) to one query block's dQ."""
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = _load_tile(
            k_base + offs_n[:, None] * s_kt + offs_d[None, :],
            offs_n,
            key_len,
            offs_d,
            HEAD_D,
            MASKED,
            PAD_D,
        )
        v = _load_tile(
            v_base + offs_n[:, None] * s_vt + offs_dv[None, :],
            offs_n,
            key_len,
            offs_dv,
            HEAD_DV,
            MASKED,
            PAD_DV,
        )
        s = _dot(q, tl.trans(k), PRECISION) * qk_scale
        p = tl.math.exp2(s - lse[:, None] * _LOG2E)
        if MASKED:
            seen = offs_n[None, :] < key_len
            if CAUSAL:
                seen = seen & (offs_n[None, :] <= offs_m[:, None] + shift)
            p = tl.where(seen, p, 0.0)
        dp = _dot(do, tl.trans(v), PRECISION)
        ds = p * (dp - delta[:, None])
        dq += _dot(_cast(ds, k.dtype, PRECISION), k, PRECISION)
    return dq


@triton.jit
def _bwd_dq_kernel(
    Q,
    K,
    V,
    DO,
    Lse,
    Delta,
    DQ,
    KeyLen,
    s_qb,
    s_qh,
    s_qt,
    s_kb,
    s_kh,
    s_kt,
    s_vb,
    s_vh,
    s_vt,
    s_dob,
    s_doh,
    s_dot,
    s_dqb,
    s_dqh,
    s_dqt,
    H,
    Tq,
    Tk,
    qk_scale,
    sm_scale,
    tune_tq,
    tune_tk,
    GROUPS: tl.constexpr,
    HEAD_D: tl.constexpr,
    HEAD_DV: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAD_D: tl.constexpr,
    PAD_DV: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_LENGTHS: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """dQ of one query block of one query head."""
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1)
    b, h = (bh // H).to(tl.int64), (bh % H).to(tl.int64)
    hkv = h // GROUPS
    key_len = Tk
    if HAS_LENGTHS:
        key_len = tl.load(KeyLen + b)
    shift = Tk - Tq

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    q = _load_tile(
        Q + b * s_qb + h * s_qh + offs_m[:, None] * s_qt + offs_d[None, :],
        offs_m,
        Tq,
        offs_d,
        HEAD_D,
        True,
        PAD_D,
    )
    do = _load_tile(
        DO + b * s_dob + h * s_doh + offs_m[:, None] * s_dot + offs_dv[None, :],
        offs_m,
        Tq,
        offs_dv,
        HEAD_DV,
        True,
        PAD_DV,
    )
    lse = tl.load(Lse + bh * Tq + offs_m, mask=offs_m < Tq, other=0.0)
    delta = tl.load(Delta + bh * Tq + offs_m, mask=offs_m < Tq, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    # Keys [0, full) are seen by every row of the block (no mask); [full, hi) need one.
    full, hi = _key_range(key_len, start_m, shift, CAUSAL, BLOCK_M, BLOCK_N)
    k_base = K + b * s_kb + hkv * s_kh
    v_base = V + b * s_vb + hkv * s_vh
    dq = _dq_step(
        dq,
        q,
        do,
        lse,
        delta,
        k_base,
        v_base,
        s_kt,
        s_vt,
        0,
        full,
        offs_m,
        offs_d,
        offs_dv,
        key_len,
        shift,
        qk_scale,
        HEAD_D,
        HEAD_DV,
        BLOCK_N,
        False,
        CAUSAL,
        PAD_D,
        PAD_DV,
        PRECISION,
    )
    dq = _dq_step(
        dq,
        q,
        do,
        lse,
        delta,
        k_base,
        v_base,
        s_kt,
        s_vt,
        full,
        hi,
        offs_m,
        offs_d,
        offs_dv,
        key_len,
        shift,
        qk_scale,
        HEAD_D,
        HEAD_DV,
        BLOCK_N,
        True,
        CAUSAL,
        PAD_D,
        PAD_DV,
        PRECISION,
    )
    dq_ptrs = DQ + b * s_dqb + h * s_dqh + offs_m[:, None] * s_dqt + offs_d[None, :]
    _store_tile(
        dq_ptrs,
        _cast(dq * sm_scale, DQ.dtype.element_ty, PRECISION),
        offs_m,
        Tq,
        offs_d,
        HEAD_D,
        PAD_D,
    )


# --- launcher ---------------------------------------------------------------------------------


# Hopper (H100/H200) candidates. dK/dV programs own a wide key block and stream narrow query
# blocks (so BLOCK_N is the wide one); dQ programs the other way round. The last 16-bit one
# of each is the small tile for short sequences. Wide tiles take 8 warps: with 4, their
# float32 accumulators spilled registers at D = 128 (dK and dV of 128 keys at D = 64 too).
# Float32 needs small tiles (see `autotuned`); `benchmarks/hopper_fit.py` checks them all.
BWD_DKDV_CONFIGS = hopper_configs(
    [(32, 128, 8, 3), (32, 128, 8, 4), (16, 128, 8, 4), (32, 64, 4, 3)]
)
BWD_DKDV_FLOAT32_CONFIGS = hopper_configs([(16, 16, 8, 2), (32, 16, 8, 2)])
BWD_DQ_CONFIGS = hopper_configs([(128, 32, 8, 3), (128, 32, 8, 4), (128, 64, 8, 3), (64, 32, 4, 3)])
BWD_DQ_FLOAT32_CONFIGS = hopper_configs([(32, 16, 4, 2)])
_dkdv_tuned = autotuned(
    _bwd_dkdv_kernel, BWD_DKDV_CONFIGS, BWD_DKDV_FLOAT32_CONFIGS, "tune_tk", "BLOCK_N"
)
_dq_tuned = autotuned(_bwd_dq_kernel, BWD_DQ_CONFIGS, BWD_DQ_FLOAT32_CONFIGS, "tune_tq", "BLOCK_M")


def _strides(x: Tensor) -> tuple[int, int, int]:
    """(batch, head, time) strides; the head dimension is contiguous (checked by the caller)."""
    return x.stride(0), x.stride(1), x.stride(2)


def flash_backward(
    grads: tuple[Tensor | None, Tensor | None],
    saved: tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor | None],
    meta: dict,
) -> tuple[Tensor, Tensor, Tensor]:
    """Launch the three backward kernels.

    Args:
        grads: ``(dout, dlse)``, either may be ``None`` (that output was not used).
        saved: ``(q, k, v, out, lse, key_lengths)`` from the forward pass.
        meta: launch settings from the forward launcher: ``causal``, ``scale``, ``blocks``
            (``None`` = autotune), the constexprs ``consts`` and the tuning keys ``tune``.

    Shape:
        as the forward pass: q ``(B, H, Tq, D)``, k ``(B, Hkv, Tk, D)``, v ``(B, Hkv, Tk, Dv)``.

    Returns:
        ``(dq, dk, dv)`` in the dtypes of ``q, k, v``.
    """
    dout, dlse = grads
    q, k, v, out, lse, lengths = saved
    b, h, tq, _ = q.shape
    hkv, tk = k.shape[1], k.shape[2]
    dout = torch.zeros_like(out) if dout is None else dout
    dout = dout if dout.stride(-1) == 1 else dout.contiguous()
    dlse = None if dlse is None else dlse.float().contiguous()
    delta = torch.empty_like(lse)
    consts = meta["consts"]
    delta_grid = (triton.cdiv(tq, 64), b * h)
    _bwd_delta_kernel[delta_grid](
        out,
        dout,
        dlse,
        delta,
        *_strides(out),
        *_strides(dout),
        h,
        tq,
        HEAD_DV=consts["HEAD_DV"],
        BLOCK_M=64,
        BLOCK_DV=consts["BLOCK_DV"],
        PAD_DV=consts["PAD_DV"],
        HAS_DLSE=dlse is not None,
        **LAUNCH_OPTIONS,
    )

    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    scalars = (h, tq, tk, meta["scale"] * LOG2E, meta["scale"], *meta["tune"])
    common = (*_strides(q), *_strides(k), *_strides(v), *_strides(dout))
    dkdv_args = (
        q,
        k,
        v,
        dout,
        lse,
        delta,
        dk,
        dv,
        lengths,
        *common,
        *_strides(dk),
        *_strides(dv),
        *scalars,
    )
    dq_args = (q, k, v, dout, lse, delta, dq, lengths, *common, *_strides(dq), *scalars)
    if meta["blocks"] is None:
        dkdv_grid = lambda m: (triton.cdiv(tk, m["BLOCK_N"]), b * hkv)  # noqa: E731
        dq_grid = lambda m: (triton.cdiv(tq, m["BLOCK_M"]), b * h)  # noqa: E731
        _dkdv_tuned[dkdv_grid](*dkdv_args, **consts, **LAUNCH_OPTIONS)
        _dq_tuned[dq_grid](*dq_args, **consts, **LAUNCH_OPTIONS)
    else:
        bm, bn = meta["blocks"]
        fixed = dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=4, num_stages=2, **LAUNCH_OPTIONS)
        _bwd_dkdv_kernel[(triton.cdiv(tk, bn), b * hkv)](*dkdv_args, **consts, **fixed)
        _bwd_dq_kernel[(triton.cdiv(tq, bm), b * h)](*dq_args, **consts, **fixed)
    return dq, dk, dv
