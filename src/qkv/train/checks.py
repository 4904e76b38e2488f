"""The checks :func:`qkv.train.loop.train` makes before it trains, while it trains, and at
the end.

Before any work (the output folder: :mod:`qkv.train.run_folder`): the model's training
state fits the device's free memory, and every training and validation pair fits the
model's positions. At each step the loss is finite. At the end: :func:`finished` says why
a run stops before ``train.steps``, and :func:`summary` is the line ``qkv train`` prints
from it. Resuming a run is checked in :mod:`qkv.train.resume`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from qkv.data.prepare import Prepared
from qkv.errors import ConfigError
from qkv.models.memory import free_memory
from qkv.train.recipe import Recipe

__all__ = [
    "check_lengths",
    "check_loss",
    "check_memory",
    "finished",
    "summary",
]


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


def finished(state, cfg, score: str = "BLEU") -> str | None:
    """Why a resumed run has nothing left to train (as the uninterrupted run would have
    stopped there), or None. ``score``: what the validation measures besides its loss
    (``"BLEU"`` for translators, ``"accuracy"`` for image classifiers)."""
    if state.step >= cfg.steps:
        return (
            f"is already at step {state.step} and train.steps is {cfg.steps}; raise "
            f"train.steps (--set train.steps=N) to train further"
        )
    if cfg.patience > 0 and state.bad_evals >= cfg.patience:
        better = "validation loss" if cfg.valid_bleu_sentences == 0 else score
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
    rate = "target tokens/s"
    if recipe.images:  # the score of image classifiers is the validation accuracy
        best, rate = f"best valid accuracy {result.best_bleu:.2f}%", "images/s"
    if recipe.language:  # language models: the loss and its perplexity
        loss = result.last_valid_loss
        perplexity = math.exp(min(loss, 700.0)) if math.isfinite(loss) else loss
        best = f"valid loss {loss:.4f} (perplexity {perplexity:.2f}); lowest valid loss"
        rate = "tokens/s"
    stopped = f"; {result.done_because}" if result.done_because else ""
    return (
        f"trained {steps} in {result.seconds:.0f} s ({result.target_tokens_per_s:.0f} {rate}"
        f"{', bf16 autocast' * result.bf16}); {best} at step {result.best_step}; "
        f"checkpoints in {result.out_dir}{stopped}"
    )
