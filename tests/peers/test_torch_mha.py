"""PyTorch's ``nn.MultiheadAttention`` tests (``pytorch/pytorch``,
``test/nn/test_multihead_attention.py``, and the MHA tests of ``test/test_transformers.py``)
ported to ``qkv.TorchMultiheadAttention.from_torch`` on every CPU backend.

torch's module is the peer: both run on the same weights and the same inputs, torch's
masks translated by ``qkv.from_torch_masks`` (torch's boolean ``True`` = do not attend).
qkv's module is batch-first only, so sequence-first inputs are transposed for it. A query
row that sees no key is NaN in torch and zeros in qkv before the output projection, so
there qkv's output must be the projection's bias.
"""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import qkv
from qkv.modules import LayerKV
from tests.peers.peer_helpers import CPU_BACKENDS, dtype_id

# the upstream helper mixes a float attention mask with a boolean padding mask, on purpose
pytestmark = pytest.mark.filterwarnings("ignore:Support for mismatched key_padding_mask")


def _ours(mha: nn.MultiheadAttention, backend: str) -> qkv.TorchMultiheadAttention:
    ours = qkv.TorchMultiheadAttention.from_torch(mha)
    ours.backend = backend
    return ours


def _assert_matches_torch(out, want, ours, atol=1e-5, rtol=1e-5, weights=None, want_weights=None):
    """qkv's batch-first ``out`` against torch's batch-first ``want``; torch's NaN rows
    (queries that see no key) must be the output projection's bias in qkv, and zero
    weights."""
    empty = want.isnan().all(-1)  # (B, Tq)
    bias = ours.out_proj.bias if ours.out_proj.bias is not None else torch.zeros(out.shape[-1])
    expected = torch.where(empty[..., None], bias.to(out.dtype).detach(), want)
    torch.testing.assert_close(out, expected, atol=atol, rtol=rtol)
    if weights is not None:
        rows = empty[:, None, :, None] if weights.ndim == 4 else empty[..., None]
        torch.testing.assert_close(
            weights, torch.where(rows, 0.0, want_weights).to(weights.dtype), atol=atol, rtol=rtol
        )


# --- TestMultiheadAttentionNN.test_multihead_attention -------------------------------------

VARIANTS = {  # the upstream inner tests: keyword arguments of its _multihead_attn_test_helper
    "no_masking": {},
    "key_padding_mask": dict(add_key_padding_mask=True),
    "add_bias_kv": dict(add_bias_kv=True),
    "add_zero_attn": dict(add_zero_attn=True),
    "saved_kv": dict(saved_kv=True),
    "add_bias_kv_zero_attn": dict(add_key_padding_mask=True, add_bias_kv=True, add_zero_attn=True),
    "all_arguments1": dict(add_key_padding_mask=True, add_zero_attn=True, saved_kv=True),
    "all_arguments3": dict(
        add_key_padding_mask=True, add_zero_attn=True, saved_kv=True, same_embed_dim=True
    ),
}


def _one_trial(
    backend,
    average,
    *,
    add_key_padding_mask=False,
    add_bias_kv=False,
    add_zero_attn=False,
    saved_kv=False,
    same_embed_dim=False,
):
    """One draw of the upstream helper: random sizes, a one-step query (a decoder state)
    attending to a source of kdim-wide states that are both keys and values, a random
    0/-inf attention mask over the source and, if asked, one padding pattern for every
    row, saved (already projected) keys and values, a learned and a zero key."""
    batch, seq_len = random.randint(2, 10), random.randint(2, 10)
    d_head, heads = random.randint(3, 10), random.randint(2, 5) * 2
    d_model = d_head * heads
    kv_dim = d_model if same_embed_dim else random.randint(5, 20)
    mha = nn.MultiheadAttention(
        d_model,
        heads,
        add_bias_kv=add_bias_kv,
        add_zero_attn=add_zero_attn,
        kdim=kv_dim,
        vdim=kv_dim,
    )
    nn.init.normal_(mha.in_proj_bias)  # torch starts biases at 0: make them count
    nn.init.normal_(mha.out_proj.bias)
    query = torch.rand(batch, 1, d_model)  # (B, 1, E)
    source = torch.rand(batch, seq_len, kv_dim)  # (B, S, kdim): keys and values
    attn_mask = torch.zeros(1, seq_len).masked_fill(torch.rand(1, seq_len) < 0.5, float("-inf"))
    key_padding_mask = None
    if add_key_padding_mask:
        key_padding_mask = (torch.rand(1, seq_len) < 0.5).expand(batch, seq_len)
    static_k = static_v = None
    if saved_kv:
        static_k = torch.rand(batch * heads, seq_len, d_head)
        static_v = torch.rand(batch * heads, seq_len, d_head)

    want, want_w = F.multi_head_attention_forward(
        query.transpose(0, 1),
        source.transpose(0, 1),
        source.transpose(0, 1),
        d_model,
        heads,
        mha.in_proj_weight,
        mha.in_proj_bias,
        mha.bias_k,
        mha.bias_v,
        mha.add_zero_attn,
        0.0,
        mha.out_proj.weight,
        mha.out_proj.bias,
        training=False,
        key_padding_mask=key_padding_mask,
        need_weights=True,
        attn_mask=attn_mask,
        use_separate_proj_weight=not mha._qkv_same_embed_dim,
        q_proj_weight=mha.q_proj_weight,
        k_proj_weight=mha.k_proj_weight,
        v_proj_weight=mha.v_proj_weight,
        static_k=static_k,
        static_v=static_v,
        average_attn_weights=average,
    )

    ours = _ours(mha, backend).eval()
    cache = None
    if saved_kv:  # keys and values given already projected: a static (cross-attention) cache
        cache = LayerKV()
        cache.set_static(
            static_k.view(batch, heads, seq_len, d_head),
            static_v.view(batch, heads, seq_len, d_head),
        )
    mask = qkv.from_torch_masks(attn_mask, key_padding_mask)
    with torch.no_grad():
        out, weights = ours(query, source, source, mask=mask, need_weights=True, cache=cache)
    if average:
        weights = weights.mean(1)
    _assert_matches_torch(
        out, want.detach().transpose(0, 1), ours, 1e-5, 1e-5, weights, want_w.detach()
    )


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("average", [True, False], ids=["average_attn_weights", "per_head_weights"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_multihead_attention(backend, average, variant):
    """pytorch/pytorch test/nn/test_multihead_attention.py,
    TestMultiheadAttentionNN.test_multihead_attention (average_attn_weights True/False), the
    inner test named by ``variant`` (test_multihead_attn_<variant>): 5 random draws of its
    helper instead of 100; torch's own forward is the reference instead of its numpy
    rewrite. Its ``all_arguments2`` (a learned key added to saved keys) is refused by torch
    and has no counterpart to compare."""
    for _ in range(5):
        _one_trial(backend, average, **VARIANTS[variant])


# --- TestMultiheadAttentionNN.test_multihead_attn_3d_attn_mask -----------------------------


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_multihead_attn_3d_attn_mask(backend):
    """pytorch/pytorch test/nn/test_multihead_attention.py,
    TestMultiheadAttentionNN.test_multihead_attn_3d_attn_mask: a (B*H, T, S) float mask
    gives torch's output, and each batch row equals that row alone under its 2-d mask."""
    embed, heads, batch, src, tgt = 8, 4, 8, 3, 2
    query = torch.rand(batch, tgt, embed)
    key = torch.rand(batch, src, embed)
    mask = torch.zeros(batch, tgt, src).masked_fill(
        torch.rand(batch, tgt, src) < 0.5, float("-inf")
    )
    mask_3d = mask.repeat_interleave(heads, dim=0)  # (B * H, T, S)
    mha = nn.MultiheadAttention(embed, heads)
    with torch.no_grad():
        want = mha(
            query.transpose(0, 1), key.transpose(0, 1), key.transpose(0, 1), attn_mask=mask_3d
        )[0]
        ours = _ours(mha, backend)
        got, _ = ours(query, key, key, mask=qkv.from_torch_masks(mask_3d, num_heads=heads))
        _assert_matches_torch(got, want.transpose(0, 1), ours)
        for i in range(batch):
            one, _ = ours(
                query[i : i + 1], key[i : i + 1], key[i : i + 1], mask=qkv.from_torch_masks(mask[i])
            )
            torch.testing.assert_close(got[i : i + 1], one)


# --- TestMultiheadAttentionNN.test_multihead_attn_no_bias; in_proj_bias/weight_none --------


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("case", ["no_bias", "in_proj_bias_none", "in_proj_weight_none"])
def test_multihead_attn_no_bias_and_separate_weights(backend, case):
    """pytorch/pytorch test/nn/test_multihead_attention.py,
    TestMultiheadAttentionNN.test_multihead_attn_no_bias and
    TestMultiheadAttentionNNDeviceType.test_multihead_attn_in_proj_bias_none,
    .test_multihead_attn_in_proj_weight_none (float64): without biases, qkv has none either;
    with kdim = vdim = 2 torch keeps separate q/k/v weights, which from_torch copies."""
    if case == "no_bias":
        mha, query, key = nn.MultiheadAttention(8, 4, bias=False), torch.rand(5, 3, 8), None
    elif case == "in_proj_bias_none":
        mha, query, key = nn.MultiheadAttention(2, 2, bias=False), torch.rand(2, 2, 2), None
    else:
        mha = nn.MultiheadAttention(4, 4, vdim=2, kdim=2)
        query, key = torch.rand(4, 4, 4), torch.rand(4, 4, 2)
    mha = mha.double()
    query = query.double()
    key = query if key is None else key.double()
    with torch.no_grad():
        want, want_w = mha(query, key, key)
        ours = _ours(mha, backend)
        got, got_w = ours(
            query.transpose(0, 1), key.transpose(0, 1), key.transpose(0, 1), need_weights=True
        )
    if case != "in_proj_weight_none":
        assert mha.in_proj_bias is None and mha.out_proj.bias is None
        assert all(p.bias is None for p in (ours.q_proj, ours.k_proj, ours.v_proj, ours.out_proj))
    else:
        assert mha.in_proj_weight is None
    torch.testing.assert_close(got, want.transpose(0, 1))
    torch.testing.assert_close(got_w.mean(1), want_w)


# --- TestMultiheadAttentionNN.test_multihead_attn_invalid_shape ----------------------------

BAD_CALLS = {  # upstream case -> (arguments, qkv's message)
    "3d_query_2d_key": (lambda q: (q, torch.randn(4, 4), q), {}, "batch-first"),
    "3d_query_2d_value": (lambda q: (q, q, torch.randn(4, 4)), {}, "batch-first"),
    "1d_key_padding_mask": (
        lambda q: (q, q, q),
        dict(key_mask=torch.tensor([True, True, False, False])),
        r"key_mask must be boolean \(B, Tk\)",
    ),
    "1d_attn_mask": (
        lambda q: (q, q, q),
        dict(mask=torch.tensor([False, False, True, True])),
        r"mask must be \(Tq, Tk\), \(B, Tq, Tk\) or \(B, H, Tq, Tk\)",
    ),
    "3d_attn_mask_of_wrong_batch": (
        lambda q: (q, q, q),
        dict(mask=torch.rand(5, 4, 4) < 0.5),
        r"got \(5, 4, 4\)",
    ),
    "unbatched_2d_query": (lambda q: (q[0], q[0], q[0]), {}, "batch-first"),
}


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("case", list(BAD_CALLS))
def test_multihead_attn_invalid_shape(backend, case):
    """pytorch/pytorch test/nn/test_multihead_attention.py,
    TestMultiheadAttentionNN.test_multihead_attn_invalid_shape and
    .test_multihead_attn_fast_path_invalid_shape: inputs and masks of the wrong rank are
    refused with a message naming the shapes. torch also takes unbatched 2-d inputs;
    qkv's module is batch-first only and refuses them the same way."""
    make, kwargs, message = BAD_CALLS[case]
    ours = _ours(nn.MultiheadAttention(4, 4, batch_first=True), backend)
    with pytest.raises(ValueError, match=message):
        ours(*make(torch.randn(4, 4, 4)), **kwargs)


# --- TestMultiheadAttentionNNDeviceType.test_multihead_self_attn_two_masks_fast_path -------


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_multihead_self_attn_two_masks_fast_path(backend):
    """pytorch/pytorch test/nn/test_multihead_attention.py,
    TestMultiheadAttentionNNDeviceType.test_multihead_self_attn_two_masks_fast_path: a
    boolean attention mask and a boolean key padding mask together, against torch's fast
    path (eval, no grad) and its slow path; rows that see no key are left out upstream,
    here they must be the output bias."""
    embed, heads, batch, src = 14, 7, 8, 5
    x = torch.rand(batch, src, embed)
    attn_mask = torch.randint(0, 2, (src, src)).bool()
    key_padding_mask = torch.randint(0, 2, (batch, src)).bool()
    mha = nn.MultiheadAttention(embed, heads, batch_first=True).eval()
    nn.init.normal_(mha.out_proj.bias)
    with torch.no_grad():
        fast, _ = mha(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask)
        slow, _ = F.multi_head_attention_forward(
            *(x.transpose(0, 1),) * 3,
            embed,
            heads,
            mha.in_proj_weight,
            mha.in_proj_bias,
            None,
            None,
            False,
            0.0,
            mha.out_proj.weight,
            mha.out_proj.bias,
            training=False,
            key_padding_mask=key_padding_mask,
            need_weights=False,
            attn_mask=attn_mask,
        )
        ours = _ours(mha, backend)
        got, _ = ours(x, mask=qkv.from_torch_masks(attn_mask, key_padding_mask))
    _assert_matches_torch(got, slow.transpose(0, 1), ours)
    seen = ~(attn_mask[None] | key_padding_mask[:, None, :]).all(-1)  # (B, T)
    torch.testing.assert_close(got[seen], fast[seen], atol=1e-5, rtol=1e-5)


# --- test_multihead_attention_dtype, _dtype_batch_first ------------------------------------

DTYPE_TOL = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 2e-3}


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("layout", ["seq_first", "batch_first_train", "batch_first_eval"])
@pytest.mark.parametrize("dtype", list(DTYPE_TOL), ids=dtype_id)
def test_multihead_attention_dtype(backend, layout, dtype):
    """pytorch/pytorch test/nn/test_multihead_attention.py,
    TestMultiheadAttentionNNDeviceType.test_multihead_attention_dtype and
    .test_multihead_attention_dtype_batch_first (CUDA there, CPU here; both of its
    training and eval paths): embed 128, 8 heads, 10 tokens, batch 8, distinct q, k, v;
    same dtype and shape out, and torch's values."""
    embed, heads, length, batch = 128, 8, 10, 8
    batch_first = layout != "seq_first"
    mha = nn.MultiheadAttention(embed, heads, batch_first=batch_first).to(dtype)
    if layout == "batch_first_eval":
        mha.eval()
    shape = (batch, length, embed) if batch_first else (length, batch, embed)
    q, k, v = (torch.randn(shape, dtype=dtype) for _ in range(3))
    with torch.no_grad():
        want, _ = mha(q, k, v, need_weights=False)
        ours = _ours(mha, backend)
        if not batch_first:
            q, k, v, want = (
                q.transpose(0, 1),
                k.transpose(0, 1),
                v.transpose(0, 1),
                want.transpose(0, 1),
            )
        got, _ = ours(q, k, v)
    assert got.shape == q.shape and got.dtype == dtype
    tol = DTYPE_TOL[dtype]
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)


# --- test_transformers.py: TestTransformers.test_multiheadattention_fastpath_attn_mask -----


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.float32], ids=["bool", "float"])
@pytest.mark.parametrize("key_padding_mask_dim", [2, None], ids=["kpm_2D", "no_kpm"])
@pytest.mark.parametrize(
    "attn_mask_dim", [2, 3, None], ids=["attn_mask_2D", "attn_mask_3D", "no_attn_mask"]
)
def test_multiheadattention_fastpath_attn_mask(
    backend, attn_mask_dim, key_padding_mask_dim, mask_dtype
):
    """pytorch/pytorch test/test_transformers.py,
    TestTransformers.test_multiheadattention_fastpath_attn_mask: B=2, L=4, D=8, H=4,
    random masks (boolean, or floats in [-9, 9) as torch's make_tensor draws them) as
    2-d or 3-d attention masks and key padding masks; qkv matches torch's slow path
    (train, no dropout) and its fast path (eval)."""
    b, length, d, h = 2, 4, 8, 4

    def make(shape):
        if mask_dtype == torch.bool:
            return torch.rand(shape) < 0.5
        return torch.rand(shape) * 18 - 9

    attn_mask = {2: lambda: make((length, length)), 3: lambda: make((b * h, length, length))}.get(
        attn_mask_dim, lambda: None
    )()
    key_padding_mask = make((b, length)) if key_padding_mask_dim == 2 else None
    mha = nn.MultiheadAttention(d, h, batch_first=True)
    nn.init.normal_(mha.out_proj.bias)
    x = torch.randn(b, length, d)
    with torch.no_grad():
        mha.train()
        slow, _ = mha(
            x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask, need_weights=False
        )
        mha.eval()
        fast, _ = mha(
            x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask, need_weights=False
        )
        ours = _ours(mha, backend)
        mask = qkv.from_torch_masks(attn_mask, key_padding_mask, num_heads=h)
        got, _ = ours(x, mask=mask)
    _assert_matches_torch(got, slow, ours)
    seen = ~fast.isnan().all(-1)  # torch's fast path gives NaN where its slow path gave 0
    torch.testing.assert_close(got[seen], fast[seen], atol=1e-5, rtol=1e-5)


# --- test_transformers.py: TestTransformers.is_causal_kernels ------------------------------


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_is_causal_kernels(backend):
    """pytorch/pytorch test/test_transformers.py, TestTransformers.is_causal_kernels (via
    test_train_with_is_causal): ones in, weights of ones, a causal mask: every output is
    16 exactly. qkv takes ``causal=True`` alone (torch also wants the mask itself)."""
    embed = 4
    mha = nn.MultiheadAttention(embed, 1, batch_first=True)
    with torch.no_grad():
        mha.in_proj_weight.fill_(1.0)
        mha.out_proj.weight.fill_(1.0)
    x = torch.ones(1, 2, embed)
    mask = nn.Transformer.generate_square_subsequent_mask(2)
    with torch.no_grad():
        want, _ = mha(x, x, x, attn_mask=mask, need_weights=False, is_causal=True)
        got, _ = _ours(mha, backend)(x, causal=True)
    assert torch.equal(want, torch.full((1, 2, embed), 16.0))
    assert torch.equal(got, want)
