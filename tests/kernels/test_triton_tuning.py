"""How the Triton kernels are launched and compiled, checked without a GPU.

The autotuning candidates compile for sm_90 (H100/H200) without spills, within shared
memory and on the tensor cores (``benchmarks/hopper_fit.py``); autotuning tries those of
the input's dtype and length; the keys are split across programs only where decoding would
leave the GPU idle, on block boundaries. What the kernels compute is checked in
``test_triton_flash.py``.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("triton")
tf = pytest.importorskip("qkv.kernels.triton_flash")
tb = pytest.importorskip("qkv.kernels.triton_bwd")

from qkv.kernels.triton_split import ALIGN, MAX_SPLITS, MIN_SPLIT_KEYS, split_len  # noqa: E402

# --- the kernels compile for the GPU, even where there is none ----------------------------


@pytest.mark.slow
def test_every_candidate_fits_hopper():
    """The interpreter runs Python, so it accepts code the compiler rejects, and says nothing
    of registers: compile every autotuning candidate for sm_90 (H100/H200) with the ptxas
    triton ships, in 16-bit and float32, at a padded head size (40) and the largest (128),
    plain and with causal + key lengths + GQA (the forward also over a key split). Each
    must compile without spilling registers (beyond a few bytes: SPILL_LIMIT) and within an
    sm_90 block's shared memory; 16-bit ones must use the tensor cores."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "hopper_fit.py"
    args = ["--head-sizes", "40", "128", "--dtypes", "bf16", "fp32"]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, str(script), *args], env=env, capture_output=True, text=True, timeout=900
    )
    if proc.returncode != 0 and "ptxas" in proc.stderr and "not found" in proc.stderr:
        pytest.skip("this triton installation has no ptxas")
    failed = [line for line in proc.stdout.splitlines() if ": fits" not in line]
    assert proc.returncode == 0, "\n".join(failed) + proc.stderr[-3000:]
    forward = len(tf.FWD_CONFIGS) + len(tf.FWD_FLOAT32_CONFIGS)
    backward = (
        len(tb.BWD_DKDV_CONFIGS)
        + len(tb.BWD_DKDV_FLOAT32_CONFIGS)
        + len(tb.BWD_DQ_CONFIGS)
        + len(tb.BWD_DQ_FLOAT32_CONFIGS)
    )
    # 2 head sizes; variants: plain, all features (+ over one key split, forward only)
    assert proc.stdout.count(": fits") == 2 * (3 * forward + 2 * backward)


@pytest.mark.parametrize(
    "tuned,pools,length_arg,block",
    [
        ("_fwd_tuned", ("FWD_CONFIGS", "FWD_FLOAT32_CONFIGS"), "tune_tq", "BLOCK_M"),
        ("_dkdv_tuned", ("BWD_DKDV_CONFIGS", "BWD_DKDV_FLOAT32_CONFIGS"), "tune_tk", "BLOCK_N"),
        ("_dq_tuned", ("BWD_DQ_CONFIGS", "BWD_DQ_FLOAT32_CONFIGS"), "tune_tq", "BLOCK_M"),
    ],
)
def test_autotuning_tries_the_candidates_of_the_dtype_and_length(tuned, pools, length_arg, block):
    """float32 (exact products) gets its own small tiles; among the 16-bit ones, long
    sequences try the wide tiles along the program's own axis, short ones the narrow."""
    module = tf if tuned == "_fwd_tuned" else tb
    tuner = getattr(module, tuned)
    sixteen, thirty_two = (getattr(module, name) for name in pools)
    assert tuner.configs == sixteen + thirty_two

    def pruned(precision: str, length: int) -> list:
        return tuner.early_config_prune(tuner.configs, {length_arg: length}, PRECISION=precision)

    assert pruned("ieee", 4096) == thirty_two and pruned("ieee", 16) == thirty_two
    wide = [c for c in sixteen if c.kwargs[block] > 64]
    assert wide and pruned("tf32", 4096) == wide
    assert pruned("tf32", 16) == [c for c in sixteen if c.kwargs[block] <= 64]


# --- key splits for decoding --------------------------------------------------------------


def test_keys_split_only_where_the_queries_leave_the_gpu_idle():
    assert split_len(32 * 64, 32768, 132) == 32768  # training: many query blocks
    assert split_len(32, 2 * MIN_SPLIT_KEYS - 1, 132) == 2 * MIN_SPLIT_KEYS - 1  # short cache
    assert split_len(32, 4096, 0) == 4096  # no multiprocessor count (not CUDA)
    per = split_len(32, 32768, 132)  # decoding: B * H = 32 programs on 132 multiprocessors
    count = -(-32768 // per)
    assert per % ALIGN == 0 and per >= MIN_SPLIT_KEYS and 32 * count >= 2 * 132 - 32
    assert -(-32768 // split_len(1, 1 << 20, 132)) <= MAX_SPLITS


@settings(max_examples=200, deadline=None)
@given(tk=st.integers(1, 10**6), splits=st.integers(1, 100), align=st.sampled_from([16, 128]))
def test_asked_splits_cover_the_keys_on_block_boundaries(tk, splits, align):
    per = split_len(1, tk, 132, splits, align)
    count = -(-tk // per)
    assert 1 <= count <= splits and (count == 1 or per % align == 0)
    assert per * count >= tk and per * (count - 1) < tk  # no split is empty
