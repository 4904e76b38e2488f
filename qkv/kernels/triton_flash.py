"""The ``triton`` backend: a FlashAttention-2 kernel written in Triton for qkv.

FlashAttention-2 (Dao 2023, https://arxiv.org/abs/2307.08691) computes exact attention
without ever storing the ``(Tq, Tk)`` score matrix. One program owns a block of query rows
and streams the keys and values through on-chip memory with an online softmax (base 2,
which is the fast hardware exponential):

.. math::
    m' = \\max(m, \\max_j s_j),\\quad
    l' = 2^{m - m'} l + \\sum_j 2^{s_j - m'},\\quad
    acc' = 2^{m - m'} acc + \\sum_j 2^{s_j - m'} v_j,\\qquad
    out = acc / l,\\quad lse = (m + \\log_2 l) \\ln 2

with :math:`s_j = \\log_2(e)\\, \\mathrm{scale}\\; q \\cdot k_j`. The backward pass (in
:mod:`qkv.kernels.triton_bwd`) recomputes the probabilities from the log-sum-exp.

Supported: causal (bottom-right aligned) and non-causal attention, ``Tq != Tk``, key padding
as per-sequence lengths, GQA/MQA (key/value head ``h // (H // Hkv)``, never repeated in
memory), head sizes up to 128, float16/bfloat16/float32 inputs with float32 accumulation,
and keys split across programs for decoding (:mod:`qkv.kernels.triton_split`). A query
row that sees no key gets zeros and ``lse = -inf``, never NaN.

The file is ordered as flash-attn's ``ops/triton``: reference, kernel, launcher,
``autograd.Function``, public function, then the backend that dispatch uses. With
``TRITON_INTERPRET=1`` set before this module is imported, the kernels run on the CPU
(slowly) through Triton's interpreter, which is how the tests run without a GPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from qkv.kernels.base import AttentionRequest, AttentionResult, Backend, shape_problem
from qkv.kernels.ranges import prefix_key_lengths
from qkv.kernels.reference import reference_attention
from qkv.kernels.triton_bwd import flash_backward
from qkv.kernels.triton_split import launch_split_len, merge_splits
from qkv.kernels.triton_tiles import (
    _BUILT_FOR_INTERPRETER,
    LAUNCH_OPTIONS,
    LOG2E,
    _cast,
    _dot,
    _key_range,
    _load_tile,
    _store_tile,
    autotuned,
    hopper_configs,
    interpreting,
    launch_meta,
    tune_bucket,
)
from qkv.kernels.weights import attention_weights

__all__ = [
    "FWD_CONFIGS",
    "FWD_FLOAT32_CONFIGS",
    "TritonBackend",
    "flash_attention",
    "flash_attention_reference",
]

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 128
_LN2 = tl.constexpr(0.6931471805599453)


# --- reference ------------------------------------------------------------------------------


def flash_attention_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool = False,
    scale: float | None = None,
    key_lengths: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """What :func:`flash_attention` computes, in plain PyTorch (qkv's reference backend).

    Takes :func:`flash_attention`'s arguments (any dtype and device) and computes in the
    inputs' dtype: float64 copies give an exact reference, the kernel's dtype gives "plain
    PyTorch math" of the same precision.

    Returns:
        ``(out, lse)``, shaped ``(B, H, Tq, Dv)`` and ``(B, H, Tq)``.
    """
    mask = None
    if key_lengths is not None:
        keys = torch.arange(k.shape[2], device=q.device)
        mask = (keys < key_lengths.to(q.device)[:, None])[:, None, None, :]  # (B, 1, 1, Tk)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    req = AttentionRequest(q, k, v, mask, causal, scale, 0.0, need_weights=False, need_lse=True)
    result = reference_attention(req)
    return result.out, result.lse


# --- kernel ---------------------------------------------------------------------------------


@triton.jit
def _fwd_step(
    acc,
    m_i,
    l_i,
    q,
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
    """Fold keys [lo, hi) into one query block's running max, normaliser and output."""
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
        s = _dot(q, tl.trans(k), PRECISION) * qk_scale  # log2 units
        if MASKED:
            seen = offs_n[None, :] < key_len
            if CAUSAL:
                seen = seen & (offs_n[None, :] <= offs_m[:, None] + shift)
            s = tl.where(seen, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_ref = m_new
        if MASKED:
            # A row that has seen no key yet keeps m = -inf; subtracting 0 instead keeps
            # exp2(-inf - -inf) = NaN out of p and alpha (both come out 0).
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.math.exp2(m_i - m_ref)
        p = tl.math.exp2(s - m_ref[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = _load_tile(
            v_base + offs_n[:, None] * s_vt + offs_dv[None, :],
            offs_n,
            key_len,
            offs_dv,
            HEAD_DV,
            MASKED,
            PAD_DV,
        )
        acc = acc * alpha[:, None] + _dot(_cast(p, v.dtype, PRECISION), v, PRECISION)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _fwd_kernel(
    Q,
    K,
    V,
    Out,
    Lse,
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
    s_os,
    s_ob,
    s_oh,
    s_ot,
    s_ls,
    H,
    Tq,
    Tk,
    split_len,
    qk_scale,
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
    SPLIT: tl.constexpr,
):
    """Output and log-sum-exp of one block of query rows of one (batch, head); with SPLIT,
    over the keys of split ``program_id(2)`` only: ``[split, split + 1) * split_len``
    (:mod:`.triton_split`)."""
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1)
    split = tl.program_id(2)
    b, h = (bh // H).to(tl.int64), (bh % H).to(tl.int64)
    hkv = h // GROUPS  # GQA: consecutive query heads share one key/value head
    key_len = Tk
    if HAS_LENGTHS:
        key_len = tl.load(KeyLen + b)
    shift = Tk - Tq  # bottom-right causal alignment: query i sees keys j <= i + shift

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
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)

    # Keys [0, full) are seen by every row of the block (no mask); [full, hi) need one.
    full, hi = _key_range(key_len, start_m, shift, CAUSAL, BLOCK_M, BLOCK_N)
    lo, mid_lo, mid_hi = 0, full, full
    if SPLIT:  # the parts of both inside this split (split_len: a multiple of BLOCK_N)
        first = split * split_len
        last = first + split_len
        lo, mid_lo = tl.minimum(first, full), tl.maximum(first, full)
        mid_hi, hi = tl.minimum(last, full), tl.minimum(last, hi)
    k_base = K + b * s_kb + hkv * s_kh
    v_base = V + b * s_vb + hkv * s_vh
    acc, m_i, l_i = _fwd_step(
        acc,
        m_i,
        l_i,
        q,
        k_base,
        v_base,
        s_kt,
        s_vt,
        lo,
        mid_hi,
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
    acc, m_i, l_i = _fwd_step(
        acc,
        m_i,
        l_i,
        q,
        k_base,
        v_base,
        s_kt,
        s_vt,
        mid_lo,
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

    seen = l_i > 0.0  # false only for rows that see no key at all
    l_safe = tl.where(seen, l_i, 1.0)
    out = acc / l_safe[:, None]  # acc is 0 on unseen rows, so they come out as zeros
    lse = tl.where(seen, (m_i + tl.log2(l_safe)) * _LN2, float("-inf"))
    o_ptrs = (
        Out
        + split.to(tl.int64) * s_os
        + b * s_ob
        + h * s_oh
        + offs_m[:, None] * s_ot
        + offs_dv[None, :]
    )
    _store_tile(
        o_ptrs, _cast(out, Out.dtype.element_ty, PRECISION), offs_m, Tq, offs_dv, HEAD_DV, PAD_DV
    )
    tl.store(Lse + split.to(tl.int64) * s_ls + bh * Tq + offs_m, lse, mask=offs_m < Tq)


# --- launcher -------------------------------------------------------------------------------

# Hopper (H100/H200) candidates as (BLOCK_M, BLOCK_N, num_warps, num_stages): 128-row query
# blocks take 8 warps (two warpgroups; with 4, the float32 accumulator of a 128 x 128 tile
# spills registers at D = 128), with 3-4 stages of K/V prefetch (224 KiB of shared memory
# for 128 x 128 tiles at D = 128, within an sm_90 block's 227 KiB); (64, 64) is the tile for
# short query blocks. Float32 needs small tiles (see `autotuned`). `benchmarks/hopper_fit.py`
# compiles each for sm_90 and reports its registers, spills and shared memory.
FWD_CONFIGS = hopper_configs([(128, 128, 8, 3), (128, 64, 8, 3), (128, 64, 8, 4), (64, 64, 4, 3)])
FWD_FLOAT32_CONFIGS = hopper_configs([(32, 16, 4, 2), (32, 16, 4, 3)])
_fwd_tuned = autotuned(_fwd_kernel, FWD_CONFIGS, FWD_FLOAT32_CONFIGS, "tune_tq", "BLOCK_M")


def _flash_forward(q: Tensor, k: Tensor, v: Tensor, lengths: Tensor | None, meta: dict):
    """Launch the forward kernel, over ``meta["split_len"]`` keys per split (merged in
    float32 when there are several: :mod:`.triton_split`); returns ``(out, lse)``."""
    b, h, tq, _ = q.shape
    tk, per = k.shape[2], meta["split_len"]
    splits = -(-tk // per)
    dtype = q.dtype if splits == 1 else torch.float32
    out = torch.empty((splits, b, h, tq, v.shape[-1]), dtype=dtype, device=q.device)
    lse = torch.empty((splits, b, h, tq), dtype=torch.float32, device=q.device)
    tune = meta["tune"] if splits == 1 else (meta["tune"][0], tune_bucket(per))
    consts = meta["consts"]
    strides = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:4], lse.stride(0))
    args = (q, k, v, out, lse, lengths, *strides, h, tq, tk, per, meta["scale"] * LOG2E, *tune)
    options = dict(consts, SPLIT=splits > 1, **LAUNCH_OPTIONS)
    if meta["blocks"] is None:
        grid = lambda m: (triton.cdiv(tq, m["BLOCK_M"]), b * h, splits)  # noqa: E731
        _fwd_tuned[grid](*args, **options)
    else:
        bm, bn = meta["blocks"]
        grid = (triton.cdiv(tq, bm), b * h, splits)
        _fwd_kernel[grid](*args, **options, BLOCK_M=bm, BLOCK_N=bn, num_warps=4, num_stages=2)
    return (out[0], lse[0]) if splits == 1 else merge_splits(out, lse, q.dtype)


# --- autograd -------------------------------------------------------------------------------


class _FlashAttention(torch.autograd.Function):
    """Forward kernel, backward kernels; the lse is differentiable too (for merging)."""

    @staticmethod
    def forward(ctx, q, k, v, lengths, meta):
        out, lse = _flash_forward(q, k, v, lengths, meta)
        ctx.save_for_backward(q, k, v, out, lse, lengths)
        ctx.meta = meta
        ctx.set_materialize_grads(False)  # unused outputs arrive as None: skip their work
        return out, lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout, dlse):
        dq, dk, dv = flash_backward((dout, dlse), ctx.saved_tensors, ctx.meta)
        return dq, dk, dv, None, None


# --- public function ------------------------------------------------------------------------


def flash_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool = False,
    scale: float | None = None,
    key_lengths: Tensor | None = None,
    block_sizes: tuple[int, int] | None = None,
    key_splits: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Exact attention with the FlashAttention-2 Triton kernel (Dao 2023).

    .. math::
        out = \\mathrm{softmax}(s\\, QK^\\top + M) V,\\qquad
        lse_i = \\log \\sum_{j\\ \\mathrm{visible}} e^{s\\, q_i \\cdot k_j}

    Args:
        q, k, v: float16, bfloat16 or float32 tensors on a CUDA device (or on the CPU under
            ``TRITON_INTERPRET=1``). ``Hkv`` must divide ``H``; ``D, Dv <= 128``.
        causal: query ``i`` sees keys ``j <= i + Tk - Tq`` (bottom-right aligned).
        scale: score scale, default ``1 / sqrt(D)``.
        key_lengths: ``(B,)`` integer tensor; sequence ``b`` sees only its first
            ``key_lengths[b]`` keys (key padding). ``None``: every key is real.
        block_sizes: fixed ``(BLOCK_M, BLOCK_N)`` (each a power of two >= 16) instead of
            autotuning; used by tests and under the interpreter.
        key_splits: split the keys into this many parts, one program each, merged by
            their lse (Flash-Decoding: :mod:`.triton_split`). ``None``: only where the
            query blocks alone would leave a CUDA GPU's multiprocessors idle (decoding).

    Shape:
        q ``(B, H, Tq, D)``, k ``(B, Hkv, Tk, D)``, v ``(B, Hkv, Tk, Dv)``.

    Returns:
        ``(out, lse)``: out ``(B, H, Tq, Dv)`` in the input dtype, lse ``(B, H, Tq)`` in
        float32 (natural log). Rows that see no key: zeros and ``-inf``. Both are
        differentiable (dq, dk, dv come from the backward kernels).
    """
    problems = _input_problems(q, k, v)
    if block_sizes is not None and not all(b >= 16 and b & (b - 1) == 0 for b in block_sizes):
        problems.append(f"block sizes {block_sizes} must be powers of two >= 16")
    if key_splits is not None and (not isinstance(key_splits, int) or key_splits < 1):
        problems.append(f"key_splits must be a positive integer or None, got {key_splits!r}")
    if problems:
        raise ValueError("flash_attention: " + "; ".join(problems))
    b, tk = q.shape[0], k.shape[2]
    lengths = None
    if key_lengths is not None:
        key_lengths = torch.as_tensor(key_lengths, device=q.device)
        if key_lengths.shape != (b,) or key_lengths.is_floating_point():
            raise ValueError(f"key_lengths must be an integer (B,) = ({b},) tensor")
        lengths = key_lengths.clamp(0, tk).to(torch.int32).contiguous()
    # The kernels need the head dimension contiguous; other strides are passed through.
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    if q.numel() == 0 or v.shape[-1] == 0:  # nothing to launch; keep autograd connected
        return flash_attention_reference(q, k, v, causal=causal, scale=scale, key_lengths=lengths)
    meta = launch_meta(q, k, v, lengths, causal, scale, block_sizes)
    meta["split_len"] = launch_split_len(q, tk, meta["blocks"], key_splits)
    return _FlashAttention.apply(q, k, v, lengths, meta)


def _input_problems(q: Tensor, k: Tensor, v: Tensor) -> list[str]:
    """What about these tensors the kernel cannot handle (empty when it can)."""
    if q.device.type != "cuda" and not (_BUILT_FOR_INTERPRETER and interpreting()):
        # alone: nothing else matters there, and `auto` asks on every CPU call
        return [
            f"needs a CUDA device (tensors are on {q.device.type}; the CPU works only with "
            "TRITON_INTERPRET=1 set before qkv.kernels.triton_flash is imported)"
        ]
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        return [f"q, k, v must be 4-d (B, H, T, D), got {q.ndim}, {k.ndim}, {v.ndim} dims"]
    problems = []
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in SUPPORTED_DTYPES:
        problems.append(f"dtype {q.dtype} not supported (float16, bfloat16, float32)")
    if q.shape[-1] > MAX_HEAD_DIM or v.shape[-1] > MAX_HEAD_DIM:
        problems.append(f"head size {q.shape[-1]}/{v.shape[-1]} over {MAX_HEAD_DIM}")
    misfit = shape_problem(q.shape, k.shape, v.shape)
    if misfit:
        shapes = f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        problems.append(
            f"shapes {shapes} do not fit (B, H, Tq, D), (B, Hkv, Tk, D), (B, Hkv, Tk, Dv): {misfit}"
        )
    return problems


# --- backend --------------------------------------------------------------------------------


class TritonBackend(Backend):
    """FlashAttention-2 in Triton: causal or not, key padding, GQA; the lse; weights beside."""

    name = "triton"

    def why_not_auto(self, req: AttentionRequest) -> list[str]:
        if torch.compiler.is_compiling():  # not traced through yet: SDPA the compiler knows
            return ["under torch.compile: left to SDPA"]
        return self.why_not(req)

    def why_not(self, req: AttentionRequest) -> list[str]:
        reasons = _input_problems(req.q, req.k, req.v)
        if req.dropout_p > 0:
            reasons.append("does not implement attention dropout")
        # The mask is read (a device sync) only when nothing else rules the kernel out: on
        # a CPU that check cost 40 us of every 600-us decoding step of a small GPT.
        if req.mask is not None and not reasons:
            if _lengths(req) is None:
                reasons.append(
                    "only key-padding masks given as lengths (a boolean (B, 1, 1, Tk) "
                    "mask that is True on a prefix of the keys)"
                )
        return reasons

    def __call__(self, req: AttentionRequest) -> AttentionResult:
        lengths = None if req.mask is None else _lengths(req)
        out, lse = flash_attention(
            req.q, req.k, req.v, causal=req.causal, scale=req.scale, key_lengths=lengths
        )
        weights = None
        if req.need_weights:  # from the kernel's lse: exp(s - lse), only what was asked for
            weights = attention_weights(req, lse.detach(), req.weight_heads, req.weight_rows)
        return AttentionResult(out=out, weights=weights, lse=lse if req.need_lse else None)


def _lengths(req: AttentionRequest) -> Tensor | None:
    """The request's key lengths, worked out (one device sync) once per request."""
    b, tk = req.q.shape[0], req.k.shape[2]
    return req.remember("key_lengths", lambda: prefix_key_lengths(req.mask, b, tk))
