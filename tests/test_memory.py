"""Heap reuse while training (Linux/glibc only): freed memory is not faulted in again."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from qkv import memory

pytestmark = pytest.mark.skipif(memory._libc() is None, reason="needs Linux with glibc")


@pytest.mark.skipif(
    any(k.startswith("MALLOC_") for k in os.environ) or "GLIBC_TUNABLES" in os.environ,
    reason="malloc tuned by the environment",
)
def test_reused_memory_is_not_faulted_in_again():
    """64 MiB allocated and freed ten times: ~16k page faults a time without, ~0 within.

    Run in a fresh interpreter: what glibc's heap already holds (from earlier tests) decides
    whether a large block comes from it or from ``mmap``.
    """
    out = subprocess.run([sys.executable, "-c", _CHURN], capture_output=True, text=True,
                         check=True).stdout.split()  # fmt: skip
    plain, reused = int(out[0]), int(out[1])
    pages = (16 << 20) * 4 // 4096
    assert plain > 10 * pages // 2  # each round faulted most pages in afresh
    assert reused < plain // 20


_CHURN = """
import resource, torch
from qkv.memory import reuse_freed_memory
def churn():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(10):
        torch.empty(16 << 20).fill_(1.0)  # 64 MiB, above glibc's largest mmap threshold
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
plain = churn()
with reuse_freed_memory():
    churn()  # the first round grows the heap once
    reused = churn()
print(plain, reused)
"""


def test_onednn_caches_are_bounded_unless_the_user_set_them():
    script = """
import os
from qkv.memory import bound_onednn_caches
os.environ.pop("ONEDNN_PRIMITIVE_CACHE_CAPACITY", None)
os.environ["LRU_CACHE_CAPACITY"] = "7"
bound_onednn_caches(16)
print(os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"], os.environ["LRU_CACHE_CAPACITY"])
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["16", "7"]
