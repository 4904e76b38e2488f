"""``qkv train CONFIG.yaml [--set key=value ...] [--resume | --overwrite] [--out DIR]``."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

from qkv.errors import CheckpointError, ConfigError, CorpusError, UserError
from qkv.train.checks import summary
from qkv.train.loop import TrainResult, train
from qkv.train.recipe import Recipe, load_yaml
from qkv.train.run_folder import check_not_a_run, check_out_dir, resume_note

__all__ = ["run_cli"]


def run_cli(args) -> int:
    """``qkv train CONFIG.yaml [--set key=value ...] [--resume | --overwrite]``."""
    try:
        if args.out:
            check_out_dir(Path(args.out), "--out")
        recipe = load_yaml(args.config, list(args.set))
        if args.out:  # a folder name as typed, not a YAML value ("2024", "run #2")
            recipe = dataclasses.replace(recipe, out=args.out)
        if not args.overwrite:
            check_not_a_run(recipe.out_dir, resume=args.resume)
        result = _train_or_say_where_to_resume(recipe, args.resume)
    except (ConfigError, CorpusError, CheckpointError) as err:
        raise UserError(str(err)) from None
    if os.environ.get("RANK", "0") == "0":  # under torchrun, rank 0 reports for the run
        print(summary(result, recipe))
    return 0


def _train_or_say_where_to_resume(recipe: Recipe, resume: bool) -> TrainResult:
    try:
        return train(recipe, resume=resume)
    except KeyboardInterrupt:  # Ctrl-C: say what is left to continue from, then stop
        print(f"qkv train: {resume_note(recipe.out_dir)}", file=sys.stderr)
        raise
