"""Heap reuse while training (Linux/glibc only): freed memory is not faulted in again."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from qkv.kernels.cpu import memory

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
    out = subprocess.run(
        [sys.executable, "-c", _CHURN], capture_output=True, text=True, check=True
    ).stdout.split()
    plain, reused = int(out[0]), int(out[1])
    pages = (16 << 20) * 4 // 4096
    assert plain > 10 * pages // 2  # each round faulted most pages in afresh
    assert reused < plain // 20


_CHURN = """
import resource, torch
from qkv.kernels.cpu.memory import reuse_freed_memory
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


def test_blocks_inside_blocks_restore_the_defaults_when_the_last_is_left(monkeypatch):
    """A block inside another (``generate`` inside a training loop) leaves the outer one's
    setting in force; the defaults come back when the outer one ends."""
    calls = []

    class Libc:
        def mallopt(self, param, value):
            calls.append((param, value))

    monkeypatch.setattr(memory, "_libc", lambda: Libc())
    with memory.reuse_freed_memory():
        set_ = list(calls)
        with memory.reuse_freed_memory():
            pass
        assert calls == set_  # the inner block changed nothing
    assert set_ == [(memory._M_MMAP_MAX, 0), (memory._M_TRIM_THRESHOLD, 2**31 - 1)]
    assert calls[2:] == list(memory._GLIBC_DEFAULTS.items())
    with pytest.raises(RuntimeError), memory.reuse_freed_memory():
        raise RuntimeError  # left by an error: restored all the same
    assert calls[-2:] == list(memory._GLIBC_DEFAULTS.items()) and memory._reusing == 0


def test_onednn_caches_are_bounded_unless_the_user_set_them():
    script = """
import os
from qkv.kernels.cpu.memory import bound_onednn_caches
os.environ.pop("ONEDNN_PRIMITIVE_CACHE_CAPACITY", None)
os.environ["LRU_CACHE_CAPACITY"] = "7"
bound_onednn_caches(16)
print(os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"], os.environ["LRU_CACHE_CAPACITY"])
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["16", "7"]


def test_kept_results_respect_size_dtype_limit_and_clear():
    kept = memory.KeptResults(limit_bytes=3 * 4096, min_bytes=4096)
    small = kept.empty((10,), torch.float32, torch.device("cpu"))  # below min_bytes
    a = kept.empty((4, 256), torch.float32, "cpu")  # 4 KiB: kept
    a_ptr = a.data_ptr()
    assert len(kept._kept) == 1 and small.numel() == 10
    del a
    assert kept.empty((256, 4), torch.float32, "cpu").data_ptr() == a_ptr  # same size, free
    b = kept.empty((1024,), torch.int32, "cpu")  # same bytes, another dtype: a new buffer
    assert b.data_ptr() != a_ptr and b.dtype == torch.int32
    held = [kept.empty((1024,), torch.float32, "cpu") for _ in range(3)]
    assert sum(t.numel() * t.element_size() for t in kept._kept) <= 3 * 4096
    assert len({t.data_ptr() for t in held}) == 3  # none handed out twice while held
    too_big = kept.empty((4 * 1024,), torch.float32, "cpu")  # above the limit: never kept
    assert all(t.data_ptr() != too_big.data_ptr() for t in kept._kept)
    kept.clear()
    assert kept._kept == []
    off = memory.KeptResults(limit_bytes=0)
    off.empty((1 << 20,), torch.float32, "cpu")
    assert off._kept == []
    assert kept.empty((1024,), torch.float32, "meta").device.type == "meta"  # CPU only
