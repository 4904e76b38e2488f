"""Lab ``parallelism``: a recurrence is sequential in the length; self-attention is not.

Claim:
    An RNN computes :math:`h_t` from :math:`h_{t-1}`, so a sentence of ``T`` tokens needs
    ``T`` steps one after another, and no amount of hardware shortens that chain.
    Self-attention computes every position of a layer at once (matrix products), so its
    chain of sequential steps is the number of layers, whatever ``T``.

Method:
    A GRU encoder (``L`` layers, width ``E``) and a self-attention encoder (``L`` post-LN
    Transformer layers, width ``E``, feed-forward width chosen so both have about the same
    number of parameters). For lengths 16 … 1024, time one forward and backward pass of a
    batch (median of repeats, after a warm-up) on the CPU, and on the GPU when one is
    present, and report the number of sequential steps (``L·T`` for the GRU, ``L`` for
    attention) and the time ratio. The log–log slope of time against ``T`` says how the
    cost grows: the GRU's sequential chain grows linearly; attention's work grows
    quadratically but in parallel, so on a wide device its time stays flat much longer.
"""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from qkv.lab.common import (
    LabRun,
    Table,
    new_figure,
    num_threads,
    save_figure,
    seed_all,
    steps_bar,
)
from qkv.modules.transformer import Encoder, EncoderLayer

__all__ = ["Setting", "QUICK", "FULL", "GRUEncoder", "AttentionEncoder", "run", "table"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Setting:
    """Sizes and repeats."""

    lengths: tuple[int, ...]
    batch: int
    width: int
    layers: int
    heads: int
    repeats: int
    seed: int = 0


QUICK = Setting(lengths=(16, 64, 256), batch=8, width=64, layers=2, heads=4, repeats=3)
FULL = Setting(
    lengths=(16, 32, 64, 128, 256, 512, 1024), batch=16, width=256, layers=2, heads=4, repeats=5
)


class GRUEncoder(nn.Module):
    """``L`` stacked GRU layers of width ``E``: ``L·T`` sequential steps."""

    def __init__(self, width: int, layers: int):
        super().__init__()
        self.rnn = nn.GRU(width, width, num_layers=layers, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.rnn(x)[0]  # (B, T, E)

    def sequential_steps(self, length: int) -> int:
        return self.rnn.num_layers * length


class AttentionEncoder(nn.Module):
    """``L`` Transformer encoder layers of width ``E``: ``L`` sequential steps."""

    def __init__(self, width: int, layers: int, heads: int, ff_dim: int):
        super().__init__()
        self.layers = layers
        self.encoder = Encoder([EncoderLayer(width, heads, ff_dim) for _ in range(layers)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x).hidden  # (B, T, E)

    def sequential_steps(self, length: int) -> int:
        return self.layers


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


def _slope(lengths: list[int], seconds: list[float]) -> float:
    """Least-squares slope of log(time) against log(T)."""
    return float(np.polyfit(np.log(lengths), np.log(seconds), 1)[0])


def _row(length: int, t_gru: float, t_attn: float, gru, attn) -> dict:
    return {
        "length": length,
        "gru_seconds": t_gru,
        "attention_seconds": t_attn,
        "gru_steps": gru.sequential_steps(length),
        "attention_steps": attn.sequential_steps(length),
        "time_ratio_gru_over_attention": t_gru / t_attn,
    }


def measure(setting: Setting, device: str) -> dict:
    """Times, sequential steps and ratios at every length on ``device``."""
    gen = seed_all(setting.seed)
    gru, attn = (m.to(device) for m in build_pair(setting))
    rows = []
    with steps_bar(f"timing on {device}", 2 * len(setting.lengths)) as advance:
        for length in setting.lengths:
            x = torch.randn(setting.batch, length, setting.width, generator=gen).to(device)
            t_gru = time_step(gru, x, setting.repeats)
            advance()
            t_attn = time_step(attn, x, setting.repeats)
            advance()
            rows.append(_row(length, t_gru, t_attn, gru, attn))
            log.info("%s T=%d: GRU %.4f s, attention %.4f s", device, length, t_gru, t_attn)
    lengths = [r["length"] for r in rows]
    return {
        "parameters": {"gru": _params(gru), "attention": _params(attn)},
        "rows": rows,
        "gru_slope": _slope(lengths, [r["gru_seconds"] for r in rows]),
        "attention_slope": _slope(lengths, [r["attention_seconds"] for r in rows]),
    }


def _figure(results: dict[str, dict], out: Path) -> str:
    fig = new_figure(11, 4.2)
    ax_t, ax_s = fig.subplots(1, 2)
    for device, r in results.items():
        lengths = [row["length"] for row in r["rows"]]
        ax_t.plot(lengths, [row["gru_seconds"] for row in r["rows"]], "-o", label=f"GRU ({device})")
        ax_t.plot(
            lengths,
            [row["attention_seconds"] for row in r["rows"]],
            "-s",
            label=f"self-attention ({device})",
        )
    first = next(iter(results.values()))["rows"]
    lengths = [row["length"] for row in first]
    ax_s.plot(lengths, [row["gru_steps"] for row in first], "-o", label="GRU: L·T")
    ax_s.plot(lengths, [row["attention_steps"] for row in first], "-s", label="self-attention: L")
    for ax, ylabel in ((ax_t, "forward + backward time per batch (s)"), (ax_s, "sequential steps")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length T")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.suptitle("Recurrence vs self-attention at matched parameter count")
    return save_figure(fig, out / "time-vs-length.png")


def run(out: Path, *, quick: bool = False) -> LabRun:
    """Time both encoders on the CPU (and the GPU when present); draw the figure."""
    setting = QUICK if quick else FULL
    threads = torch.get_num_threads()
    devices = {"cpu-1thread": ("cpu", 1)}
    if not quick and threads > 1:
        devices[f"cpu-{threads}threads"] = ("cpu", threads)
    if torch.cuda.is_available():
        devices["cuda"] = ("cuda", threads)
    results = {}
    for label, (device, n) in devices.items():
        with num_threads(n):
            results[label] = measure(setting, device)
    figure = _figure(results, out)
    return LabRun(
        name="parallelism",
        quick=quick,
        config={**asdict(setting), "devices": devices},
        seeds=[setting.seed],
        results=results,
        figures=[figure],
        verdict=_verdict(results),
    )


def _growth(label: str, r: dict) -> str:
    """How the times of one device grow with T, and their ratio at the longest T."""
    last = r["rows"][-1]
    return (
        f"{label}: time grows as T^{r['gru_slope']:.2f} for the GRU and "
        f"T^{r['attention_slope']:.2f} for self-attention, GRU/attention "
        f"{last['time_ratio_gru_over_attention']:.2f} at T={last['length']}"
    )


def _verdict(results: dict[str, dict]) -> str:
    """One line: the 1-thread CPU growth, the sequential steps, and the GPU's growth (the
    measurement that can show the parallel speed-up) when one was timed."""
    cpu = results["cpu-1thread"]
    last = cpu["rows"][-1]
    verdict = (
        f"{_growth('CPU (1 thread)', cpu)}; sequential steps {last['gru_steps']} vs "
        f"{last['attention_steps']} at T={last['length']}"
    )
    if "cuda" in results:
        return f"{verdict}; {_growth('GPU', results['cuda'])}"
    return f"{verdict}; no GPU here"


def table(run: LabRun) -> Table:
    """Per device and length: times, ratio and sequential steps."""
    rows = []
    for device, r in run.results.items():
        for row in r["rows"]:
            rows.append(
                [
                    f"{device} T={row['length']}",
                    f"{1e3 * row['gru_seconds']:.1f}",
                    f"{1e3 * row['attention_seconds']:.1f}",
                    f"{row['time_ratio_gru_over_attention']:.2f}",
                    f"{row['gru_steps']} / {row['attention_steps']}",
                ]
            )
    columns = ["device, length", "GRU ms", "attention ms", "GRU/attn", "sequential steps"]
    return Table("forward + backward per batch (matched parameters)", columns, rows)
