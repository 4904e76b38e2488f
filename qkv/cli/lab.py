"""``qkv lab NAME [--quick] [--out DIR]``: run one experiment and print its table."""

from __future__ import annotations

import sys
from pathlib import Path

from qkv.errors import CorpusError, UserError
from qkv.lab import EXPERIMENTS, run_experiment, table
from qkv.lab.common import print_table, progress_bars

__all__ = ["run_cli"]


def run_cli(args) -> int:
    """``qkv lab NAME [--quick] [--out DIR]``."""
    name = args.name.replace("_", "-")
    if name not in EXPERIMENTS:
        raise UserError(f"unknown experiment {args.name!r}; choose one of {', '.join(EXPERIMENTS)}")
    out = Path(args.out) if args.out else Path("runs/lab") / name
    try:
        with progress_bars():  # a bar per trained model: the full runs train for minutes
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
