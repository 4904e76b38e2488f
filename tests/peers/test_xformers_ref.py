"""xFormers' memory-efficient attention tests (``facebookresearch/xformers``,
``tests/test_mem_eff_attention.py``) ported to every CPU backend of qkv.

xFormers checks each kernel against ``ref_attention``: float32 math with the attention
bias materialised and added, inputs drawn as ``randn * 3``. Its bias classes become qkv
masks here: ``LowerTriangularMask`` is causal aligned top-left (an explicit mask in qkv),
``LowerTriangularFromBottomRightMask`` is qkv's ``causal=True``, a tensor bias is a float
mask, and the block-diagonal masks of packed sequences are boolean masks of blocks. Its
layout is (B, M, H, K); qkv reads it through transposed views.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

import qkv
from tests.peers.peer_helpers import CPU_BACKENDS, causal_bool, dtype_id, sample

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# the CUTLASS op's FORWARD_ERROR_ATOL / FORWARD_ERROR_RTOL
FORWARD_TOL = {
    torch.float32: (3e-4, 2e-5),
    torch.float16: (4e-3, 4e-4),
    torch.bfloat16: (2e-2, 5e-3),
}
BIAS_TYPES = [
    "none",
    "LowerTriangularMask",
    "LowerTriangularFromBottomRightMask",
    "tensor",
    "tensor_broadcast_over_queries",
    "LowerTriangularMaskWithTensorBias",
    "BlockDiagonalMask",
    "BlockDiagonalCausalMask",
    "BlockDiagonalCausalFromBottomRightMask",
]


def generate_test_shapes_B_Mq_Mkv_H_K_Kv(batch_sizes=(1, 3), test_k=(32, 128), max_k=512):
    """The upstream shape list: (B, Mq, Mkv, H, K, Kv) over square and odd lengths, odd
    head sizes, a value size other than K, long-against-short lengths and more heads."""
    shapes = []
    for b in batch_sizes:
        shapes += [
            (b, mq, mkv, 1, k, k) for mq in (32, 256) for mkv in (32, 64, 256) for k in test_k
        ]
        mq, mkv, k, h = 256, 128, 32, 1
        for m in (2, 3, 15, 31, 32, 34, 68, 72, 90, 132, 136):
            shapes += [(b, m, mkv, h, k, k), (b, mq, m, h, k, k)]
        shapes += [
            (b, mq, mkv, h, kk, kk)
            for kk in (1, 2, 3, 31, 34, 36, 38, 40, 64, 258, 264, 512)
            if kk <= max_k
        ]
        for kk in (32, 36, 64, 264):
            shapes += [(b, mq, mkv, h, k, kk), (b, mq, mkv, h, kk, k)]
        for k2 in test_k:
            shapes += [(b, 16, 1024, h, k2, k2), (b, 1024, 16, h, k2, k2)]
        shapes += [(max(1, b // h2), mq, mkv, h2, k, k) for h2 in (3, 5, 12)]
    return shapes  # upstream also has (1, 128, 128, 300, 128, 128): 300 heads, left out here


SHAPES = generate_test_shapes_B_Mq_Mkv_H_K_Kv()


def ref_attention(q, k, v, attn_bias=None, scale=None):
    """xFormers' reference, rewritten for (B, M, H, K) inputs: float32, q scaled first,
    the bias (a float tensor broadcastable to (B, H, Mq, Mkv), -inf where hidden) added,
    softmax, weighted values. A row that sees no key gives zeros (qkv's convention;
    xFormers' reference gives NaN there and its tests avoid such rows)."""
    q, k, v = (t.float().transpose(1, 2) for t in (q, k, v))  # (B, H, M, K)
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    scale = 1 / q.shape[-1] ** 0.5 if scale is None else scale
    attn = (q * scale) @ k.transpose(-2, -1)
    if attn_bias is not None:
        attn = attn + attn_bias.float()
    empty = torch.isneginf(attn).all(-1, keepdim=True)
    attn = attn.masked_fill(empty, 0.0).softmax(-1).masked_fill(empty, 0.0)
    return (attn @ v).transpose(1, 2)  # (B, Mq, H, Kv)


def _rand_seqlens(total_q, total_kv, blocks, more_keys_than_queries):
    """Random lengths of ``blocks`` packed sequences adding up to the totals (each >= 1);
    with ``more_keys_than_queries`` each key block is at least its query block."""

    def split(total, n):
        cuts = sorted(random.sample(range(1, total), n - 1))
        return [b - a for a, b in zip([0] + cuts, cuts + [total])]

    q = split(total_q, blocks)
    if not more_keys_than_queries:
        return q, split(total_kv, blocks)
    extra = split(total_kv - total_q + blocks, blocks)  # each >= 1
    return q, [n + e - 1 for n, e in zip(q, extra)]


def create_attn_bias(bias_type, b, h, mq, mkv, dtype):
    """``(mask for qkv, additive bias for ref_attention)``: qkv gets a boolean mask
    (``True`` = may attend), a float mask, or ``causal=True`` (returned as the string
    ``"causal"``); the reference always gets a float bias with -inf where hidden."""
    if bias_type == "none":
        return None, None
    if bias_type == "LowerTriangularFromBottomRightMask":
        allowed = causal_bool(mq, mkv, "bottom_right")
        return "causal", torch.zeros(mq, mkv).masked_fill(~allowed, -math.inf)
    if bias_type in ("tensor", "LowerTriangularMaskWithTensorBias"):
        bias = torch.randn(b, h, mq, mkv, dtype=dtype) * 3
    elif bias_type == "tensor_broadcast_over_queries":
        bias = (torch.randn(b, h, 1, mkv, dtype=dtype) * 3).expand(b, h, mq, mkv)
    if bias_type in ("tensor", "tensor_broadcast_over_queries"):
        return bias, bias.float()
    if bias_type == "LowerTriangularMask":
        allowed = causal_bool(mq, mkv, "top_left")
        return allowed, torch.zeros(mq, mkv).masked_fill(~allowed, -math.inf)
    if bias_type == "LowerTriangularMaskWithTensorBias":
        hidden = ~causal_bool(mq, mkv, "top_left")
        bias = bias.masked_fill(hidden, -math.inf)
        return bias, bias.float()
    # block-diagonal: sequences packed one after another, batch 1
    blocks = max(1, min(3, mq, mkv))
    bottom_right = bias_type == "BlockDiagonalCausalFromBottomRightMask"
    q_lens, kv_lens = _rand_seqlens(mq, mkv, blocks, bottom_right and mkv >= mq)
    allowed = block_diagonal(
        q_lens,
        kv_lens,
        causal={
            "BlockDiagonalMask": None,
            "BlockDiagonalCausalMask": "top_left",
            "BlockDiagonalCausalFromBottomRightMask": "bottom_right",
        }[bias_type],
    )
    return allowed, torch.zeros(mq, mkv).masked_fill(~allowed, -math.inf)


def block_diagonal(q_lens, kv_lens, causal=None):
    """``(sum q_lens, sum kv_lens)`` boolean mask: query block i sees key block i only,
    causally (``"top_left"`` or ``"bottom_right"`` within the block) if asked."""
    mask = torch.zeros(sum(q_lens), sum(kv_lens), dtype=torch.bool)
    q0 = k0 = 0
    for nq, nk in zip(q_lens, kv_lens):
        mask[q0 : q0 + nq, k0 : k0 + nk] = True if causal is None else causal_bool(nq, nk, causal)
        q0, k0 = q0 + nq, k0 + nk
    return mask


def create_tensors(dtype, b, mq, mkv, h, k, kv, h_kv=None, requires_grad=False):
    """(B, M, H, K) inputs drawn as upstream: ``randn * 3``."""
    h_kv = h if h_kv is None else h_kv
    q = torch.randn(b, mq, h, k, dtype=dtype) * 3
    key = torch.randn(b, mkv, h_kv, k, dtype=dtype) * 3
    value = torch.randn(b, mkv, h_kv, kv, dtype=dtype) * 3
    return [t.requires_grad_(requires_grad) for t in (q, key, value)]


def _memory_efficient_attention(q, k, v, mask, backend, scale=None):
    """qkv on xFormers' (B, M, H, K) layout."""
    causal = isinstance(mask, str)
    out = qkv.scaled_dot_product_attention(
        q.transpose(1, 2),
        k.transpose(1, 2),
        v.transpose(1, 2),
        None if causal else mask,
        causal=causal,
        scale=scale,
        backend=backend,
    )
    return out.transpose(1, 2)


def assert_allclose(out, ref, msg="failed", atol=1e-8, rtol=1e-5):
    """xFormers' assert_allclose: the worst element named in the message."""
    assert out.shape == ref.shape
    excess = ((out.float() - ref.float()).abs() - atol - ref.float().abs() * rtol).flatten()
    worst = int(excess.argmax())
    assert torch.allclose(out.float(), ref.float(), rtol=rtol, atol=atol), (
        f"{msg}: out={out.flatten()[worst]} and ref={ref.flatten()[worst]} "
        f"(diff={excess[worst]:.3g} > 0) / atol={atol}, rtol={rtol}"
    )


def backward_error_atol(k, kv_len, q_len, dtype):
    """The upstream gradient tolerances: growing with the sizes in float32, and with the
    length (1.4x per 64) in half precision."""
    if dtype == torch.float16:
        return 5e-2 * 1.4 ** (max(q_len, kv_len) // 64), 2e-2
    if dtype == torch.bfloat16:
        return 0.5 * 1.4 ** (max(q_len, kv_len) // 64), 0.1
    return 2e-4 + 2e-6 * k * kv_len * math.sqrt(q_len), 1e-4


def _draw_shape(salt, block_diagonal_bias):
    """One shape of the upstream list, the same in every run; packed sequences have batch 1."""
    b, mq, mkv, h, k, kv = sample(SHAPES, 1, salt)[0]
    return (1 if block_diagonal_bias else b), mq, mkv, h, k, kv


def _cases(dtypes, test):
    cases = []
    for bias_type in BIAS_TYPES:
        for dtype in dtypes:
            shape = _draw_shape(f"{test}-{bias_type}-{dtype}", bias_type.startswith("Block"))
            cases.append((bias_type, dtype, shape))
    return cases


def _case_id(case):
    bias_type, dtype, (b, mq, mkv, h, k, kv) = case
    return f"{bias_type}-{dtype_id(dtype)}-{b},{mq},{mkv},{h},{k},{kv}"


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("case", _cases(DTYPES, "test_forward"), ids=_case_id)
def test_forward(backend, case):
    """facebookresearch/xformers tests/test_mem_eff_attention.py, test_forward (BMHK
    layout): every bias type of its later versions in every dtype, each with one shape
    drawn from generate_test_shapes_B_Mq_Mkv_H_K_Kv; the CUTLASS op's tolerances."""
    bias_type, dtype, (b, mq, mkv, h, k, kv) = case
    q, key, value = create_tensors(dtype, b, mq, mkv, h, k, kv)
    mask, bias = create_attn_bias(bias_type, b, h, mq, mkv, dtype)
    out = _memory_efficient_attention(q, key, value, mask, backend)
    ref = ref_attention(q, key, value, bias)
    atol, rtol = FORWARD_TOL[dtype]
    assert out.dtype == dtype
    assert_allclose(out, ref, atol=atol, rtol=rtol)


BACKWARD_CASES = _cases([torch.float32], "test_backward") + sample(
    _cases([torch.float16, torch.bfloat16], "test_backward"), 3, salt="test_backward-half"
)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("case", BACKWARD_CASES, ids=_case_id)
def test_backward(backend, case):
    """facebookresearch/xformers tests/test_mem_eff_attention.py, test_backward: every bias
    type in float32 and three in half precision, one drawn shape each, a packed (B, M, 3,
    H, K) input where q, k and v fit one (upstream's qkv-packed case) and a gradient of
    ones, non-contiguous (expanded) for half the cases as its grad_out_contiguous=False;
    its backward_error_atol."""
    bias_type, dtype, (b, mq, mkv, h, k, kv) = case
    packed = mq == mkv and k == kv
    if packed:
        stacked = (torch.randn(b, mq, 3, h, k, dtype=dtype) * 3).requires_grad_(True)
        q, key, value = stacked.unbind(2)
        leaves = [stacked]
    else:
        q, key, value = create_tensors(dtype, b, mq, mkv, h, k, kv, requires_grad=True)
        leaves = [q, key, value]
    mask, bias = create_attn_bias(bias_type, b, h, mq, mkv, dtype)
    out = _memory_efficient_attention(q, key, value, mask, backend)
    grad_out = torch.ones_like(out)
    if random.random() < 0.5:
        grad_out = torch.ones(1, dtype=dtype).expand_as(out)
    grads = torch.autograd.grad(out, leaves, grad_out)
    ref = ref_attention(q, key, value, bias)
    grads_ref = torch.autograd.grad(ref, leaves, grad_out.float())
    atol, rtol = backward_error_atol(k, mkv, mq, dtype)
    names = ["qkv"] if packed else ["query", "key", "value"]
    for name, g, g_ref in zip(names, grads, grads_ref):
        assert_allclose(g, g_ref, name, atol=atol, rtol=rtol)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize(
    "bias_type", ["none", "LowerTriangularFromBottomRightMask", "BlockDiagonalMask"]
)
def test_forward_gqa(backend, bias_type):
    """facebookresearch/xformers tests/test_mem_eff_attention.py, test_forward in its
    BMGHK format: G=2 groups of key/value heads, each shared by 3 query heads (xFormers
    expands k and v over the group with stride 0; qkv takes the 2 heads as they are),
    bfloat16, Mq=Mkv=128 (a packed batch of 1 for the block-diagonal bias), K=64."""
    b, m, groups, per_group, k = (1 if bias_type.startswith("Block") else 2), 128, 2, 3, 64
    h = groups * per_group
    q, key, value = create_tensors(torch.bfloat16, b, m, m, h, k, k, h_kv=groups)
    mask, bias = create_attn_bias(bias_type, b, h, m, m, torch.bfloat16)
    out = _memory_efficient_attention(q, key, value, mask, backend)
    expanded = [t.repeat_interleave(per_group, dim=2) for t in (key, value)]  # BMGHK made BMHK
    ref = ref_attention(q, *expanded, bias)
    assert_allclose(
        out, ref, atol=FORWARD_TOL[torch.bfloat16][0], rtol=FORWARD_TOL[torch.bfloat16][1]
    )


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize(
    "q_len,kv_len,k_len,batch", [(128, 512, 5, 1), (512, 128, 6, 4), (128, 128, 32, 4)]
)
def test_key_query_all_ones(backend, q_len, kv_len, k_len, batch):
    """facebookresearch/xformers tests/test_mem_eff_attention.py, test_key_query_all_ones
    (3 of its 24 combinations): queries and keys all ones make every score equal, so each
    output row is the mean of the values."""
    query = torch.ones(batch, 1, q_len, k_len)
    key = torch.ones(batch, 1, kv_len, k_len)
    value = torch.randn(batch, 1, kv_len, k_len) * 3
    out = qkv.scaled_dot_product_attention(query, key, value, backend=backend)
    ref = value.mean(2, keepdim=True).expand_as(out)
    assert_allclose(out, ref, atol=1e-5)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize(
    "shape",
    [(1, 32, 256, 1, 32, 32), (3, 256, 64, 1, 128, 128), (1, 15, 128, 1, 32, 32)],
    ids=lambda s: ",".join(map(str, s)),
)
def test_logsumexp(backend, shape):
    """facebookresearch/xformers tests/test_mem_eff_attention.py, test_logsumexp (float32):
    ``qkv.attention_lse`` against logsumexp of (q / sqrt(K)) kᵀ, atol 2e-4. A backend
    that does not return the log-sum-exp must say so (upstream skips such ops)."""
    b, mq, mkv, h, k, kv = shape
    q, key, value = create_tensors(torch.float32, b, mq, mkv, h, k, kv)
    args = (q.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2))
    try:
        _, lse = qkv.attention_lse(*args, backend=backend)
    except ValueError as e:  # a backend without it says so by name (torch's sdpa)
        assert "log-sum-exp" in str(e) and backend == "sdpa", e
        return
    ref = ((args[0] / k**0.5) @ args[1].transpose(-2, -1)).logsumexp(-1)
    assert_allclose(lse, ref, atol=2e-4)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_memory_efficient_attention_full_block_masked(backend):
    """facebookresearch/xformers tests/test_mem_eff_attention.py,
    test_memory_efficient_attention_full_block_masked: 96 keys in 3 blocks of 32, of which
    each query sees only the first 4 keys of the first two blocks; forward (atol 2e-4)
    and gradients of ones (atol 6e-4, its CPU tolerance)."""
    q_len = kv_len = 3 * 32
    q, key, value = (torch.randn(1, 1, n, 32) * 3 for n in (q_len, kv_len, kv_len))
    for t in (q, key, value):
        t.requires_grad_(True)
    bias = torch.full((3, 32), -math.inf)
    bias[:2, :4] = 0
    bias = bias.flatten()[None, None, None, :].expand(1, 1, q_len, kv_len)
    out = qkv.scaled_dot_product_attention(q, key, value, bias, backend=backend)
    ref = ref_attention(*(t.transpose(1, 2) for t in (q, key, value)), bias).transpose(1, 2)
    assert_allclose(out, ref, atol=2e-4)
    grads = torch.autograd.grad(out, (q, key, value), torch.ones_like(out))
    grads_ref = torch.autograd.grad(ref, (q, key, value), torch.ones_like(ref))
    for name, g, g_ref in zip(("grad_q", "grad_k", "grad_v"), grads, grads_ref):
        assert_allclose(g, g_ref, name, atol=6e-4)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_custom_scale(backend):
    """facebookresearch/xformers tests/test_mem_eff_attention.py, test_custom_scale
    (CUDA there): scale 1 instead of 1/sqrt(K), forward and gradients of ones, float32,
    one shape of the list."""
    b, mq, mkv, h, k, kv = 1, 32, 64, 1, 32, 32
    q, key, value = create_tensors(torch.float32, b, mq, mkv, h, k, kv, requires_grad=True)
    out = _memory_efficient_attention(q, key, value, None, backend, scale=1.0)
    ref = ref_attention(q, key, value, scale=1.0)
    assert_allclose(out, ref, atol=FORWARD_TOL[torch.float32][0])
    grads = torch.autograd.grad(out, (q, key, value), torch.ones_like(out))
    grads_ref = torch.autograd.grad(ref, (q, key, value), torch.ones_like(ref))
    atol, rtol = backward_error_atol(k, mkv, mq, torch.float32)
    for g, g_ref in zip(grads, grads_ref):
        assert_allclose(g, g_ref, atol=atol, rtol=rtol)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize(
    "causal",
    [None, "top_left", "bottom_right"],
    ids=["plain", "causal", "causal_from_bottom_right"],
)
def test_attn_bias_blockdiag_doc(backend, causal):
    """facebookresearch/xformers tests/test_mem_eff_attention.py, test_attn_bias_blockdiag_doc
    (the BlockDiagonalMask docstring's example, with its causal variants): three sequences
    of 2, 3 and 2 queries over 3, 6 and 2 keys packed in one batch row give, block by
    block, what each sequence gives alone."""
    q_lens, kv_lens = [2, 3, 2], [3, 6, 2]
    q = torch.randn(1, 4, sum(q_lens), 16)
    key, value = torch.randn(1, 4, sum(kv_lens), 16), torch.randn(1, 4, sum(kv_lens), 16)
    mask = block_diagonal(q_lens, kv_lens, causal)
    out = qkv.scaled_dot_product_attention(q, key, value, mask, backend=backend)
    q0 = k0 = 0
    for nq, nk in zip(q_lens, kv_lens):
        own = None if causal is None else causal_bool(nq, nk, causal)
        alone = qkv.scaled_dot_product_attention(
            q[:, :, q0 : q0 + nq],
            key[:, :, k0 : k0 + nk],
            value[:, :, k0 : k0 + nk],
            own,
            backend=backend,
        )
        torch.testing.assert_close(out[:, :, q0 : q0 + nq], alone)
        q0, k0 = q0 + nq, k0 + nk
