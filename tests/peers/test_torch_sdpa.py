"""PyTorch's SDPA tests (``pytorch/pytorch``, ``test/test_transformers.py``) ported to
``qkv.scaled_dot_product_attention`` and run on every CPU backend.

Where the two libraries agree by convention the ports keep PyTorch's assertions; where
they differ they compare against qkv's documented convention instead:

- a boolean mask means the same in both (``True`` = may attend); float masks are added;
- ``causal=True`` is aligned bottom-right when ``Tq != Tk``; torch's ``is_causal`` is
  top-left, so a top-left case passes torch's mask explicitly;
- a query row that sees no key gives zeros (torch's math gives zeros or NaN, by version);
- q, k, v are 4-d and share their batch size (torch also takes 3-d and broadcast batches).
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right, causal_upper_left

import qkv
from tests.peers.peer_helpers import (
    CPU_BACKENDS,
    causal_bool,
    dtype_id,
    sample,
    sees_no_key,
)

ALL_DTYPES = [torch.float64, torch.float32, torch.bfloat16, torch.float16]
# test_transformers.py's Tolerances for the fused CPU kernel against math
TOL = {
    torch.float64: (1e-5, 5e-6),
    torch.float32: (1e-5, 5e-6),
    torch.bfloat16: (5e-2, 5e-2),
    torch.float16: (1e-2, 1e-2),
}
GRAD_TOL = {  # the newer mask and GQA tests' tol_grad
    torch.float64: (1e-5, 5e-6),
    torch.float32: (1.25e-5, 5.25e-6),
    torch.bfloat16: (5e-2, 5e-2),
    torch.float16: (1e-1, 1e-1),
}


def math_sdpa(q, k, v, mask=None, *, causal=None, scale=None, dtype=torch.float64):
    """torch's math SDPA as its documentation writes it, computed in ``dtype``: scores
    scaled, boolean masks filled with -inf, float masks added, softmax, weighted values.
    ``causal``: ``None``, ``"top_left"`` or ``"bottom_right"``. GQA repeats each key/value
    head for its group, as ``enable_gqa=True`` does. A row that sees no key gives zeros
    (torch >= 2.5 math; older versions gave NaN)."""
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    tq, tk = q.shape[-2], k.shape[-2]
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    bias = torch.zeros(tq, tk, dtype=dtype)
    if causal is not None:
        bias = bias.masked_fill(~causal_bool(tq, tk, causal), -math.inf)
    if mask is not None:
        bias = bias.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else bias + mask
    scores = q @ k.transpose(-2, -1) * scale + bias
    empty = torch.isneginf(scores).all(-1, keepdim=True)
    weights = torch.softmax(scores.masked_fill(empty, 0.0), -1).masked_fill(empty, 0.0)
    return weights @ v


def _close(got, want, atol, rtol, what="output"):
    torch.testing.assert_close(
        got, want.to(got.dtype), atol=atol, rtol=rtol, msg=lambda m: f"{what}: {m}"
    )


def _grads(out, inputs, grad_out=None):
    grad_out = torch.ones_like(out) if grad_out is None else grad_out
    return torch.autograd.grad(out, inputs, grad_out)


# --- TestTransformers.test_scaled_dot_product_attention ------------------------------------

MASK_CASES = {  # upstream ids (its 4-d input cases): (attn_mask_dim, is_causal)
    "4D_input_dim_no_attn_mask": (None, False),
    "4D_input_dim_2D_attn_mask": (2, False),
    "4D_input_dim_2D_causal_attn_mask": (2, True),
    "4D_input_dim_4D_attn_mask": (4, False),
    "4D_input_dim_4D_causal_attn_mask": (4, True),
}


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("case", list(MASK_CASES))
def test_scaled_dot_product_attention(backend, case):
    """pytorch/pytorch test/test_transformers.py, TestTransformers.test_scaled_dot_product_attention
    (4-d inputs, dropout 0; qkv refuses 3-d inputs and cannot replay torch's dropout RNG).

    Random boolean masks are compared with rows that see no key at zeros. torch's
    ``is_causal`` (top-left, row i sees keys 0..i) is given to qkv as that boolean mask;
    qkv's own ``causal=True`` is checked against the bottom-right mask (with L=4 > S=3 its
    first row sees no key).
    """
    mask_dim, is_causal = MASK_CASES[case]
    n, n_prime, length, source, embed = 5, 2, 4, 3, 6
    for dtype in (torch.float64, torch.float32):
        atol = rtol = 1e-7 if dtype == torch.float64 else None  # assertEqual's defaults
        q = torch.randn(n, n_prime, length, embed, dtype=dtype)
        k = torch.randn(n, n_prime, source, embed, dtype=dtype)
        v = torch.randn(n, n_prime, source, embed, dtype=dtype)
        mask = None
        if mask_dim is not None:
            shape = (length, source) if mask_dim == 2 else (n, n_prime, length, source)
            if is_causal:
                mask = torch.ones(shape, dtype=torch.bool).tril()
            else:
                mask = torch.randint(0, 2, shape, dtype=torch.bool)
        got = qkv.scaled_dot_product_attention(q, k, v, mask, backend=backend)
        want = math_sdpa(q, k, v, mask)
        torch.testing.assert_close(got, want.to(dtype), atol=atol, rtol=rtol)
        if is_causal:  # qkv's causal flag: bottom-right, not torch's top-left
            got = qkv.scaled_dot_product_attention(q, k, v, causal=True, backend=backend)
            want = math_sdpa(q, k, v, causal="bottom_right")
            torch.testing.assert_close(got, want.to(dtype), atol=atol, rtol=rtol)
            assert not got[:, :, 0].any(), "row 0 sees no key when L > S: zeros"


# --- TestSDPA.test_sdp_math_gradcheck (and the gradcheck of the test above) ----------------


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("contiguous", [True, False], ids=["contiguous", "packed_views"])
def test_sdp_math_gradcheck(backend, contiguous):
    """pytorch/pytorch test/test_transformers.py, TestSDPA.test_sdp_math_gradcheck
    (contiguous_inputs True/False): gradcheck in float64 of q, k, v sliced from one packed
    projection, as strided views or made contiguous (B=4, T=4, H=2, D=16)."""
    b, t, h, d = 4, 4, 2, 16
    packed = torch.randn(b, t, 3 * h * d, dtype=torch.float64, requires_grad=True)
    q, k, v = (x.view(b, t, h, d).transpose(1, 2) for x in packed.chunk(3, dim=-1))
    if contiguous:
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    else:
        assert not q.is_contiguous()

    def attend(q, k, v):
        return qkv.scaled_dot_product_attention(q, k, v, backend=backend)

    assert torch.autograd.gradcheck(attend, (q, k, v))


# --- TestSDPA.test_scaled_dot_product_fused_attention_vs_math_cpu --------------------------

VS_MATH_DEFAULT = [  # (dtype, batch, seq_len, n_head, head_dim, causal)
    (dtype, 2, 267, 3, 16, causal) for dtype in ALL_DTYPES for causal in (False, True)
]
VS_MATH_TAIL = sample(
    [
        (dtype, batch, seq, heads, d, causal)
        for dtype, batch, seq, heads, d, causal in itertools.product(
            ALL_DTYPES, [2, 12], [267, 1030], [1, 3], [8, 16], [False, True]
        )
        if not (batch == 12 and seq == 1030)  # the costliest corner stays out of the sample
        and (dtype, batch, seq, heads, d, causal) not in VS_MATH_DEFAULT
    ],
    3,
    salt="fused_attention_vs_math_cpu",
)


def _vs_math_id(case):
    dtype, batch, seq, heads, d, causal = case
    return f"{dtype_id(dtype)}-B{batch}-T{seq}-H{heads}-D{d}" + ("-causal" if causal else "")


def _check_vs_math(backend, dtype, batch, seq_len, n_head, head_dim, causal):
    embed = n_head * head_dim
    x = torch.randn(batch, seq_len, 3 * embed, dtype=dtype, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    math_dtype = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype

    def heads(t):  # (B, T, E) -> (B, H, T, D), a strided view as in the upstream test
        return t.view(batch, seq_len, n_head, head_dim).transpose(1, 2)

    q, k, v = (heads(t) for t in x.split(embed, dim=2))
    q2, k2, v2 = (heads(t) for t in x2.split(embed, dim=2))
    got = qkv.scaled_dot_product_attention(q, k, v, causal=causal, backend=backend)
    want = math_sdpa(q2, k2, v2, causal="top_left" if causal else None, dtype=math_dtype)
    atol, rtol = TOL[dtype]
    _close(got, want, atol, rtol)
    got.sum().backward()
    want.to(dtype).sum().backward()
    for name, g, g_ref in zip("qkv", x.grad.split(embed, 2), x2.grad.split(embed, 2)):
        _close(g, g_ref, atol, rtol, what=f"grad of {name}")


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("case", VS_MATH_DEFAULT, ids=_vs_math_id)
def test_scaled_dot_product_fused_attention_vs_math_cpu(backend, case):
    """pytorch/pytorch test/test_transformers.py,
    TestSDPA.test_scaled_dot_product_fused_attention_vs_math_cpu (train=True: outputs and
    the gradients of a packed input): every dtype, causal or not, at B=2, T=267, H=3, D=16;
    torch's math in float32 for half inputs, its tolerances. Tq == Tk, so both causal
    alignments agree."""
    _check_vs_math(backend, *case)


@pytest.mark.slow
@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("case", VS_MATH_TAIL, ids=_vs_math_id)
def test_scaled_dot_product_fused_attention_vs_math_cpu_sampled(backend, case):
    """pytorch/pytorch test/test_transformers.py,
    TestSDPA.test_scaled_dot_product_fused_attention_vs_math_cpu: a fixed sample of the
    rest of its grid (batch 2/12, seq_len 267/1030, n_head 1/3, head_dim 8/16)."""
    _check_vs_math(backend, *case)


INFERENCE_CASES = [  # (batch, seq_len, n_head, n_kv_head, head_dim, causal): float32
    (batch, seq, heads, heads, d, causal)
    for batch, seq, heads, d, causal in itertools.product(
        [2, 12], [267, 1030], [1, 3], [8, 16], [False, True]
    )
    if not (batch == 12 and seq == 1030)
] + [(12, 100, 4, 2, 8, True), (12, 100, 6, 1, 8, False)]  # the GQA test's heads


@pytest.mark.parametrize(
    "case",
    INFERENCE_CASES,
    ids=lambda c: f"B{c[0]}-T{c[1]}-H{c[2]}/{c[3]}-D{c[4]}" + ("-causal" if c[5] else ""),
)
def test_cpu_flash_vs_math_cpu(case):
    """pytorch/pytorch test/test_transformers.py,
    TestSDPA.test_scaled_dot_product_fused_attention_vs_math_cpu and its GQA test, the
    part that ``cpu_flash`` serves: float32 inference without a mask (train=False), the
    whole grid of batch, seq_len, n_head and head_dim, q, k and v strided views of one
    packed projection; torch's tolerances for its fused CPU kernel."""
    batch, seq_len, n_head, n_kv, head_dim, causal = case
    sizes = [n_head * head_dim, n_kv * head_dim, n_kv * head_dim]
    x = torch.randn(batch, seq_len, sum(sizes))
    q, k, v = (t.view(batch, seq_len, -1, head_dim).transpose(1, 2) for t in x.split(sizes, dim=2))
    with torch.no_grad():
        got = qkv.scaled_dot_product_attention(q, k, v, causal=causal, backend="cpu_flash")
        assert qkv.explain_dispatch(q, k, v, causal=causal).chosen == "cpu_flash"
    want = math_sdpa(q, k, v, causal="top_left" if causal else None, dtype=torch.float32)
    _close(got, want, *TOL[torch.float32])


# --- TestSDPA.test_scaled_dot_product_fused_attention_mask_vs_math_cpu ---------------------

MASK_GRID = list(itertools.product(ALL_DTYPES, [2, 4], [False, True], [False, True]))
MASK_DEFAULT = [case for case in MASK_GRID if case[0] == torch.float32] + [
    (torch.bfloat16, 2, True, False),
    (torch.bfloat16, 4, False, True),
]
MASK_TAIL = sample(
    [case for case in MASK_GRID if case not in MASK_DEFAULT],
    4,
    salt="fused_attention_mask_vs_math_cpu",
)


def _mask_id(case):
    dtype, mask_dim, bool_mask, causal = case
    kind = "bool" if bool_mask else "float"
    return f"{dtype_id(dtype)}-{mask_dim}D_{kind}_mask" + ("-causal" if causal else "")


def _mask_shapes(mask_dim, b, h, tq, tk):
    """The upstream loop over every broadcast of the mask: 4 shapes of a 2-d mask, 16 of a
    4-d one."""
    if mask_dim == 2:
        return list(itertools.product([tq, 1], [tk, 1]))
    return list(itertools.product([b, 1], [h, 1], [tq, 1], [tk, 1]))


def _check_mask_vs_math(backend, dtype, mask_dim, bool_mask, causal):
    b, tq, tk, h, d = 2, 267, 514, 3, 8
    atol, rtol = TOL[dtype]
    g_atol, g_rtol = GRAD_TOL[dtype]
    math_dtype = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    for shape in _mask_shapes(mask_dim, b, h, tq, tk):
        q = torch.randn(b, h, tq, d, dtype=dtype, requires_grad=True)
        k = torch.randn(b, h, tk, d, dtype=dtype, requires_grad=True)
        v = torch.randn(b, h, tk, d, dtype=dtype, requires_grad=True)
        if bool_mask:
            mask = torch.randint(0, 2, shape, dtype=torch.bool)
        else:
            mask = torch.randn(shape, dtype=dtype)
        got = qkv.scaled_dot_product_attention(q, k, v, mask, causal=causal, backend=backend)
        ref_mask = mask if bool_mask else mask.to(math_dtype)
        align = "bottom_right" if causal else None  # qkv's alignment (Tq < Tk here)
        want = math_sdpa(q, k, v, ref_mask, causal=align, dtype=math_dtype)
        _close(got, want, atol, rtol, what=f"output, mask {shape}")
        grads = _grads(got, (q, k, v))
        grads_ref = _grads(want.to(dtype), (q, k, v))
        for name, g, g_ref in zip("qkv", grads, grads_ref):
            _close(g, g_ref, g_atol, g_rtol, what=f"grad of {name}, mask {shape}")


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("case", MASK_DEFAULT, ids=_mask_id)
def test_scaled_dot_product_fused_attention_mask_vs_math_cpu(backend, case):
    """pytorch/pytorch test/test_transformers.py,
    TestSDPA.test_scaled_dot_product_fused_attention_mask_vs_math_cpu (train=True, with
    its newer ``casual`` parameter): B=2, q_seq_len=267, kv_seq_len=514, n_head=3,
    head_dim=8, boolean or float masks in every broadcast shape; float32 in full,
    bfloat16 twice. Causal here is qkv's bottom-right alignment."""
    _check_mask_vs_math(backend, *case)


@pytest.mark.slow
@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("case", MASK_TAIL, ids=_mask_id)
def test_scaled_dot_product_fused_attention_mask_vs_math_cpu_sampled(backend, case):
    """pytorch/pytorch test/test_transformers.py,
    TestSDPA.test_scaled_dot_product_fused_attention_mask_vs_math_cpu: a fixed sample of
    the rest of its grid (float64, bfloat16, float16)."""
    _check_mask_vs_math(backend, *case)


# --- TestSDPA.test_scaled_dot_product_fused_attention_gqa_vs_math_cpu ----------------------


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("n_heads", [(4, 2), (6, 1)], ids=["gqa_4q_2kv", "mqa_6q_1kv"])
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
def test_scaled_dot_product_fused_attention_gqa_vs_math_cpu(backend, n_heads, dtype):
    """pytorch/pytorch test/test_transformers.py,
    TestSDPA.test_scaled_dot_product_fused_attention_gqa_vs_math_cpu (train=True):
    B=12, Tq=17, Tk=100, D=8, a float mask (B, Hq, Tq, Tk); qkv groups heads without a
    flag (torch's ``enable_gqa=True``). The head counts are this port's."""
    hq, hkv = n_heads
    b, tq, tk, d = 12, 17, 100, 8
    q = torch.randn(b, hq, tq, d, dtype=dtype, requires_grad=True)
    k = torch.randn(b, hkv, tk, d, dtype=dtype, requires_grad=True)
    v = torch.randn(b, hkv, tk, d, dtype=dtype, requires_grad=True)
    mask = torch.randn(b, hq, tq, tk, dtype=dtype)
    got = qkv.scaled_dot_product_attention(q, k, v, mask, backend=backend)
    math_dtype = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    want = math_sdpa(q, k, v, mask.to(math_dtype), dtype=math_dtype)
    tol_grad = {torch.bfloat16: (1e-1, 1e-1), torch.float16: (1e-1, 1e-1)}
    atol, rtol = TOL[dtype]
    _close(got, want, atol, rtol)
    g_atol, g_rtol = tol_grad.get(dtype, TOL[dtype])
    for name, g, g_ref in zip("qkv", _grads(got, (q, k, v)), _grads(want.to(dtype), (q, k, v))):
        assert g is not None
        _close(g, g_ref, g_atol, g_rtol, what=f"grad of {name}")


# --- TestSDPA.test_scaled_dot_product_fused_attention_with_inf -----------------------------


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_scaled_dot_product_fused_attention_with_inf(backend):
    """pytorch/pytorch test/test_transformers.py,
    TestSDPA.test_scaled_dot_product_fused_attention_with_inf (pytorch issue 127055): a
    600x600 float mask of -inf outside a band of 10 keys (``triu(-inf, 1) + tril(-inf,
    -10)``), against torch's math SDPA on CPU, the peer itself."""
    full = torch.full((600, 600), -math.inf)
    mask = torch.triu(full, diagonal=1) + torch.tril(full, diagonal=-10)
    q, k, v = (torch.randn(1, 2, 600, 8) for _ in range(3))
    with sdpa_kernel(backends=[SDPBackend.MATH]):
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    got = qkv.scaled_dot_product_attention(q, k, v, mask, backend=backend)
    torch.testing.assert_close(got, want)
    band = torch.isfinite(mask)  # the same band as a boolean mask
    torch.testing.assert_close(
        qkv.scaled_dot_product_attention(q, k, v, band, backend=backend), want
    )


# --- TestSDPA.test_scaled_dot_product_attention_math_with_negative_scale -------------------


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_scaled_dot_product_attention_math_with_negative_scale(backend):
    """pytorch/pytorch test/test_transformers.py,
    TestSDPA.test_scaled_dot_product_attention_math_with_negative_scale (pytorch issue
    105190): scale = -1/0.0001 on x of (1, 3, 64, 64), against softmax(x xᵀ / -0.0001) x.
    In float64 here (upstream float32 on the math kernel, which computes exactly its
    reference): scores multiplied by -10000 turn a float32 rounding of a near-tied score
    into percents of weight for any computation that orders its sums otherwise; in
    float32 every backend missed the float32 tolerance on 8 of 300 draws, in float64 none."""
    x = torch.randn(1, 3, 64, 64, dtype=torch.float64)
    want = torch.softmax(x @ x.transpose(-1, -2) / -0.0001, dim=-1) @ x
    got = qkv.scaled_dot_product_attention(x, x, x, scale=-1.0 / 0.0001, backend=backend)
    torch.testing.assert_close(got, want)


# --- TestSDPA.test_fully_masked_out_rows ---------------------------------------------------


def _masked_rows_inputs(seq_len, head_dim, dtype, every=4):
    """The upstream inputs: rand q, k, v (1, 1, T, D); every 4th query row sees no key; the
    others see the keys j with j = i (mod 5)."""
    q, k, v = (
        torch.rand(1, 1, seq_len, head_dim, dtype=dtype, requires_grad=True) for _ in range(3)
    )
    mask = torch.ones(1, 1, seq_len, seq_len, dtype=torch.bool)
    mask[0, 0, ::every, :] = False
    pattern = torch.arange(seq_len)[:, None] % 5 == torch.arange(seq_len)[None, :] % 5
    return q, k, v, mask & pattern


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("mask_kind", ["bool", "float_-inf"])
@pytest.mark.parametrize("seq_len", [1, 32, 64])
def test_fully_masked_out_rows(backend, mask_kind, seq_len):
    """pytorch/pytorch test/test_transformers.py, TestSDPA.test_fully_masked_out_rows
    (float32, head_dim 16): rows that see no key give zero outputs and zero query
    gradients, no NaN anywhere, and the rest matches math (outputs atol 5e-3, gradients
    3e-3). The same mask written as a float 0/-inf mask must do the same."""
    q, k, v, mask = _masked_rows_inputs(seq_len, 16, torch.float32)
    given = mask if mask_kind == "bool" else torch.zeros(mask.shape).masked_fill(~mask, -math.inf)
    out = qkv.scaled_dot_product_attention(q, k, v, given, backend=backend)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    want = math_sdpa(q, k, v, mask, dtype=torch.float32)
    grads_ref = torch.autograd.grad(want.sum(), (q, k, v))
    torch.testing.assert_close(out, want, atol=5e-3, rtol=0)
    assert not out.isnan().any()
    for g, g_ref in zip(grads, grads_ref):
        torch.testing.assert_close(g, g_ref, atol=3e-3, rtol=0)
        assert not g.isnan().any()
    empty = sees_no_key(mask).expand_as(out)
    assert empty.any(), "no row is fully masked"
    assert (out[empty] == 0).all(), "a row that sees no key must be zeros"
    assert (grads[0][empty] == 0).all(), "its query gets no gradient"


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("keys", [64, 600], ids=["64_keys", "600_keys"])
def test_fully_masked_out_rows_at_finfo_min(backend, keys):
    """pytorch/pytorch test/test_transformers.py, TestSDPA.test_fully_masked_out_rows, with
    the mask written as Hugging Face writes it: 0 / ``torch.finfo(float32).min``. Such
    rows are not empty (every score is finite): torch's math, the peer, gives them the
    plain mean of the values; qkv must agree, also past 512 keys (more than one key block
    of ``chunked``)."""
    q = torch.rand(2, 2, 48, 16)
    k, v = torch.rand(2, 2, keys, 16), torch.rand(2, 2, keys, 16)
    allowed = torch.rand(2, 1, 48, keys) > 0.5
    allowed[:, :, ::4] = False  # every 4th row: all its scores at finfo.min
    mask = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
    with sdpa_kernel(backends=[SDPBackend.MATH]):
        want = F.scaled_dot_product_attention(
            q.double(), k.double(), v.double(), attn_mask=mask.double()
        )
    got = qkv.scaled_dot_product_attention(q, k, v, mask, backend=backend)
    torch.testing.assert_close(got[:, :, ::4], v.mean(-2, keepdim=True).expand(-1, -1, 12, -1))
    torch.testing.assert_close(got, want.float(), atol=1e-5, rtol=1e-5)


# --- TestAttnBias.test_causal_variants, test_is_causal_equals_upper_left -------------------

CAUSAL_SHAPES = {  # upstream (16, 16, ...) batches and heads shrunk to 2 x 2
    "128x128_D16": (2, 2, 128, 128, 16),
    "128x256_D32": (2, 2, 128, 256, 32),
    "256x128_D32": (2, 2, 256, 128, 32),
    "23x56_D15": (1, 1, 23, 56, 15),
}


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("variant", ["upper_left", "lower_right"])
@pytest.mark.parametrize("shape", list(CAUSAL_SHAPES))
def test_causal_variants(backend, variant, shape):
    """pytorch/pytorch test/test_transformers.py, TestAttnBias.test_causal_variants and
    test_is_causal_equals_upper_left, in float32: torch's ``CausalBias`` on its math SDPA
    is the peer. ``lower_right`` is qkv's ``causal=True``; ``upper_left`` (torch's
    ``is_causal``) is given to qkv as an explicit mask. Upstream skips lower-right with
    Tq > Tk (NaN there); qkv's leading rows that see no key are zeros, checked against
    float64 math."""
    b, h, tq, tk, d = CAUSAL_SHAPES[shape]
    q = torch.randn(b, h, tq, d, requires_grad=True)
    k = torch.randn(b, h, tk, d, requires_grad=True)
    v = torch.randn(b, h, tk, d, requires_grad=True)
    if variant == "lower_right":
        got = qkv.scaled_dot_product_attention(q, k, v, causal=True, backend=backend)
        bias, align = causal_lower_right(tq, tk), "bottom_right"
    else:
        mask = causal_bool(tq, tk, "top_left")
        got = qkv.scaled_dot_product_attention(q, k, v, mask, backend=backend)
        bias, align = causal_upper_left(tq, tk), "top_left"
    want = math_sdpa(q, k, v, causal=align)
    grad_out = torch.randn_like(got)
    grads = _grads(got, (q, k, v), grad_out)
    grads_ref = _grads(want, (q, k, v), grad_out.double())
    torch.testing.assert_close(got, want.float(), atol=1e-5, rtol=1e-5)
    for g, g_ref in zip(grads, grads_ref):
        torch.testing.assert_close(g, g_ref.float(), atol=1e-5, rtol=1e-5)
    if not (variant == "lower_right" and tq > tk):  # where torch's own answer is defined
        with torch.no_grad(), sdpa_kernel(backends=[SDPBackend.MATH]):
            peer = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        torch.testing.assert_close(got, peer, atol=1e-5, rtol=1e-5)
    if variant == "upper_left":
        with torch.no_grad(), sdpa_kernel(backends=[SDPBackend.MATH]):
            is_causal = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        torch.testing.assert_close(got, is_causal, atol=1e-5, rtol=1e-5)


# --- TestSDPAFailureModes: zero-length, single-token and strided inputs, bad inputs --------

LENGTHS = {"Tq0": (0, 5), "Tk0": (4, 0), "Tq1_Tk1": (1, 1), "Tq1_Tk7": (1, 7), "Tq6_Tk1": (6, 1)}


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("lengths", list(LENGTHS))
def test_invalid_sequence_lengths(backend, lengths):
    """pytorch/pytorch test/test_transformers.py, TestSDPAFailureModes.test_invalid_sequence_lengths
    and test_fused_kernels_seq_len_0_inputs: torch's fused CUDA kernels refuse empty
    sequences; its math answers them, and so must every qkv backend: empty queries give
    an empty output, no keys give zeros, single tokens match the math."""
    tq, tk = LENGTHS[lengths]
    q = torch.randn(2, 2, tq, 8, requires_grad=True)
    k = torch.randn(2, 2, tk, 8, requires_grad=True)
    v = torch.randn(2, 2, tk, 4, requires_grad=True)
    with sdpa_kernel(backends=[SDPBackend.MATH]):
        want = F.scaled_dot_product_attention(q, k, v)
    got = qkv.scaled_dot_product_attention(q, k, v, backend=backend)
    assert got.shape == want.shape == (2, 2, tq, 4)
    torch.testing.assert_close(got, want)
    if tk == 0:
        assert not got.any()
    grads = _grads(got, (q, k, v))
    grads_ref = _grads(want, (q, k, v))
    for g, g_ref in zip(grads, grads_ref):
        torch.testing.assert_close(g, g_ref)


def _strided(kind):
    """q, k, v (2, 2, 8, 8) laid out as in the upstream stride tests, and contiguous copies."""
    if kind == "last_dim_stride_2":  # test_invalid_last_dim_stride: q.as_strided_(size, [2]*4)
        q = torch.rand(2, 2, 8, 8).as_strided((2, 2, 8, 8), (2, 2, 2, 2))
        k, v = torch.rand(2, 2, 8, 8), torch.rand(2, 2, 8, 8)
    elif kind == "bthd_transposed":  # (B, T, H, D) tensors seen as (B, H, T, D)
        q, k, v = (torch.rand(2, 8, 2, 8).transpose(1, 2) for _ in range(3))
    else:  # "broadcast_batch": one key/value batch row expanded (stride 0)
        q = torch.rand(2, 2, 8, 8)
        k, v = (torch.rand(1, 2, 8, 8).expand(2, -1, -1, -1) for _ in range(2))
    return (q, k, v), tuple(t.contiguous() for t in (q, k, v))


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("kind", ["last_dim_stride_2", "bthd_transposed", "broadcast_batch"])
def test_invalid_last_dim_stride(backend, kind):
    """pytorch/pytorch test/test_transformers.py, TestSDPAFailureModes.test_invalid_last_dim_stride
    (and the strided layouts of test_invalid_fused_inputs_broadcast): torch's fused kernels
    refuse a last dimension with stride != 1; qkv takes any layout and must give the
    result of the same values made contiguous, and torch's math result."""
    strided, contiguous = _strided(kind)
    got = qkv.scaled_dot_product_attention(*strided, backend=backend)
    torch.testing.assert_close(got, qkv.scaled_dot_product_attention(*contiguous, backend=backend))
    with sdpa_kernel(backends=[SDPBackend.MATH]):
        torch.testing.assert_close(got, F.scaled_dot_product_attention(*contiguous))


BAD_INPUTS = {
    "different_datatypes": (
        lambda: (
            torch.randn(1, 4, 8, 16),
            torch.randn(1, 4, 8, 16).half(),
            torch.randn(1, 4, 8, 16).half(),
        ),
        "must share one floating dtype",
    ),
    "1_dimensional_inputs": (
        lambda: (torch.randn(4).half(), torch.randn(1, 4).half(), torch.randn(1, 4).half()),
        r"must be 4-d \(B, H, T, D\)",
    ),
    "broadcast_batch_of_query": (
        lambda: (torch.randn(1, 4, 3, 8), torch.randn(2, 4, 3, 8), torch.randn(2, 4, 3, 8)),
        "batch sizes differ",
    ),
}


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_invalid_inputs(backend, case):
    """pytorch/pytorch test/test_transformers.py, TestSDPAFailureModes
    .test_invalid_inputs_different_datatypes, .test_invalid_inputs_1_dimensional_inputs and
    .test_invalid_fused_inputs_broadcast: refused, in one message that says why. (torch's
    math broadcasts a batch of 1; qkv takes q, k, v of one batch size and says so.)"""
    make, message = BAD_INPUTS[case]
    with pytest.raises(ValueError, match=message):
        qkv.scaled_dot_product_attention(*make(), backend=backend)
