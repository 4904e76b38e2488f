"""``qkv lab NAME [--quick] [--out DIR] [--jobs N] [--device cpu|cuda]``: run one
experiment and print its table.

Run again with the same ``--out``, an experiment continues its trainings where they
stopped (:mod:`qkv.lab.training`); ``--jobs N`` trains N of them at once, ``--device cuda``
on the GPU.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from qkv.errors import CorpusError, UserError
from qkv.lab import EXPERIMENTS, run_experiment, table
from qkv.lab.common import print_table, progress_bars
from qkv.lab.training import parallel_trainings

__all__ = ["run_cli"]


def run_cli(args) -> int:
    """``qkv lab NAME [--quick] [--out DIR] [--jobs N] [--device cpu|cuda]``."""
    name = args.name.replace("_", "-")
    if name not in EXPERIMENTS:
        raise UserError(f"unknown experiment {args.name!r}; choose one of {', '.join(EXPERIMENTS)}")
    if args.jobs < 1:
        raise UserError(f"--jobs: at least 1 training at a time, got {args.jobs}")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--device cuda: torch {torch.__version__} finds no CUDA device here")
    out = Path(args.out) if args.out else Path("runs/lab") / name
    try:
        # a bar per trained model: the full runs train for hours
        with progress_bars(), parallel_trainings(args.jobs, args.device):
            run = run_experiment(name, out, quick=args.quick)
    except (FileNotFoundError, CorpusError) as err:  # a corpus missing or unusable
        raise UserError(str(err)) from None
    if hasattr(sys.stdout, "reconfigure"):  # "→", "ρ", Hangul: UTF-8 whatever the locale
        sys.stdout.reconfigure(encoding="utf-8")
    print_table(table(run))
    if run.verdict:
        print(run.verdict)
    print(f"result.json and {len(run.figures)} figure(s) in {out}/")
    return 0
