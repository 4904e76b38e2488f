"""The checks :func:`qkv.train.loop.train` makes before it trains, and resuming a run.

Before any work (the output folder: :mod:`qkv.train.run_folder`): the model's training
state fits the device's free memory, and every training and validation pair fits the
model's positions. On ``--resume``: the checkpoint was trained
on the same data (the recipe's data and tokenizer sections, then the tokenizers
themselves) and the same model, so that a resumed run continues the one it resumes.
At the end: :func:`finished` says why a run stops before ``train.steps``, and
:func:`summary` is the line ``qkv train`` prints from it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from qkv.data.prepare import Prepared
from qkv.models.checkpoint import CheckpointError, load_checkpoint, model_kind, restore_rng
from qkv.train.recipe import ConfigError, Recipe
from qkv.train.run_folder import later_best

__all__ = [
    "check_lengths",
    "check_memory",
    "finished",
    "restore",
    "summary",
]

log = logging.getLogger(__name__)

_PATHS = {"data.train", "data.valid", "data.test", "data.path"}  # where files are, not what


def check_memory(build: Callable[[], nn.Module], device: torch.device) -> None:
    """Refuse a model whose training state cannot fit in the device's free memory.

    The model is built on the meta device first (no memory), so that a size typed with a
    few zeros too many is one line instead of the allocator's traceback. Training with
    AdamW holds four copies of the parameters: weights, gradients and the two moments.
    """
    with torch.device("meta"):
        model = build()
    count = sum(p.numel() for p in model.parameters())
    need = 4 * sum(p.numel() * p.element_size() for p in model.parameters())
    tables = sum(b.numel() * b.element_size() for b in model.buffers())  # sinusoidal positions
    free = free_memory(device)
    if free is not None and need + tables > free:
        also = f" and {tables / 2**30:,.1f} GiB of tables (positional encodings, model.max_len)"
        also *= tables > 0
        raise ConfigError(
            f"model: {count:,} parameters need {need / 2**30:,.1f} GiB to train (weights, "
            f"gradients and AdamW's two moments){also}, more than the {free / 2**30:,.1f} "
            f"GiB free on {device.type}"
        )


def free_memory(device: torch.device) -> int | None:
    """Bytes free on ``device`` (CPU: the kernel's MemAvailable), or None if unknown."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type != "cpu":
        return None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_lengths(model: nn.Module, data: Prepared) -> None:
    """There are validation pairs, and every training and validation pair fits the
    model's positions (``model.max_len``)."""
    if not data.valid_examples:  # e.g. empty validation files
        raise ConfigError(
            "data.valid: no validation pair to read, but validation picks the best "
            "checkpoint and early stopping; give a validation set with at least one pair"
        )
    config = model.config
    key = "max_src_len" if hasattr(config, "max_src_len") else "max_len"
    sides = (
        ("source", getattr(config, "max_source_len", None), 0, 0),
        ("target", getattr(config, "max_target_len", None), 1, 1),
    )
    for split, examples in (("training", data.train_examples), ("validation", data.valid_examples)):
        for side, limit, column, extra in sides:  # extra: the target's <s>
            if limit is None or not examples:
                continue
            lengths = [len(pair[column]) + extra for pair in examples]
            too_long = sum(n > limit for n in lengths)
            if too_long:
                plus = " (with <s>)" if extra else ""
                raise ConfigError(
                    f"model.{key}: {limit} positions, but {too_long} of {len(examples)} "
                    f"{split} pairs have a longer {side}{plus}, up to {max(lengths)} tokens; "
                    f"raise model.{key} or keep shorter sentences ({_shorter(split)})"
                )


def check_loss(loss: float, step: int) -> float:
    """``loss``, if it is finite. A NaN or infinite loss means the weights are no longer
    numbers (AdamW spreads them to every weight): every later step, evaluation and
    checkpoint would be NaN too, so training stops before anything is saved."""
    if not math.isfinite(loss):
        raise ConfigError(
            f"train: the loss is {loss} at step {step}, training diverged; lower train.lr, "
            "raise train.warmup or keep train.clip_norm > 0 (checkpoints written before "
            "this step are kept)"
        )
    return loss


def _shorter(split: str) -> str:
    """How to keep a split's sentences shorter: data.max_tokens filters training files only."""
    files = "data.max_tokens for files" if split == "training" else f"a shorter {split} file"
    return f"data.max_len for the toy corpus, {files}"


def restore(
    path: Path, model: nn.Module, optimizer, recipe: Recipe, data: Prepared
) -> dict[str, Any]:
    """Load a checkpoint to resume from into ``model`` and ``optimizer``; its saved loop state.

    Raises:
        CheckpointError: other data or another model, or a corrupt training state.
    """
    ckpt = load_checkpoint(path)
    change = _data_change(ckpt, recipe, data)
    if change:
        raise CheckpointError(
            f"{path}: cannot resume: the config's data differ from the checkpoint's "
            f"({change}); use the same data and tokenizer, or another --out"
        )
    change = _model_change(ckpt, model)
    if change:
        raise CheckpointError(
            f"{path}: cannot resume: the config's model differs from the checkpoint's "
            f"({change}); use the same model and data, or another --out"
        )
    _warn_order_change(path, ckpt.extra.get("recipe"), recipe)
    model.load_state_dict(ckpt.model.state_dict())
    try:
        saved = _loop_state(ckpt.extra.get("train", {}))
        _adopt_later_best(path.parent, saved)
        if ckpt.optimizer_state is not None:
            _check_optimizer_state(optimizer, ckpt.optimizer_state)
            optimizer.load_state_dict(ckpt.optimizer_state)
            _use_config_settings(optimizer, recipe)
        if ckpt.rng is not None:
            restore_rng(ckpt.rng)
        return saved
    except (ValueError, TypeError, KeyError, RuntimeError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CheckpointError(f"{path}: cannot resume: corrupt training state ({first})") from None


def _adopt_later_best(out: Path, saved: dict[str, Any]) -> None:
    """Take the best of ``best.safetensors`` when it is from a step after the checkpoint's
    (a run killed between saves), so that the resumed run knows what that file holds: it
    is replaced only when this run evaluates better. The checkpoint's own state names an
    older best, which that file overwrote."""
    later = later_best(out, saved.get("step", 0))
    keys = ("best_bleu", "best_loss", "best_step")
    try:
        best = _loop_state({key: later[key] for key in keys}) if later is not None else None
    except (KeyError, TypeError, ValueError):  # not a state qkv wrote: left as it is
        best = None
    if best is not None:
        saved.update(best)
        log.warning(
            "best.safetensors holds step %d, after the resumed step %d: kept as the "
            "best so far (valid BLEU %.2f)",
            saved["best_step"],
            saved.get("step", 0),
            saved["best_bleu"],
        )


# The training loop's saved state (qkv.train.loop._State) and the JSON type of each entry.
LOOP_STATE = {
    "step": int,
    "epoch": int,
    "batch_in_epoch": int,
    "best_step": int,
    "bad_evals": int,
    "best_bleu": float,
    "best_loss": float,
    "valid_loss": float,
    "seconds": float,
}


def _loop_state(saved: Any) -> dict[str, Any]:
    """The saved loop state, its entries checked: counts are integers >= 0, scores and
    seconds numbers (a hand-edited or foreign header would fail later, mid-run)."""
    if not isinstance(saved, dict):
        raise TypeError(f"training state is a {type(saved).__name__}, not an object")
    for key, kind in LOOP_STATE.items():
        if key not in saved:
            continue
        value = saved[key]
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or (kind is int and not isinstance(value, int)):
            raise TypeError(
                f"{key} is {value!r}, not {'an integer' if kind is int else 'a number'}"
            )
        if kind is int and value < 0:
            raise ValueError(f"{key} is {value}, not >= 0")
    return saved


_ADAMW_STATE = {"step", "exp_avg", "exp_avg_sq"}  # per parameter, as train's AdamW keeps it


def _check_optimizer_state(optimizer, saved: dict) -> None:
    """Each parameter's saved AdamW state has a step (one number) and two moments of the
    parameter's shape: torch loads anything, then the step fails on a missing moment
    (a KeyError traceback), and the fused step reads past a moment that is too small."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for pid, entries in saved["state"].items():
        if not 0 <= pid < len(params):
            raise ValueError(f"optim.{pid}: the model has {len(params)} parameters")
        if set(entries) != _ADAMW_STATE:
            names = ", ".join(sorted(set(entries) ^ _ADAMW_STATE))
            raise ValueError(
                f"optim.{pid}: AdamW's state has step, exp_avg and exp_avg_sq, "
                f"this one differs in {names}"
            )
        for key, value in entries.items():
            want = () if key == "step" else tuple(params[pid].shape)
            if tuple(value.shape) != want:
                raise ValueError(
                    f"optim.{pid}.{key} is {tuple(value.shape)}, its parameter's is {want}"
                )


def _warn_order_change(path: Path, saved: Any, recipe: Recipe) -> None:
    """Warn when the batch order of the epoch being resumed is not the checkpoint's: the
    saved position then points into another order (some batches repeat, some are skipped)."""
    before = saved.get("train") if isinstance(saved, dict) else None
    if not isinstance(before, dict):
        return
    changed = [k for k in ("seed", "max_tokens") if before.get(k) != getattr(recipe.train, k)]
    if changed:
        names = " and ".join(f"train.{k}" for k in changed)
        log.warning(
            "%s: %s %s from the checkpoint's: the rest of this epoch follows another "
            "batch order, so some of its batches repeat and others are skipped",
            path,
            names,
            "differs" if len(changed) == 1 else "differ",
        )


def _use_config_settings(optimizer, recipe: Recipe) -> None:
    """The config's lr, betas and weight decay, not the checkpoint's: loading the
    optimiser's state also loads the settings it was saved with, which would silently
    override ``--set train.lr=...`` on resume (the schedule starts from ``initial_lr``)."""
    cfg = recipe.train
    for group in optimizer.param_groups:
        group.update(
            lr=cfg.lr, initial_lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay
        )


def _data_change(ckpt, recipe: Recipe, data: Prepared) -> str | None:
    """What differs between the data a checkpoint was trained on and ``recipe``'s.

    The recipe's ``data`` and ``tokenizer`` sections are compared key by key (when the
    checkpoint holds its recipe), then the tokenizers themselves: the same vocabulary
    sizes with other ids for the words would train on garbage without any error. Files
    that only moved (other paths, the same tokenizers built from them) may resume.
    """
    saved = ckpt.extra.get("recipe")
    if isinstance(saved, dict):
        changed = []
        for section in ("data", "tokenizer"):
            now = json.loads(json.dumps(dataclasses.asdict(getattr(recipe, section)), default=list))
            before = saved.get(section) if isinstance(saved.get(section), dict) else {}
            keys = sorted(k for k in now.keys() | before.keys() if now.get(k) != before.get(k))
            changed += [f"{section}.{k}" for k in keys]
        if set(changed) - _PATHS:
            return ", ".join(changed)
        if changed:
            log.warning(
                "%s: other paths than the checkpoint's; resuming only if the "
                "tokenizers built from them are the same",
                ", ".join(changed),
            )
    tokenizers = {"src": data.src_tok, "tgt": data.tgt_tok}
    for side, tok in tokenizers.items():
        try:
            same = json.loads(ckpt.tokenizers.get(side, "null")) == json.loads(tok.to_json())
        except json.JSONDecodeError:
            same = False
        if not same:
            return f"the {side} tokenizer trained on them has other tokens or ids"
    return None


def _model_change(ckpt, model: nn.Module) -> str | None:
    """What differs between a checkpoint's model and ``model``: "type", fields, or None."""
    if ckpt.model_type != model_kind(model):
        return "type"
    config = json.loads(json.dumps(model.config.to_dict()))  # as the checkpoint stores it
    saved = ckpt.model_config
    changed = sorted(k for k in config.keys() | saved.keys() if config.get(k) != saved.get(k))
    return ", ".join(changed) or None


def finished(state, cfg) -> str | None:
    """Why a resumed run has nothing left to train (as the uninterrupted run would have
    stopped there), or None."""
    if state.step >= cfg.steps:
        return (
            f"is already at step {state.step} and train.steps is {cfg.steps}; raise "
            f"train.steps (--set train.steps=N) to train further"
        )
    if cfg.patience > 0 and state.bad_evals >= cfg.patience:
        better = "validation loss" if cfg.valid_bleu_sentences == 0 else "BLEU"
        return (
            f"stopped early at step {state.step}: {state.bad_evals} evaluations without a "
            f"better {better} and train.patience is {cfg.patience}; raise train.patience "
            f"to train further"
        )
    if cfg.max_seconds > 0 and state.seconds >= cfg.max_seconds:
        return (
            f"stopped at step {state.step} after {state.seconds:.0f} s of training and "
            f"train.max_seconds is {cfg.max_seconds:g}; raise train.max_seconds to "
            f"train further"
        )
    return None


def summary(result, recipe: Recipe) -> str:
    """The last line of ``qkv train``: the steps this process trained (a resumed run's
    from its checkpoint's step on), the best checkpoint, and why the run stopped before
    ``train.steps`` if it did."""
    if result.already_done:
        return f"nothing to do: {result.out_dir / 'last.safetensors'} {result.done_because}"
    count = result.steps - result.first_step
    steps = f"{count} step{'s' * (count != 1)}"
    if result.first_step:
        steps += f" (from step {result.first_step} to {result.steps})"
    bleu = recipe.train.valid_bleu_sentences  # without it, the lowest loss picks the best
    best = f"best valid BLEU {result.best_bleu:.2f}" if bleu else "lowest valid loss"
    stopped = f"; {result.done_because}" if result.done_because else ""
    return (
        f"trained {steps} in {result.seconds:.0f} s ({result.target_tokens_per_s:.0f} target "
        f"tokens/s{', bf16 autocast' * result.bf16}); {best} at step {result.best_step}; "
        f"checkpoints in {result.out_dir}{stopped}"
    )
