"""Whether every Triton autotuning candidate fits an H100/H200 (sm_90), checked without a GPU.

Each candidate of :mod:`qkv.kernels.triton_flash` (forward, dK/dV and dQ) is compiled for
sm_90 the way a launch on the GPU compiles it: Triton's compiler and the ``ptxas`` it
ships, 16-byte aligned pointers and strides (what Triton assumes for contiguous tensors
with a head size that is a multiple of 8). For each one it reports the registers per
thread, the bytes spilled to local memory, the shared memory a block needs, and whether
tiles arrive by asynchronous copies (``cp.async``: loads software-pipelined over
``num_stages``). A spill (over :data:`SPILL_LIMIT` bytes) means local-memory traffic in
the inner loop; shared memory over an sm_90 block's 227 KiB means the config cannot launch
at all (the autotuner would skip it).

The CPU interpreter runs Python, so it checks what the kernels compute but not how they
compile; this is the check for the second, on any machine with triton installed.

Each candidate is compiled plain (one query head per key head, no key lengths) and with
every feature on (causal, key lengths, two query heads per key head); the forward kernel
also with all of them over one split of the keys (Flash-Decoding). Head sizes that
are not powers of two compile with padded tiles.

Run: ``python benchmarks/hopper_fit.py [--head-sizes 64 128] [--dtypes bf16 fp32]
[--jobs N]``. One line per compiled case; exit status 1 if any spills or does not fit.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHARED_LIMIT = 227 * 1024  # largest shared memory one sm_90 block may opt into
# Bytes of spill stores per thread tolerated: Triton 3.6's ptxas spilled 4-12 bytes in two
# float32 cases using 64-80 of 255 registers, a value or two kept in local memory rather
# than register pressure; the spills this report was written to catch were 88 bytes to 3.8 KB.
SPILL_LIMIT = 16
FLOAT32_ARGS = {"Lse", "DLse", "Delta"}
TENSOR_ARGS = {"Q", "K", "V", "Out", "DOut", "DO", "DK", "DV", "DQ", "KeyLen"} | FLOAT32_ARGS
DTYPES = ["bf16", "fp16", "fp32"]  # Triton's names


def kernels() -> dict:
    """name -> (jit function, 16-bit candidates, float32 candidates)."""
    from qkv.kernels import triton_flash as tf

    return {
        "fwd": (tf._fwd_kernel, tf.FWD_CONFIGS, tf.FWD_FLOAT32_CONFIGS),
        "dkdv": (tf._bwd_dkdv_kernel, tf.BWD_DKDV_CONFIGS, tf.BWD_DKDV_FLOAT32_CONFIGS),
        "dq": (tf._bwd_dq_kernel, tf.BWD_DQ_CONFIGS, tf.BWD_DQ_FLOAT32_CONFIGS),
    }


def signature(fn, consts: dict, dtype: str) -> tuple[dict, dict]:
    """Triton's argument types for ``fn`` and the 16-byte divisibility of its integers and
    pointers (every argument but the scales and the tuning keys)."""
    sig = {}
    for name in fn.arg_names:
        if name in consts:
            sig[name] = "constexpr"
        elif name == "KeyLen":
            sig[name] = "*i32"
        elif name in TENSOR_ARGS:
            sig[name] = "*fp32" if name in FLOAT32_ARGS else "*" + dtype
        else:
            sig[name] = "fp32" if name.endswith("scale") else "i32"
    aligned = {
        (i,): [["tt.divisibility", 16]]
        for i, name in enumerate(fn.arg_names)
        if sig[name] not in ("constexpr", "fp32") and not name.startswith("tune")
    }
    return sig, aligned


VARIANTS = ("plain", "all features", "all + split")  # the last for the forward kernel only


def constants(d: int, dtype: str, config, variant: str, fn_args=()) -> dict:
    """The constexprs of one launch: "all features" turns on causal, key lengths and GQA;
    "all + split" also key splits (for a kernel with ``SPLIT`` among ``fn_args``)."""
    import triton

    block_d = max(16, triton.next_power_of_2(d))
    full = variant != "plain"
    consts = dict(
        GROUPS=2 if full else 1,
        HEAD_D=d,
        HEAD_DV=d,
        BLOCK_D=block_d,
        BLOCK_DV=block_d,
        PAD_D=block_d != d,
        PAD_DV=block_d != d,
        CAUSAL=full,
        HAS_LENGTHS=full,
        PRECISION="ieee" if dtype == "fp32" else "tf32",
        **config.kwargs,
    )
    if not full:
        consts["KeyLen"] = None
    if "SPLIT" in fn_args:
        consts["SPLIT"] = variant == "all + split"
    return consts


def compile_case(case: tuple) -> dict:
    """Compile one (kernel, dtype, head size, variant, config index) for sm_90."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    name, dtype, d, variant, index = case
    fn, configs16, configs32 = kernels()[name]
    config = (configs32 if dtype == "fp32" else configs16)[index]
    consts = constants(d, dtype, config, variant, fn.arg_names)
    sig, aligned = signature(fn, consts, dtype)
    options = dict(num_warps=config.num_warps, num_stages=config.num_stages, enable_fp_fusion=True)
    triton.knobs.nvidia.dump_ptxas_log = True  # ptxas -v: registers and spills
    log = io.StringIO()
    with contextlib.redirect_stdout(log):
        kernel = triton.compile(
            ASTSource(fn, sig, consts, aligned), target=GPUTarget("cuda", 90, 32), options=options
        )
    text = log.getvalue()
    registers = re.findall(r"Used (\d+) registers", text)
    return dict(
        kernel=name,
        dtype=dtype,
        head_size=d,
        variant=variant,
        block_m=config.kwargs["BLOCK_M"],
        block_n=config.kwargs["BLOCK_N"],
        warps=config.num_warps,
        stages=config.num_stages,
        registers=int(registers[0]) if registers else None,
        spilled=sum(int(x) for x in re.findall(r"(\d+) bytes spill stores", text)),
        shared=kernel.metadata.shared,
        tensor_cores="wgmma" in kernel.asm["ptx"],
        async_copies=kernel.asm["ptx"].count("cp.async"),
    )


def cases(head_sizes: list[int], dtypes: list[str]) -> list[tuple]:
    """Every (kernel, dtype, head size, variant, config index) to compile."""
    out = []
    for name, (fn, configs16, configs32) in kernels().items():
        variants = VARIANTS if "SPLIT" in fn.arg_names else VARIANTS[:2]
        for dtype in dtypes:
            count = len(configs32 if dtype == "fp32" else configs16)
            out += [
                (name, dtype, d, variant, i)
                for d in head_sizes
                for variant in variants
                for i in range(count)
            ]
    return out


def problems(row: dict) -> list[str]:
    """What is wrong with one compiled case (empty when it fits)."""
    found = []
    if row["spilled"] > SPILL_LIMIT:
        found.append(f"spills {row['spilled']} bytes")
    if row["shared"] > SHARED_LIMIT:
        found.append(f"needs {row['shared'] / 1024:.0f} KiB of shared memory")
    if row["dtype"] != "fp32" and not row["tensor_cores"]:
        found.append("no wgmma (Hopper tensor core) instructions")
    if row["dtype"] != "fp32" and row["stages"] > 1 and not row.get("async_copies", 1):
        found.append("no asynchronous copies: the K/V loads are not pipelined")
    return found


def line(row: dict) -> str:
    """One row of the report."""
    tile = f"{row['block_m']}x{row['block_n']} w{row['warps']} s{row['stages']}"
    head = f"{row['kernel']:>4} {row['dtype']} D={row['head_size']:<3} {row['variant']:<12}"
    fit = "; ".join(problems(row)) or "fits"
    regs, copies = row["registers"], row.get("async_copies")
    return (
        f"{head} {tile:<15} regs {regs} spilled {row['spilled']} B "
        f"shared {row['shared'] / 1024:.0f} KiB cp.async {copies}: {fit}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--head-sizes", type=int, nargs="+", default=[32, 64, 128])
    parser.add_argument("--dtypes", nargs="+", choices=DTYPES, default=["bf16", "fp32"])
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    # A fresh cache: a kernel found in Triton's cache is not assembled again, so ptxas
    # would not report on it.
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="qkv-hopper-fit-")
    os.environ.pop("TRITON_INTERPRET", None)
    todo = cases(args.head_sizes, args.dtypes)
    bad = 0
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for row in pool.map(compile_case, todo):
            print(line(row), flush=True)
            bad += bool(problems(row))
    print(f"{len(todo) - bad} of {len(todo)} cases fit sm_90")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
