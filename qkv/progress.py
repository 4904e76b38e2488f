"""A training progress bar (rich): step, loss, target tokens per second and ETA."""

from __future__ import annotations

__all__ = ["TrainingProgress"]


class TrainingProgress:
    """Context manager around a rich progress bar; does nothing when ``enabled`` is False."""

    def __init__(self, total: int, start: int = 0, *, enabled: bool = True, label: str = "train"):
        self.total, self.start, self.enabled, self.label = total, start, enabled, label
        self._progress = None
        self._task = None

    def __enter__(self) -> TrainingProgress:
        if self.enabled:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("loss {task.fields[loss]:.3f}"),
                TextColumn("{task.fields[rate]:.0f} tok/s"),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
            )
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
