"""scaled_dot_product_attention: every backend against float64 math and torch SDPA."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

import qkv
from tests.conftest import naive_attention

BACKENDS = ["reference", "sdpa", "chunked"]
# benchmarks/device.sh runs the half-precision mask tests again with QKV_TEST_DEVICE=cuda
DEVICE = torch.device(os.environ.get("QKV_TEST_DEVICE", "cpu"))
SHAPES = {
    "self": (2, 4, 4, 9, 9, 16),
    "cross_tq<tk": (2, 4, 4, 5, 13, 8),
    "cross_tq>tk": (1, 4, 4, 11, 6, 8),
    "gqa": (2, 8, 2, 7, 10, 16),
    "mqa": (2, 4, 1, 6, 6, 8),
}
MASKS = ["none", "bool", "float", "keypad"]


def _inputs(shape, dtype=torch.float32, grad=False):
    b, h, hkv, tq, tk, d = shape
    q = torch.randn(b, h, tq, d, dtype=dtype, requires_grad=grad)
    k = torch.randn(b, hkv, tk, d, dtype=dtype, requires_grad=grad)
    v = torch.randn(b, hkv, tk, d, dtype=dtype, requires_grad=grad)
    return q, k, v


def _mask(kind, shape):
    b, h, _, tq, tk, _ = shape
    if kind == "none":
        return None
    if kind == "bool":
        m = torch.rand(b, h, tq, tk) > 0.3
        m[..., 0] = True  # keep every row non-empty here; empty rows are tested separately
        return m
    if kind == "float":
        return torch.randn(b, 1, tq, tk)
    lengths = torch.randint(1, tk + 1, (b,))
    return qkv.padding_mask(lengths, tk)[:, None, None, :]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape_id", list(SHAPES))
@pytest.mark.parametrize("mask_kind", MASKS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_matches_float64_reference(backend, shape_id, mask_kind, causal):
    shape = SHAPES[shape_id]
    q, k, v = _inputs(shape, torch.float64)
    mask = _mask(mask_kind, shape)
    out = qkv.scaled_dot_product_attention(q, k, v, mask, causal=causal, backend=backend)
    expected, _ = naive_attention(q, k, v, mask, causal)
    torch.testing.assert_close(out, expected, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape_id", ["self", "gqa", "cross_tq<tk"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gradients_match_float64_reference(backend, shape_id, causal):
    shape = SHAPES[shape_id]
    q, k, v = _inputs(shape, torch.float64, grad=True)
    mask = _mask("bool", shape)
    grad_out = torch.randn(shape[0], shape[1], shape[3], shape[5], dtype=torch.float64)
    out = qkv.scaled_dot_product_attention(q, k, v, mask, causal=causal, backend=backend)
    ours = torch.autograd.grad(out, (q, k, v), grad_out)
    ref, _ = naive_attention(q, k, v, mask, causal)
    theirs = torch.autograd.grad(ref, (q, k, v), grad_out)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-8)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_float32_matches_torch_sdpa(backend, causal):
    q, k, v = _inputs((3, 8, 8, 33, 33, 32))
    mask = torch.rand(3, 1, 33, 33) > 0.2
    mask[..., 0] = True
    ours = qkv.scaled_dot_product_attention(q, k, v, mask, causal=causal, backend=backend)
    full = mask & torch.ones(33, 33, dtype=torch.bool).tril() if causal else mask
    theirs = F.scaled_dot_product_attention(q, k, v, attn_mask=full)
    torch.testing.assert_close(ours, theirs, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kv_heads", [4, 2, 1], ids=["gqa-2", "gqa-4", "mqa"])
def test_gqa_matches_torch_sdpa_enable_gqa(backend, kv_heads):
    """Query head h reads key/value head h // (H / Hkv), as torch's ``enable_gqa=True``;
    a float mask per query head would show any other grouping."""
    q = torch.randn(2, 8, 7, 16, dtype=torch.float64)
    k = torch.randn(2, kv_heads, 9, 16, dtype=torch.float64)
    v = torch.randn(2, kv_heads, 9, 12, dtype=torch.float64)
    mask = torch.randn(2, 8, 7, 9, dtype=torch.float64) * 3
    ours = qkv.scaled_dot_product_attention(q, k, v, mask, scale=0.3, backend=backend)
    theirs = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3, enable_gqa=True)
    torch.testing.assert_close(ours, theirs, atol=1e-12, rtol=0)
    k, v = k[:, :, :7], v[:, :, :7]
    ours = qkv.scaled_dot_product_attention(q, k, v, causal=True, backend=backend)
    theirs = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(ours, theirs, atol=1e-12, rtol=0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mask_kind", ["bool", "float"])
def test_fully_masked_rows_are_zero_never_nan(backend, dtype, mask_kind):
    q, k, v = _inputs((2, 2, 2, 6, 5, 8), dtype, grad=True)
    allowed = torch.rand(2, 2, 6, 5) > 0.4
    allowed[:, :, 2] = False  # query row 2 sees nothing
    allowed[:, :, 3, 0] = True
    if mask_kind == "bool":
        mask = allowed
    else:
        mask = torch.zeros(2, 2, 6, 5, dtype=dtype).masked_fill(~allowed, float("-inf"))
    need_weights = backend != "sdpa"
    res = qkv.scaled_dot_product_attention(
        q, k, v, mask, backend=backend, need_weights=need_weights
    )
    out = res[0] if need_weights else res
    assert torch.isfinite(out).all()
    assert (out[:, :, 2] == 0).all()
    if need_weights:
        assert (res[1][:, :, 2] == 0).all()
    out.float().sum().backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("backend", BACKENDS)
def test_half_precision_error_is_close_to_torch(dtype, backend):
    q, k, v = _inputs((2, 4, 4, 40, 40, 32), torch.float64)
    exact, _ = naive_attention(q, k, v, causal=True)
    ours = qkv.scaled_dot_product_attention(
        q.to(dtype), k.to(dtype), v.to(dtype), causal=True, backend=backend
    )
    torch_math = F.scaled_dot_product_attention(
        q.to(dtype), k.to(dtype), v.to(dtype), is_causal=True
    )
    err_ours = (ours.double() - exact).abs().max().item()
    err_torch = (torch_math.double() - exact).abs().max().item()
    assert ours.dtype == dtype
    assert err_ours <= 2 * err_torch + 1e-3


def _within_twice_torchs_error(ours, theirs, exact, atol):
    exact = exact.cpu()
    err_ours = (ours.double().cpu() - exact).abs().max().item()
    err_torch = (theirs.double().cpu() - exact).abs().max().item()
    assert err_ours <= 2 * err_torch + atol, (err_ours, err_torch)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("backend", BACKENDS + ["auto"])
def test_half_inputs_with_a_float32_mask_of_huge_negatives_act_as_torch(dtype, backend):
    """A Hugging Face-style float32 mask, torch.finfo(float32).min on a whole row and on
    padding keys, beside half inputs: torch adds it to float32 scores (the row then attends
    uniformly); every backend does the same, without NaN, also in the gradients."""
    q, k, v = (x.to(DEVICE) for x in _inputs((2, 4, 4, 6, 5, 8), torch.float64))
    mask = torch.zeros(2, 1, 6, 5, device=DEVICE)
    mask[:, :, 0] = torch.finfo(torch.float32).min
    mask[1, :, :, 3:] = torch.finfo(torch.float32).min
    exact = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.double())
    q, k, v = (x.to(dtype).requires_grad_() for x in (q, k, v))
    ours = qkv.scaled_dot_product_attention(q, k, v, mask, backend=backend)
    theirs = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    # atol: one unit in the last place at 1 (a max over few values is noisy: in bf16 the
    # ratio to torch's error reached 2.6 in 4 of 300 seeds, median 1.13)
    atol = torch.finfo(dtype).eps
    _within_twice_torchs_error(ours, theirs, exact, atol)
    with torch.no_grad():  # inference takes other paths (chunked: split kernel calls)
        inference = qkv.scaled_dot_product_attention(q, k, v, mask, backend=backend)
    _within_twice_torchs_error(inference, theirs, exact, atol)
    ours.float().sum().backward()
    assert all(torch.isfinite(x.grad).all() for x in (q, k, v))


@pytest.mark.parametrize("backend", BACKENDS)
def test_float16_scores_past_its_largest_value_stay_finite(backend):
    """Products q . k above 65504 overflow float16, but torch's kernels score in float32."""
    q, k, v = (x.to(DEVICE) for x in _inputs((1, 2, 2, 4, 6, 48), torch.float64))
    q, k = q * 120, k * 120
    assert (q @ k.transpose(-1, -2)).abs().max() > 2 * torch.finfo(torch.float16).max
    exact, _ = naive_attention(q.cpu(), k.cpu(), v.cpu())
    q, k, v = (x.half() for x in (q, k, v))
    ours, w = qkv.scaled_dot_product_attention(q, k, v, backend=backend, need_weights=True)
    _within_twice_torchs_error(ours, F.scaled_dot_product_attention(q, k, v), exact, 1e-3)
    assert torch.isfinite(w).all()


def test_weights_sum_to_one_and_equal_reference():
    q, k, v = _inputs((2, 4, 2, 7, 9, 8), torch.float64)
    mask = torch.rand(2, 1, 7, 9) > 0.5
    mask[..., -1] = True
    for backend in ["reference", "chunked"]:
        out, w = qkv.scaled_dot_product_attention(q, k, v, mask, need_weights=True, backend=backend)
        assert w.shape == (2, 4, 7, 9)
        torch.testing.assert_close(w.sum(-1), torch.ones(2, 4, 7, dtype=torch.float64))
        assert (w.masked_select(~mask.expand_as(w)) == 0).all()
        _, expected = naive_attention(q, k, v, mask)
        torch.testing.assert_close(w, expected)


def test_scale_argument():
    q, k, v = _inputs((1, 2, 2, 4, 4, 8), torch.float64)
    out = qkv.scaled_dot_product_attention(q, k, v, scale=0.05)
    torch.testing.assert_close(out, naive_attention(q, k, v, scale=0.05)[0])


def test_dropout_only_in_backends_that_support_it():
    q, k, v = _inputs((1, 2, 2, 4, 4, 8))
    torch.manual_seed(0)
    a = qkv.scaled_dot_product_attention(q, k, v, dropout_p=0.5, backend="reference")
    assert not torch.allclose(a, qkv.scaled_dot_product_attention(q, k, v))
    with pytest.raises(ValueError, match="chunked.*dropout"):
        qkv.scaled_dot_product_attention(q, k, v, dropout_p=0.5, backend="chunked")


@pytest.mark.parametrize("backend", ["auto", *BACKENDS])
@pytest.mark.parametrize(
    "sizes", [(0, 4, 5), (2, 0, 5), (2, 4, 0), (0, 0, 0)], ids=["B=0", "Tq=0", "Tk=0", "all-0"]
)
@pytest.mark.parametrize("request_kind", ["weights", "some-heads", "causal-mask", "lse"])
def test_zero_length_inputs_give_empty_or_zero_results(backend, sizes, request_kind):
    """B, Tq or Tk of 0: results of the right shapes; with no key, zeros (and lse -inf),
    as the reference backend gives."""
    b, tq, tk = sizes
    q, k, v = torch.randn(b, 4, tq, 8), torch.randn(b, 2, tk, 8), torch.randn(b, 2, tk, 6)
    if request_kind == "lse" and backend == "sdpa":  # refused by name, also when empty
        with pytest.raises(ValueError, match="does not return the log-sum-exp"):
            qkv.attention_lse(q, k, v, causal=True, backend=backend)
        return
    if request_kind == "lse":
        out, lse = qkv.attention_lse(q, k, v, causal=True, backend=backend)
        assert lse.shape == (b, 4, tq)
        assert tk > 0 or torch.isneginf(lse).all()
    else:
        heads = [3, 1] if request_kind == "some-heads" else True
        mask = torch.ones(tq, tk, dtype=torch.bool) if request_kind == "causal-mask" else None
        causal = request_kind == "causal-mask"
        out, w = qkv.scaled_dot_product_attention(
            q, k, v, mask, causal=causal, need_weights=heads, backend=backend
        )
        assert w.shape == (b, 4 if heads is True else 2, tq, tk)
    assert out.shape == (b, 4, tq, 6)
    assert tk > 0 or (out == 0).all()


@pytest.mark.parametrize("backend", ["auto", *BACKENDS])
def test_head_size_zero_matches_torch(backend):
    """D = 0: every score is an empty sum, 0, so each row averages the values, as torch's
    SDPA gives (the default scale 1/sqrt(0) was a ZeroDivisionError)."""
    q, k, v = torch.randn(2, 4, 3, 0), torch.randn(2, 2, 5, 0), torch.randn(2, 2, 5, 6)
    out, w = qkv.scaled_dot_product_attention(q, k, v, need_weights=True, backend=backend)
    expected = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(w, torch.full((2, 4, 3, 5), 0.2))


@pytest.mark.parametrize("backend", ["auto", *BACKENDS])
@pytest.mark.parametrize("sizes", [(0, 4, 5), (2, 0, 5), (2, 4, 0)], ids=["B=0", "Tq=0", "Tk=0"])
@pytest.mark.parametrize("layout", ["key-padding", "per-row", "full"])
@pytest.mark.parametrize("kind", ["bool", "float"])
def test_zero_length_inputs_with_masks_of_every_layout(backend, sizes, layout, kind):
    """Masks over empty batches, queries or keys: chunked raised 'amin(): Expected
    reduction dim' (a float mask with Tk = 0), 'not enough values to unpack' (a mask the
    same for every query row, with Tq = 0) and, for the lse, 'torch.cat(): expected a
    non-empty list' (a mask with B = 0). Now all agree with float64 math."""
    b, tq, tk = sizes
    shape = {"key-padding": (b, 1, 1, tk), "per-row": (tq, 1), "full": (b, 4, tq, tk)}[layout]
    mask = torch.rand(shape) < 0.7
    if kind == "float":
        mask = torch.randn(shape).masked_fill(~mask, float("-inf"))
    q, k, v = torch.randn(b, 4, tq, 8), torch.randn(b, 2, tk, 8), torch.randn(b, 2, tk, 6)
    want, want_w = naive_attention(q, k, v, mask)
    out, w = qkv.scaled_dot_product_attention(q, k, v, mask, need_weights=True, backend=backend)
    torch.testing.assert_close(out.double(), want)
    torch.testing.assert_close(w.double(), want_w)
    if backend != "sdpa":  # sdpa refuses the lse by name
        out, lse = qkv.attention_lse(q, k, v, mask, backend=backend)
        torch.testing.assert_close(out.double(), want)
        assert lse.shape == (b, 4, tq) and (tk > 0 or torch.isneginf(lse).all())
