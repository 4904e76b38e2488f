"""Heap reuse while training (Linux/glibc only): freed memory is not faulted in again."""

from __future__ import annotations

import os
import resource

import pytest
import torch

from qkv import memory
from qkv.memory import reuse_freed_memory

pytestmark = pytest.mark.skipif(memory._libc() is None, reason="needs Linux with glibc")


def _minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


@pytest.mark.skipif(
    any(k.startswith("MALLOC_") for k in os.environ) or "GLIBC_TUNABLES" in os.environ,
    reason="malloc tuned by the environment",
)
def test_reused_memory_is_not_faulted_in_again():
    """64 MiB allocated and freed ten times: ~16k page faults a time without, ~0 within."""
    n = 16 << 20  # floats: 64 MiB, above glibc's largest mmap threshold (32 MiB)

    def churn() -> int:
        before = _minor_faults()
        for _ in range(10):
            torch.empty(n).fill_(1.0)
        return _minor_faults() - before

    plain = churn()
    with reuse_freed_memory():
        churn()  # the first round grows the heap once
        reused = churn()
    after = churn()
    pages = n * 4 // 4096
    assert plain > 10 * pages // 2  # each round faulted most pages in afresh
    assert reused < plain // 20
    assert after > 10 * pages // 2  # glibc's defaults are back: large blocks are mmap-ed again
