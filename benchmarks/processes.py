"""Running a training or decoding process under watch: peak memory, a time budget.

Used by the benchmarks that drive other programs (``benchmarks/joeynmt.py``): the peak
resident memory of the whole process tree is sampled every half second, and a training
run can be sent SIGINT once its budget is spent (counted from a marker in its log).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import ROOT

__all__ = ["Supervised", "check", "supervise", "thread_env"]


@dataclass
class Supervised:
    """How a supervised process went: exit code, peak memory and its training clock."""

    returncode: int
    peak_mib: float
    train_seconds: float
    log: Path


def _status_kib(pid: int, key: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def _tree_rss_kib(root: int) -> int:
    """Resident memory of ``root`` and all its descendants (KiB)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += _status_kib(pid, "VmRSS")
        todo += children.get(pid, [])
    return total


def supervise(
    cmd: list, log: Path, env: dict, *, limit_s: float, budget_s: float = 0, marker: str = ""
) -> Supervised:
    """Run ``cmd`` (output to ``log``), sampling memory; SIGINT it ``budget_s`` after start.

    The training clock starts when ``marker`` appears in the log (at launch without one);
    with a budget the process gets SIGINT once the budget is spent, then has two minutes to
    save and exit. Past ``limit_s`` it is killed and this raises.
    """

    def default_sigint() -> None:  # a child of a background shell job would inherit SIG_IGN
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    with open(log, "w") as out:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, preexec_fn=default_sigint
        )
    launched = time.monotonic()
    started = None if marker else launched
    stopped, peak_kib = None, 0
    while proc.poll() is None:
        peak_kib = max(peak_kib, _tree_rss_kib(proc.pid), _status_kib(proc.pid, "VmHWM"))
        now = time.monotonic()
        if started is None and marker in log.read_text(errors="replace"):
            started = now
        if budget_s and started is not None and stopped is None and now - started >= budget_s:
            proc.send_signal(signal.SIGINT)
            stopped = now
        if now - launched > limit_s or (stopped is not None and now - stopped > 120):
            proc.kill()
            raise RuntimeError(f"{cmd[0]} ran past its time limit; see {log}")
        time.sleep(0.5)
    end = stopped or time.monotonic()
    return Supervised(proc.returncode, peak_kib / 1024, end - (started or end), log)


def check(run: Supervised, what: str) -> None:
    if run.returncode != 0:
        tail = "\n".join(run.log.read_text(errors="replace").splitlines()[-15:])
        raise RuntimeError(f"{what} failed (exit {run.returncode}); end of {run.log}:\n{tail}")


def thread_env(threads: int) -> dict:
    """The environment of every child: ``threads`` threads for torch, BLAS and tokenizers."""
    n = str(threads)
    return dict(
        os.environ, OMP_NUM_THREADS=n, MKL_NUM_THREADS=n, RAYON_NUM_THREADS=n, PYTHONUNBUFFERED="1"
    )
