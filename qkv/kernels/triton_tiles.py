"""Tile helpers and autotuning shared by the Triton kernels (forward and backward).

Loads and stores of 2-d tiles that mask only where a tile may cross an edge, the tile
product and cast under each precision (with the CPU interpreter's bfloat16 quirks
emulated), the key bounds of a query block, and the launch settings: whether the kernels
were built for the interpreter, the precision of each dtype, the launch options, and the
autotuning candidates keyed on bucketed lengths. Imported by
:mod:`qkv.kernels.triton_flash` and :mod:`qkv.kernels.triton_bwd`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = [
    "LAUNCH_OPTIONS",
    "LOG2E",
    "autotuned",
    "dot_precision",
    "hopper_configs",
    "interpreting",
    "launch_meta",
    "tune_bucket",
]

LOG2E = 1.4426950408889634  # exp(x) = exp2(x * log2(e)); exp2 is the fast hardware path


def interpreting() -> bool:
    """Whether Triton's CPU interpreter is switched on (``TRITON_INTERPRET=1``) right now."""
    return bool(triton.knobs.runtime.interpret)


# The kernels were built for the interpreter only if it was on when the modules were imported
# (this one first: the kernel modules import it).
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
