"""Lab ``parallelism``: a recurrence is sequential in the length; self-attention is not.

Claim:
    An RNN computes :math:`h_t` from :math:`h_{t-1}`, so a sentence of ``T`` tokens needs
    ``T`` steps one after another, and no amount of hardware shortens that chain.
    Self-attention computes every position of a layer at once (matrix products), so its
    chain of dependent steps is the number of layers, whatever ``T``.

Method:
    A GRU encoder (``L`` layers, width ``E``) and a self-attention encoder (``L`` post-LN
    Transformer layers, width ``E``, feed-forward width chosen so both have about the same
    number of parameters). At every length ``T`` the experiment measures three things that
    it keeps apart:

    1. **the chain** (what "parallelisable" means): the longest path of the backward graph
       that autograd built for one forward pass, walking ``grad_fn.next_functions``,
       counted in matrix products (``mm``, ``addmm``, ``bmm``; a fused attention node
       counts 2: scores, then weighted sum) and in autograd nodes. Work off that path can
       run at the same time; the path itself cannot.
    2. **the work**: FLOPs of one forward and one backward pass, counted by
       :class:`torch.utils.flop_counter.FlopCounterMode` (PyTorch's CPU flash attention
       is counted with PyTorch's own SDPA formulas).
    3. **the time** (what "faster on this CPU" means): one forward + backward pass of a
       batch, median of repeats after a warm-up, in a fresh process per thread count
       (``torch.set_num_threads`` pinned to 1, then 2; and the GPU when one is present);
       the parallel speed-up is the 1-thread time over the 2-thread time. The machine
       must be quiet: a 1-minute load average of at most half the cores before the
       timings, and while they run, other processes (the machine's busy CPU time in
       ``/proc/stat``, steal included, less this process's and its children's) at most
       a tenth of the machine's CPU time. Otherwise the timings are recorded but called
       untrustworthy. (The load average after the timings would count the timings
       themselves.)
"""

from __future__ import annotations

import json
import logging
import math
import os
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from qkv.lab.common import (
    LabRun,
    Table,
    new_figure,
    save_figure,
    seed_all,
    steps_bar,
)
from qkv.modules.transformer import Encoder, EncoderLayer

__all__ = [
    "Setting",
    "QUICK",
    "FULL",
    "GRUEncoder",
    "AttentionEncoder",
    "build_pair",
    "dependency_chain",
    "count_flops",
    "machine_load",
    "measure",
    "time_step",
    "timing_worker",
    "run",
    "table",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Setting:
    """Sizes, repeats and the CPU thread counts compared."""

    lengths: tuple[int, ...]
    batch: int
    width: int
    layers: int
    heads: int
    repeats: int
    seed: int = 0
    threads: tuple[int, ...] = (1, 2)


QUICK = Setting(lengths=(8, 32, 128), batch=4, width=32, layers=2, heads=4, repeats=2)
FULL = Setting(
    lengths=(16, 32, 64, 128, 256, 512, 1024), batch=16, width=256, layers=2, heads=4, repeats=5
)

MODELS = ("gru", "attention")
LOAD_SHARE = 0.5  # quiet before the timings: 1-minute load average <= this x cores
OTHERS_SHARE = 0.1  # quiet during them: other processes' CPU time <= this x the machine's


class GRUEncoder(nn.Module):
    """``L`` stacked GRU layers of width ``E``."""

    def __init__(self, width: int, layers: int):
        super().__init__()
        self.rnn = nn.GRU(width, width, num_layers=layers, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.rnn(x)[0]  # (B, T, E)


class AttentionEncoder(nn.Module):
    """``L`` Transformer encoder layers of width ``E``."""

    def __init__(self, width: int, layers: int, heads: int, ff_dim: int):
        super().__init__()
        self.ff_dim = ff_dim
        self.encoder = Encoder([EncoderLayer(width, heads, ff_dim) for _ in range(layers)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x).hidden  # (B, T, E)


def _params(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


def build_pair(setting: Setting) -> tuple[GRUEncoder, AttentionEncoder]:
    """The two encoders, the attention feed-forward width chosen to match the GRU's size."""
    gru = GRUEncoder(setting.width, setting.layers)
    target = _params(gru)
    best = None
    for ff in range(8, 16 * setting.width + 1, 8):
        candidate = _params(AttentionEncoder(setting.width, setting.layers, setting.heads, ff))
        if best is None or abs(candidate - target) < abs(best[1] - target):
            best = (ff, candidate)
        if candidate > target:
            break
    return gru, AttentionEncoder(setting.width, setting.layers, setting.heads, best[0])


# --- 1. the chain of dependent operations ------------------------------------------------

_PRODUCTS = ("MmBackward", "AddmmBackward", "BmmBackward")


def _products(node: Any) -> int:
    """Matrix products one backward node stands for: 1 for a product, 2 for fused attention
    (scores ``Q Kᵀ``, then the weighted sum of ``V``), 0 otherwise."""
    name = type(node).__name__
    if name.startswith(_PRODUCTS):
        return 1
    return 2 if "Attention" in name else 0


def dependency_chain(model: nn.Module, x: torch.Tensor) -> dict[str, int]:
    """The longest path of the backward graph of ``model(x)``.

    The graph is walked from the output's ``grad_fn`` through ``next_functions``
    (iteratively: a GRU at T = 1024 has tens of thousands of nodes on one path).

    Returns:
        ``{"products": P, "nodes": N, "graph_nodes": G}``: the longest path counted in
        matrix products (:func:`_products`) and in autograd nodes, and the graph's size.
    """
    root = model(x).square().mean().grad_fn
    best: dict[Any, tuple[int, int]] = {}  # node -> (products, nodes) of its longest path
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        children = [n for n, _ in node.next_functions if n is not None]
        if expanded:
            below = [best[c] for c in children]
            products = max((b[0] for b in below), default=0)
            nodes = max((b[1] for b in below), default=0)
            best[node] = (_products(node) + products, 1 + nodes)
        elif node not in best:
            stack.append((node, True))
            stack.extend((c, False) for c in children if c not in best)
    products, nodes = best[root]
    return {"products": products, "nodes": nodes, "graph_nodes": len(best)}


# --- 2. the work ---------------------------------------------------------------------------


def _cpu_attention_flops(q_shape, k_shape, v_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(q_shape, k_shape, v_shape)


def _cpu_attention_backward_flops(
    grad_shape, q_shape, k_shape, v_shape, *args, out_shape=None, **kwargs
) -> int:
    return sdpa_backward_flop_count(grad_shape, q_shape, k_shape, v_shape)


# PyTorch's CPU flash attention has no formula in FlopCounterMode: give it the SDPA ones
_CPU_ATTENTION_FLOPS = {
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_attention_flops,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: (
        _cpu_attention_backward_flops
    ),
}


def count_flops(model: nn.Module, x: torch.Tensor) -> dict[str, int]:
    """FLOPs of one forward and one backward pass of ``model(x).square().mean()``."""
    model.zero_grad(set_to_none=True)
    with FlopCounterMode(display=False, custom_mapping=_CPU_ATTENTION_FLOPS) as forward:
        loss = model(x).square().mean()
    with FlopCounterMode(display=False, custom_mapping=_CPU_ATTENTION_FLOPS) as backward:
        loss.backward()
    model.zero_grad(set_to_none=True)
    return {"forward": forward.get_total_flops(), "backward": backward.get_total_flops()}


def structure(setting: Setting) -> dict[str, Any]:
    """Chain and FLOPs of both encoders at every length (no timing: any machine)."""
    gen = seed_all(setting.seed)
    models = dict(zip(MODELS, build_pair(setting), strict=True))
    rows = []
    with steps_bar("graphs and FLOPs", len(setting.lengths)) as advance:
        for length in setting.lengths:
            x = torch.randn(setting.batch, length, setting.width, generator=gen)
            row: dict[str, Any] = {"length": length}
            for name, model in models.items():
                chain = dependency_chain(model, x)
                flops = count_flops(model, x)
                row[f"{name}_chain_products"] = chain["products"]
                row[f"{name}_chain_nodes"] = chain["nodes"]
                row[f"{name}_graph_nodes"] = chain["graph_nodes"]
                row[f"{name}_flops_forward"] = flops["forward"]
                row[f"{name}_flops_backward"] = flops["backward"]
            rows.append(row)
            advance()
    return {
        "parameters": {name: _params(m) for name, m in models.items()},
        "attention_ff_dim": models["attention"].ff_dim,
        "rows": rows,
    }


# --- 3. the time ---------------------------------------------------------------------------


def time_step(model: nn.Module, x: torch.Tensor, repeats: int) -> float:
    """Median seconds of one forward + backward pass (after one warm-up pass)."""
    sync = torch.cuda.synchronize if x.is_cuda else (lambda: None)
    times = []
    for i in range(repeats + 1):
        model.zero_grad(set_to_none=True)
        sync()
        start = time.perf_counter()
        model(x).square().mean().backward()
        sync()
        if i:  # the first pass warms up kernels and allocators
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def timing_worker(setting: dict[str, Any], threads: int, device: str) -> dict[str, Any]:
    """Time both encoders at every length with ``threads`` CPU threads on ``device``.

    Meant for a fresh process (:func:`_timed_in_subprocess`): a process that already ran
    with another thread count keeps its thread pools warm, and its first timings with the
    new count pay for resizing them.
    """
    torch.set_num_threads(threads)
    s = Setting(**{k: tuple(v) if isinstance(v, list) else v for k, v in setting.items()})
    return {"threads": torch.get_num_threads(), "device": device, **measure(s, device)}


def measure(setting: Setting, device: str) -> dict[str, Any]:
    """Both encoders timed at every length on ``device``, in this process, with its
    current thread count: ``{"rows": [{"length", "gru_seconds", "attention_seconds"}]}``."""
    gen = seed_all(setting.seed)
    models = [m.to(device) for m in build_pair(setting)]
    rows = []
    with steps_bar(f"timing on {device}", len(MODELS) * len(setting.lengths)) as advance:
        for length in setting.lengths:
            x = torch.randn(setting.batch, length, setting.width, generator=gen).to(device)
            row = {"length": length}
            for name, model in zip(MODELS, models, strict=True):
                row[f"{name}_seconds"] = time_step(model, x, setting.repeats)
                advance()
            rows.append(row)
    return {"rows": rows}


def _timed_in_subprocess(setting: Setting, threads: int, device: str) -> dict[str, Any]:
    """:func:`timing_worker` in a fresh Python process with ``threads`` threads pinned."""
    package_root = str(Path(__file__).resolve().parents[2])  # the folder holding qkv/
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    code = (
        "import json, sys\n"
        "from qkv.lab.parallelism import timing_worker\n"
        "args = json.loads(sys.argv[1])\n"
        "print(json.dumps(timing_worker(**args)))\n"
    )
    args = json.dumps({"setting": asdict(setting), "threads": threads, "device": device})
    done = subprocess.run(
        [sys.executable, "-c", code, args], capture_output=True, text=True, env=env, check=False
    )
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-5:]
        raise RuntimeError(f"timing with {threads} thread(s) on {device} failed: {tail}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def machine_load() -> dict[str, Any]:
    """The load averages (1, 5, 15 min), the number of cores, and CPU seconds so far: the
    whole machine's busy time (``/proc/stat``: user, nice, system, irq, softirq and steal;
    NaN where there is no such file), this process's and its finished children's, and a
    monotonic clock."""
    try:
        load = list(os.getloadavg())
    except OSError:  # not available on this platform
        load = [float("nan")] * 3
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
        user, nice, system, _idle, _iowait, irq, softirq, steal = fields
        busy = (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        busy = float("nan")
    own = sum(
        usage.ru_utime + usage.ru_stime
        for usage in (
            resource.getrusage(resource.RUSAGE_SELF),
            resource.getrusage(resource.RUSAGE_CHILDREN),
        )
    )
    return {
        "load_average": load,
        "cores": os.cpu_count() or 1,
        "busy_s": busy,
        "own_s": own,
        "clock_s": time.monotonic(),
    }


def _quiet(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Whether the machine was quiet enough for the timings to be trusted: before them,
    a 1-minute load average of at most :data:`LOAD_SHARE` x cores; while they ran, other
    processes' CPU time at most :data:`OTHERS_SHARE` of the machine's (cores x wall)."""
    cores = before["cores"]
    limit = LOAD_SHARE * cores
    load = before["load_average"][0]
    machine_s = (after["clock_s"] - before["clock_s"]) * cores
    others_s = (after["busy_s"] - before["busy_s"]) - (after["own_s"] - before["own_s"])
    others = max(others_s, 0.0) / machine_s if machine_s > 0 else math.nan
    return {
        "cores": cores,
        "load_before": before["load_average"],
        "load_after": after["load_average"],
        "limit": limit,
        "others_share": others,
        "others_limit": OTHERS_SHARE,
        # NaN (load or CPU time unknown): not trusted
        "trustworthy": bool(load <= limit and others <= OTHERS_SHARE),
    }


def _slope(lengths: list[int], seconds: list[float]) -> float:
    """Least-squares slope of log(time) against log(T)."""
    return float(np.polyfit(np.log(lengths), np.log(seconds), 1)[0])


def timings(setting: Setting) -> dict[str, Any]:
    """Each CPU thread count (and the GPU when present) in its own process; load around."""
    plans = [(f"cpu-{n}thread{'s' * (n > 1)}", n, "cpu") for n in setting.threads]
    if torch.cuda.is_available():
        plans.append(("cuda", 1, "cuda"))
    before = machine_load()
    runs = {}
    with steps_bar("timing (a process per thread count)", len(plans)) as advance:
        for label, n, device in plans:
            r = _timed_in_subprocess(setting, n, device)
            lengths = [row["length"] for row in r["rows"]]
            for name in MODELS:
                r[f"{name}_slope"] = _slope(lengths, [row[f"{name}_seconds"] for row in r["rows"]])
            runs[label] = r
            log.info("timed %s", label)
            advance()
    machine = _quiet(before, machine_load())
    return {"runs": runs, "speedup": _speedups(runs, setting.threads), "machine": machine}


def _speedups(runs: dict[str, dict], threads: tuple[int, ...]) -> list[dict[str, Any]]:
    """Per length: the 1-thread time over the time with the most threads, per model."""
    one, most = runs[f"cpu-{threads[0]}thread"], runs[f"cpu-{threads[-1]}threads"]
    rows = []
    for a, b in zip(one["rows"], most["rows"], strict=True):
        row = {"length": a["length"]}
        for name in MODELS:
            row[name] = a[f"{name}_seconds"] / b[f"{name}_seconds"]
        rows.append(row)
    return rows


# --- the experiment ------------------------------------------------------------------------


def _figure(result: dict[str, Any], out: Path) -> str:
    fig = new_figure(11, 8.0)
    (ax_t, ax_p), (ax_c, ax_f) = fig.subplots(2, 2)
    styles = {"gru": ("-o", "GRU"), "attention": ("-s", "self-attention")}
    lengths = [row["length"] for row in result["structure"]["rows"]]
    for label, r in result["timing"]["runs"].items():
        for name, (style, title) in styles.items():
            seconds = [row[f"{name}_seconds"] for row in r["rows"]]
            ax_t.plot(lengths, seconds, style, label=f"{title} ({label})")
    for name, (style, title) in styles.items():
        ax_p.plot(lengths, [row[name] for row in result["timing"]["speedup"]], style, label=title)
        rows = result["structure"]["rows"]
        ax_c.plot(lengths, [row[f"{name}_chain_products"] for row in rows], style, label=title)
        flops = [row[f"{name}_flops_forward"] + row[f"{name}_flops_backward"] for row in rows]
        ax_f.plot(lengths, flops, style, label=title)
    ax_p.axhline(1.0, color="grey", lw=0.8)
    machine = result["timing"]["machine"]
    trust = "" if machine["trustworthy"] else " — NOT trustworthy (busy machine)"
    titles = (
        (ax_t, "forward + backward time per batch (s)", f"time{trust}", "log"),
        (ax_p, "speed-up: 1-thread time / 2-thread time", f"parallel speed-up{trust}", "linear"),
        (ax_c, "dependent matrix products (longest path)", "chain (autograd graph)", "log"),
        (ax_f, "FLOPs, forward + backward", "work (FlopCounterMode)", "log"),
    )
    for ax, ylabel, title, yscale in titles:
        ax.set_xscale("log", base=2)
        ax.set_yscale(yscale)
        ax.set_xlabel("sequence length T")
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.suptitle("Recurrence vs self-attention at matched parameter count")
    return save_figure(fig, out / "time-vs-length.png")


def run(out: Path, *, quick: bool = False, setting: Setting | None = None) -> LabRun:
    """Count the chain and the FLOPs, time each thread count in its own process, draw.

    Args:
        out: the folder of the figure.
        quick: :data:`QUICK` rather than :data:`FULL`.
        setting: any other sizes (``quick`` is then only recorded).
    """
    if setting is None:
        setting = QUICK if quick else FULL
    if len(setting.threads) < 2 or setting.threads[0] != 1:
        raise ValueError(f"Setting.threads: 1 and more, got {setting.threads}")
    result = {"structure": structure(setting), "timing": timings(setting)}
    figure = _figure(result, out)
    return LabRun(
        name="parallelism",
        quick=quick,
        config={**asdict(setting), "load_share": LOAD_SHARE, "others_share": OTHERS_SHARE},
        seeds=[setting.seed],
        results=result,
        figures=[figure],
        verdict=_verdict(result),
    )


def _verdict(result: dict[str, Any]) -> str:
    """Parallelisable (the chain), the work (FLOPs), then faster on this machine (time)."""
    last = result["structure"]["rows"][-1]
    first = result["structure"]["rows"][0]
    t = last["length"]
    flops = {n: last[f"{n}_flops_forward"] + last[f"{n}_flops_backward"] for n in MODELS}
    parts = [
        f"parallelisable: the longest chain of dependent matrix products grows with T for "
        f"the GRU ({first['gru_chain_products']} at T={first['length']}, "
        f"{last['gru_chain_products']} at T={t}) and stays {last['attention_chain_products']} "
        f"for self-attention",
        f"work at T={t}: self-attention {flops['attention'] / flops['gru']:.2f}× the GRU's FLOPs",
    ]
    timing = result["timing"]
    speed = timing["speedup"][-1]
    one = timing["runs"]["cpu-1thread"]["rows"][-1]
    ratio = one["gru_seconds"] / one["attention_seconds"]
    parts.append(
        f"on this CPU at T={t}: 1 thread GRU/attention time {ratio:.2f}, "
        f"2-thread speed-up GRU {speed['gru']:.2f}×, self-attention {speed['attention']:.2f}×"
    )
    machine = timing["machine"]
    if not machine["trustworthy"]:
        parts.append(
            f"timings NOT trustworthy: 1-minute load average {machine['load_before'][0]:.2f} "
            f"before them (limit {machine['limit']:.1f}, {LOAD_SHARE} × {machine['cores']} "
            f"cores), other processes {machine['others_share']:.0%} of the CPU time while "
            f"they ran (limit {OTHERS_SHARE:.0%})"
        )
    if "cuda" in timing["runs"]:
        row = timing["runs"]["cuda"]["rows"][-1]
        parts.append(
            f"GPU at T={t}: GRU/attention time {row['gru_seconds'] / row['attention_seconds']:.2f}"
        )
    else:
        parts.append("GPU half unmeasured (no GPU here)")
    return "; ".join(parts)


def table(run: LabRun) -> Table:
    """Per length: the chain, the FLOPs, the 1-thread times and the 2-thread speed-ups."""
    timing = run.results["timing"]
    one = timing["runs"]["cpu-1thread"]["rows"]
    gpu = timing["runs"].get("cuda", {}).get("rows")
    rows = []
    structure_rows = run.results["structure"]["rows"]
    for i, (s, t, sp) in enumerate(zip(structure_rows, one, timing["speedup"], strict=True)):
        rows.append(
            [
                str(s["length"]),
                f"{s['gru_chain_products']} / {s['attention_chain_products']}",
                f"{(s['gru_flops_forward'] + s['gru_flops_backward']) / 1e9:.3g} / "
                f"{(s['attention_flops_forward'] + s['attention_flops_backward']) / 1e9:.3g}",
                _milliseconds(t),
                f"{sp['gru']:.2f} / {sp['attention']:.2f}",
                *([_milliseconds(gpu[i])] if gpu else []),
            ]
        )
    columns = ["T", "chain (products)", "GFLOPs fwd+bwd", "1-thread ms", "2-thread speed-up"]
    columns += ["GPU ms"] if gpu else []
    trust = "" if timing["machine"]["trustworthy"] else " (timings NOT trustworthy: busy machine)"
    return Table(f"GRU / self-attention, matched parameters{trust}", columns, rows)


def _milliseconds(row: dict[str, Any]) -> str:
    return f"{1e3 * row['gru_seconds']:.1f} / {1e3 * row['attention_seconds']:.1f}"
