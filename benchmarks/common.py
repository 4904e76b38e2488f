"""What every benchmark shares: timing, peak memory, the JSON format and BENCHMARKS.md.

One JSON file per benchmark, ``{"name", "machine", "versions", "command", "results"}``;
each result names the case, qkv's figure and its peer's figure from the same run, and
their ratio, so a number is never read without the one it is compared with.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

_ARGV = list(sys.argv)  # as started: a script may take its own options out of sys.argv

__all__ = [
    "cli",
    "machine",
    "measure",
    "measure_pair",
    "measure_turns",
    "peak_rss_mib",
    "render_markdown",
    "report",
    "result",
    "write",
]

ROOT = Path(__file__).resolve().parents[1]


def machine() -> dict:
    """CPU, cores, memory, threads and library versions of this run."""
    info = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    try:
        with open("/proc/meminfo") as f:
            info["mem_gib"] = round(int(f.readline().split()[1]) / 2**20, 1)
        with open("/proc/cpuinfo") as f:  # results name the machine they ran on
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        info["cpu_model"] = names[0] if names else None
    except OSError:
        pass
    from qkv.kernels import native
    from qkv.train.distributed import native_bf16

    info["native_bf16"] = native_bf16(torch.device("cpu"))
    info["native_softmax"] = native.why_unavailable() or "built"  # the weights' C kernel
    return info


def versions() -> dict:
    import numpy

    out = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
    }
    for name in ("transformers", "triton"):
        try:
            out[name] = __import__(name).__version__
        except ImportError:
            pass
    return out


MIN_SAMPLE_S = 0.02  # one sample of a short call repeats it until it lasts about this long


def _batched(fn: Callable[[], object]) -> tuple[Callable[[], object], int]:
    """``fn`` repeated ``n`` times per sample so that a sample lasts ``MIN_SAMPLE_S``.

    A single call of a millisecond is at the mercy of the timer and of whatever else ran
    on the machine in that millisecond; a median of such calls moved by 5% between runs.
    """
    t0 = time.perf_counter()
    fn()
    n = max(1, math.ceil(MIN_SAMPLE_S / max(time.perf_counter() - t0, 1e-9)))
    if n == 1:
        return fn, 1

    def repeated() -> None:
        for _ in range(n):
            fn()

    return repeated, n


def measure(
    fn: Callable[[], object], *, repeat: int = 5, warmup: int = 1, budget_s: float = 20
) -> float:
    """Median wall time of ``fn()`` in seconds (fewer repeats when one call is slow)."""
    for _ in range(warmup):
        fn()
    return measure_turns({"fn": fn}, repeat=repeat, budget_s=budget_s, warm=False)["fn"]


_SAMPLER = """
import os, threading, time
_page = os.sysconf("SC_PAGE_SIZE")
def _rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _page
_peak = [0]
_stop = threading.Event()
def _watch():
    while not _stop.is_set():
        _peak[0] = max(_peak[0], _rss())
        time.sleep(0.0005)
"""


def matmul_gflops(n: int = 2048, dtype: torch.dtype = torch.float32) -> float:
    """This machine's matmul throughput (GFLOP/s) in ``dtype`` at the current thread count."""
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    best = float("inf")
    for _ in range(4):
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e9


def matmul_share(row: dict) -> str:
    """``"case qkv% / peer%"``: the shares of the matmul peak in a row (see ``result``)."""
    return f"{row['case']} {row['qkv_matmul_fraction']:.0%} / {row['peer_matmul_fraction']:.0%}"


def measure_pair(
    fn_a: Callable[[], object], fn_b: Callable[[], object], *, repeat: int = 7, budget_s: float = 30
) -> tuple[float, float]:
    """Median wall times of ``fn_a`` and ``fn_b``, called in turns (a, b, a, b, ...).

    Alternating cancels slow drifts of a shared machine that would otherwise favour
    whichever side ran in the quieter moment.
    """
    s = measure_turns({"a": fn_a, "b": fn_b}, repeat=repeat, budget_s=budget_s)
    return s["a"], s["b"]


def measure_turns(
    fns: dict[str, Callable[[], object]],
    *,
    repeat: int = 5,
    budget_s: float = 60,
    warm: bool = True,
) -> dict[str, float]:
    """Median wall time of each function, all called in turns (see :func:`measure_pair`);
    a short function is timed over several calls per sample (:func:`_batched`)."""
    if warm:
        for fn in fns.values():
            fn()
    batched = {name: _batched(fn) for name, fn in fns.items()}
    times: dict[str, list[float]] = {name: [] for name in fns}
    start = time.perf_counter()
    while min(map(len, times.values())) < repeat and (
        not times[next(iter(fns))] or time.perf_counter() - start < budget_s
    ):
        for name, (fn, n) in batched.items():
            t0 = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - t0) / n)
    return {name: statistics.median(t) for name, t in times.items()}


def peak_rss_mib(code: str) -> float:
    """Extra peak resident memory (MiB) of ``code``'s part after ``# --- measure ---``.

    The code runs in a fresh interpreter. The setup before the marker runs first; then a
    thread samples the resident set size every 0.5 ms while the measured part runs, and
    the figure is the highest sample minus the size before it started.

    glibc's mmap threshold is fixed at its initial 128 KiB for the run (and the heap is
    trimmed as soon as 128 KiB are free at its top): by default the threshold grows to
    the size of the largest block freed so far, so whether a later block of a similar size
    arrives as fresh pages (counted) or as reused heap (not counted) depended on what
    happened to be freed before, and an output could count for one side and not the other.
    Fixed, every large block of the measured part counts, the result included.
    """
    setup, body = code.split("# --- measure ---")
    script = (
        _SAMPLER
        + setup
        + "\nbase = _rss()\nthreading.Thread(target=_watch, daemon=True).start()\n"
        + body
        + "\n_stop.set(); time.sleep(0.01)\nprint((max(_peak[0], _rss()) - base) / 2**20)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.update(MALLOC_MMAP_THRESHOLD_="131072", MALLOC_TRIM_THRESHOLD_="131072")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip().splitlines()[-1])
    return float(out.stdout.strip().splitlines()[-1])


def result(
    case: str,
    qkv_value: float,
    peer: str,
    peer_value: float,
    *,
    unit: str = "s",
    target: str | None = None,
    met: bool | None = None,
    **extra,
) -> dict:
    """One row: qkv's figure, the peer's figure, and qkv / peer."""
    row = {
        "case": case,
        "unit": unit,
        "qkv": qkv_value,
        "peer": peer,
        "peer_value": peer_value,
        "ratio": qkv_value / peer_value if peer_value else None,
    }
    if target is not None:
        row["target"], row["met"] = target, met
    row.update(extra)
    return row


def write(out_dir: Path, name: str, rows: list[dict], *, notes: str = "") -> Path:
    """Write ``out_dir/NAME.json`` atomically and return its path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    doc = {
        "name": name,
        "machine": machine(),
        "versions": versions(),
        "command": " ".join([Path(_ARGV[0]).name, *_ARGV[1:]]),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "notes": notes,
        "results": rows,
    }
    path = out_dir / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=2))
    os.replace(tmp, path)
    return path


def format_table(rows: list[dict]) -> str:
    """A plain-text table of rows (used for printing and for BENCHMARKS.md)."""
    lines = [
        "| case | qkv | peer | peer value | qkv / peer | target |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        unit = r.get("unit", "s")
        target = r.get("target", "")
        if target:
            target += " ✓" if r.get("met") else " ✗"
        ratio = f"{r['ratio']:.2f}×" if r.get("ratio") is not None else "–"
        lines.append(
            f"| {r['case']} | {_fmt(r['qkv'], unit)} | {r['peer']} | "
            f"{_fmt(r['peer_value'], unit)} | {ratio} | {target} |"
        )
    return "\n".join(lines)


def _fmt(value: float, unit: str) -> str:
    if unit == "s":
        return f"{value * 1e3:.2f} ms" if value < 1 else f"{value:.2f} s"
    return f"{value:.3g} {unit}"


def render_markdown(results_dir: Path) -> str:
    """The measured part of BENCHMARKS.md, from every JSON file in ``results_dir``."""
    parts = []
    for path in sorted(Path(results_dir).glob("*.json")):
        doc = json.loads(path.read_text())
        m, v = doc["machine"], doc["versions"]
        parts.append(f"### {doc['name']}\n")
        parts.append(
            f"`{doc['command']}` on {doc['date']}: {m.get('processor')}, {m.get('cpus')} "
            f"CPUs, {m.get('torch_threads')} torch threads, torch {v.get('torch')}"
            + (f", {m['cuda']}" if m.get("cuda") else "")
            + ".\n"
        )
        if doc.get("notes"):
            parts.append(doc["notes"] + "\n")
        parts.append(format_table(doc["results"]) + "\n")
    return "\n".join(parts)


def report(out_dir: Path, name: str, rows: list[dict], *, notes: str = "") -> dict:
    """Write ``out_dir/NAME.json``, print the table, and return rows and path."""
    path = write(out_dir, name, rows, notes=notes)
    print(format_table(rows))
    print(f"written to {path}")
    return {"rows": rows, "path": str(path)}


def cli(run: Callable[..., dict], doc: str | None) -> None:
    """The command line every benchmark script shares: ``[--quick] [--out DIR]``."""
    import argparse

    ap = argparse.ArgumentParser(description=doc)
    ap.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    ap.add_argument("--out", default="benchmarks/results", type=Path)
    ap.add_argument("--threads", type=int, default=None, help="torch threads")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    run(args.out, args.quick)
