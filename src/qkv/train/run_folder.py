"""A run's output folder: checked before any work, made ready for a new or resumed run,
and what an interrupted run leaves there to resume from."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

from qkv.errors import ConfigError
from qkv.files import replacing, write_text_atomic
from qkv.models.checkpoint import saved_extra

__all__ = [
    "best_from_last",
    "check_not_a_run",
    "check_out_dir",
    "later_best",
    "prepare_out_dir",
    "remove_partial_checkpoints",
    "resume_note",
    "trim_log",
]

log = logging.getLogger(__name__)


def check_out_dir(path: Path, name: str = "out") -> None:
    """Refuse an output folder that is a file or lies under one, before any work is done."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{name} {path}: is a file, not a folder")
    folder = path
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        raise ConfigError(f"{name} {path}: {folder} is a file, not a folder")


def check_not_a_run(out: Path, resume: bool = False) -> None:
    """Refuse to start a new run in a folder that holds one: its checkpoints and log would
    be replaced without a word (``qkv train`` asks for ``--resume`` or ``--overwrite``).
    A folder with a best checkpoint but no last one (deleted to save space) has nothing
    to resume from, and a new run there would delete that best model: refused as well."""
    if (out / "last.safetensors").exists():
        if not resume:
            raise ConfigError(
                f"out {out}: holds a run already (last.safetensors); --resume continues it, "
                "--overwrite starts again and replaces its checkpoints and log"
            )
    elif (out / "best.safetensors").exists():
        raise ConfigError(
            f"out {out}: holds a run's best.safetensors but no last.safetensors to resume "
            "from; --overwrite starts again and replaces it, or give another --out"
        )


def prepare_out_dir(out: Path, step: int, best_step: int = 0) -> None:
    """Make ``out`` ready for a run that starts at ``step`` (0: a new run): the log cut
    back to that step, what killed checkpoint writes left removed, and for a new run the
    checkpoints of an earlier one too (they are not this run's: an old last.safetensors
    left until the first save would be what ``--resume`` continues, beside the new log).

    A resumed run whose checkpoint was its best evaluation (``best_step == step``) and
    whose ``best.safetensors`` is not that step's (killed between the two writes of
    :func:`best_from_last`'s save order) gets it back from ``last.safetensors``."""
    out.mkdir(parents=True, exist_ok=True)
    trim_log(out / "log.jsonl", step)
    remove_partial_checkpoints(out)
    if step == 0:
        for name in ("last", "best"):
            (out / f"{name}.safetensors").unlink(missing_ok=True)
    elif best_step == step and _saved_step(out / "best.safetensors") != step:
        log.warning(
            "best.safetensors is not the best evaluation of step %d that last.safetensors "
            "holds (the run stopped between the two saves): written again from it",
            step,
        )
        best_from_last(out)


def best_from_last(out: Path) -> Path:
    """``best.safetensors`` becomes a copy of ``last.safetensors``, atomically. The loop
    saves ``last`` first and then this, so that a kill between the two leaves a ``last``
    that :func:`prepare_out_dir` completes the pair from. A copy, not a hard link: a file
    copied over one of the two names (``cp``, ``shutil.copy``) would change both."""
    last, best = out / "last.safetensors", out / "best.safetensors"
    with replacing(best) as tmp:
        shutil.copyfile(last, tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
    return best


def remove_partial_checkpoints(out: Path) -> None:
    """Delete what checkpoint writes that a kill cut short left: each write's private
    folder (with safetensors' own temporary file inside, as big as a checkpoint), or the
    file that earlier versions wrote. A resumed run is the only writer of its folder, so
    these go at once (a later save would remove them only after 10 minutes)."""
    for name in ("last", "best"):
        for partial in out.glob(f".{name}.safetensors.*.tmp"):
            if partial.is_dir():
                shutil.rmtree(partial, ignore_errors=True)
            else:
                partial.unlink(missing_ok=True)


def trim_log(path: Path, step: int) -> None:
    """On resume, drop log rows written after the checkpoint's step, and a row that a
    crash left half written (it is not JSON, and rows after it come from later steps).
    A row whose step is not a number (not written by qkv) is kept as it is."""
    if not path.exists():
        return
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines() if step else []
    kept = []
    for line in lines:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(row, dict):
            continue
        at = row.get("step", 0)
        if not isinstance(at, (int, float)) or isinstance(at, bool) or at <= step:
            kept.append(line)
    write_text_atomic(path, "".join(r + "\n" for r in kept))  # an interrupt keeps the log


def resume_note(out: Path) -> str:
    """What an interrupted ``qkv train`` leaves: the step its ``last.safetensors`` holds
    and how to continue from it, or that nothing was saved yet."""
    last = Path(out) / "last.safetensors"
    if not last.is_file():
        return f"no checkpoint in {out} yet: a new run starts from step 0"
    state = _saved_loop_state(last)
    if state is None:
        return f"{last} is not a qkv checkpoint that --resume can read"
    return f"{last} holds step {state.get('step', '?')}; --resume continues from it"


def later_best(out: Path, step: int) -> dict | None:
    """The loop state saved with ``best.safetensors`` when that file is from a step after
    ``step``: a run killed between saves (best at step 10, last at step 8) left it, and
    a run resumed from ``last.safetensors`` must know what it holds. ``None`` otherwise."""
    best = Path(out) / "best.safetensors"
    state = _saved_loop_state(best) if best.is_file() else None
    saved_step = None if state is None else state.get("step")
    return state if isinstance(saved_step, int) and saved_step > step else None


def _saved_step(checkpoint: Path) -> int | None:
    """The step a checkpoint holds, or ``None`` (no such file, or not one qkv wrote)."""
    state = _saved_loop_state(checkpoint) if checkpoint.is_file() else None
    step = None if state is None else state.get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def _saved_loop_state(checkpoint: Path) -> dict | None:
    """The training loop's state that :mod:`qkv.train.loop` saves with a checkpoint (its
    ``extra["train"]``), read from the header alone; ``None`` for an unreadable file."""
    extra = saved_extra(checkpoint)
    return None if extra is None else dict(extra.get("train") or {})
