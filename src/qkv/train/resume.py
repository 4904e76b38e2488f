"""Resuming a run (``qkv train --resume``): the checkpoint must fit the config.

:func:`restore` loads ``last.safetensors`` into the model and the optimiser once the
checkpoint is known to have been trained on the same data (the recipe's data and tokenizer
sections, then the tokenizers themselves) and the same model, so that a resumed run
continues the one it resumes. Its saved loop state and optimiser state are checked entry by
entry first (a hand-edited or foreign header fails here in one line, not mid-run), and the
config's optimiser settings win over the saved ones. A ``best.safetensors`` written after
the checkpoint (a run killed between saves) is what :mod:`qkv.train.run_folder` finds.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from pathlib import Path
from typing import Any

from torch import nn

from qkv.data.prepare import Prepared
from qkv.errors import CheckpointError
from qkv.models.checkpoint import load_checkpoint, model_kind, restore_rng
from qkv.train.recipe import Recipe
from qkv.train.run_folder import later_best

__all__ = ["LOOP_STATE", "restore"]

log = logging.getLogger(__name__)

_PATHS = {"data.train", "data.valid", "data.test", "data.path"}  # where files are, not what

# The training loop's saved state (qkv.train.loop's _State) and the JSON type of each entry.
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

_ADAMW_STATE = {"step", "exp_avg", "exp_avg_sq"}  # per parameter, as train's AdamW keeps it

# The settings of each AdamW parameter group that the config gives (--set train.lr=...):
# a resumed run takes the config's, so the saved ones need only be of the right type.
_CONFIG_SETTINGS = {"lr", "initial_lr", "betas", "weight_decay"}


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
        saved = _checked_loop_state(ckpt.extra.get("train", {}))
        _adopt_later_best(path.parent, saved)
        if ckpt.optimizer_state is not None:
            _check_settings(optimizer, ckpt.optimizer_state["param_groups"])
            _check_optimizer_state(optimizer, ckpt.optimizer_state)
            ours = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
            optimizer.load_state_dict(ckpt.optimizer_state)
            for group, settings in zip(optimizer.param_groups, ours):
                for key, value in settings.items():  # what the file left out: this run's
                    group.setdefault(key, value)
            _use_config_settings(optimizer, recipe, ours)
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
        best = _checked_loop_state({k: later[k] for k in keys}) if later is not None else None
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


def _checked_loop_state(saved: Any) -> dict[str, Any]:
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


def _check_settings(optimizer, saved: Any) -> None:
    """The saved AdamW settings are the ones this run trains with, key by key.

    torch loads a parameter group's settings as they are, and they decide what the step
    computes: ``amsgrad: true`` failed on a missing moment (a KeyError traceback),
    ``differentiable: true`` and ``eps: "abc"`` in the step (tracebacks), and
    ``maximize: true`` climbed the loss without a word. qkv always writes the settings
    of the AdamW that :func:`qkv.train.loop.train` builds, so any other value is a
    file edited by hand or written by another program, and is refused (a ``ValueError``
    naming the key, which :func:`restore` makes one line naming the file). The
    config's settings (learning rate, betas, weight decay) are only checked for their
    type: the config's values replace them. A key that is missing (a checkpoint of an
    older torch) takes this run's value, as torch's own loading does.
    """
    groups = optimizer.param_groups
    if not isinstance(saved, list) or len(saved) != len(groups):
        count = len(saved) if isinstance(saved, list) else type(saved).__name__
        raise ValueError(f"optimizer.param_groups has {count} groups, AdamW here {len(groups)}")
    first = 0
    for index, (group, ours) in enumerate(zip(saved, groups)):
        where = f"optimizer.param_groups[{index}]"
        if not isinstance(group, dict):
            raise TypeError(f"{where} is a {type(group).__name__}, not an object")
        ids = list(range(first, first + len(ours["params"])))
        if group.get("params") != ids:
            raise ValueError(f"{where}.params is not the model's parameters {ids[0]}..{ids[-1]}")
        first += len(ids)
        settings = {k: v for k, v in ours.items() if k != "params"}
        settings.setdefault("initial_lr", ours["lr"])  # the schedule adds it, after this
        for key, value in group.items():
            if key == "params":
                continue
            if key not in settings:
                raise ValueError(f"{where}.{key}: not a setting of the AdamW qkv trains with")
            _check_setting(f"{where}.{key}", value, settings[key], key in _CONFIG_SETTINGS)


def _check_setting(where: str, value: Any, ours: Any, from_config: bool) -> None:
    """One saved setting against this run's: of its type, and (unless the config gives
    it) equal to it."""
    wanted = list(ours) if isinstance(ours, tuple) else [ours]  # betas: two numbers
    got = list(value) if isinstance(value, (list, tuple)) else [value]
    if isinstance(ours, tuple) != isinstance(value, (list, tuple)) or len(got) != len(wanted):
        raise TypeError(f"{where} is {_json(value)}, not {_kind(ours)}")
    for part, want in zip(got, wanted):
        if isinstance(want, bool) or want is None:  # switches: amsgrad, maximize, fused ...
            fits = part is None or isinstance(part, bool)
        else:  # lr, eps, betas, weight decay
            fits = isinstance(part, (int, float)) and not isinstance(part, bool)
            fits = fits and math.isfinite(part)
        if not fits:
            raise TypeError(f"{where} is {_json(value)}, not {_kind(ours)}")
    if not from_config and got != wanted:
        used = _json(ours)
        raise ValueError(
            f"{where} is {_json(value)}, but qkv trains with {used}: a checkpoint qkv wrote "
            f"holds {used} (edited by hand, or written by another program?)"
        )


def _kind(value: Any) -> str:
    if isinstance(value, tuple):
        return f"{len(value)} finite numbers"
    if isinstance(value, bool) or value is None:
        return "true, false or null"
    return "a finite number"


def _json(value: Any) -> str:
    try:
        return json.dumps(list(value) if isinstance(value, tuple) else value)
    except (TypeError, ValueError):
        return repr(value)


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
    keys = ("seed", "max_tokens", "batch_size")  # batch_size: images' and text windows' batches
    changed = [k for k in keys if before.get(k) != getattr(recipe.train, k)]
    if changed:
        names = " and ".join(f"train.{k}" for k in changed)
        log.warning(
            "%s: %s %s from the checkpoint's: the rest of this epoch follows another "
            "batch order, so some of its batches repeat and others are skipped",
            path,
            names,
            "differs" if len(changed) == 1 else "differ",
        )


def _use_config_settings(optimizer, recipe: Recipe, ours: list[dict[str, Any]]) -> None:
    """The config's lr, betas and weight decay, not the checkpoint's: loading the
    optimiser's state also loads the settings it was saved with, which would silently
    override ``--set train.lr=...`` on resume (the schedule starts from ``initial_lr``).
    Each group's weight decay is the one this run built it with (``ours``): the config's,
    or none for the biases and gains of ``train.decay_matrices_only``."""
    cfg = recipe.train
    for group, settings in zip(optimizer.param_groups, ours):
        group.update(
            lr=cfg.lr,
            initial_lr=cfg.lr,
            betas=tuple(cfg.betas),
            weight_decay=settings["weight_decay"],
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
