"""Independent jobs in child processes, a few at a time, that never outlive the lab.

:func:`run_in_processes` starts each job in a spawned process of its own (no copy of the
parent's threads), at most ``processes`` at once. A job that fails stops the others and
raises; so does an interrupt. The others are stopped with SIGTERM, which a training turns
into "finish the step, save it, stop" (:class:`qkv.train.loop.Interrupted`). A child whose
parent dies (killed, even with SIGKILL) notices within a second and sends itself the same
SIGTERM, so that no job goes on unseen beside a new run of the lab.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["run_in_processes"]


def _child(target: Callable[[Any], object], job: Any) -> None:
    """A child process: ``target(job)``, stopped as on SIGTERM once its parent is gone."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
    target(job)


def run_in_processes(
    target: Callable[[Any], object],
    jobs: Sequence[Any],
    processes: int,
    names: Sequence[str],
    finished: Callable[[int], object] | None = None,
) -> None:
    """Run ``target(job)`` for every job, each in its own process, ``processes`` at a time.

    ``target`` must be importable (a module's function: it is named, not copied, to the
    child); ``names`` name the jobs in process titles and errors. ``finished(i)`` runs in
    this process as soon as job ``i`` has ended well, while the others go on; an error in
    it stops them as a failed job does.

    Raises:
        RuntimeError: a job's process ended with a non-zero exit code.
    """
    spawn = multiprocessing.get_context("spawn")
    waiting, running = list(enumerate(zip(names, jobs))), []

    def start() -> None:
        while waiting and len(running) < processes:
            i, (name, job) = waiting.pop(0)
            child = spawn.Process(target=_child, args=(target, job), name=f"lab-{name}")
            child.start()
            running.append((i, name, child))

    try:
        start()
        while running:
            multiprocessing.connection.wait([child.sentinel for *_, child in running])
            ended = [r for r in running if not r[2].is_alive()]
            for i, name, child in ended:
                running.remove((i, name, child))
                if child.exitcode != 0:
                    raise RuntimeError(
                        f"{name} failed (exit code {child.exitcode}); the lab continues it "
                        f"when run again"
                    )
            start()  # the next jobs train while the ended ones are finished here
            for i, *_ in ended:
                if finished is not None:
                    finished(i)
    except BaseException as err:  # the others save their step and stop
        if isinstance(err, KeyboardInterrupt):  # Ctrl-C reaches them too: their own stop
            for *_, child in running:
                child.join(timeout=30)
        for *_, child in running:
            if child.is_alive():
                child.terminate()  # SIGTERM
        for *_, child in running:
            child.join()
        raise
