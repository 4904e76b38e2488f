"""Ring attention on the CPU: 2 gloo processes against one process with the same total
length, forward and backward: peak memory per process, time per step, and the time the
ring spends waiting for blocks (``irecv``) and the bytes it sends.

The one-process peers are the formula (``qkv.attention``: scores held whole, as the
ring's blocks hold theirs) and ``qkv.scaled_dot_product_attention`` (dispatched: torch's
fused kernel on the CPU). The one process gets as many threads as the ring has processes
(one each), so both sides use the same cores.

Run: ``python benchmarks/ring.py [--quick] [--out DIR]``.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import qkv  # noqa: E402
from benchmarks.common import cli, report, result  # noqa: E402
from qkv.distributed import RingStats, ring_attention, zigzag_split  # noqa: E402

B, H, D = 1, 4, 64
WORLD = 2
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


class _PeakRss:
    """Highest resident set size while inside, sampled every 0.5 ms, minus the size on
    entry (MiB)."""

    def __enter__(self):
        self.base = self.peak = _rss()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()
        return self

    def _watch(self):
        while not self.stop.is_set():
            self.peak = max(self.peak, _rss())
            time.sleep(0.0005)

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
        self.mib = (max(self.peak, _rss()) - self.base) / 2**20


def _worker(rank: int, world: int, how: str, t: int, causal: bool, repeat: int, port, out):
    """One process of a ring (``how="ring"``) or the one process alone: inputs of the whole
    sequence from one seed, this process's part of them, one warm-up step, the peak memory
    of one step, then the median time of ``repeat`` steps."""
    torch.set_num_threads(1 if how == "ring" else WORLD)
    if how == "ring":
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
        )
    gen = torch.Generator().manual_seed(0)
    whole = [torch.randn(B, H, t, D, generator=gen) for _ in range(4)]  # q, k, v, grad

    def part(x):
        if how != "ring":
            return x
        return zigzag_split(x, rank, world) if causal else x.chunk(world, dim=2)[rank]

    q, k, v, grad = [part(x).clone() for x in whole]
    del whole
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    stats = RingStats()
    attend = {
        "ring": lambda: ring_attention(q, k, v, causal=causal, stats=stats),
        "formula": lambda: qkv.attention(q, k, v, causal=causal),
        "sdpa": lambda: qkv.scaled_dot_product_attention(q, k, v, causal=causal),
    }[how]

    def step():
        attend().backward(grad)
        for x in (q, k, v):
            x.grad = None

    step()  # warm-up
    with _PeakRss() as peak:
        step()
    before = RingStats(stats.wait_s, stats.sent_bytes, stats.transfers)
    times = []
    for _ in range(repeat):
        if how == "ring":
            dist.barrier()
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    record = {
        "peak_mib": peak.mib,
        "step_s": statistics.median(times),
        "wait_s": (stats.wait_s - before.wait_s) / repeat,
        "sent_bytes": (stats.sent_bytes - before.sent_bytes) / repeat,
    }
    Path(out, f"{how}-{rank}.json").write_text(json.dumps(record))
    if how == "ring":
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(how: str, t: int, causal: bool, repeat: int) -> list[dict]:
    """Each process's record (see :func:`_worker`), in fresh processes."""
    world = WORLD if how == "ring" else 1
    with tempfile.TemporaryDirectory() as out:
        args = (world, how, t, causal, repeat, _free_port(), out)
        mp.spawn(_worker, args=args, nprocs=world)
        return [json.loads(Path(out, f"{how}-{r}.json").read_text()) for r in range(world)]


def rows_for(t: int, causal: bool, repeat: int) -> list[dict]:
    kind = "causal" if causal else "full"
    ring = measure("ring", t, causal, repeat)
    peak = max(r["peak_mib"] for r in ring)
    step = max(r["step_s"] for r in ring)
    wait = max(r["wait_s"] for r in ring)
    sent = ring[0]["sent_bytes"]
    rows = []
    for peer in ("formula", "sdpa"):
        (one,) = measure(peer, t, causal, repeat)
        extra = {"wait_s": wait, "wait_share": wait / step, "sent_mib_per_step": sent / 2**20}
        rows.append(
            result(
                f"{kind} T={t} peak MiB/process",
                peak,
                f"1 process, {peer}",
                one["peak_mib"],
                unit="MiB",
                **(
                    {"target": "<= 0.6x", "met": peak <= 0.6 * one["peak_mib"]}
                    if peer == "formula"
                    else {}
                ),
                **extra,
            )
        )
        rows.append(
            result(
                f"{kind} T={t} s/step (fwd+bwd)", step, f"1 process, {peer}", one["step_s"], **extra
            )
        )
    return rows


def run(out_dir: Path = Path("benchmarks/results"), quick: bool = False) -> dict:
    """2-process ring attention against one process; write ``out_dir/ring.json``."""
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", "131072")  # freed blocks leave the RSS
    os.environ.setdefault("MALLOC_TRIM_THRESHOLD_", "131072")
    t, repeat = (1024, 2) if quick else (8192, 3)
    rows = [row for causal in (False, True) for row in rows_for(t, causal, repeat)]
    load = os.getloadavg()
    notes = (
        f"CPU fp32, forward and backward, B={B}, H={H}, D={D}, T={t} in total; the ring: "
        f"{WORLD} gloo processes of 1 thread, T/{WORLD} each (causal: zig-zag); one process: "
        f"{WORLD} threads. Peak = highest RSS during one step minus RSS before it; time = "
        f"median of {repeat} steps; wait = time in irecv waits per step (largest process). "
        f"Load average at the end: {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}."
    )
    return report(out_dir, "ring", rows, notes=notes)


if __name__ == "__main__":
    cli(run, __doc__)
