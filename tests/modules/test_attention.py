"""MultiHeadAttention: parity with torch.nn.MultiheadAttention, GQA, cache, permutations;
under ``torch.compile``, one graph and the same numbers as eagerly."""

from __future__ import annotations

import shutil

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import qkv
from qkv.functional import from_torch_masks
from qkv.modules.transformer import EncoderLayer

E, H = 24, 4
X, KEYS = torch.randn(2, 5, E), torch.ones(2, 5, dtype=torch.bool)
MASK = r"mask must be \(Tq, Tk\), .* with B=2, H=4, Tq=5, Tk=5"


EXTRAS = {  # torch.nn.MultiheadAttention's options that append keys
    "plain": {},
    "bias_kv": dict(add_bias_kv=True),
    "zero_attn": dict(add_zero_attn=True),
    "both": dict(add_bias_kv=True, add_zero_attn=True),
}


def _torch_mha(batch_first, kdim=None, vdim=None, bias=True, **extras):
    m = nn.MultiheadAttention(
        E, H, batch_first=batch_first, kdim=kdim, vdim=vdim, bias=bias, **extras
    )
    if m.bias_k is not None:  # torch starts them at small random values; make them count
        nn.init.normal_(m.bias_k)
        nn.init.normal_(m.bias_v)
    return m.double()


def _torch_masks(kind, b, tq, tk):
    kpm = attn = None
    if kind in ("keypad", "both"):
        lengths = torch.randint(1, tk + 1, (b,))
        kpm = ~qkv.padding_mask(lengths, tk)  # torch: True = padding
    if kind in ("bool", "both"):
        attn = torch.rand(tq, tk) > 0.6
        attn[:, 0] = False  # torch NaNs on empty rows; keep them non-empty
        if kpm is not None:
            kpm[:, 0] = False
    if kind == "float":
        attn = torch.randn(tq, tk, dtype=torch.float64)
    if kind == "per-head":
        attn = torch.randn(b * H, tq, tk, dtype=torch.float64)
    return attn, kpm


@pytest.mark.parametrize("batch_first", [True, False], ids=["batch_first", "seq_first"])
@pytest.mark.parametrize("masks", ["none", "keypad", "bool", "float", "both", "per-head"])
@pytest.mark.parametrize("kv", ["self", "cross", "kdim-vdim"])
@pytest.mark.parametrize("extras", sorted(EXTRAS))
def test_from_torch_matches_outputs_weights_and_gradients(batch_first, masks, kv, extras):
    kdim, vdim = (10, 14) if kv == "kdim-vdim" else (None, None)
    ref = _torch_mha(batch_first, kdim, vdim, **EXTRAS[extras])
    ours = qkv.TorchMultiheadAttention.from_torch(ref)
    b, tq, tk = 3, 5, 7 if kv != "self" else 5
    x = torch.randn(b, tq, E, dtype=torch.float64)
    key = x if kv == "self" else torch.randn(b, tk, kdim or E, dtype=torch.float64)
    value = x if kv == "self" else torch.randn(b, tk, vdim or E, dtype=torch.float64)
    attn, kpm = _torch_masks(masks, b, tq, tk)

    def t(y):
        return y if batch_first else y.transpose(0, 1)

    out_ref, w_ref = ref(
        t(x),
        t(key),
        t(value),
        key_padding_mask=kpm,
        attn_mask=attn,
        need_weights=True,
        average_attn_weights=False,
    )
    mask = from_torch_masks(attn, kpm, num_heads=H, dtype=torch.float64)
    out, w = ours(
        x,
        None if kv == "self" else key,
        None if kv == "self" else value,
        mask=mask,
        need_weights=True,
    )
    torch.testing.assert_close(out, t(out_ref), atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(w, w_ref, atol=1e-12, rtol=1e-10)
    _, w_avg = ref(t(x), t(key), t(value), key_padding_mask=kpm, attn_mask=attn)
    torch.testing.assert_close(w.mean(1), w_avg, atol=1e-12, rtol=1e-10)

    grad = torch.randn_like(out)
    out.backward(grad)
    out_ref.backward(t(grad))
    ours_w = [ours.q_proj.weight.grad, ours.k_proj.weight.grad, ours.v_proj.weight.grad]
    if ref._qkv_same_embed_dim:
        torch.testing.assert_close(torch.cat(ours_w), ref.in_proj_weight.grad)
    else:
        theirs = [ref.q_proj_weight.grad, ref.k_proj_weight.grad, ref.v_proj_weight.grad]
        for a, c in zip(ours_w, theirs):
            torch.testing.assert_close(a, c)
    torch.testing.assert_close(ours.out_proj.weight.grad, ref.out_proj.weight.grad)
    bias_grads = [ours.q_proj.bias.grad, ours.k_proj.bias.grad, ours.v_proj.bias.grad]
    torch.testing.assert_close(torch.cat(bias_grads), ref.in_proj_bias.grad)
    if ref.bias_k is not None:
        torch.testing.assert_close(ours.bias_k.grad, ref.bias_k.grad.flatten())
        torch.testing.assert_close(ours.bias_v.grad, ref.bias_v.grad.flatten())


def test_from_torch_float32_fast_path_and_no_bias():
    ref = nn.MultiheadAttention(E, H, batch_first=True, bias=False).eval()
    ours = qkv.TorchMultiheadAttention.from_torch(ref).eval()
    x = torch.randn(2, 9, E)
    kpm = torch.zeros(2, 9, dtype=torch.bool)
    kpm[1, 6:] = True
    with torch.no_grad():  # torch takes its fused inference path here
        out_ref, _ = ref(x, x, x, key_padding_mask=kpm, need_weights=False)
        out, _ = ours(x, key_mask=~kpm)
    torch.testing.assert_close(out[0], out_ref[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[1, :6], out_ref[1, :6], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
def test_from_torch_keeps_train_or_eval_mode(training):
    ref = nn.MultiheadAttention(E, H, dropout=0.5, batch_first=True).train(training)
    ours = qkv.TorchMultiheadAttention.from_torch(ref)
    assert ours.training == training
    if not training:  # an eval-mode copy must not drop weights at random
        x = torch.randn(2, 5, E)
        out_ref, _ = ref(x, x, x, need_weights=False)
        torch.testing.assert_close(ours(x)[0], out_ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", ["reference", "sdpa", "chunked"])
def test_extra_keys_with_causal_and_cache(backend):
    """Causal attention over the real keys, and cached decoding, beside the extra keys."""
    ours = qkv.TorchMultiheadAttention(E, H, add_bias_kv=True, add_zero_attn=True, backend=backend)
    ours = ours.double().requires_grad_(False)
    nn.init.normal_(ours.bias_k)
    nn.init.normal_(ours.bias_v)
    x = torch.randn(2, 6, E, dtype=torch.float64)
    out, w = ours(x, causal=True, need_weights=True)
    assert w.shape == (2, H, 6, 8)
    future = torch.ones(6, 6, dtype=torch.bool).triu(1)
    assert (w[..., :6][..., future] == 0).all() and (w[..., 6:] > 0).all()
    torch.testing.assert_close(w.sum(-1), torch.ones(2, H, 6, dtype=torch.float64))
    plain = qkv.MultiHeadAttention(E, H, backend="reference").double()
    plain.load_state_dict({k: v for k, v in ours.state_dict().items() if "bias_" not in k})
    assert not torch.allclose(out, plain(x, causal=True)[0])  # the extra keys change it
    cache = qkv.KVCache(1)
    steps = [ours(x[:, t : t + 1], cache=cache)[0] for t in range(6)]
    torch.testing.assert_close(torch.cat(steps, 1), out, atol=1e-12, rtol=0)


@pytest.mark.parametrize("backend", ["reference", "sdpa", "chunked"])
@pytest.mark.parametrize("kv_heads", [4, 2, 1], ids=["mha", "gqa", "mqa"])
def test_gqa_equals_mha_with_repeated_kv_weights(backend, kv_heads):
    gqa = qkv.MultiHeadAttention(E, H, num_kv_heads=kv_heads, backend=backend).double()
    mha = qkv.MultiHeadAttention(E, H).double()
    d = E // H
    with torch.no_grad():
        for name in ("q_proj", "out_proj"):
            getattr(mha, name).load_state_dict(getattr(gqa, name).state_dict())
        for name in ("k_proj", "v_proj"):
            w = getattr(gqa, name).weight.view(kv_heads, d, E).repeat_interleave(H // kv_heads, 0)
            b = getattr(gqa, name).bias.view(kv_heads, d).repeat_interleave(H // kv_heads, 0)
            getattr(mha, name).weight.copy_(w.reshape(E, E))
            getattr(mha, name).bias.copy_(b.reshape(E))
    x = torch.randn(2, 6, E, dtype=torch.float64)
    torch.testing.assert_close(gqa(x, causal=True)[0], mha(x, causal=True)[0])


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), t=st.integers(2, 10))
def test_self_attention_without_positions_is_permutation_equivariant(seed, t):
    torch.manual_seed(seed)
    m = qkv.MultiHeadAttention(E, H).double()
    x = torch.randn(2, t, E, dtype=torch.float64)
    perm = torch.randperm(t)
    out, w = m(x, need_weights=True)
    out_p, w_p = m(x[:, perm], need_weights=True)
    torch.testing.assert_close(out_p, out[:, perm])
    torch.testing.assert_close(w_p, w[:, :, perm][:, :, :, perm])


def test_rope_breaks_permutation_equivariance():
    torch.manual_seed(0)
    m = qkv.MultiHeadAttention(E, H, positional=qkv.RotaryPositionalEncoding(E // H)).double()
    x = torch.randn(1, 5, E, dtype=torch.float64)
    perm = torch.tensor([4, 3, 2, 1, 0])
    assert not torch.allclose(m(x[:, perm])[0], m(x)[0][:, perm])


@pytest.mark.parametrize("backend", ["auto", "reference", "chunked"])
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "left-padded"])
@pytest.mark.parametrize("positional", ["none", "rope", "alibi"])
@pytest.mark.parametrize("kv_heads", [4, 2, 1], ids=["mha", "gqa", "mqa"])
def test_kv_cache_decoding_equals_one_causal_pass(positional, kv_heads, padded, backend):
    pos = {"none": None, "rope": qkv.RotaryPositionalEncoding(E // H), "alibi": qkv.ALiBi(H)}
    m = qkv.MultiHeadAttention(
        E, H, num_kv_heads=kv_heads, positional=pos[positional], backend=backend
    ).double()
    x = torch.randn(2, 9, E, dtype=torch.float64)
    keys = qkv.padding_mask(torch.tensor([9, 4]), 9).flip(1) if padded else None  # row 1: 5 pads
    full, w_full = m(x, causal=True, key_mask=keys, need_weights=True)
    cache = qkv.KVCache(1)
    pieces, first = [], 3  # a 3-token prompt, then one token at a time
    out, _ = m(x[:, :first], causal=True, key_mask=_upto(keys, first), cache=cache)
    pieces.append(out)
    for t in range(first, 9):
        out, w = m(
            x[:, t : t + 1],
            causal=True,
            key_mask=_upto(keys, t + 1),
            cache=cache,
            need_weights=True,
        )
        pieces.append(out)
        torch.testing.assert_close(w[:, :, 0], w_full[:, :, t, : t + 1])
    torch.testing.assert_close(torch.cat(pieces, 1), full)
    assert cache.length == 9


def _upto(key_mask: torch.Tensor | None, t: int) -> torch.Tensor | None:
    return None if key_mask is None else key_mask[:, :t]


@pytest.mark.parametrize("positional", ["none", "rope", "alibi"])
def test_query_passed_as_key_and_value_is_self_attention(positional):
    """``m(x, x, x)``, as torch.nn.MultiheadAttention is called, is ``m(x)``: RoPE and
    ALiBi were dropped (0.097 off), and cached decoding froze the first step's keys as
    cross-attention does (1.03 off)."""
    pos = {"none": None, "rope": qkv.RotaryPositionalEncoding(E // H), "alibi": qkv.ALiBi(H)}
    m = qkv.MultiHeadAttention(E, H, positional=pos[positional]).double()
    x = torch.randn(2, 6, E, dtype=torch.float64)
    full, _ = m(x, causal=True)
    torch.testing.assert_close(m(x, x, x, causal=True)[0], full, rtol=0, atol=0)
    torch.testing.assert_close(m(x, x, causal=True)[0], full, rtol=0, atol=0)
    cache = qkv.KVCache(1)
    steps = [m(s, s, s, causal=True, cache=cache)[0] for s in x.split(1, dim=1)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-12, rtol=0)


def test_cross_attention_cache_projects_keys_once():
    m = qkv.MultiHeadAttention(E, H, kdim=10, vdim=10).double()
    memory = torch.randn(2, 7, 10, dtype=torch.float64)
    q = torch.randn(2, 3, E, dtype=torch.float64)
    cache = qkv.KVCache(1)
    first, _ = m(q[:, :1], memory, cache=cache)
    assert cache[0].static and cache[0].length == 7
    second, _ = m(q[:, 1:2], torch.zeros_like(memory), cache=cache)  # memory ignored now
    torch.testing.assert_close(second, m(q[:, 1:2], memory)[0])
    torch.testing.assert_close(first, m(q[:, :1], memory)[0])


def test_dropout_only_while_training():
    m = qkv.MultiHeadAttention(E, H, dropout=0.5)
    x = torch.randn(2, 6, E)
    m.eval()
    torch.testing.assert_close(m(x)[0], m(x)[0])
    m.train()
    assert not torch.allclose(m(x)[0], m(x)[0])


@pytest.mark.parametrize("heads, rows", [(True, None), ([3, 1], slice(2, 5))], ids=["all", "some"])
def test_explicit_sdpa_returns_weights_under_autograd(heads, rows):
    """``backend="sdpa"`` with weights while training (auto would take the reference):
    outputs, the weights asked for (heads and ``weight_rows``) and the gradients of both
    equal the reference backend's in float64."""
    fused = qkv.MultiHeadAttention(E, H, num_kv_heads=2, backend="sdpa").double()
    ref = qkv.MultiHeadAttention(E, H, num_kv_heads=2, backend="reference").double()
    ref.load_state_dict(fused.state_dict())
    x = torch.randn(2, 6, E, dtype=torch.float64)
    key_mask = qkv.padding_mask(torch.tensor([6, 3]), 6)
    out, w = fused(x, key_mask=key_mask, causal=True, need_weights=heads, weight_rows=rows)
    ref_out, ref_w = ref(x, key_mask=key_mask, causal=True, need_weights=True)
    ref_w = ref_w[:, list(range(H)) if heads is True else heads, rows or slice(None)]
    torch.testing.assert_close(out, ref_out, atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(w, ref_w, atol=1e-12, rtol=1e-10)
    g_out, g_w = torch.randn_like(out), torch.randn_like(w)
    ours = torch.autograd.grad((out * g_out).sum() + (w * g_w).sum(), list(fused.parameters()))
    theirs = torch.autograd.grad(
        (ref_out * g_out).sum() + (ref_w * g_w).sum(), list(ref.parameters())
    )
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-8)


@pytest.mark.parametrize(
    "kwargs, call, match",
    [
        ({}, lambda m: m(torch.randn(2, 5)), r"batch-first \(B, T, E\)"),
        ({}, lambda m: m(torch.randn(2, 5, 7)), "embed_dim=24"),
        (
            {},
            lambda m: m(torch.randn(2, 5, E), key_mask=torch.ones(2, 4, dtype=torch.bool)),
            "key_mask must be boolean",
        ),
        ({}, lambda m: m(torch.randn(2, 5, E), torch.randn(3, 5, E)), "batch"),
        ({}, lambda m: m(X, key_mask=torch.ones(3, 5, dtype=torch.bool)), "B=2, Tk=5"),
        ({}, lambda m: m(X, mask=torch.ones(5, 6, dtype=torch.bool), key_mask=KEYS), MASK),
        ({}, lambda m: m(X, mask=torch.ones(3, 5, 5, dtype=torch.bool)), MASK + r".*\(3, 5"),
        (dict(positional=qkv.ALiBi(H)), lambda m: m(X, mask=torch.zeros(5, 6)), MASK),
        (dict(add_bias_kv=True), lambda m: m(X, mask=torch.ones(5, 6, dtype=torch.bool)), MASK),
        ({}, lambda m: m(X.double()), "weights are torch.float32 .* query is torch.float64"),
        ({}, lambda m: m(X, X.double()), "its key is torch.float64"),
        ({}, lambda m: m(X, mask=[[True] * 5] * 5), "^mask must be a tensor or None, got list$"),
        ({}, lambda m: m(X, key_mask=KEYS.tolist()), "^key_mask must be a tensor .* got list$"),
    ],
    ids=[
        "rank",
        "width",
        "key-mask",
        "batch",
        "key-mask-batch",
        "mask-and-key-mask",
        "mask-batch",
        "mask-and-alibi",
        "mask-and-bias-kv",
        "dtype-query",
        "dtype-key",
        "mask-a-list",
        "key-mask-a-list",
    ],
)
def test_bad_inputs_raise_value_errors_with_shapes(kwargs, call, match):
    """One ValueError naming the shapes, not a broadcasting or matmul RuntimeError
    from inside torch (as masks combined with key padding, ALiBi or extra keys gave), nor
    an AttributeError for a mask given as a list."""
    module = qkv.TorchMultiheadAttention if "add_bias_kv" in kwargs else qkv.MultiHeadAttention
    with pytest.raises(ValueError, match=match):
        call(module(E, H, **kwargs))


def test_dtype_check_leaves_autocast_alone():
    m = qkv.MultiHeadAttention(E, H)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = m(X.bfloat16(), causal=True)
    assert out.dtype == torch.bfloat16


def test_a_cache_of_the_other_kind_of_attention_is_refused():
    """Self-attention given a cross-attention cache used the cached source keys instead
    of its own; cross-attention given a self-attention cache overwrote it."""
    m = qkv.MultiHeadAttention(E, H)
    cross, own = qkv.KVCache(1), qkv.KVCache(1)
    m(X, torch.randn(2, 7, E), cache=cross)
    m(X, cache=own)
    with pytest.raises(ValueError, match="self-attention was given a cross-attention"):
        m(X[:, :1], cache=cross)
    with pytest.raises(ValueError, match="cross-attention was given a self-attention cache of 5"):
        m(X[:, :1], torch.randn(2, 7, E), cache=own)
    assert own.length == 5 and cross.length == 7


def test_bad_head_configuration():
    with pytest.raises(ValueError, match="not divisible"):
        qkv.MultiHeadAttention(10, 3)
    with pytest.raises(ValueError, match="must divide"):
        qkv.MultiHeadAttention(E, 4, num_kv_heads=3)


@pytest.mark.parametrize(
    "args, kwargs, match",
    [
        ((E, 0), {}, "^num_heads must be a positive int, got 0$"),  # was ZeroDivisionError
        ((E, -2), {}, "^num_heads must be a positive int, got -2$"),
        ((0, H), {}, "^embed_dim must be a positive int, got 0$"),
        ((24.0, H), {}, r"^embed_dim must be a positive int, got 24\.0$"),
        ((E, H), dict(kdim=-3), "^kdim must be a positive int, got -3$"),
        ((E, H), dict(vdim=0), "^vdim must be a positive int, got 0$"),
    ],
    ids=["no-heads", "negative-heads", "no-width", "float-width", "negative-kdim", "zero-vdim"],
)
def test_bad_sizes_are_named(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        qkv.MultiHeadAttention(*args, **kwargs)


@pytest.mark.parametrize("change", ["dtype", "batch"])
def test_a_cross_attention_cache_that_no_longer_fits_is_named(change):
    """A cross-attention cache filled before model.double(), or for another batch, was
    refused as 'q, k, v must share one floating dtype' or 'batch sizes differ: q ..., k
    ...', though the caller passed matching query and memory: the cache is now named."""
    m, cache = qkv.MultiHeadAttention(E, H), qkv.KVCache(1)
    memory = torch.randn(2, 7, E)
    cached, _ = m(X[:, :1], memory, cache=cache)
    b, dtype = (2, torch.float64) if change == "dtype" else (3, torch.float32)
    m.to(dtype)
    query, memory = torch.randn(b, 1, E, dtype=dtype), torch.randn(b, 7, E, dtype=dtype)
    with pytest.raises(ValueError, match=r"cross-attention cache holds .* start a new cache"):
        m(query, memory, cache=cache)
    m.float()
    torch.testing.assert_close(m(X[:, :1], cache=cache, key=memory[:2].float())[0], cached)


def test_value_without_key_is_refused():
    """``m(x, value=y)`` was run as self-attention with values projected from ``y`` and
    keys from ``x``: neither torch's call (which needs both) nor cross-attention."""
    m = qkv.MultiHeadAttention(E, H)
    with pytest.raises(ValueError, match="value was given without key"):
        m(X, value=torch.randn(2, 5, E))
    torch.testing.assert_close(m(X, value=X)[0], m(X)[0])  # the query itself: self-attention


def test_an_unknown_backend_is_refused_when_the_module_is_built():
    """A misspelt backend passed construction and failed at the first forward pass (after
    loading weights, or hours into training)."""
    with pytest.raises(ValueError, match="unknown attention backend 'sdap'; known: "):
        qkv.MultiHeadAttention(E, H, backend="sdap")
    with pytest.raises(ValueError, match="unknown attention backend 'chunk'"):
        EncoderLayer(E, H, 4 * E, backend="chunk")


# ---- under torch.compile: one graph, and the same numbers as eagerly -----------------


COMPILE_E = 32  # the width of the torch.compile tests


def _compile_inputs():
    x = torch.randn(2, 9, COMPILE_E)
    keys = torch.ones(2, 9, dtype=torch.bool)
    keys[1, 6:] = False
    keys[0, :] = False  # a row that sees no key: zeros, whatever the mask
    return x, keys


COMPILE_CASES = {
    "key-mask-causal": dict(causal=True, use_keys=True),
    "causal": dict(causal=True),
    "key-mask-weights": dict(use_keys=True, need_weights=True),
    "bool-mask": dict(mask="bool"),
    "float-mask": dict(mask="float", need_weights=True),
}


@pytest.mark.parametrize("case", sorted(COMPILE_CASES))
def test_attention_traces_as_one_graph(case):
    """A padding mask made the backends ask whether every row sees a key (a
    data-dependent branch), which broke the graph; ``fullgraph=True`` refused it."""
    torch._dynamo.reset()
    kw = dict(COMPILE_CASES[case])
    m = qkv.MultiHeadAttention(COMPILE_E, H).eval()
    x, keys = _compile_inputs()
    if kw.pop("use_keys", False):
        kw["key_mask"] = keys
    if kw.get("mask") == "bool":
        kw["mask"] = torch.rand(9, 9) > 0.5
    elif kw.get("mask") == "float":
        kw["mask"] = torch.randn(2, 9, 9)
    want = m(x, **kw)
    got = torch.compile(m, fullgraph=True, backend="eager")(x, **kw)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
    if kw.get("need_weights"):
        torch.testing.assert_close(got[1], want[1], rtol=0, atol=0)


def test_attention_trains_as_one_graph():
    torch._dynamo.reset()
    m = qkv.MultiHeadAttention(COMPILE_E, H).double()
    x, keys = _compile_inputs()
    x = x.double()
    m(x, key_mask=keys, causal=True)[0].square().sum().backward()
    want = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    step = torch.compile(m, fullgraph=True, backend="aot_eager")
    step(x, key_mask=keys, causal=True)[0].square().sum().backward()
    for p, g in zip(m.parameters(), want, strict=True):
        torch.testing.assert_close(p.grad, g)


@pytest.mark.skipif(shutil.which("g++") is None, reason="inductor on the CPU needs g++")
def test_attention_compiles_with_inductor():
    """Inductor's C++ for the rows check (a byte view of the mask, then ``all``) did not
    compile on torch 2.13: ``Vectorized<bool>`` has no member ``cast``."""
    torch._dynamo.reset()
    m = qkv.MultiHeadAttention(COMPILE_E, H).eval()
    x, keys = _compile_inputs()
    want = m(x, key_mask=keys, causal=True)[0]
    got = torch.compile(m)(x, key_mask=keys, causal=True)[0]
    torch.testing.assert_close(got, want)
