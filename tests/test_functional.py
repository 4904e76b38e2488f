"""qkv/functional.py: the public attention functions, their inputs, masks and the merge.

``scaled_dot_product_attention`` and ``attention_lse`` on every backend against float64
math and torch's SDPA; bad arguments named in one line; the mask helpers
(``from_torch_masks``, ``combine_masks``) and masks at work; the log-sum-exp and
``merge_attention``. The formula itself and its mask helpers (``causal_mask``,
``padding_mask``) are tested in ``test_attention.py``, the dispatch between backends in
``kernels/test_dispatch.py``.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.attention import SDPBackend, sdpa_kernel

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


# --- every backend against float64 math and torch's SDPA ----------------------------------


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
@pytest.mark.parametrize(
    "dtype",
    [torch.float32, torch.float64, torch.bfloat16, torch.float16],
    ids=["fp32", "fp64", "bf16", "fp16"],
)
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


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
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
def test_half_inputs_with_a_float32_mask_of_huge_negatives_act_as_torch(dtype, backend, request):
    """A Hugging Face-style float32 mask, torch.finfo(float32).min on a whole row and on
    padding keys, beside half inputs: torch adds it to float32 scores (the row then attends
    uniformly); every backend does the same, without NaN, also in the gradients."""
    if DEVICE.type == "cuda" and backend != "reference":
        # an H200 with torch 2.11 (2026-12-04): the fused CUDA kernels behind these backends
        # were off by about 1 (the math kernel's error: under 0.01)
        request.applymarker(pytest.mark.xfail(strict=True, reason="CUDA kernels, masked row"))
    q, k, v = (x.to(DEVICE) for x in _inputs((2, 4, 4, 6, 5, 8), torch.float64))
    mask = torch.zeros(2, 1, 6, 5, device=DEVICE)
    mask[:, :, 0] = torch.finfo(torch.float32).min
    mask[1, :, :, 3:] = torch.finfo(torch.float32).min
    exact = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.double())
    q, k, v = (x.to(dtype).requires_grad_() for x in (q, k, v))
    ours = qkv.scaled_dot_product_attention(q, k, v, mask, backend=backend)
    # torch's math kernel: on CUDA the kernel torch picks (cuDNN, torch 2.11 on an H200)
    # returns NaN for the row masked whole
    with sdpa_kernel(SDPBackend.MATH):
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


# --- bad arguments: one line that names the argument --------------------------------------

# "meta" stands for another device (a GPU) on a machine that has none.
CASES = {
    "k-on-another-device": (dict(k="meta"), r"k on meta"),
    "v-on-another-device": (dict(v="meta"), r"v on meta"),
    "mask-on-another-device": (dict(mask="meta"), r"mask is on meta"),
    "float-mask-on-another-device": (dict(mask="meta-float"), r"mask is on meta"),
    "q-a-list": (dict(q="list"), r"^q must be a tensor, got list$"),
    "k-an-array": (dict(k="numpy"), r"^k must be a tensor, got ndarray$"),
    "scale-a-string": (dict(scale="a"), r"^scale must be a number"),
    "scale-nan": (dict(scale=float("nan")), r"^scale must be a finite number"),
    "dropout-a-string": (dict(dropout_p="0.1"), r"^dropout_p must be a number in \[0, 1\)"),
    "causal-a-string": (dict(causal="no"), r"^causal must be True or False, got 'no'$"),
    "causal-none": (dict(causal=None), r"^causal must be True or False, got None$"),
    "k-float64": (dict(k="float64"), r"^q, k, v must share one floating dtype: torch.float32, "),
    "integer-qkv": (dict(q="int", k="int", v="int"), r"^q, k, v must share one floating dtype"),
    "mask-a-list": (dict(mask="list"), r"^mask must be a tensor or None, got list$"),
    "mask-of-integers": (dict(mask="int"), r"^mask must be boolean .* or float, got torch.int64$"),
}


def _arguments(change: dict):
    q, k, v = torch.randn(2, 4, 3, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 6)
    args = {"q": q, "k": k, "v": v, "mask": torch.rand(3, 5) > 0.5}
    for name, how in change.items():
        if how == "meta":
            args[name] = args[name].to("meta")
        elif how == "meta-float":
            args[name] = torch.randn(3, 5, device="meta")
        elif how == "list":
            args[name] = args[name].tolist()
        elif how == "numpy":
            args[name] = args[name].numpy()
        elif how == "float64":
            args[name] = args[name].double()
        elif how == "int":
            args[name] = (args[name] * 10).long()
    options = {
        key: value for key, value in change.items() if key in ("scale", "dropout_p", "causal")
    }
    return args, options


@pytest.mark.parametrize("backend", ["auto", "reference", "sdpa", "chunked"])
@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_argument_is_named_in_one_line(case, backend):
    change, message = CASES[case]
    args, options = _arguments(change)
    with pytest.raises(ValueError, match=message) as caught:
        qkv.scaled_dot_product_attention(**args, **options, backend=backend)
    assert "\n" not in str(caught.value)
    if options:  # attention_lse takes no dropout_p, explain_dispatch no scale
        return
    with pytest.raises(ValueError, match=message):
        qkv.attention_lse(**args, backend="chunked" if backend == "sdpa" else backend)
    with pytest.raises(ValueError, match=message):
        qkv.explain_dispatch(args["q"], args["k"], args["v"], args["mask"])


@pytest.mark.parametrize("backend", ["reference", "sdpa", "chunked"])
def test_nan_reaches_the_rows_the_docstring_says(backend):
    """A NaN key or value makes every row that sees it NaN; a NaN query gives a NaN row
    with the reference and what torch's own SDPA gives (zeros on the CPU) otherwise."""
    q, k, v = (torch.randn(2, 3, 5, 8) for _ in range(3))
    mask = torch.ones(5, 5, dtype=torch.bool).tril()  # row i sees keys 0..i
    bad_k, bad_v, bad_q = k.clone(), v.clone(), q.clone()
    bad_k[1, 2, 3, 0] = bad_v[1, 2, 3, 0] = bad_q[0, 1, 2, 4] = float("nan")
    for kk, vv in ((bad_k, v), (k, bad_v)):
        for masks in ({"mask": mask}, {"causal": True}):
            out = qkv.scaled_dot_product_attention(q, kk, vv, **masks, backend=backend)
            rows = out.isnan().any(-1)
            assert rows[1, 2, 3:].all() and rows.sum() == rows[1, 2].sum()
    for masks in ({"mask": mask}, {}):  # torch's math path, then its fused CPU kernel
        out = qkv.scaled_dot_product_attention(bad_q, k, v, **masks, backend=backend)
        peer = torch.nn.functional.scaled_dot_product_attention(bad_q, k, v, masks.get("mask"))
        fused = backend != "reference" and not masks
        want = torch.zeros(8) if fused else torch.full((8,), float("nan"))
        torch.testing.assert_close(out[0, 1, 2], want, equal_nan=True)
        torch.testing.assert_close(
            peer[0, 1, 2], torch.zeros(8) if not masks else want, equal_nan=True
        )
        assert out.isnan().any(-1).sum() == (not fused)


def test_bad_helper_arguments_are_named_in_one_line():
    q = k = v = torch.randn(1, 2, 4, 8)
    with pytest.raises(ValueError, match=r"^weight_rows must be a slice with step 1, got "):
        qkv.scaled_dot_product_attention(q, k, v, need_weights=True, weight_rows=slice(0, 4, 2))
    with pytest.raises(ValueError, match=r"^lengths must be 1-d \(B,\), got shape \(2, 1\)$"):
        qkv.padding_mask(torch.tensor([[3], [1]]))
    with pytest.raises(ValueError, match=r"^a 3-d attn_mask \(B\*H, Tq, Tk\) needs num_heads$"):
        qkv.functional.from_torch_masks(torch.zeros(4, 3, 3, dtype=torch.bool))


@pytest.mark.parametrize(
    "q_shape, k_shape, v_shape, mask_shape, match",
    [
        ((2, 4, 5), (2, 4, 5, 8), (2, 4, 5, 8), None, r"4-d.*q \(2, 4, 5\)"),
        (
            (2, 6, 5, 8),
            (2, 4, 5, 8),
            (2, 4, 5, 8),
            None,
            r"Hkv must divide query heads H.*q \(2, 6, 5, 8\)",
        ),
        ((2, 4, 5, 8), (2, 4, 5, 4), (2, 4, 5, 8), None, "same head size"),
        ((2, 4, 5, 8), (3, 4, 5, 8), (3, 4, 5, 8), None, "batch sizes differ"),
        ((2, 4, 5, 8), (2, 4, 5, 8), (2, 4, 6, 8), None, "same heads and length"),
        (
            (2, 4, 5, 8),
            (2, 4, 6, 8),
            (2, 4, 6, 8),
            (5, 5),
            r"mask of shape \(5, 5\).*\(2, 4, 5, 6\)",
        ),
    ],
    ids=["rank", "heads", "head-size", "batch", "kv-length", "mask-shape"],
)
def test_bad_shapes_name_the_shapes(q_shape, k_shape, v_shape, mask_shape, match):
    q, k, v = torch.randn(q_shape), torch.randn(k_shape), torch.randn(v_shape)
    mask = None if mask_shape is None else torch.ones(mask_shape, dtype=torch.bool)
    with pytest.raises(ValueError, match=match):
        qkv.scaled_dot_product_attention(q, k, v, mask)


# --- masks --------------------------------------------------------------------------------


def test_from_torch_masks_flips_polarity_and_adds_floats():
    attn = torch.tensor([[False, True], [False, False]])  # torch: True = ignore
    kpm = torch.tensor([[False, False], [False, True]])
    m = qkv.from_torch_masks(attn, kpm)
    assert m.dtype == torch.bool and m.shape == (2, 1, 2, 2)
    assert m[0, 0].tolist() == [[True, False], [True, True]]
    assert m[1, 0].tolist() == [[True, False], [True, False]]
    f = qkv.from_torch_masks(torch.tensor([[0.5, -1.0], [0.0, 2.0]]), kpm)
    assert f.dtype == torch.float32
    assert f[1, 0, 0].tolist() == [0.5, float("-inf")]


@pytest.mark.parametrize("num_heads", [4, 0])
def test_from_torch_masks_names_a_3d_mask_that_num_heads_does_not_divide(num_heads):
    """(B*H, Tq, Tk) = (6, 2, 2) with 4 heads was torch's reshape error, naming no mask."""
    with pytest.raises(ValueError, match=r"3-d attn_mask .* 6 rows .* num_heads=" + str(num_heads)):
        qkv.from_torch_masks(torch.zeros(6, 2, 2, dtype=torch.bool), num_heads=num_heads)


def test_combine_masks_mixed():
    b = torch.tensor([True, False])
    f = torch.tensor([1.0, 2.0])
    assert qkv.combine_masks(b, None, f).tolist() == [1.0, float("-inf")]
    assert qkv.combine_masks(None) is None


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), backend=st.sampled_from(["reference", "sdpa", "chunked"]))
def test_values_at_masked_keys_change_nothing(seed, backend):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, 2, 6, 8, generator=g) for _ in range(3))
    mask = torch.rand(2, 1, 6, 6, generator=g) > 0.5
    hidden = ~mask.any(dim=2, keepdim=True)  # keys no query sees: (B, 1, 1, Tk)
    v2 = torch.where(hidden.transpose(-1, -2), torch.randn(2, 2, 6, 8, generator=g) * 100, v)
    k2 = torch.where(hidden.transpose(-1, -2), torch.randn(2, 2, 6, 8, generator=g) * 100, k)
    a = qkv.scaled_dot_product_attention(q, k, v, mask, backend=backend)
    b = qkv.scaled_dot_product_attention(q, k2, v2, mask, backend=backend)
    torch.testing.assert_close(a, b)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), t=st.integers(2, 12))
def test_weights_sum_to_one_over_visible_keys(seed, t):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 3, t, 4, generator=g) for _ in range(3))
    mask = torch.rand(1, 3, t, t, generator=g) > 0.5
    _, w = qkv.scaled_dot_product_attention(q, k, v, mask, need_weights=True)
    sums = w.sum(-1)
    visible = mask.any(-1)
    torch.testing.assert_close(sums[visible], torch.ones_like(sums[visible]))
    assert (sums[~visible] == 0).all()
    assert (w[~mask] == 0).all()


def test_one_query_row_sees_every_key_under_causal():
    """A decoding step (Tq = 1) needs no causal mask: bottom-right, it sees the whole cache."""
    q, k, v = torch.randn(2, 3, 1, 8), torch.randn(2, 3, 5, 8), torch.randn(2, 3, 5, 8)
    out, w = qkv.scaled_dot_product_attention(q, k, v, causal=True, need_weights=True)
    ref = qkv.scaled_dot_product_attention(q, k, v, backend="reference")
    torch.testing.assert_close(out, ref)
    assert bool((w > 0).all())


def test_causal_with_cache_alignment_matches_naive():
    q = torch.randn(1, 2, 3, 8, dtype=torch.float64)
    k = torch.randn(1, 2, 7, 8, dtype=torch.float64)
    v = torch.randn(1, 2, 7, 8, dtype=torch.float64)
    out = qkv.scaled_dot_product_attention(q, k, v, causal=True)
    torch.testing.assert_close(out, naive_attention(q, k, v, causal=True)[0])


# --- the log-sum-exp and the merge --------------------------------------------------------


@pytest.mark.parametrize("backend", ["reference", "chunked"])
def test_lse_is_logsumexp_of_visible_scores(backend):
    q, k, v = (torch.randn(1, 2, 5, 4, dtype=torch.float64) for _ in range(3))
    mask = torch.rand(5, 5) > 0.4
    mask[:, 0] = True
    _, lse = qkv.attention_lse(q, k, v, mask, backend=backend)
    s = (q @ k.transpose(-1, -2) / 2.0).masked_fill(~mask, float("-inf"))
    torch.testing.assert_close(lse, torch.logsumexp(s, -1))


@settings(max_examples=40, deadline=None)
@given(
    tk=st.integers(2, 24),
    tq=st.integers(1, 12),
    split=st.integers(1, 23),
    causal=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_merge_of_any_split_equals_whole(tk, tq, split, causal, seed):
    split = min(split, tk - 1)
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 2, tq, 8, generator=g, dtype=torch.float64)
    k = torch.randn(2, 2, tk, 8, generator=g, dtype=torch.float64)
    v = torch.randn(2, 2, tk, 8, generator=g, dtype=torch.float64)
    mask = qkv.causal_mask(tq, tk) if causal else torch.rand(tq, tk, generator=g) > 0.3
    out, lse = qkv.attention_lse(q, k, v, mask)
    a = qkv.attention_lse(q, k[:, :, :split], v[:, :, :split], mask[:, :split])
    b = qkv.attention_lse(q, k[:, :, split:], v[:, :, split:], mask[:, split:])
    merged, merged_lse = qkv.merge_attention(*a, *b)
    torch.testing.assert_close(merged, out)
    torch.testing.assert_close(merged_lse, lse)
    empty = ~mask.any(-1)
    assert (out[..., empty, :] == 0).all() and torch.isinf(lse[..., empty]).all()


@pytest.mark.parametrize("inplace", [False, True], ids=["new", "inplace"])
@pytest.mark.parametrize(
    "fill",
    [torch.finfo(torch.float32).min, -1e30, float("-inf")],
    ids=["finfo-min", "huge", "-inf"],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_merge_of_rows_at_a_huge_negative_averages_equal_halves(dtype, fill, inplace):
    """Scores that all sit at torch.finfo(float32).min (transformers' mask fill) round so
    that lse + log 2 == lse: the merge weighed each half by e^(lse_a - lse) = 1 and
    returned the sum of the halves. Two halves of as many keys each weigh one half."""
    g = torch.Generator().manual_seed(int(torch.randint(0, 2**31 - 1, ())))
    q = torch.randn(1, 2, 3, 8, generator=g, dtype=dtype)
    k, v = (torch.randn(1, 2, 64, 8, generator=g, dtype=dtype) for _ in range(2))
    mask = torch.zeros(1, 1, 3, 64, dtype=dtype)
    mask[..., 1, :] = fill  # one row sees only keys at the fill (or none for -inf)
    if fill != float("-inf"):
        mask[..., 2, :32] = fill  # another: its first half at the fill, its second at 0
    whole = qkv.attention_lse(q, k, v, mask, backend="reference")[0]
    a = qkv.attention_lse(q, k[:, :, :32], v[:, :, :32], mask[..., :32], backend="reference")
    b = qkv.attention_lse(q, k[:, :, 32:], v[:, :, 32:], mask[..., 32:], backend="reference")
    merged, _ = qkv.merge_attention(*a, *b, inplace=inplace)
    torch.testing.assert_close(merged, whole)
    assert torch.isfinite(merged).all()


@pytest.mark.parametrize(
    "shapes",
    [
        ((2, 5, 8), (2, 5), (2, 5, 8), (2, 6)),
        ((2, 5, 8), (2, 5), (2, 5, 4), (2, 5)),
        ((2, 5, 8), (2, 4), (2, 5, 8), (2, 4)),
        ((1, 5, 8), (1, 5), (2, 5, 8), (2, 5)),
    ],
    ids=["lse-length", "value-size", "lse-rows", "batch"],
)
def test_merge_of_mismatched_parts_names_the_shapes(shapes):
    """Parts that broadcast or do not fit at all are refused in one line, by shape."""
    parts = [torch.randn(s) for s in shapes]
    shown = ", ".join(f"{n} {s}" for n, s in zip(["out_a", "lse_a", "out_b", "lse_b"], shapes))
    with pytest.raises(ValueError, match="merge_attention needs") as info:
        qkv.merge_attention(*parts)
    assert str(info.value).endswith(shown)


@pytest.mark.parametrize("inplace", [False, True])
def test_merge_computes_in_the_wider_lse_dtype(inplace):
    """A float64 lse_b beside a float32 lse_a: the merge works in float64 (it rounded both
    to float32, the first one's dtype, about 1e-7 off)."""
    out_a, out_b = torch.randn(3, 7, 4), torch.randn(3, 7, 4)
    lse_a = torch.randn(3, 7) * 30
    lse_b = torch.randn(3, 7, dtype=torch.float64) * 30 + 1e-3 * torch.rand(3, 7)
    want = torch.logaddexp(lse_a.double(), lse_b)
    w_a, w_b = (lse_a.double() - want).exp(), (lse_b - want).exp()
    exact = w_a[..., None] * out_a.double() + w_b[..., None] * out_b.double()
    out, lse = qkv.merge_attention(out_a.clone(), lse_a, out_b, lse_b, inplace=inplace)
    assert lse.dtype == torch.float64 and out.dtype == torch.float32
    torch.testing.assert_close(lse, want, atol=1e-12, rtol=0)
    torch.testing.assert_close(out.double(), exact, atol=2e-6, rtol=0)


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"lse_b": "int"}, "lse_b must be floating point, got torch.int64"),
        ({"out_b": "meta"}, "out_b is on meta, out_a on cpu"),
        ({"lse_a": "meta"}, "lse_a is on meta, out_a on cpu"),
    ],
    ids=["integer-lse", "out-elsewhere", "lse-elsewhere"],
)
def test_merge_names_parts_of_another_kind_or_device(change, says):
    parts = {
        "out_a": torch.randn(2, 5, 8),
        "lse_a": torch.randn(2, 5),
        "out_b": torch.randn(2, 5, 8),
        "lse_b": torch.randn(2, 5),
    }
    for name, how in change.items():
        parts[name] = parts[name].long() if how == "int" else parts[name].to("meta")
    with pytest.raises(ValueError, match=f"^merge_attention: {says}"):
        qkv.merge_attention(*parts.values())
