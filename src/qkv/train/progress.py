"""A training progress bar (rich): step, loss, target tokens per second and ETA; bars of
steps (:func:`steps_progress`) and of sentences translated (:func:`terminal_progress`).

The bars go to stderr, as tqdm's do: stdout keeps the results (``qkv train > result.txt``
still shows the bar, and the file holds only the summary line).
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator

__all__ = [
    "LogProgress",
    "StepTimes",
    "TrainingProgress",
    "console",
    "stderr_bar",
    "steps_progress",
    "terminal_progress",
    "usable_cores",
]

log = logging.getLogger(__name__)


def console(**kwargs):
    """A rich ``Console`` (kwargs as rich's) for what a command prints on stdout.

    Rich ends the process with exit status 1 when the reader of a pipe goes away
    (``qkv walkthrough ... | head``): this one raises ``BrokenPipeError`` instead, which the
    command line turns into exit 141 as for its other commands.
    """
    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            raise BrokenPipeError

    return _Console(**kwargs)


def _stderr():
    return console(stderr=True)


def stderr_bar(*fields: str, **options):
    """A rich ``Progress`` on stderr: the label, the bar, steps done of all, ``fields``
    (rich column formats), the time so far and the time left."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        *(TextColumn(f) for f in fields),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=_stderr(),
        **options,
    )


@contextlib.contextmanager
def steps_progress(label: str, total: int) -> Iterator[Callable[[], None]]:
    """A bar of ``total`` steps; yields the function that advances it. It is redrawn at
    each step, not by a thread ten times a second, so it does not disturb timed code."""
    with stderr_bar(auto_refresh=False) as bar:
        task = bar.add_task(label, total=total)
        bar.refresh()

        def advance() -> None:
            bar.advance(task)
            bar.refresh()

        yield advance


@contextlib.contextmanager
def terminal_progress(label: str, unit: str, total: int) -> Iterator[Callable[[int], None]]:
    """A bar of ``total`` ``unit`` (``"sentences"``) on stderr when stderr is a terminal;
    yields the function that takes how many are done. A log file of stderr gets no bar
    (stdout holds only the results), nor does a ``total`` of 0: the function then does
    nothing."""
    if sys.stderr is None or not sys.stderr.isatty() or not total:
        yield lambda done: None
        return
    with stderr_bar(unit) as bar:
        task = bar.add_task(label, total=total)
        yield lambda done: bar.update(task, completed=done)


class TrainingProgress:
    """Context manager around a rich progress bar; does nothing when ``enabled`` is False."""

    def __init__(
        self,
        total: int,
        start: int = 0,
        *,
        enabled: bool = True,
        label: str = "train",
        unit: str = "tok",
    ):
        """``unit``: what the rate counts per second (``"tok"``: target tokens,
        ``"img"``: images)."""
        self.total, self.start, self.enabled, self.label = total, start, enabled, label
        self.unit = unit
        self._progress = None
        self._task = None

    def __enter__(self) -> TrainingProgress:
        if self.enabled:
            fields = ("loss {task.fields[loss]:.3f}", "{task.fields[rate]:.0f} " + self.unit + "/s")
            self._progress = stderr_bar(*fields)
            self._progress.start()
            self._task = self._progress.add_task(
                self.label, total=self.total, completed=self.start, loss=float("nan"), rate=0.0
            )
        return self

    def update(self, step: int, *, loss: float, tokens_per_s: float) -> None:
        if self._progress is not None:
            self._progress.update(self._task, completed=step, loss=loss, rate=tokens_per_s)

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.stop()


class StepTimes:
    """Times each training step and warns, once, when one takes far longer than the
    steps before it: ``factor`` times the median of the last ``window`` steps.

    On a machine whose cores are busy with other work, torch's threads wait for each
    other at every operation: with two threads on two loaded cores, steps of 0.1 s took
    up to 4 s. A step that slow is named with the
    likely cause, ``train.threads`` against the load, instead of a run that is silently
    five times slower than it should be.

    Args:
        threads: torch's thread count while training (named in the warning).
        window: how many of the latest steps the median is taken over; no step is judged
            before there are that many.
        factor: how many times the median a step may take before the warning.
        clock: seconds, as ``time.perf_counter`` gives them.
    """

    def __init__(
        self,
        threads: int,
        *,
        window: int = 20,
        factor: float = 5.0,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.threads, self.factor, self.clock = threads, factor, clock
        self.times: collections.deque[float] = collections.deque(maxlen=window)
        self.warned, self._start = False, 0.0

    def start(self) -> None:
        self._start = self.clock()

    def stop(self, step: int) -> float:
        """End the step begun by :meth:`start`; its seconds (the warning is logged here)."""
        seconds = self.clock() - self._start
        if not self.warned and len(self.times) == self.times.maxlen:
            median = statistics.median(self.times)
            if seconds > self.factor * median > 0:
                self.warned = True
                advice = (
                    "--set train.threads=1 (or fewer threads than idle cores) is faster "
                    "on a loaded machine"
                    if self.threads > 1
                    else "one thread is the least it can use: the steps speed up when the "
                    "other work ends"
                )
                log.warning(
                    "step %d took %.2f s, %.0fx the median %.3f s of the %d steps before "
                    "it: other work is likely using the cores (%s), and training with %d "
                    "thread%s (train.threads) waits for them; %s",
                    step,
                    seconds,
                    seconds / median,
                    median,
                    len(self.times),
                    _load(),
                    self.threads,
                    "s" * (self.threads != 1),
                    advice,
                )
        self.times.append(seconds)
        return seconds


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the system has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _load() -> str:
    """The load average of the last minute against the cores, in words."""
    cores = usable_cores()
    try:
        return f"load average {os.getloadavg()[0]:.1f} on {cores} cores"
    except OSError:  # not available on this system
        return f"{cores} cores"


class LogProgress:
    """Progress of runs in other processes, read from their JSON-lines logs.

    Args:
        logs: run name -> its ``log.jsonl``.
        limits: run name -> its time budget in seconds (the bar's total), 0 for none.
    """

    def __init__(self, logs: dict, limits: dict, *, enabled: bool = True):
        self.logs, self.limits, self.enabled = logs, limits, enabled
        self._progress, self._tasks = None, {}

    def __enter__(self) -> LogProgress:
        if self.enabled:
            from rich.progress import BarColumn, Progress, TextColumn

            self._progress = Progress(
                TextColumn("[bold]{task.description:12s}"),
                BarColumn(),
                TextColumn("step {task.fields[step]:>5}  loss {task.fields[loss]:.3f}"),
                TextColumn("{task.completed:>4.0f} s trained"),
                console=_stderr(),
            )
            self._progress.start()
            for name, limit in self.limits.items():
                self._tasks[name] = self._progress.add_task(
                    name, total=limit or None, step=0, loss=float("nan")
                )
        return self

    def refresh(self) -> None:
        """Each bar shows its run's own training time (``seconds`` in its last log row)."""
        if self._progress is None:
            return
        for name, path in self.logs.items():
            step, loss, seconds = _last_training_row(path)
            self._progress.update(self._tasks[name], completed=seconds, step=step, loss=loss)

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self.refresh()
            self._progress.stop()


def _last_training_row(path) -> tuple[int, float, float]:
    """(step, loss, seconds) of the last complete training row of a run's ``log.jsonl``.

    The run appends to the log while this reads it, so the last line may be half written
    (or the file may hold bytes cut mid-character): such rows are skipped, not an error.
    """
    try:
        lines = path.read_bytes().decode("utf-8", errors="replace").split("\n")[-6:]
    except OSError:
        return 0, float("nan"), 0.0
    for line in reversed(lines):
        try:
            row = json.loads(line)
            return int(row["step"]), float(row["loss"]), float(row.get("seconds", 0.0))
        except (ValueError, TypeError, KeyError):
            continue  # half written, a validation row without "loss", or not a row
    return 0, float("nan"), 0.0
