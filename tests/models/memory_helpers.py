"""Helpers shared by the tests of hostile files: run a command under an address-space
limit and measure its peak memory; write a safetensors file by hand (a header that names a
tensor the file holds only as a hole)."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import struct
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).parents[2]
GIB = 2**30
# `python -m qkv translate` on a small checkpoint peaks near 400 MB of memory and runs in
# 1 GiB of address space: 2 GiB leaves room, and fails long before what the files claim
ADDRESS_SPACE = 2 * GIB
MAX_RSS = GIB


# Run `python -m MODULE ...` or `python -c CODE ...` given as sys.argv[1:], and write the
# peak resident memory of this process (VmHWM, KiB, which starts afresh at exec) to the file
# named by QKV_TEST_PEAK_FILE as it exits, by an exception or sys.exit included.
_REPORT_PEAK = """
import atexit, os, runpy, sys

def report():
    with open("/proc/self/status") as status:
        kib = next(line.split()[1] for line in status if line.startswith("VmHWM:"))
    with open(os.environ["QKV_TEST_PEAK_FILE"], "w") as out:
        out.write(kib)

atexit.register(report)
flag, target, *rest = sys.argv[1:]
if flag == "-m":
    sys.argv = [target, *rest]
    runpy.run_module(target, run_name="__main__", alter_sys=True)
else:
    sys.argv = ["-c", *rest]
    exec(compile(target, "<string>", "exec"), {"__name__": "__main__"})
"""


@dataclass
class Bounded:
    """What :func:`run_bounded` saw: exit code, output and peak resident memory (bytes)."""

    returncode: int
    stdout: str
    stderr: str
    max_rss: int


def run_bounded(
    args: list[str], *, stdin: str = "", address_space: int = ADDRESS_SPACE, timeout: float = 600
) -> Bounded:
    """Run ``python ARGS`` from the repository root with its address space limited to
    ``address_space`` bytes (``ulimit -v``), and measure its peak resident memory: the
    ``VmHWM`` it reports as it exits (see :data:`_REPORT_PEAK`), since the ``ru_maxrss`` of
    ``wait4`` starts from this process's resident memory at the fork, however large."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))

    with (
        tempfile.TemporaryFile("w+") as out,
        tempfile.TemporaryFile("w+") as err,
        tempfile.NamedTemporaryFile("r") as peak,
    ):
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        env["QKV_TEST_PEAK_FILE"] = peak.name
        proc = subprocess.Popen(
            [sys.executable, "-c", _REPORT_PEAK, *args],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=err,
            text=True,
            preexec_fn=limit,
        )
        killer = threading.Timer(timeout, proc.kill)
        killer.start()
        try:
            with contextlib.suppress(BrokenPipeError):  # it may exit before reading
                proc.stdin.write(stdin)
                proc.stdin.close()
            proc.wait()
        finally:
            killer.cancel()
        out.seek(0)
        err.seek(0)
        reported = peak.read().strip()  # empty when the process was killed
        max_rss = int(reported) * 1024 if reported else 2**63
        return Bounded(proc.returncode, out.read(), err.read(), max_rss)


_DTYPE_NAMES = {torch.float32: "F32", torch.float16: "F16", torch.int64: "I64"}


def write_safetensors(
    path: Path,
    tensors: dict[str, torch.Tensor],
    *,
    metadata: dict[str, str] | None = None,
    holes: dict[str, tuple[tuple[int, ...], torch.dtype]] | None = None,
) -> Path:
    """A safetensors file of ``tensors``, then of ``holes`` (``{name: (shape, dtype)}``):
    tensors that its header names and that the file holds as a sparse hole of zeros, so a
    header may name gigabytes that take no disk and no time to write."""
    header: dict = {"__metadata__": metadata} if metadata else {}
    at, data = 0, []
    for name, t in tensors.items():
        raw = t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        header[name] = {"dtype": _DTYPE_NAMES[t.dtype], "shape": list(t.shape)}
        header[name]["data_offsets"] = [at, at + len(raw)]
        data.append(raw)
        at += len(raw)
    for name, (shape, dtype) in (holes or {}).items():
        size = dtype.itemsize
        for n in shape:
            size *= n
        header[name] = {"dtype": _DTYPE_NAMES[dtype], "shape": list(shape)}
        header[name]["data_offsets"] = [at, at + size]
        at += size
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(data))
        f.truncate(8 + len(text) + at)  # the holes: a sparse end of the file
    return path
