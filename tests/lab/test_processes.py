"""qkv.lab.processes: a job that fails stops the jobs running beside it (SIGTERM, their
own stop) and the ones not begun, and names itself in the error."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import pytest

from qkv.lab.processes import run_in_processes


def _job(job: tuple[str, str]) -> None:
    """A job of the test, run in a spawned child (so a module function)."""
    kind, folder = job[0], Path(job[1])
    (folder / f"{kind}.started").touch()
    if kind == "long":  # stops as a training does on SIGTERM: says so, then ends

        def stop(signum, frame):
            (folder / "long.stopped").write_text(str(signum))
            sys.exit(0)

        signal.signal(signal.SIGTERM, stop)
        time.sleep(120)
    elif kind == "fail":  # fails once the long job runs beside it
        deadline = time.monotonic() + 60
        while not (folder / "long.started").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        sys.exit(3)


def test_a_failed_job_stops_the_others_and_is_named(tmp_path):
    jobs = [(kind, str(tmp_path)) for kind in ("long", "fail", "later")]
    with pytest.raises(RuntimeError, match=r"^fail failed \(exit code 3\)"):
        run_in_processes(_job, jobs, processes=2, names=["long", "fail", "later"])
    assert (tmp_path / "long.stopped").read_text() == str(int(signal.SIGTERM))
    assert not (tmp_path / "later.started").exists()  # the job not begun never starts


def test_every_job_runs_once(tmp_path):
    kinds = [f"job{i}" for i in range(5)]
    run_in_processes(_job, [(k, str(tmp_path)) for k in kinds], processes=2, names=kinds)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{k}.started" for k in kinds)
