"""One small C kernel for what torch's operations cannot do in one pass.

:func:`softmax_rows` turns a block of scores into probabilities in place, and folds into
that one pass what torch needs several for: the scale, a boolean mask read as bytes
(never made into a float bias), a float bias such as ALiBi, a causal limit, and a second
copy of the result written with non-temporal stores, which send each cache line to
memory without fetching it first. Two callers use it:

- the attention weights beside a fused kernel (:mod:`qkv.kernels.weights`): the 512 MiB
  of weights at ``B=4, H=8, T=2048`` have to reach memory once, and ``torch.softmax(s,
  out=weights)`` reads every line of the result in before it overwrites it, which makes
  it the slower of the two;
- masked runs of the ``chunked`` backend in float32 (:mod:`qkv.kernels.rows`), whole rows
  of scores at a time, faster than SDPA on a random boolean mask.

The readable reference is :func:`softmax_rows_reference` (torch's operations, zeros for
rows that see no key); the C source is ``softmax_rows.c`` beside this file. It is
compiled on first use with the system C compiler into ``$XDG_CACHE_HOME/qkv/native``
(``~/.cache/qkv/native``; ``QKV_NATIVE_DIR`` overrides), under a name made from the
source and the compiler, written atomically, and loaded with ``ctypes``. It is built
with OpenMP, which links the ``libgomp`` that torch has loaded already, so its rows are
split among torch's own threads (``torch.get_num_threads()``). A pool of Python threads
was slower than torch's softmax on two threads: torch's idle workers spin on the cores for
a while after each matrix product (measured: BENCHMARKS.md, 'Native softmax').

Where it cannot run, :func:`why_unavailable` says why and callers use torch: not
x86-64, no AVX-512F, no compiler, a failed build, or ``QKV_NATIVE=0``.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch
from torch import Tensor

from qkv.files import cache_root

__all__ = [
    "build",
    "cache_dir",
    "kernel",
    "load_library",
    "softmax_rows",
    "softmax_rows_reference",
    "supports",
    "threads_for",
    "why_unavailable",
]

SOURCE = Path(__file__).with_name("softmax_rows.c")
FLAGS = ["-O2", "-shared", "-fPIC", "-fopenmp"]
MIN_ROWS_PER_THREAD = 16  # fewer rows than this per thread: one thread does them all


def softmax_rows_reference(
    s: Tensor,
    mask: Tensor | None = None,
    bias: Tensor | None = None,
    scale: float = 1.0,
    seen0: int | None = None,
) -> Tensor:
    """What :func:`softmax_rows` computes, in torch: the softmax of ``s * scale + bias``
    over the last dimension with keys hidden where ``mask`` is False and, given
    ``seen0``, every key from ``seen0 + r`` on in row ``r``; zeros for a row that sees no
    key."""
    x = s * scale if bias is None else s * scale + bias
    hidden = torch.zeros(x.shape, dtype=torch.bool) if mask is None else ~mask.expand(x.shape)
    if seen0 is not None:
        rows, keys = torch.arange(x.shape[-2]).unsqueeze(1), torch.arange(x.shape[-1])
        hidden = hidden | (keys >= seen0 + rows)
    x = x.masked_fill(hidden, float("-inf"))
    p = torch.softmax(x, dim=-1)
    return p.masked_fill((x == float("-inf")).all(dim=-1, keepdim=True), 0.0)


def supports(
    s: Tensor, dest: Tensor | None = None, mask: Tensor | None = None, bias: Tensor | None = None
) -> bool:
    """Whether :func:`softmax_rows` serves these tensors: float32 CPU scores whose rows
    are contiguous and laid out as grids of evenly spaced rows (any slice of rows of a
    contiguous tensor is); ``dest`` alike, of the same shape, apart from ``s``; a boolean
    ``mask`` and a float32 ``bias`` that broadcast to ``s`` with contiguous keys; and the
    kernel built here."""
    return _layout(s, dest, mask, bias) is not None and why_unavailable() is None


def softmax_rows(
    s: Tensor,
    dest: Tensor | None = None,
    mask: Tensor | None = None,
    bias: Tensor | None = None,
    scale: float = 1.0,
    seen0: int | None = None,
) -> Tensor:
    """:func:`softmax_rows_reference` in place: ``s`` (``(..., rows, keys)``) becomes the
    probabilities, and ``dest`` (unless ``None``) receives them too through non-temporal
    stores; returns ``s``. Requires :func:`supports`."""
    layout = _layout(s, dest, mask, bias)
    if layout is None or why_unavailable() is not None:
        raise ValueError("softmax_rows: needs float32 CPU rows, contiguous, apart")
    if s.numel() == 0:
        return s
    (outer, rows, _, _), n = _grids(s), s.shape[-1]
    seen = n if seen0 is None else min(seen0, n)  # row r sees its first seen + r keys
    kernel()(*layout, outer, rows, n, float(scale), seen, threads_for(outer * rows))
    return s


def kernel():
    """The C function itself (arguments as in ``softmax_rows.c``), unchecked: for a caller
    that passed one block to :func:`softmax_rows` and calls it again on blocks of the same
    layout, whose addresses it computes."""
    return _library().qkv_softmax_rows


def threads_for(rows: int) -> int:
    """Threads for ``rows`` rows: torch's, but at least MIN_ROWS_PER_THREAD rows each."""
    return min(torch.get_num_threads(), max(1, rows // MIN_ROWS_PER_THREAD))


def _layout(s: Tensor, dest, mask, bias) -> list | None:
    """The kernel's first twelve arguments (address, grid and row stride of ``s``,
    ``dest``, ``mask`` and ``bias``), or ``None`` when :func:`softmax_rows` cannot take
    these tensors (see :func:`supports`)."""
    g = _grids(s) if s.dtype == torch.float32 and s.device.type == "cpu" and s.dim() >= 2 else None
    if g is None:
        return None
    args = [s.data_ptr(), g[2], g[3]]
    for t, kind in ((dest, "result"), (mask, torch.bool), (bias, torch.float32)):
        if t is None:
            args += [None, 0, 0]
            continue
        if t.device != s.device:
            return None
        if kind == "result":  # written: a grid of its own, apart from s
            fits = t.dtype == s.dtype and t.shape == s.shape and not _overlap(s, t)
            g = _grids(t) if fits else None
        else:  # read only: broadcast to s
            g = _grids(t, s.shape) if t.dtype == kind else None
        if g is None:
            return None
        args += [t.data_ptr(), g[2], g[3]]
    return args


def why_unavailable() -> str | None:
    """``None`` when the kernel is built and runs on this CPU; else the reason."""
    return _load()[1]


def _library() -> ctypes.CDLL:
    lib, reason = _load()
    if lib is None:
        raise RuntimeError(f"qkv native kernel unavailable: {reason}")
    return lib


def load_library(source_path: Path) -> tuple[ctypes.CDLL | None, str | None]:
    """The compiled ``source_path`` (see :func:`build`) loaded with ``ctypes``, or
    ``None`` and the reason it cannot run here: ``QKV_NATIVE=0``, not x86-64, no C
    compiler, a failed build, or a CPU without AVX-512F (the source's ``qkv_cpu_ok``)."""
    if os.environ.get("QKV_NATIVE", "1") == "0":
        return None, "turned off by QKV_NATIVE=0"
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None, f"the kernel is written for x86-64, not {platform.machine()}"
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None, "no C compiler (cc or gcc) on PATH"
    try:
        lib = ctypes.CDLL(str(build(compiler, cache_dir(), source_path)))
    except (OSError, subprocess.SubprocessError, RuntimeError) as err:
        return None, f"could not build {source_path.name}: {str(err).splitlines()[0]}"
    if not lib.qkv_cpu_ok():
        return None, "this CPU has no AVX-512F"
    return lib, None


@functools.cache
def _load() -> tuple[ctypes.CDLL | None, str | None]:
    lib, reason = load_library(SOURCE)
    if lib is None:
        return None, reason
    lib.qkv_softmax_rows.restype = None
    grid = [ctypes.c_void_p, ctypes.c_long, ctypes.c_long]  # address, grid and row strides
    lib.qkv_softmax_rows.argtypes = (
        grid * 4
        + [ctypes.c_long] * 3
        + [
            ctypes.c_float,
            ctypes.c_long,
            ctypes.c_int,
        ]
    )
    return lib, None


def build(compiler: str, folder: Path, source_path: Path = SOURCE) -> Path:
    """The shared library of ``source_path`` (a C file beside this module) for
    ``compiler``, compiled into ``folder`` unless a build of the same source, headers
    (the ``.h`` files beside it) and compiler is there already; written atomically (a
    reader never sees a half-written file, and concurrent builds of the same name agree)."""
    headers = sorted(source_path.parent.glob("*.h"))
    source = b"".join(path.read_bytes() for path in [source_path, *headers])
    version = subprocess.run([compiler, "--version"], capture_output=True, timeout=60).stdout
    digest = hashlib.sha256(source + version + " ".join(FLAGS).encode()).hexdigest()[:16]
    target = folder / f"{source_path.stem}-{digest}.so"
    if target.exists():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, suffix=".so.tmp")
    os.close(fd)
    try:
        done = subprocess.run(
            [compiler, *FLAGS, str(source_path), "-o", tmp],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            raise RuntimeError(done.stderr.strip() or f"{compiler} exited {done.returncode}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def cache_dir() -> Path:
    if os.environ.get("QKV_NATIVE_DIR"):
        return Path(os.environ["QKV_NATIVE_DIR"])
    return cache_root() / "native"


def _grids(t: Tensor, shape: torch.Size | None = None) -> tuple[int, int, int, int] | None:
    """``t`` (broadcast to ``shape`` when given: a read-only input) as ``outer`` grids of
    ``rows`` rows: ``(outer, rows, grid stride, row stride)``, the keys of each row
    contiguous; ``None`` for other layouts. Without ``shape``, rows and grids must not
    overlap (the kernel writes them)."""
    if shape is not None:
        try:
            t = t.expand(shape)
        except RuntimeError:
            return None
    n = t.shape[-1]
    if t.numel() == 0:
        return 0, 0, 0, 0
    if n > 1 and t.stride(-1) != 1:
        return None
    try:
        g = t.view(-1, *t.shape[-2:])
    except RuntimeError:
        return None
    outer, rows, _ = g.shape
    so, sr = g.stride(0), g.stride(1)
    if shape is not None:
        return outer, rows, so, sr
    rows_apart = rows == 1 or sr >= n
    grids_apart = outer == 1 or so >= (rows - 1) * sr + n
    return (outer, rows, so, sr) if rows_apart and grids_apart else None


def _overlap(a: Tensor, b: Tensor) -> bool:
    def span(t: Tensor) -> tuple[int, int]:
        start = t.data_ptr()
        last = sum((n - 1) * st for n, st in zip(t.shape, t.stride()) if n > 0)
        return start, start + (last + 1) * t.element_size()

    if a.numel() == 0 or b.numel() == 0:
        return False
    (a0, a1), (b0, b1) = span(a), span(b)
    return a0 < b1 and b0 < a1
