"""The C softmax kernel: against a float64 softmax, its layout checks, its build and cache."""

from __future__ import annotations

import ctypes
import math
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import qkv
from qkv.kernels import native
from qkv.kernels import weights as weights_module
from qkv.lab.common import num_threads
from tests.conftest import naive_attention


def _cpu_has_avx512() -> bool:
    try:
        return " avx512f" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


needs_kernel = pytest.mark.skipif(
    native.why_unavailable() is not None, reason=f"native kernel: {native.why_unavailable()}"
)


def _exact(s: torch.Tensor) -> torch.Tensor:
    """float64 softmax with zeros for rows that see nothing."""
    return native.softmax_rows_reference(s.double())


@pytest.mark.skipif(
    not (_cpu_has_avx512() and shutil.which("cc")), reason="needs AVX-512F and a C compiler"
)
def test_kernel_is_built_wherever_it_can_run():
    """On a machine that can run it, a failed build must not pass silently as torch."""
    assert native.why_unavailable() is None


@needs_kernel
@settings(max_examples=60, deadline=None)
@given(
    outer=st.integers(1, 3),
    rows=st.integers(1, 30),
    cols=st.integers(1, 300),
    hidden=st.floats(0.0, 0.95),
    spread=st.floats(0.1, 60.0),
    offset=st.integers(0, 17),
    first_row=st.integers(0, 2),
    threads=st.sampled_from([1, 2]),
    seed=st.integers(0, 2**31 - 1),
)
def test_softmax_rows_matches_a_float64_softmax(
    outer, rows, cols, hidden, spread, offset, first_row, threads, seed
):
    """Any width (the masked tail), any alignment of the result's rows (the streamed
    middle starts at the first 64-byte boundary), a block of rows cut from several grids
    (as a block of rows of several heads is), hidden keys and whole hidden rows."""
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(outer, rows, cols, generator=g) * spread
    s[torch.rand(outer, rows, cols, generator=g) < hidden] = float("-inf")
    s[:, ::7] = float("-inf")  # rows that see no key
    backing = torch.full((outer, rows + 3, cols + offset + 3), 7.0)
    dest = backing[:, first_row : first_row + rows, offset : offset + cols]
    src = s.clone()
    with num_threads(threads):
        assert native.supports(s, dest)
        assert native.softmax_rows(s, dest) is s
    assert torch.equal(s, dest)
    exact = _exact(src)
    err = (dest.double() - exact).abs().max().item()
    err_torch = (native.softmax_rows_reference(src).double() - exact).abs().max().item()
    assert err <= 2 * err_torch + 1e-7
    assert (dest[src == float("-inf")] == 0).all()
    untouched = torch.ones_like(backing, dtype=torch.bool)
    untouched[:, first_row : first_row + rows, offset : offset + cols] = False
    assert (backing[untouched] == 7).all()


@needs_kernel
@settings(max_examples=60, deadline=None)
@given(
    heads=st.integers(1, 3),
    rows=st.integers(1, 20),
    cols=st.integers(1, 90),
    kind=st.sampled_from(["bool", "bool per head", "padding", "bias", "none"]),
    causal=st.booleans(),
    seen0=st.integers(-5, 30),
    scale=st.sampled_from([1.0, 0.125, 0.3]),
    seed=st.integers(0, 2**31 - 1),
)
def test_masks_bias_scale_and_causal_limit_match_the_reference(
    heads, rows, cols, kind, causal, seen0, scale, seed
):
    """Everything the kernel folds into its first pass against torch's ops in float64:
    boolean masks (shared by the heads, per head, one row for every row: key padding), a
    float bias, the scale, and a causal limit that may hide whole rows."""
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(heads, rows, cols, generator=g) * 4
    mask = bias = None
    if kind == "bool":
        mask = torch.rand(rows, cols, generator=g) > 0.4
    elif kind == "bool per head":
        mask = torch.rand(heads, rows, cols, generator=g) > 0.6
    elif kind == "padding":
        mask = torch.arange(cols) < torch.randint(0, cols + 1, (1,), generator=g)
        mask = mask.expand(rows, cols)[:1]  # (1, cols): every row the same
    elif kind == "bias":
        bias = torch.randn(heads, rows, cols, generator=g).neg_().exp_() * -3
    seen = seen0 if causal else None
    exact = native.softmax_rows_reference(
        s.double(), mask, None if bias is None else bias.double(), scale, seen
    )
    got = native.softmax_rows(s.clone(), None, mask, bias, scale, seen)
    torch.testing.assert_close(got.double(), exact, rtol=1e-5, atol=1e-7)
    if mask is not None:
        assert (got[~mask.expand_as(got)] == 0).all()


@needs_kernel
def test_exponentials_hold_over_the_whole_float_range():
    """Scores from -104 (exp underflows) to 88: every step of the range reduction."""
    s = torch.linspace(-104.0, 0.0, 4096).view(4, 1024)
    s[:, 0] = 0.0
    s = torch.cat([s, s + 88.0])  # the same rows shifted: the kernel subtracts the max
    dest = torch.empty_like(s)
    got = native.softmax_rows(s.clone(), dest)
    # below the smallest normal float (1.2e-38) the kernel gives zeros, not denormals
    torch.testing.assert_close(got.double(), _exact(s), rtol=4e-6, atol=1.2e-38)
    assert (got[s < -87.34] == 0).all()


@needs_kernel
def test_nan_and_inf_propagate_as_in_torch():
    s = torch.randn(4, 37)
    s[0, 5] = float("nan")
    s[1] = float("nan")  # no finite maximum at all: still NaN, not the zeros of a hidden row
    s[2, 9] = float("inf")  # inf - inf
    s[3] = float("-inf")
    out = native.softmax_rows(s.clone(), torch.empty_like(s))
    assert out[:3].isnan().all()
    assert (out[3] == 0).all()


def test_streams_only_where_the_layout_allows():
    s = torch.randn(6, 32)
    assert not native.supports(s.double(), s.double().clone())
    assert not native.supports(s, s[:, :16].clone())  # shapes differ
    assert not native.supports(s, s)  # the same memory
    assert not native.supports(s[:, :16], s[:, 16:])  # rows interleaved in one buffer
    assert not native.supports(s.t(), s.t().clone())  # rows not contiguous
    assert not native.supports(s[:1].expand(6, 32), torch.empty(6, 32))  # rows overlap
    assert not native.supports(s.view(2, 3, 32).transpose(0, 1), torch.empty(3, 2, 32))  # grids
    grids = torch.randn(2, 3, 4, 32)[:, :2]  # no one stride from grid to grid
    assert not native.supports(grids, torch.empty_like(grids))
    assert native.supports(torch.randn(0, 5), torch.empty(0, 5))
    assert not native.supports(s, mask=torch.ones(6, 32))  # a float mask is a bias
    assert not native.supports(s, bias=torch.zeros(6, 32, dtype=torch.float64))
    assert not native.supports(s, mask=torch.ones(6, 1, dtype=torch.bool).expand(6, 32))
    assert native.supports(s, mask=torch.ones(1, 32, dtype=torch.bool))  # broadcast rows
    with pytest.raises(ValueError, match="float32 CPU rows"):
        native.softmax_rows(s, s)


def test_a_build_is_cached_and_written_atomically(tmp_path, monkeypatch):
    compiler = shutil.which("cc") or pytest.skip("needs a C compiler")
    first = native.build(compiler, tmp_path)
    assert first.exists() and [p.name for p in tmp_path.iterdir()] == [first.name]
    calls = []
    real_run = subprocess.run
    monkeypatch.setattr(
        native.subprocess, "run", lambda cmd, **kw: calls.append(cmd) or real_run(cmd, **kw)
    )
    assert native.build(compiler, tmp_path) == first
    assert calls == [[compiler, "--version"]]  # no second compile


def test_a_header_beside_the_source_is_part_of_the_build(tmp_path):
    """A changed header gives a new build: the kernels include ``exp16.h``."""
    compiler = shutil.which("cc") or pytest.skip("needs a C compiler")
    source = tmp_path / "kernel.c"
    source.write_text('#include "value.h"\nint qkv_value(void) { return VALUE; }\n')
    (tmp_path / "value.h").write_text("#define VALUE 1\n")
    first = native.build(compiler, tmp_path / "built", source)
    (tmp_path / "value.h").write_text("#define VALUE 2\n")
    second = native.build(compiler, tmp_path / "built", source)
    assert first != second
    assert [ctypes.CDLL(str(so)).qkv_value() for so in (first, second)] == [1, 2]


def test_a_failed_build_says_why_and_leaves_nothing(tmp_path):
    fake = tmp_path / "cc"
    fake.write_text(
        '#!/bin/sh\n[ "$1" = --version ] && echo fake 1.0 && exit 0\n'
        "echo 'softmax_rows.c:1: no such compiler' >&2\nexit 1\n"
    )
    fake.chmod(0o755)
    out = tmp_path / "cache"
    with pytest.raises(RuntimeError, match="no such compiler"):
        native.build(str(fake), out)
    assert list(out.iterdir()) == []


def test_turned_off_by_the_environment(monkeypatch):
    monkeypatch.setenv("QKV_NATIVE", "0")
    native._load.cache_clear()
    try:
        assert native.why_unavailable() == "turned off by QKV_NATIVE=0"
        assert not native.supports(torch.randn(2, 8), torch.empty(2, 8))
    finally:
        monkeypatch.delenv("QKV_NATIVE")
        native._load.cache_clear()


@needs_kernel
@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("kind", ["bool", "bias", "causal", "padding-causal"])
@pytest.mark.parametrize("d", [16, 24], ids=["scale-pow2", "scale-other"])
def test_blocked_weights_stream_through_the_kernel(monkeypatch, threads, kind, d):
    """The per-block path of the weights calls the kernel with the user's mask or bias,
    the scale and the causal limit (Tq < Tk: bottom-right), and the probabilities it
    leaves in the scratch block give the same output as the weights it returns; with
    threads, each block holds rows of several heads (3 heads: a last unit of 1 or 2)."""
    monkeypatch.setattr(weights_module, "SMALL_ELEMENTS", 100)  # the per-pair loop
    monkeypatch.setattr(weights_module, "ROW_BLOCK_ELEMENTS", 5 * 67)  # 5 rows per block
    used = []
    real = native.softmax_rows
    monkeypatch.setattr(native, "softmax_rows", lambda s, *a: used.append(s.shape) or real(s, *a))
    q = torch.randn(2, 3, 23, d)
    k, v = (torch.randn(2, 3, 67, d) for _ in range(2))
    mask = torch.rand(2, 1, 23, 67) > 0.5
    mask[0, 0, 4] = False  # a row that sees nothing
    if kind == "bias":
        mask = torch.randn(1, 3, 23, 67).masked_fill(~mask[:1], float("-inf"))
    elif kind == "padding-causal":
        mask = qkv.padding_mask(torch.tensor([67, 40]), 67)[:, None, None, :]
    causal = kind.endswith("causal")
    mask = None if kind == "causal" else mask
    with num_threads(threads):
        out, w = qkv.scaled_dot_product_attention(
            q, k, v, mask, causal=causal, need_weights=True, backend="sdpa"
        )
    assert sum(math.prod(shape) for shape in used) == w.numel()  # every weight, once
    ref_out, ref_w = naive_attention(q, k, v, mask, causal)
    torch.testing.assert_close(w.double(), ref_w, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(out.double(), ref_out, atol=1e-5, rtol=1e-5)
    if kind in ("bool", "bias"):
        assert (w[0, :, 4] == 0).all() and (out[0, :, 4] == 0).all()
