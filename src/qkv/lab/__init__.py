"""The lab: experiments that measure each claim the attention story makes.

``qkv lab NAME [--quick] [--out DIR] [--jobs N]`` runs one experiment, writes ``result.json`` (every
number, the config, the seeds, the versions) and its figures into ``DIR`` (default
``runs/lab/NAME``) and prints a short table. ``--quick`` is a small setting that finishes in
seconds to about a minute on two cores (``heads`` is the slowest) and is what the tests run;
the claims themselves (``docs/claims.md``) come from full runs. The translation
experiments' trainings continue what ``DIR`` holds when run again, and ``--jobs N`` trains
N of them at once (:mod:`qkv.lab.training`).

=============  ==============================================================
name           claim
=============  ==============================================================
bottleneck     one context vector fails on long sentences; attention does not
gradients      gradients vanish/explode through a recurrence, not through attention
parallelism    recurrence is sequential in the length; self-attention is not
word-order     without positions self-attention ignores word order
heads          different heads look at different things
decoder-heads  a decoder LLM's heads: attention sinks, previous-token heads
alignment      a decoder query finds the related source words
vision         attention relates distant parts of an image (ViT against a CNN)
=============  ==============================================================
"""

from __future__ import annotations

import importlib
import json
import logging
import time
from pathlib import Path

from qkv.lab.common import (
    LabRun,
    Table,
    check_writable,
    staged_figures,
    write_result,
)

__all__ = ["EXPERIMENTS", "run_experiment", "table"]

log = logging.getLogger(__name__)

# name on the command line -> module with ``run(out, quick) -> LabRun`` and ``table(run)``
EXPERIMENTS: dict[str, str] = {
    "bottleneck": "qkv.lab.bottleneck",
    "gradients": "qkv.lab.gradients",
    "parallelism": "qkv.lab.parallelism",
    "word-order": "qkv.lab.word_order",
    "heads": "qkv.lab.heads",
    "decoder-heads": "qkv.lab.decoder_heads",
    "alignment": "qkv.lab.alignment",
    "vision": "qkv.lab.vision",
}


def run_experiment(name: str, out: Path | None = None, *, quick: bool = False) -> LabRun:
    """Run experiment ``name``, write ``result.json`` and its figures into ``out``.

    Raises:
        KeyError: for an unknown name.
        OutputFolderError: ``out`` cannot be written (checked before the run starts).
    """
    if name not in EXPERIMENTS:
        raise KeyError(name)
    out = Path(out) if out is not None else Path("runs/lab") / name
    out.mkdir(parents=True, exist_ok=True)
    check_writable(out)
    earlier = _earlier_figures(out)
    module = importlib.import_module(EXPERIMENTS[name])
    started = time.perf_counter()
    with staged_figures(out) as publish:  # an interrupted run leaves the earlier one whole
        run = module.run(out, quick=quick)
        publish()
        write_result(out, run, time.perf_counter() - started)
    for stale in earlier - {Path(f).name for f in run.figures}:
        (out / stale).unlink(missing_ok=True)
    return run


def _earlier_figures(out: Path) -> set[str]:
    """The figures an earlier run's ``result.json`` in ``out`` lists as its own.

    A full run draws figures that a quick one does not (the Multi30k part): left beside
    the new result.json they would show numbers it does not hold.
    """
    try:
        figures = json.loads((out / "result.json").read_text(encoding="utf-8"))["figures"]
    except (OSError, ValueError, TypeError, KeyError):
        return set()
    if not isinstance(figures, list):
        return set()
    # names only, and only PNGs: a hand-edited list cannot reach outside the folder
    return {f for f in figures if isinstance(f, str) and f == Path(f).name and f.endswith(".png")}


def table(run: LabRun) -> Table:
    """The short table of a finished run."""
    return importlib.import_module(EXPERIMENTS[run.name]).table(run)
