"""Cheap attention weights: recomputed beside a fused output, only the heads and rows asked for."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import qkv
from qkv.functional import _request
from qkv.kernels import weights as weights_module
from qkv.kernels.cpu.memory import KeptResults
from tests.conftest import naive_attention

BACKENDS = ["sdpa", "chunked", "reference"]
DTYPE_IDS = {
    torch.float64: "fp64",
    torch.float32: "fp32",
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
}


def _case(kind: str, dtype=torch.float64):
    b, h, hkv, tq, tk, d = 2, 4, 2, 9, 13, 8
    q = torch.randn(b, h, tq, d, dtype=dtype)
    k, v = (torch.randn(b, hkv, tk, d, dtype=dtype) for _ in range(2))
    mask = None
    if kind == "bool":
        mask = torch.rand(b, h, tq, tk) > 0.4
        mask[1, 2, 3] = False  # one row that sees nothing
    elif kind == "float":
        mask = torch.randn(1, h, tq, tk, dtype=dtype)
    elif kind == "padding":
        mask = qkv.padding_mask(torch.tensor([tk, 4]), tk)[:, None, None, :]
    return q, k, v, mask


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["none", "bool", "float", "padding"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_weights_match_float64_reference(backend, kind, causal):
    q, k, v, mask = _case(kind)
    out, w = qkv.scaled_dot_product_attention(
        q, k, v, mask, causal=causal, need_weights=True, backend=backend
    )
    ref_out, ref_w = naive_attention(q, k, v, mask, causal)
    torch.testing.assert_close(w, ref_w.expand_as(w), atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(out, ref_out, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("backend", BACKENDS)
def test_selected_heads_and_rows_are_slices_of_the_full_weights(backend):
    q, k, v, mask = _case("bool")
    _, full = qkv.scaled_dot_product_attention(q, k, v, mask, need_weights=True)
    heads = [3, 0]
    out, some = qkv.scaled_dot_product_attention(
        q, k, v, mask, need_weights=heads, weight_rows=slice(2, 7), backend=backend
    )
    assert some.shape == (2, 2, 5, 13)
    torch.testing.assert_close(some, full[:, heads, 2:7], atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(out, qkv.scaled_dot_product_attention(q, k, v, mask))


def test_large_problems_go_block_by_block(monkeypatch):
    monkeypatch.setattr(weights_module, "SMALL_ELEMENTS", 100)  # force the per-head loop
    monkeypatch.setattr(weights_module, "ROW_BLOCK_ELEMENTS", 3 * 13)  # 3 rows per block
    q, k, v, mask = _case("bool")
    _, w = qkv.scaled_dot_product_attention(q, k, v, mask, causal=True, need_weights=[1, 2])
    _, ref = naive_attention(q, k, v, mask, causal=True)
    torch.testing.assert_close(w, ref[:, [1, 2]], atol=1e-12, rtol=1e-10)


def test_blocked_weights_of_strided_heads_match_the_reference(monkeypatch):
    """Heads cut from a projection's (B, T, H, D) layout are strided: each (batch, head)
    pair copies its keys and values into the same reused memory, which must hold that
    pair's and no other's when its rows are computed."""
    monkeypatch.setattr(weights_module, "SMALL_ELEMENTS", 100)  # the per-pair loop
    monkeypatch.setattr(weights_module, "ROW_BLOCK_ELEMENTS", 4 * 11)  # 4 rows per block
    b, h, tq, tk, d = 2, 3, 10, 11, 8
    q = torch.randn(b, tq, h, d, dtype=torch.float64).transpose(1, 2)
    k, v = (torch.randn(b, tk, h, d, dtype=torch.float64).transpose(1, 2) for _ in range(2))
    assert not k[0, 1].is_contiguous()
    mask = torch.rand(b, 1, tq, tk) > 0.3
    out, w = qkv.scaled_dot_product_attention(q, k, v, mask, need_weights=True, backend="sdpa")
    ref_out, ref_w = naive_attention(q, k, v, mask)
    torch.testing.assert_close(w, ref_w, atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(out, ref_out, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_low_precision_weights_sum_to_one(dtype):
    q, k, v, mask = _case("padding", dtype)
    _, w = qkv.scaled_dot_product_attention(q, k, v, mask, need_weights=True, backend="sdpa")
    assert w.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(w.float().sum(-1), torch.ones(w.shape[:-1]), atol=tol, rtol=0)
    assert (w[1, :, :, 4:] == 0).all()  # padded keys get exactly zero


@settings(max_examples=25, deadline=None)
@given(
    heads=st.lists(st.integers(0, 3), min_size=1, max_size=4, unique=True),
    start=st.integers(0, 8),
    length=st.integers(1, 9),
)
def test_any_selection_matches_the_reference_backend(heads, start, length):
    q, k, v, mask = _case("float")
    rows = slice(start, min(start + length, 9))
    _, w = qkv.scaled_dot_product_attention(q, k, v, mask, need_weights=heads, weight_rows=rows)
    _, ref = qkv.scaled_dot_product_attention(
        q, k, v, mask, need_weights=heads, weight_rows=rows, backend="reference"
    )
    torch.testing.assert_close(w, ref, atol=1e-12, rtol=1e-10)


def test_bad_selections_are_rejected():
    q, k, v, _ = _case("none")
    with pytest.raises(ValueError, match="heads must be indices in"):
        qkv.scaled_dot_product_attention(q, k, v, need_weights=[4])
    with pytest.raises(ValueError, match="selects no query row"):
        qkv.scaled_dot_product_attention(q, k, v, need_weights=True, weight_rows=slice(5, 5))
    for wrong in (2, 1.0, "01"):  # an int is not a head list (True is every head)
        with pytest.raises(TypeError, match="need_weights .*(sequence of head indices|integers)"):
            qkv.scaled_dot_product_attention(q, k, v, need_weights=wrong)
    with pytest.raises(TypeError, match="heads must be integers"):
        qkv.scaled_dot_product_attention(q, k, v, need_weights=[0, 1.5])
    with pytest.raises(ValueError, match="weight_rows .*pass need_weights too"):
        qkv.scaled_dot_product_attention(q, k, v, weight_rows=slice(0, 2))
    with pytest.raises(ValueError, match="weight_rows .*pass need_weights too"):
        qkv.MultiHeadAttention(16, 4)(torch.randn(2, 5, 16), weight_rows=slice(0, 2))


def test_module_returns_only_the_heads_asked_for():
    torch.manual_seed(0)
    mha = qkv.MultiHeadAttention(32, 4).double().eval()
    x = torch.randn(2, 7, 32, dtype=torch.float64)
    out_all, w_all = mha(x, need_weights=True, causal=True)
    out_two, w_two = mha(x, need_weights=[2, 1], causal=True)
    torch.testing.assert_close(out_two, out_all)
    torch.testing.assert_close(w_two, w_all[:, [2, 1]])
    assert mha(x, causal=True)[1] is None


def _all_weights(q, k, v, mask):
    return qkv.scaled_dot_product_attention(q, k, v, mask, need_weights=True, backend="sdpa")


def test_large_weights_reuse_their_storage_only_once_released(monkeypatch):
    """The weights' storage is handed out again only when no tensor refers to it."""
    monkeypatch.setattr(weights_module, "SMALL_ELEMENTS", 100)  # the blocked path
    monkeypatch.setattr(weights_module, "kept_results", KeptResults(1 << 20, min_bytes=1))
    cases = [_case("bool", torch.float32) for _ in range(3)]
    _, w1 = _all_weights(*cases[0])
    view = w1[1, 2]  # a view alone keeps the storage in use
    expected = view.clone()
    del w1
    _, w2 = _all_weights(*cases[1])
    assert w2.data_ptr() != view.data_ptr()
    assert torch.equal(view, expected)  # the held weights were not overwritten
    kept_ptrs = {view.data_ptr() - view.storage_offset() * 4, w2.data_ptr()}
    del view, w2
    out, w3 = _all_weights(*cases[2])
    assert w3.data_ptr() in kept_ptrs  # an old storage again, every element rewritten
    ref_out, ref_w = naive_attention(*(t.double() for t in cases[2][:3]), cases[2][3], False)
    torch.testing.assert_close(w3.double(), ref_w, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(out.double(), ref_out, atol=1e-5, rtol=1e-5)


def test_weights_under_autograd_are_never_kept(monkeypatch):
    kept = KeptResults(1 << 20, min_bytes=1)
    monkeypatch.setattr(weights_module, "kept_results", kept)
    q, k, v, mask = _case("none", torch.float32)
    q.requires_grad_(True)
    _, w = qkv.scaled_dot_product_attention(q, k, v, need_weights=True, backend="chunked")
    (w * torch.randn_like(w)).sum().backward()
    assert kept._kept == [] and q.grad is not None


@pytest.mark.parametrize("first", ["inference", "plain"])
def test_kept_weights_never_cross_inference_mode(monkeypatch, first):
    """Weights kept from a call under torch.inference_mode are inference tensors: handed
    out again to a call outside it, they could not be written (torch's softmax refused)
    nor used with autograd; and the other way round the caller asked for an inference
    tensor. Each call gets a buffer of its own mode, with the formula's weights."""
    monkeypatch.setattr(weights_module, "SMALL_ELEMENTS", 100)  # the blocked path
    monkeypatch.setattr(weights_module, "kept_results", KeptResults(1 << 20, min_bytes=1))
    modes = {"inference": torch.inference_mode, "plain": torch.no_grad}
    second = "plain" if first == "inference" else "inference"
    for mode in (first, second):
        q, k, v, mask = _case("bool", torch.float32)
        with modes[mode]():
            _, w = qkv.scaled_dot_product_attention(q, k, v, mask, need_weights=True)
        assert w.is_inference() == (mode == "inference")
        _, ref_w = naive_attention(q.double(), k.double(), v.double(), mask, False)
        torch.testing.assert_close(w.double(), ref_w, atol=1e-6, rtol=1e-5)
        del w  # released: its storage may be handed out again


def _rows_unseen(kind: str):
    """q, k, v (float64, requiring gradients) and a mask under which some query rows see
    no key, with the causal flag: a boolean mask with empty rows, a float mask with a row
    of -inf (its gradient is checked too), or causal with more queries than keys."""
    b, h, hkv, d = 2, 4, 2, 8
    tq, tk = (7, 4) if kind == "causal-tq>tk" else (6, 5)
    q = torch.randn(b, h, tq, d, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(b, hkv, tk, d, dtype=torch.float64, requires_grad=True) for _ in "kv")
    mask = None
    if kind == "bool":
        mask = torch.rand(b, h, tq, tk) > 0.4
        mask[:, :, 1] = False
    elif kind == "float":
        mask = torch.randn(1, h, tq, tk, dtype=torch.float64)
        mask[:, :, 2] = float("-inf")
        mask.requires_grad_(True)
    return q, k, v, mask, kind == "causal-tq>tk"


@pytest.mark.parametrize("backend", ["sdpa", "chunked"])
@pytest.mark.parametrize("selection", ["all", "heads", "heads-and-rows"])
@pytest.mark.parametrize("kind", ["bool", "float", "causal-tq>tk"])
def test_weights_under_autograd_equal_the_reference(backend, selection, kind):
    """A fused backend named explicitly returns weights under autograd (``auto`` prefers
    the reference there): outputs, weights and the gradients of both equal float64
    attention, zeros and not NaN for rows that see no key."""
    q, k, v, mask, causal = _rows_unseen(kind)
    heads = {"all": True, "heads": [3, 0], "heads-and-rows": [1]}[selection]
    rows = slice(1, 4) if selection == "heads-and-rows" else None
    out, w = qkv.scaled_dot_product_attention(
        q, k, v, mask, causal=causal, need_weights=heads, weight_rows=rows, backend=backend
    )
    ref_out, ref_w = naive_attention(q, k, v, mask, causal)
    ref_w = ref_w.expand(q.shape[0], -1, -1, -1)[:, [0, 1, 2, 3] if heads is True else heads]
    ref_w = ref_w[:, :, rows] if rows is not None else ref_w
    torch.testing.assert_close(out, ref_out, atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(w, ref_w, atol=1e-12, rtol=1e-10)
    inputs = [t for t in (q, k, v, mask) if t is not None and t.requires_grad]
    g_out, g_w = torch.randn_like(out), torch.randn_like(w)
    ours = torch.autograd.grad((out * g_out).sum() + (w * g_w).sum(), inputs)
    theirs = torch.autograd.grad((ref_out * g_out).sum() + (ref_w * g_w).sum(), inputs)
    for a, b in zip(ours, theirs):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-8)


def test_auto_still_leaves_weights_under_autograd_to_the_reference():
    q, k, v, _, _ = _rows_unseen("bool")
    d = qkv.explain_dispatch(q, k, v, need_weights=True)
    assert d.chosen == "reference" and "under autograd" in d.reasons["sdpa"][0]
    with torch.no_grad():
        assert qkv.explain_dispatch(q, k, v, need_weights=True).chosen == "sdpa"


@pytest.mark.parametrize("backend", ["auto", *BACKENDS])
@pytest.mark.parametrize("kind", ["bool", "float", "padding"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_a_nan_query_row_stays_nan_beside_rows_that_see_no_key(backend, kind, causal):
    """Weights without autograd took every NaN row for one that sees no key, so a query
    row holding NaN came back as zero weights (auto, sdpa and chunked; the reference
    gives NaN), and for auto and sdpa a zero output. Now that row is NaN, a row the mask
    hides is still zeros, and the others match float64 math."""
    q, k, v, mask = _case(kind, torch.float32)
    if kind == "bool":
        mask = mask.clone()
        mask[..., 5, :] = False  # a hidden row in every sequence and head
    q[0, 1, 6, int(torch.randint(0, 8, ()))] = float("nan")
    out, w = qkv.scaled_dot_product_attention(
        q, k, v, mask, causal=causal, need_weights=True, backend=backend
    )
    assert torch.isnan(w[0, 1, 6]).any()
    # chunked's output comes from torch's CPU flash kernel, which gives zeros for a NaN
    # row where no mask goes along (torch 2.13); the others compute it from the weights
    assert backend == "chunked" or torch.isnan(out[0, 1, 6]).all()
    keep = torch.ones(w.shape[:3], dtype=torch.bool)
    keep[0, 1, 6] = False
    want_out, want_w = naive_attention(q, k, v, mask, causal)
    torch.testing.assert_close(w[keep].double(), want_w.expand(w.shape)[keep], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(out[keep].double(), want_out[keep], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize(
    "fill", [torch.finfo(torch.float32).min, -1e30, -1e6], ids=["f32-min", "-1e30", "-1e6"]
)
@pytest.mark.parametrize("dtype", list(DTYPE_IDS), ids=list(DTYPE_IDS.values()))
def test_weights_from_an_lse_at_a_huge_negative_sum_to_one(fill, dtype):
    """``exp(s - lse)`` needs an lse as precise as the weights: at finfo(float32).min it has
    rounded log(Tk) away, and every weight of the row was 1 (at -1e6 off by up to 3%).
    Those rows get the softmax of their whole row instead: weights that sum to 1."""
    q = torch.randint(-2, 3, (2, 2, 5, 16)).to(dtype)  # scores: multiples of 1/4, exact
    k = torch.randint(-2, 3, (2, 2, 300, 16)).to(dtype)  # in float32 beside -1e6
    v = torch.randn(2, 2, 300, 16, dtype=dtype)
    mask = torch.zeros(2, 1, 5, 300, dtype=torch.float64 if dtype == torch.float64 else None)
    mask[:, :, 1] = fill  # the whole row at the fill
    mask[:, :, 2, ::2] = fill  # half of it (those keys weigh 0)
    mask[1] = fill  # a fully padded sequence
    _, lse = qkv.attention_lse(q, k, v, mask, scale=0.25, backend="reference")
    req = _request(q, k, v, mask, False, 0.25, 0.0, True, True)
    weights = weights_module.attention_weights(req, lse)
    _, want = naive_attention(q, k, v, mask, scale=0.25)
    atol = {torch.float64: 1e-12, torch.float32: 2e-6, torch.bfloat16: 4e-3, torch.float16: 5e-4}
    torch.testing.assert_close(weights.double(), want, atol=atol[dtype], rtol=0)
    sums = weights.double().sum(-1)
    torch.testing.assert_close(sums, torch.ones_like(sums), atol=atol[dtype], rtol=0)
