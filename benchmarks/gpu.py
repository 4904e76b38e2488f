"""GPU benchmark: qkv's Triton FlashAttention-2 kernel against PyTorch SDPA, in one run.

Compares :func:`qkv.kernels.triton_flash.flash_attention` with
``torch.nn.functional.scaled_dot_product_attention`` restricted (``sdpa_kernel``) to each
of its fused kernels: flash, cuDNN and memory-efficient. bfloat16; head size 64 (32 heads)
and 128 (16 heads); sequence lengths 1k-16k with ``B = 16384 // T`` (about 16k tokens per
batch); causal and not; forward and forward+backward. Then decoding steps ("decode"): one
query row against caches of 4k-64k keys (B = 1, H = 32, D = 128, forward only), where qkv
splits the keys across programs (split-K decoding in :mod:`qkv.kernels.triton_flash`); its
time in one pass over the keys (``key_splits=1``) is in the same row, and the cache read
rate in GB/s.

Throughput follows flash-attn's benchmark convention: the forward pass does
``4 * B * H * T * T * D`` FLOPs (two matmuls), the backward 2.5 times that, so
forward+backward counts 3.5 times; causal attention counts half. Ratios are qkv's
throughput over each SDPA kernel's, measured in the same process, on the same inputs.
Correctness is checked in the same run: the largest absolute difference of the output and
of dq, dk, dv from the first SDPA kernel that runs (flash, normally), next to the
difference between the SDPA kernels themselves for scale.

Usage::

    python benchmarks/gpu.py [OUT_DIR] [--quick] [--budget-s 240]

Results go to ``OUT_DIR/gpu.json`` (default ``benchmarks/results/``) in the format every
benchmark shares (:func:`benchmarks.common.write`: machine, versions, command, and one row
per case with qkv's figure beside the peer's), so ``qkv bench`` puts them into
BENCHMARKS.md; ``qkv bench gpu`` runs it too. A table is printed. Autotuning (Hopper
configs in :mod:`qkv.kernels.triton_flash`) happens
on each kernel's first call and is not timed. Without a CUDA device the script says so
and exits with status 0; it exits with 1 if qkv's kernel failed on any case.

Cases run in the order of :func:`ordered_cases` (those with a forward target first), and
the JSON file is rewritten after each one, so a run cut short by ``--budget-s`` or from
outside keeps what it measured. ``benchmarks/device.sh`` runs this with the kernel's tests
and the compile report in one call on a lent GPU.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import result, write  # noqa: E402

__all__ = ["chosen_tiles", "main", "ordered_cases", "plan", "run", "to_results"]

LENGTHS = [1024, 2048, 4096, 8192, 16384]
QUICK_LENGTHS = [1024, 4096]
HEADS = {64: 32, 128: 16}  # head size -> number of heads (model width 2048)
TOKENS = 16384
SDPA_KERNELS = ["flash", "cudnn", "efficient"]
FWD_BWD_FACTOR = 3.5  # forward (1) + backward (2.5), as flash-attn counts
FWD_TFLOPS_TARGET = 450.0  # forward, D = 128, T >= 4k, non-causal, on an H200
DECODE_LENGTHS = [4096, 16384, 65536]  # cache lengths of the decoding cases
DECODE_HEADS = 32  # D = 128, one sequence, one query row: 32 programs without key splits


def attention_flops(b: int, h: int, t: int, d: int, causal: bool, mode: str) -> float:
    """Matmul FLOPs of one attention call (see the module docstring)."""
    flops = 4.0 * b * h * t * t * d * (0.5 if causal else 1.0)
    return flops if mode == "fwd" else FWD_BWD_FACTOR * flops


def _implementations(causal: bool) -> dict:
    """name -> (context manager factory, attention function (q, k, v) -> out)."""
    from contextlib import nullcontext

    from torch.nn.attention import SDPBackend, sdpa_kernel

    from qkv.kernels.triton_flash import flash_attention

    sdpa_backends = {
        "flash": SDPBackend.FLASH_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
    }
    impls = {"qkv": (nullcontext, lambda q, k, v: flash_attention(q, k, v, causal=causal)[0])}
    for name in SDPA_KERNELS:
        backend = sdpa_backends[name]
        impls[name] = (
            lambda backend=backend: sdpa_kernel(backend),
            lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
        )
    return impls


def chosen_tiles() -> dict[str, str]:
    """The tiles the autotuner picked at the last launch of each qkv kernel, as
    ``BLOCK_MxBLOCK_N wWARPS sSTAGES`` (none before a kernel's first launch)."""
    from qkv.kernels import triton_flash as tf

    tiles = {}
    for name, tuner in (("fwd", tf._fwd_tuned), ("dkdv", tf._dkdv_tuned), ("dq", tf._dq_tuned)):
        config = getattr(tuner, "best_config", None)
        if config is not None:
            m, n = config.kwargs["BLOCK_M"], config.kwargs["BLOCK_N"]
            tiles[name] = f"{m}x{n} w{config.num_warps} s{config.num_stages}"
    return tiles


def _outputs_and_grads(fn, q, k, v, dout) -> list[torch.Tensor]:
    for x in (q, k, v):
        x.grad = None
    out = fn(q, k, v)
    out.backward(dout)
    return [out.detach(), q.grad.clone(), k.grad.clone(), v.grad.clone()]


def _max_diffs(a: list[torch.Tensor], b: list[torch.Tensor]) -> dict[str, float]:
    names = ["out", "dq", "dk", "dv"]
    return {n: (x.float() - y.float()).abs().max().item() for n, x, y in zip(names, a, b)}


def run_case(d: int, t: int, causal: bool) -> list[dict]:
    """Time every implementation on one shape; one row per (implementation, mode)."""
    from triton.testing import do_bench

    h, b = HEADS[d], max(1, TOKENS // t)
    shape = (b, h, t, d)
    q, k, v = (
        torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for _ in range(3)
    )
    dout = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    rows, results = [], {}
    for name, (context, fn) in _implementations(causal).items():
        base = dict(impl=name, D=d, H=h, B=b, T=t, causal=causal)
        try:
            with context():
                results[name] = _outputs_and_grads(fn, q, k, v, dout)  # also autotunes
                fwd_ms = do_bench(lambda: fn(q, k, v), return_mode="median")
                both_ms = do_bench(
                    lambda: fn(q, k, v).backward(dout), grad_to_none=[q, k, v], return_mode="median"
                )
        except Exception as err:  # e.g. an SDPA kernel without support for this case
            reason = _reason(err)
            rows.append(dict(base, mode="fwd", ms=None, tflops=None, error=reason))
            rows.append(dict(base, mode="fwd+bwd", ms=None, tflops=None, error=reason))
            continue
        if name == "qkv":
            base["tiles"] = chosen_tiles()
        for mode, ms in (("fwd", fwd_ms), ("fwd+bwd", both_ms)):
            tflops = attention_flops(b, h, t, d, causal, mode) / (ms * 1e-3) / 1e12
            rows.append(dict(base, mode=mode, ms=ms, tflops=tflops))
    reference = next((n for n in SDPA_KERNELS if n in results), None)
    for row in rows:
        if reference and row["impl"] in results and row["impl"] != reference:
            row["max_abs_diff_vs"] = reference
            row["max_abs_diff"] = _max_diffs(results[row["impl"]], results[reference])
    _add_ratios(rows)
    return rows


def _reason(err: Exception) -> str:
    """The first line of an error, for a row that could not run."""
    return str(err).strip().splitlines()[0][:160] if str(err).strip() else repr(err)


def run_decode_case(tk: int) -> list[dict]:
    """One decoding step (B = 1, H = 32, D = 128, one query row) over a cache of ``tk``
    keys, forward only: qkv (key splits by its own rule), qkv in one pass over the keys
    (``key_splits=1``, as a field of qkv's row) and each SDPA kernel."""
    from contextlib import nullcontext

    from triton.testing import do_bench

    from qkv.kernels.triton_flash import flash_attention

    h, d = DECODE_HEADS, 128
    q = torch.randn(1, h, 1, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(1, h, tk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    impls = dict(_implementations(False))
    impls["qkv one pass"] = (nullcontext, lambda q, k, v: flash_attention(q, k, v, key_splits=1)[0])
    rows, outs = [], {}
    for name, (context, fn) in impls.items():
        base = dict(impl=name, D=d, H=h, B=1, T=tk, causal=False, mode="decode")
        try:
            with context():
                outs[name] = fn(q, k, v)
                ms = do_bench(lambda: fn(q, k, v), return_mode="median")
        except Exception as err:
            rows.append(dict(base, ms=None, tflops=None, error=_reason(err)))
            continue
        cache_gb = 2 * h * tk * d * 2 / 1e9  # K and V, bf16: read once per step
        rows.append(
            dict(
                base,
                ms=ms,
                tflops=4.0 * h * tk * d / (ms * 1e-3) / 1e12,
                cache_gb_per_s=cache_gb / (ms * 1e-3),
            )
        )
    reference = next((n for n in SDPA_KERNELS if n in outs), None)
    by_impl = {r["impl"]: r for r in rows}
    if "qkv" in by_impl and reference and "qkv" in outs:
        by_impl["qkv"]["max_abs_diff_vs"] = reference
        by_impl["qkv"]["max_abs_diff"] = _max_diffs([outs["qkv"]], [outs[reference]])
        by_impl["qkv"]["one_pass_ms"] = by_impl.get("qkv one pass", {}).get("ms")
    _add_ratios(rows)
    return [r for r in rows if r["impl"] != "qkv one pass"]


def _add_ratios(rows: list[dict]) -> None:
    """qkv throughput / each SDPA kernel's, per mode (None where either did not run)."""
    for mode in ("fwd", "fwd+bwd", "decode"):
        by_impl = {r["impl"]: r for r in rows if r["mode"] == mode}
        ours = by_impl.get("qkv", {}).get("tflops")
        ratios = {}
        for name in SDPA_KERNELS:
            theirs = by_impl.get(name, {}).get("tflops")
            ratios[name] = ours / theirs if ours and theirs else None
        if "qkv" in by_impl:
            by_impl["qkv"]["ratio_to_sdpa"] = ratios


def has_forward_target(d: int, t: int, causal: bool) -> bool:
    """Whether the issue sets a forward target for this shape: D = 128, T >= 4k, not causal."""
    return d == 128 and t >= 4096 and not causal


def _target(row: dict) -> tuple[str | None, bool | None]:
    """The issue's target for a qkv row against the best SDPA kernel, and whether it is met."""
    ratio = row.get("best_ratio")
    if ratio is None:
        return None, None
    if row["mode"] == "fwd+bwd":
        return "≥ 0.9×", ratio >= 0.9
    if row["mode"] == "fwd" and has_forward_target(row["D"], row["T"], row["causal"]):
        met = ratio >= 1.0 and row["tflops"] >= FWD_TFLOPS_TARGET
        return f"≥ 1.0× and ≥ {FWD_TFLOPS_TARGET:.0f} TFLOP/s", met
    return None, None


def to_results(rows: list[dict]) -> list[dict]:
    """Measurement rows -> the shared format: qkv against the fastest SDPA kernel per case.

    Each result carries qkv's and the peer's TFLOP/s and milliseconds, every kernel's
    ratio, and qkv's largest differences from SDPA (out, dq, dk, dv).
    """
    out = []
    keys = sorted({(r["D"], r["T"], r["causal"], r["mode"]) for r in rows})
    for d, t, causal, mode in keys:
        group = {
            r["impl"]: r
            for r in rows
            if (r["D"], r["T"], r["causal"], r["mode"]) == (d, t, causal, mode)
        }
        ours = group.get("qkv", {})
        ran = [n for n in SDPA_KERNELS if group.get(n, {}).get("tflops")]
        if not ours.get("tflops") or not ran:
            continue
        best = max(ran, key=lambda n: group[n]["tflops"])
        row = dict(ours, best_ratio=ours["tflops"] / group[best]["tflops"])
        target, met = _target(row)
        case = f"D={d} T={t} {'causal' if causal else 'full'} {mode}"
        extra = dict(
            qkv_ms=ours["ms"],
            peer_ms=group[best]["ms"],
            B=ours["B"],
            H=ours["H"],
            ratio_to_sdpa=ours.get("ratio_to_sdpa"),
            max_abs_diff=ours.get("max_abs_diff"),
            tiles=ours.get("tiles"),
            one_pass_ms=ours.get("one_pass_ms"),
        )
        out.append(
            result(
                case,
                ours["tflops"],
                f"SDPA {best}",
                group[best]["tflops"],
                unit="TFLOP/s",
                target=target,
                met=met,
                **extra,
            )
        )
    return out


def _fmt(x: float | None, spec: str = "6.1f") -> str:
    return format(x, spec) if x is not None else "   -  "


def print_table(rows: list[dict]) -> None:
    """One line per (shape, mode): TFLOP/s of each implementation and qkv's ratios."""
    head = f"{'D':>4} {'T':>6} {'causal':>6} {'mode':>8} | {'qkv':>6} "
    head += " ".join(f"{n:>9}" for n in SDPA_KERNELS)
    head += " | " + " ".join(f"{'/' + n:>9}" for n in SDPA_KERNELS) + " | max|diff| out/dq/dk/dv"
    print(head)
    print("-" * len(head))
    keys = sorted({(r["D"], r["T"], r["causal"], r["mode"]) for r in rows})
    for d, t, causal, mode in keys:
        same = [r for r in rows if (r["D"], r["T"], r["causal"], r["mode"]) == (d, t, causal, mode)]
        group = {r["impl"]: r for r in same}
        ours = group.get("qkv", {})
        line = f"{d:>4} {t:>6} {causal!s:>6} {mode:>8} | {_fmt(ours.get('tflops'))} "
        line += " ".join(f"{_fmt(group.get(n, {}).get('tflops')):>9}" for n in SDPA_KERNELS)
        ratios = ours.get("ratio_to_sdpa", {})
        line += " | " + " ".join(f"{_fmt(ratios.get(n), '9.2f'):>9}" for n in SDPA_KERNELS)
        diff = ours.get("max_abs_diff")
        if diff:
            line += " | " + "/".join(
                f"{diff[k]:.1e}" for k in ("out", "dq", "dk", "dv") if k in diff
            )
        print(line)


def ordered_cases(lengths: list[int]) -> list[tuple[int, int, bool]]:
    """Every ``(D, T, causal)``, those with a forward target first (D = 128, T >= 4k, not
    causal), then the rest of D = 128, then D = 64: a budget cut drops the least needed."""
    cases = [(d, t, c) for d in HEADS for t in lengths for c in (False, True)]
    return sorted(cases, key=lambda c: (not has_forward_target(*c), -c[0]))


def plan(lengths: list[int], decode_lengths: list[int]) -> list[tuple]:
    """The run's cases in order: ``("train", D, T, causal)`` with a forward target, the
    decoding steps ``("decode", Tk)``, then the other training shapes."""
    cases = ordered_cases(lengths)
    targets = [c for c in cases if has_forward_target(*c)]
    rest = [c for c in cases if c not in targets]
    decode = [("decode", t) for t in decode_lengths]
    return [("train", *c) for c in targets] + decode + [("train", *c) for c in rest]


def _notes(start: float, left: list, triton) -> str:
    """The JSON file's notes; ``left``: the cases not measured (skipped, or still to come)."""
    seconds = round(time.monotonic() - start, 1)
    return (
        f"{torch.cuda.get_device_name()}, triton {triton.__version__}, bfloat16, about "
        f"{TOKENS} tokens per batch; FLOPs: forward 4·B·H·T·T·D, fwd+bwd 3.5×, causal halved; "
        f"qkv against the fastest SDPA kernel of each case ({seconds} s"
        + (f"; {len(left)} cases not measured" if left else "")
        + "). Every kernel's ratio and qkv's differences from SDPA are in the JSON."
    )


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; returns the process exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", nargs="?", default="benchmarks/results", type=Path)
    parser.add_argument("--quick", action="store_true", help="T = 1k and 4k only")
    parser.add_argument(
        "--budget-s", type=float, default=240.0, help="start no new case after this many seconds"
    )
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks/gpu.py: no CUDA device found; nothing to measure.")
        return 0
    try:
        import triton
    except ImportError:
        print("benchmarks/gpu.py: triton is not installed (pip install 'qkv[kernels]').")
        return 1

    torch.manual_seed(0)
    start, rows, skipped = time.monotonic(), [], []
    quick = args.quick
    cases = plan(
        QUICK_LENGTHS if quick else LENGTHS, DECODE_LENGTHS[1:2] if quick else DECODE_LENGTHS
    )
    for i, case in enumerate(cases, 1):
        if time.monotonic() - start > args.budget_s:
            skipped.append(case)
            continue
        print(f"[{i}/{len(cases)} {time.monotonic() - start:5.0f} s] {case}", flush=True)
        rows += run_decode_case(case[1]) if case[0] == "decode" else run_case(*case[1:])
        torch.cuda.empty_cache()
        # after every case, so that a run stopped from outside keeps what it measured
        write(args.out_dir, "gpu", to_results(rows), notes=_notes(start, cases[i:], triton))

    seconds = round(time.monotonic() - start, 1)
    notes = _notes(start, skipped, triton)
    path = write(args.out_dir, "gpu", to_results(rows), notes=notes)
    print()
    print_table(rows)
    print(f"\n{len(rows)} rows in {seconds} s -> {path}")
    if skipped:
        print(f"{len(skipped)} cases skipped: over the {args.budget_s:.0f} s budget")
    failed = [r for r in rows if r["impl"] == "qkv" and r.get("error")]
    for row in failed:
        print(f"qkv failed at D={row['D']} T={row['T']} causal={row['causal']}: {row['error']}")
    return 1 if failed else 0


def run(out_dir: Path = Path("benchmarks/results"), quick: bool = False) -> None:
    """``qkv bench gpu``: the same run (nothing to measure without a CUDA device)."""
    main([str(out_dir)] + (["--quick"] if quick else []))


if __name__ == "__main__":
    sys.exit(main())
