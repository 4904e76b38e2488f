"""The memory free on a device, which the checks before a large allocation compare with
what the work needs: training a model (:func:`qkv.train.checks.check_memory`) and a
search over a target vocabulary (:func:`qkv.translate.translator.translate_lines`)."""

from __future__ import annotations

from pathlib import Path

import torch

__all__ = ["free_memory"]


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
