"""Progress of runs in other processes: each bar follows its own run's log; a bar of
sentences only on a terminal's stderr; slow steps named once."""

from __future__ import annotations

import io
import json
import random
import sys

import yaml

from qkv.train.progress import LogProgress, StepTimes, terminal_progress
from tests.train.helpers import run_cli, tiny_dict


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_each_bar_shows_its_own_runs_training_time(tmp_path):
    first, later = tmp_path / "first.jsonl", tmp_path / "later.jsonl"
    seconds = random.uniform(5, 100)
    _write(first, [{"step": 7, "loss": 2.5, "seconds": seconds}, {"step": 7, "valid_loss": 1.0}])
    logs = {"first": first, "later": later}  # "later" has not started: no log yet
    with LogProgress(logs, {"first": 120.0, "later": 40.0}) as bars:
        bars.refresh()
        tasks = {t.description: t for t in bars._progress.tasks}
        assert tasks["first"].completed == seconds
        assert tasks["first"].fields["step"] == 7 and tasks["first"].fields["loss"] == 2.5
        assert tasks["later"].completed == 0 and tasks["later"].fields["step"] == 0
        _write(later, [{"step": 3, "loss": 4.0, "seconds": 1.5}])
        bars.refresh()
        assert {t.description: t.completed for t in bars._progress.tasks}["later"] == 1.5


def test_the_training_bar_goes_to_stderr_and_stdout_keeps_the_summary(tmp_path):
    steps = random.randint(2, 4)
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(tiny_dict(tmp_path / "out", steps=steps)))
    proc = run_cli("train", str(config))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [proc.stdout.strip()]
    assert proc.stdout.startswith(f"trained {steps} steps")
    assert f"{steps}/{steps}" in proc.stderr and "tok/s" in proc.stderr  # the bar, once


def test_a_half_written_last_row_is_skipped(tmp_path):
    """The run appends to its log while the bars read it: a row caught half written ended
    the demo with a JSONDecodeError traceback; the bar keeps the last complete row."""
    log = tmp_path / "run.jsonl"
    seconds = random.uniform(5, 100)
    _write(log, [{"step": 4, "loss": 3.0, "seconds": seconds}])
    with log.open("a") as f:
        f.write('{"step": 5, "loss": 2.')
    with LogProgress({"run": log}, {"run": 120.0}) as bars:
        bars.refresh()
        task = bars._progress.tasks[0]
        assert task.completed == seconds and task.fields["step"] == 4
        log.write_bytes(b'{"step": 6, "loss": 1.5, "seconds": 9.0}\n{"step": 7, "lo\xc3')
        bars.refresh()
        assert bars._progress.tasks[0].fields["step"] == 6


def _timed(durations, threads=2, **options):
    """A StepTimes whose clock gives the steps ``durations``; the steps' warnings."""
    now = [0.0]
    times = StepTimes(threads, clock=lambda: now[0], **options)
    for step, seconds in enumerate(durations, 1):
        times.start()
        now[0] += seconds
        times.stop(step)
    return times


def test_a_step_far_slower_than_the_last_ones_warns_once(caplog):
    """Two threads on two loaded cores made steps of 0.1 s take up to 4.4 s, and the
    run was five times slower without a word."""
    base = random.uniform(0.05, 0.2)
    steps = [base * random.uniform(0.9, 1.1) for _ in range(20)]
    with caplog.at_level("WARNING", logger="qkv.train.progress"):
        _timed([*steps, base * 4, base * 30, base * 40], window=20, factor=5)
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1, warned
    assert warned[0].startswith("step 22 took ")
    assert "the median" in warned[0] and "2 threads (train.threads)" in warned[0]
    assert "--set train.threads=1" in warned[0] and "cores" in warned[0]


def test_one_thread_is_not_told_to_use_one_thread(caplog):
    """A run already on one thread (train.threads 0 on a loaded machine) was told to
    --set train.threads=1: the warning says one thread is the least it can use."""
    base = random.uniform(0.05, 0.2)
    with caplog.at_level("WARNING", logger="qkv.train.progress"):
        _timed([base] * 10 + [base * 20], threads=1, window=10, factor=5)
    (warned,) = [r.getMessage() for r in caplog.records]
    assert "1 thread (train.threads)" in warned and "--set train.threads=1" not in warned
    assert "one thread is the least" in warned


def test_no_step_is_judged_before_the_window_is_full(caplog):
    """The first steps (memory paged in, kernels chosen) are slow on every machine."""
    with caplog.at_level("WARNING", logger="qkv.train.progress"):
        _timed([3.0, 0.1, 0.1, 2.0, *[0.1] * 6], window=10, factor=5)
    assert caplog.records == []


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_bar_of_items_shows_on_a_terminal_only(monkeypatch):
    total = random.randint(3, 9)
    for stderr, total_shown, shown in (
        (_Terminal(), total, True),
        (io.StringIO(), total, False),  # a log file of stderr
        (_Terminal(), 0, False),  # nothing to count
    ):
        monkeypatch.setattr(sys, "stderr", stderr)
        with terminal_progress("translate", "sentences", total_shown) as progress:
            for done in range(1, total + 1):
                progress(done)
        written = stderr.getvalue()
        assert (f"{total}/{total}" in written and "sentences" in written) == shown, written
        assert ("translate" in written) == shown
