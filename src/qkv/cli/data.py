"""``qkv data download NAME [--cache DIR]``: fetch a public corpus into the local cache."""

from __future__ import annotations

import contextlib
import sys
from typing import Any

from qkv.data.download import DATASETS, Progress, download
from qkv.errors import DownloadError, UserError

__all__ = ["run_cli"]


def run_cli(args: Any) -> int:
    """``qkv data download NAME [--cache DIR]``: download and print the folder.

    Args:
        args: namespace with ``name``, ``cache`` and ``base_url``.

    Returns:
        Exit code 0.

    Raises:
        UserError: unknown corpus name or failed download (one-line message).
    """

    if args.name not in DATASETS:
        known = ", ".join(sorted(DATASETS))
        raise UserError(f"unknown corpus {args.name!r}; choose one of: {known}")
    bar, report = _progress_bar()
    try:
        with bar:
            folder = download(args.name, args.cache, args.base_url, progress=report)
    except DownloadError as err:
        raise UserError(str(err)) from None
    except OSError as err:
        raise UserError(f"cannot write to the cache: {err}") from None
    print(folder, file=sys.stdout)
    return 0


def _progress_bar() -> tuple[Any, Progress]:
    """A rich progress bar on stderr (bytes, rate, ETA) and the callback that drives it."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )
    from rich.progress import Progress as RichProgress

    bar = RichProgress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
    )
    tasks: dict[str, Any] = {}

    def report(file: str, done: int, total: int | None) -> None:
        if not tasks:
            bar.start()  # only once bytes arrive: a bar stopped unused leaves a blank line
        if file not in tasks:
            tasks[file] = bar.add_task(file, total=total)
        bar.update(tasks[file], completed=done, total=total)

    @contextlib.contextmanager
    def running():
        try:
            yield
        finally:
            if tasks:
                bar.stop()

    return running(), report
