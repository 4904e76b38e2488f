"""The ``triton`` backend: a FlashAttention-2 kernel family written in Triton for qkv.

FlashAttention-2 (Dao 2023, https://arxiv.org/abs/2307.08691) computes exact attention
without ever storing the ``(Tq, Tk)`` score matrix. One program owns a block of query rows
and streams the keys and values through on-chip memory with an online softmax (base 2,
which is the fast hardware exponential):

.. math::
    m' = \\max(m, \\max_j s_j),\\quad
    l' = 2^{m - m'} l + \\sum_j 2^{s_j - m'},\\quad
    acc' = 2^{m - m'} acc + \\sum_j 2^{s_j - m'} v_j,\\qquad
    out = acc / l,\\quad lse = (m + \\log_2 l) \\ln 2

with :math:`s_j = \\log_2(e)\\, \\mathrm{scale}\\; q \\cdot k_j`.

The backward pass (Algorithm 2 of the paper) recomputes the probabilities from the saved
log-sum-exp instead of storing them:

.. math::
    P = \\exp(s\\,QK^\\top - L),\\quad dV = P^\\top dO,\\quad dP = dO\\,V^\\top,\\quad
    dS = P \\circ (dP - \\Delta),\\quad dQ = s\\,dS\\,K,\\quad dK = s\\,dS^\\top Q

with :math:`\\Delta_i = \\sum_d dO_{id} O_{id} - dL_i` (the second term carries the gradient
of the returned log-sum-exp, since :math:`\\partial L_i / \\partial S_{ij} = P_{ij}`). Two
kernels, no atomics, deterministic: one program per key block accumulates ``dK, dV`` over
every query block and every query head of its GQA group (so grouped heads are summed in
registers, never materialised); one program per query block accumulates ``dQ``. Each key or
query range is split into blocks that need no mask (visited without any mask arithmetic) and
boundary blocks (causal diagonal, key padding, sequence ends) that do.

Decoding with a KV cache has one query row (or a few) per sequence, so ``B * H`` programs,
fewer than an H100/H200 has multiprocessors (132), each walking the whole cache alone. As in
Flash-Decoding (Dao, Haziza, Massa, Sizov 2023), the keys are then cut into ``S`` splits of
``split_len`` keys, one program per (query block, batch, head, split); each writes its
split's output, running maximum ``m_s`` and normaliser ``l_s`` in float32, and
:func:`merge_splits` combines them exactly, the maximum and the sum kept apart:

.. math::
    M = \\max_s m_s,\\quad w_s = l_s\\, 2^{m_s - M},\\qquad
    out = \\frac{\\sum_s w_s\\, out_s}{\\sum_s w_s},\\quad
    lse = \\Big(M + \\log_2 \\sum_s w_s\\Big) \\ln 2

Weighing the splits by their log-sum-exp instead would lose their sizes where a row's
scores are all huge in magnitude: ``lse_s`` rounds ``log l_s`` away in float32, and splits
of different numbers of tied keys would weigh the same. The merged ``out`` and ``lse`` are
those of one pass over all keys (up to rounding), so the backward kernels use them
unchanged.

Supported: causal (bottom-right aligned) and non-causal attention, ``Tq != Tk``, key padding
as per-sequence lengths, GQA/MQA (key/value head ``h // (H // Hkv)``, never repeated in
memory), head sizes up to 128, float16/bfloat16/float32 inputs with float32 accumulation,
and keys split across programs for decoding. A query row that sees no key gets zeros and
``lse = -inf``, never NaN.

The file reads top to bottom as flash-attn's ``ops/triton`` files do: the reference, the
shared tile helpers and autotuning configs, the ``@triton.jit`` forward kernel, the backward
kernels, split-K decoding, the launchers, the ``autograd.Function``, the public function and
the backend that dispatch uses. With ``TRITON_INTERPRET=1`` set before this module is
imported, the kernels run on the CPU (slowly) through Triton's interpreter, which is how the
tests run without a GPU.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from torch import Tensor

from qkv.kernels.base import AttentionRequest, AttentionResult, Backend, shape_problem
from qkv.kernels.ranges import prefix_key_lengths
from qkv.kernels.reference import reference_attention
from qkv.kernels.weights import attention_weights

__all__ = [
    "BWD_DKDV_CONFIGS",
    "BWD_DKDV_FLOAT32_CONFIGS",
    "BWD_DQ_CONFIGS",
    "BWD_DQ_FLOAT32_CONFIGS",
    "FWD_CONFIGS",
    "FWD_FLOAT32_CONFIGS",
    "MAX_SPLITS",
    "MIN_SPLIT_KEYS",
    "TritonBackend",
    "flash_attention",
    "flash_attention_reference",
    "merge_splits",
    "split_len",
]

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 128
LOG2E = 1.4426950408889634  # exp(x) = exp2(x * log2(e)); exp2 is the fast hardware path
_LOG2E = tl.constexpr(LOG2E)  # kernels may read only constexpr globals
LN2 = 0.6931471805599453  # ln(2): base-2 log-sum-exp to natural units
_LN2 = tl.constexpr(LN2)


# --- reference -------------------------------------------------------------------------------


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


# --- shared tile helpers ---------------------------------------------------------------------


def interpreting() -> bool:
    """Whether Triton's CPU interpreter is switched on (``TRITON_INTERPRET=1``) right now."""
    return bool(triton.knobs.runtime.interpret)


# The kernels were built for the interpreter only if it was on when this module was imported.
_BUILT_FOR_INTERPRETER = interpreting()


@triton.jit
def _load_tile(ptrs, rows, n_rows, cols, n_cols, CHECK_ROWS: tl.constexpr, PAD_COLS: tl.constexpr):
    """Load a 2-d tile; out-of-range rows/columns read as zero (masks only where needed)."""
    if CHECK_ROWS:
        if PAD_COLS:
            x = tl.load(ptrs, mask=(rows[:, None] < n_rows) & (cols[None, :] < n_cols), other=0.0)
        else:
            x = tl.load(ptrs, mask=rows[:, None] < n_rows, other=0.0)
    else:
        if PAD_COLS:
            x = tl.load(ptrs, mask=cols[None, :] < n_cols, other=0.0)
        else:
            x = tl.load(ptrs)
    return x


# PRECISION, a constexpr string, says how tiles are multiplied and rounded:
#   "ieee"   float32 inputs, exact float32 products (as PyTorch's default matmul);
#   "tf32"   16-bit inputs (the setting is ignored for them: tensor cores multiply exactly);
#   "interpret-bf16"  bfloat16 under Triton 3.9's CPU interpreter, whose tl.dot multiplies the
#            raw bit patterns of bfloat16 operands and whose float32 -> bfloat16 cast truncates;
#            _dot and _cast below emulate what the GPU does instead.


def dot_precision(dtype: torch.dtype) -> str:
    """The PRECISION of ``_dot`` for tiles of this dtype."""
    if dtype == torch.float32:
        return "ieee"  # plain PyTorch does not use TF32 for float32 matmuls by default
    if dtype == torch.bfloat16 and _BUILT_FOR_INTERPRETER:
        return "interpret-bf16"
    return "tf32"  # ignored for 16-bit inputs: the tensor cores multiply them exactly


@triton.jit
def _dot(a, b, PRECISION: tl.constexpr):
    """``a @ b`` accumulated in float32 (see PRECISION above)."""
    if PRECISION == "interpret-bf16":
        # bfloat16 products are exact in float32, so this matches the tensor cores.
        c = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        c = tl.dot(a, b, input_precision=PRECISION)
    return c


@triton.jit
def _cast(x, dtype, PRECISION: tl.constexpr):
    """``x.to(dtype)`` with round-to-nearest-even, also under the interpreter."""
    if PRECISION == "interpret-bf16":
        # Round the float32 bits to the nearest even bfloat16 first; truncation is then exact.
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        x = bits.to(tl.float32, bitcast=True)
    return x.to(dtype)


@triton.jit
def _store_tile(ptrs, x, rows, n_rows, cols, n_cols, PAD_COLS: tl.constexpr):
    """Store a 2-d tile, skipping rows past ``n_rows`` and padded head columns."""
    if PAD_COLS:
        tl.store(ptrs, x, mask=(rows[:, None] < n_rows) & (cols[None, :] < n_cols))
    else:
        tl.store(ptrs, x, mask=rows[:, None] < n_rows)


@triton.jit
def _key_range(
    key_len, start_m, shift, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr
):
    """Key bounds ``(full, hi)`` for the query block starting at ``start_m``.

    Keys ``[0, full)`` are seen by every row of the block, so that loop carries no mask;
    ``[full, hi)`` holds the causal diagonal and the padding boundary. Clamping at 0 before
    dividing keeps the compiled kernel and the interpreter in agreement.
    """
    hi = key_len
    full = key_len
    if CAUSAL:
        hi = tl.minimum(key_len, start_m + BLOCK_M + shift)
        full = tl.minimum(key_len, start_m + 1 + shift)
    hi = tl.maximum(hi, 0)
    full = tl.maximum(full, 0) // BLOCK_N * BLOCK_N
    return full, hi


# --- autotuning configs ----------------------------------------------------------------------


def hopper_configs(shapes: list[tuple[int, int, int, int]]) -> list[triton.Config]:
    """Autotuning candidates from ``(BLOCK_M, BLOCK_N, num_warps, num_stages)`` tuples."""
    return [
        triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s)
        for m, n, w, s in shapes
    ]


# Options of every compiled launch. FMA contraction is Triton's default; saying so keeps
# Triton 3.9 from warning at each first compile that the default will change.
LAUNCH_OPTIONS = {"enable_fp_fusion": True}
INTERPRETER_BLOCKS = (16, 16)  # the interpreter's cost grows with the tile, not the launch


def tune_bucket(t: int) -> int:
    """Sequence lengths that share tuned configs: powers of two, capped (decoding needs this,
    or every new cache length would re-run the autotuner)."""
    return min(triton.next_power_of_2(max(t, 1)), 8192)


def autotuned(
    kernel,
    configs: list[triton.Config],
    float32_configs: list[triton.Config],
    length_arg: str,
    block: str,
):
    """``kernel`` autotuned over ``configs`` (16-bit inputs) or ``float32_configs``, keyed on
    bucketed lengths and the constexprs.

    Float32 tiles are multiplied exactly (``PRECISION="ieee"``), with FMA instructions
    instead of tensor cores, and Triton keeps each thread's whole rows of both operands in
    registers: at head size 128 only tiles of about 16-32 rows compile without spilling,
    so they get candidates of their own (see ``benchmarks/hopper_fit.py``).

    The ``tune_tq``/``tune_tk`` arguments (read by nothing but this key) are lengths rounded
    up to powers of two, so a new sequence length rarely re-runs the tuner. Short lengths
    (decoding: a handful of queries against a cache) only try tiles of at most 64 along
    ``block``, long ones only the wider tiles: half the configs to compile per case.
    """
    for_float32 = {id(c) for c in float32_configs}

    def prune(configs, named_args, **kwargs):
        exact = kwargs.get("PRECISION") == "ieee"
        pool = [c for c in configs if (id(c) in for_float32) == exact]
        short = named_args[length_arg] <= 64
        kept = [c for c in pool if (c.kwargs[block] <= 64) == short]
        return kept or pool

    key = ["tune_tq", "tune_tk", "GROUPS", "HEAD_D", "HEAD_DV", "CAUSAL", "HAS_LENGTHS"]
    return triton.autotune(
        configs + float32_configs, key=key, prune_configs_by={"early_config_prune": prune}
    )(kernel)


# Forward candidates for Hopper (H100/H200) as (BLOCK_M, BLOCK_N, num_warps, num_stages):
# 128-row query blocks take 8 warps (two warpgroups; with 4, the float32 accumulator of a
# 128 x 128 tile spills registers at D = 128), with 3-4 stages of K/V prefetch (224 KiB of
# shared memory for 128 x 128 tiles at D = 128, within an sm_90 block's 227 KiB); (64, 64) is
# the tile for short query blocks. Float32 needs small tiles (see `autotuned`).
# `benchmarks/hopper_fit.py` compiles each for sm_90 and reports its registers, spills and
# shared memory.
FWD_CONFIGS = hopper_configs([(128, 128, 8, 3), (128, 64, 8, 3), (128, 64, 8, 4), (64, 64, 4, 3)])
FWD_FLOAT32_CONFIGS = hopper_configs([(32, 16, 4, 2), (32, 16, 4, 3)])

# Backward candidates for Hopper. dK/dV programs own a wide key block and stream narrow query
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


# --- forward kernel ---------------------------------------------------------------------------


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
    s_lp,
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
    (split-K decoding, below), and instead of the lse the running maximum (base 2) and the
    normaliser, ``s_lp`` apart, for :func:`merge_splits`."""
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
    lse_ptrs = Lse + split.to(tl.int64) * s_ls + bh * Tq + offs_m
    if SPLIT:  # the maximum and the sum apart: merge_splits weighs the splits exactly
        tl.store(lse_ptrs, m_i, mask=offs_m < Tq)
        tl.store(lse_ptrs + s_lp, l_i, mask=offs_m < Tq)
    else:
        tl.store(lse_ptrs, lse, mask=offs_m < Tq)


# --- backward kernels ------------------------------------------------------------------------


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


# --- split-K decoding ------------------------------------------------------------------------
# Where the query blocks alone would leave the GPU's multiprocessors idle (decoding), the
# keys are cut into splits, one program each, merged by their lse (module docstring).
# :func:`split_len` decides. The thresholds are first guesses, not yet timed on a GPU: split
# only where the programs would fill less than one wave of the multiprocessors, into enough
# splits for about two waves, each of at least :data:`MIN_SPLIT_KEYS` keys.

MIN_SPLIT_KEYS = 512  # fewer keys per split and the merge costs more than the split saves
MAX_SPLITS = 64
ALIGN = 128  # split_len is a multiple of every BLOCK_N: a split starts on a key block


def split_len(
    programs: int, tk: int, multiprocessors: int, splits: int | None = None, align: int = ALIGN
) -> int:
    """Keys per split for a launch of ``programs`` programs over ``tk`` keys: ``tk`` itself
    (one split) unless splitting helps; a multiple of ``align`` (every BLOCK_N) otherwise.

    ``splits`` asks for that many splits (as near as the alignment allows) instead of the
    rule: ``programs * splits`` programs should reach about two waves of the
    ``multiprocessors``, each split of at least :data:`MIN_SPLIT_KEYS` keys.
    """
    if splits is None:
        if programs >= multiprocessors or tk < 2 * MIN_SPLIT_KEYS:
            return max(tk, 1)
        splits = min(-(-2 * multiprocessors // programs), tk // MIN_SPLIT_KEYS, MAX_SPLITS)
    if splits <= 1:
        return max(tk, 1)
    per = -(-tk // splits)
    return -(-per // align) * align


@functools.cache
def multiprocessors(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (0 elsewhere: never split)."""
    if device.type != "cuda":
        return 0
    return torch.cuda.get_device_properties(device).multi_processor_count


def launch_split_len(q: Tensor, tk: int, blocks: tuple[int, int] | None, splits: int | None) -> int:
    """:func:`split_len` for a forward launch on ``q`` ``(B, H, Tq, D)`` over ``tk`` keys,
    with fixed ``blocks`` or autotuned ones (64-row query blocks up to 64 queries)."""
    block_m, block_n = blocks or (64 if q.shape[2] <= 64 else 128, ALIGN)
    programs = -(-q.shape[2] // block_m) * q.shape[0] * q.shape[1]
    return split_len(programs, tk, multiprocessors(q.device), splits, block_n)


def merge_splits(out: Tensor, m: Tensor, l: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """Combine per-split results: out ``(S, B, H, Tq, Dv)``, each split's running maximum
    ``m`` (base 2) and normaliser ``l`` ``(S, B, H, Tq)``, all float32 (a split a row sees
    no key of: zeros, ``-inf`` and 0), into ``(out, lse)`` of all keys, out in ``dtype``
    (module docstring). Rows that see no key at all: zeros and ``-inf``."""
    top = m.amax(dim=0)
    top = torch.where(torch.isinf(top), 0.0, top)  # all -inf: weights 0, not NaN
    weights = l * torch.exp2(m - top)  # (S, B, H, Tq)
    total = weights.sum(dim=0)
    lse = (top + torch.log2(total)) * LN2  # -inf where no split sees a key
    total = torch.where(total > 0, total, 1.0)  # those rows stay 0
    merged = (weights.unsqueeze(-1) * out).sum(dim=0) / total.unsqueeze(-1)
    return merged.to(dtype), lse


# --- launchers -------------------------------------------------------------------------------


_fwd_tuned = autotuned(_fwd_kernel, FWD_CONFIGS, FWD_FLOAT32_CONFIGS, "tune_tq", "BLOCK_M")
_dkdv_tuned = autotuned(
    _bwd_dkdv_kernel, BWD_DKDV_CONFIGS, BWD_DKDV_FLOAT32_CONFIGS, "tune_tk", "BLOCK_N"
)
_dq_tuned = autotuned(_bwd_dq_kernel, BWD_DQ_CONFIGS, BWD_DQ_FLOAT32_CONFIGS, "tune_tq", "BLOCK_M")


def launch_meta(q, k, v, lengths, causal: bool, scale: float, blocks) -> dict:
    """Constexprs and tuning keys shared by the forward and backward launches."""
    d, dv = q.shape[-1], v.shape[-1]
    block_d, block_dv = max(16, triton.next_power_of_2(d)), max(16, triton.next_power_of_2(dv))
    if blocks is None and _BUILT_FOR_INTERPRETER:
        blocks = INTERPRETER_BLOCKS
    consts = dict(
        GROUPS=q.shape[1] // k.shape[1],
        HEAD_D=d,
        HEAD_DV=dv,
        BLOCK_D=block_d,
        BLOCK_DV=block_dv,
        PAD_D=block_d != d,
        PAD_DV=block_dv != dv,
        CAUSAL=causal,
        HAS_LENGTHS=lengths is not None,
        PRECISION=dot_precision(q.dtype),
    )
    tune = (tune_bucket(q.shape[2]), tune_bucket(k.shape[2]))
    return dict(consts=consts, tune=tune, causal=causal, scale=scale, blocks=blocks)


def _flash_forward(q: Tensor, k: Tensor, v: Tensor, lengths: Tensor | None, meta: dict):
    """Launch the forward kernel, over ``meta["split_len"]`` keys per split (merged in
    float32 when there are several, by their maxima and normalisers: :func:`merge_splits`);
    returns ``(out, lse)``."""
    b, h, tq, _ = q.shape
    tk, per = k.shape[2], meta["split_len"]
    splits = -(-tk // per)
    dtype = q.dtype if splits == 1 else torch.float32
    out = torch.empty((splits, b, h, tq, v.shape[-1]), dtype=dtype, device=q.device)
    planes = 1 if splits == 1 else 2  # the lse, or each split's maximum and normaliser
    lse = torch.empty((splits, planes, b, h, tq), dtype=torch.float32, device=q.device)
    tune = meta["tune"] if splits == 1 else (meta["tune"][0], tune_bucket(per))
    consts = meta["consts"]
    strides = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:4])
    strides += (lse.stride(0), lse.stride(1))
    args = (q, k, v, out, lse, lengths, *strides, h, tq, tk, per, meta["scale"] * LOG2E, *tune)
    options = dict(consts, SPLIT=splits > 1, **LAUNCH_OPTIONS)
    if meta["blocks"] is None:
        grid = lambda m: (triton.cdiv(tq, m["BLOCK_M"]), b * h, splits)  # noqa: E731
        _fwd_tuned[grid](*args, **options)
    else:
        bm, bn = meta["blocks"]
        grid = (triton.cdiv(tq, bm), b * h, splits)
        _fwd_kernel[grid](*args, **options, BLOCK_M=bm, BLOCK_N=bn, num_warps=4, num_stages=2)
    if splits == 1:
        return out[0], lse[0, 0]
    return merge_splits(out, lse[:, 0], lse[:, 1], q.dtype)


def _strides(x: Tensor) -> tuple[int, int, int]:
    """(batch, head, time) strides; the head dimension is contiguous (checked by the caller)."""
    return x.stride(0), x.stride(1), x.stride(2)


def _flash_backward(
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
        dq, dk, dv = _flash_backward((dout, dlse), ctx.saved_tensors, ctx.meta)
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
            their lse (Flash-Decoding: :func:`merge_splits`). ``None``: only where the
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
        # a CPU, where the kernel never runs, that check was a noticeable share of a small
        # GPT's decoding step (measured: BENCHMARKS.md, 'Dispatch overhead').
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
