"""qkv.lab.processes: a job that fails stops the jobs running beside it (SIGTERM, their
own stop) and the ones not begun, and names itself in the error; each job that ends well
is finished in the parent at once, while the others run."""

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


def test_each_job_is_finished_here_once_while_the_next_runs(tmp_path):
    """``finished(i)`` runs in the parent as soon as job i has ended, with the next job
    already started (a training is scored and kept while the next one trains)."""
    kinds = [f"job{i}" for i in range(4)]
    seen = []

    def finished(i: int) -> None:
        following = tmp_path / f"job{min(i + 1, 3)}.started"
        deadline = time.monotonic() + 30  # never there if it began after this returned
        while not following.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        seen.append((i, sorted(p.stem for p in tmp_path.glob("*.started"))))

    jobs = [(k, str(tmp_path)) for k in kinds]
    run_in_processes(_job, jobs, processes=1, names=kinds, finished=finished)
    assert [i for i, _ in seen] == [0, 1, 2, 3]
    for i, started in seen:  # job i+1 had started before job i was finished here
        assert started == kinds[: min(i + 2, 4)]


def test_an_error_in_finishing_a_job_stops_the_others(tmp_path):
    jobs = [(kind, str(tmp_path)) for kind in ("quick", "long", "later")]

    def finished(i: int) -> None:
        deadline = time.monotonic() + 60
        while not (tmp_path / "long.started").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        run_in_processes(_job, jobs, 2, ["quick", "long", "later"], finished=finished)
    assert (tmp_path / "long.stopped").read_text() == str(int(signal.SIGTERM))
    assert not (tmp_path / "later.started").exists()
