"""The learning-rate schedule of :func:`qkv.train.loop.train`: linear warmup, then inverse
square root (Vaswani et al. 2017), cosine annealing or a constant rate."""

from __future__ import annotations

import math

import torch

__all__ = ["make_schedule"]


def make_schedule(
    optimizer: torch.optim.Optimizer, cfg, start_step: int = 0, elapsed=None
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warmup, then ``inverse_sqrt`` (``lr * sqrt(warmup / step)``), ``cosine``
    (to ``min_lr`` at ``steps``) or ``constant``; positioned at ``start_step``.

    ``elapsed`` (seconds since the run started), given when ``max_seconds`` bounds a
    one-process run, makes ``cosine`` follow whichever budget is used up faster, steps or
    seconds, so a time-limited run still ends annealed (its steps then depend on speed).
    """
    warmup, total, floor = max(cfg.warmup, 1), cfg.steps, cfg.min_lr / cfg.lr

    def factor(step: int) -> float:
        step = step + 1  # the factor for the update about to be made
        if step <= warmup:
            return step / warmup
        if cfg.schedule == "inverse_sqrt":
            return math.sqrt(warmup / step)
        if cfg.schedule == "cosine":
            progress = (step - warmup) / max(total - warmup, 1)
            if elapsed is not None and cfg.max_seconds > 0:
                progress = max(progress, elapsed() / cfg.max_seconds)
            progress = min(1.0, progress)
            return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
        return 1.0

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    if start_step:  # resuming: the learning rate of the next update, as the schedule gives it
        schedule.last_epoch = start_step
        for group in optimizer.param_groups:
            group["lr"] = group["initial_lr"] * factor(start_step)
    return schedule
