"""KVCache and LayerKV: what a cache accepts as the next positions."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import qkv
from qkv.modules.cache import LayerKV
from qkv.modules.transformer import Decoder, DecoderLayer


def _kv(b=2, hkv=2, t=3, d=4, dtype=torch.float64):
    return torch.randn(b, hkv, t, d, dtype=dtype), torch.randn(b, hkv, t, d + 1, dtype=dtype)


def test_append_grows_along_positions():
    layer = LayerKV()
    (k1, v1), (k2, v2) = _kv(t=3), _kv(t=1)
    layer.append(k1, v1)
    k, v = layer.append(k2, v2)
    assert layer.length == 4
    torch.testing.assert_close(k, torch.cat([k1, k2], 2), rtol=0, atol=0)
    torch.testing.assert_close(v, torch.cat([v1, v2], 2), rtol=0, atol=0)


@pytest.mark.parametrize(
    "new",
    [dict(b=3), dict(hkv=1), dict(d=8), dict(dtype=torch.float32)],
    ids=["batch", "kv-heads", "head-size", "dtype"],
)
def test_positions_that_do_not_fit_are_refused_by_name(new):
    """A torch.cat error (batch, heads) or a silent promotion to float64 (dtype) before."""
    layer = LayerKV()
    layer.append(*_kv())
    k, v = _kv(**{"t": 1, **new})
    with pytest.raises(
        ValueError, match=r"new keys .* cannot follow the cached .* \(B, Hkv, T, D\)"
    ):
        layer.append(k, v)
    assert layer.length == 3  # unchanged


def test_a_module_with_other_heads_cannot_reuse_a_cache():
    cache = qkv.KVCache(1)
    qkv.MultiHeadAttention(24, 4)(torch.randn(2, 5, 24), cache=cache)
    with pytest.raises(ValueError, match=r"\(2, 2, 1, 6\) .* cached torch.float32 \(2, 4, 5, 6\)"):
        qkv.MultiHeadAttention(24, 4, num_kv_heads=2)(torch.randn(2, 1, 24), cache=cache)


@settings(max_examples=25, deadline=None)
@given(steps=st.lists(st.integers(1, 70), min_size=1, max_size=12))
def test_appends_write_in_place_and_equal_concatenation(steps):
    """Decoding steps fill a buffer with room to spare: the keys and values equal those
    concatenated, a view returned earlier keeps its positions, and a step that fits the
    room left copies nothing (the buffer's address stays)."""
    layer, ks, vs, earlier = LayerKV(), [], [], []
    for t in steps:
        k, v = _kv(t=t)
        ks.append(k), vs.append(v)
        before = None if layer.length == 0 else (layer._k.data_ptr(), layer._k.shape[2])
        got_k, got_v = layer.append(k, v)
        earlier.append((got_k, torch.cat(ks, 2)))
        torch.testing.assert_close(got_k, torch.cat(ks, 2), rtol=0, atol=0)
        torch.testing.assert_close(got_v, torch.cat(vs, 2), rtol=0, atol=0)
        if before is not None and layer.length <= before[1]:
            assert layer._k.data_ptr() == before[0]
        assert layer._k.shape[2] >= layer.length
    for view, want in earlier:
        torch.testing.assert_close(view, want, rtol=0, atol=0)
    assert layer.length == sum(steps)


@settings(max_examples=25, deadline=None)
@given(steps=st.lists(st.integers(0, 40), min_size=1, max_size=10))
def test_positions_written_after_reserve_equal_appended_ones(steps):
    """A caller that writes its positions itself (:meth:`LayerKV.reserve`, then
    :meth:`LayerKV.advance`) leaves the cache as appending the same keys and values does
    (outside autograd, where appends write in place)."""
    written, appended = LayerKV(), LayerKV()
    first_k, first_v = _kv(t=2)
    written.append(first_k, first_v), appended.append(first_k, first_v)
    for t in steps:
        k, v = _kv(t=t)
        with torch.no_grad():
            kb, vb = written.reserve(t)
        n = written.length
        assert kb.shape[2] >= n + t and kb.is_contiguous()
        kb[:, :, n : n + t], vb[:, :, n : n + t] = k, v
        written.advance(t)
        appended.append(k, v)
        assert torch.equal(written.k, appended.k) and torch.equal(written.v, appended.v)


def test_reserve_needs_a_cache_written_in_place():
    """Empty, static, or under autograd: ``reserve`` refuses; ``advance`` beyond the room
    reserved is refused too."""
    layer = LayerKV()
    assert not layer.in_place
    with pytest.raises(ValueError, match="written in place"):
        layer.reserve(1)
    static = LayerKV()
    static.set_static(*_kv(t=3))
    with pytest.raises(ValueError, match="written in place"):
        static.reserve(1)
    layer.append(*_kv(t=3))
    with torch.enable_grad():
        assert not layer.in_place
    with torch.no_grad():
        assert layer.in_place
        k, _ = layer.reserve(2)
        with pytest.raises(ValueError, match="reserve room"):
            layer.advance(k.shape[2] - 3 + 1)
        layer.advance(2)
    assert layer.length == 5


def test_reorder_after_growth_keeps_the_chosen_rows():
    layer, ks = LayerKV(), []
    for t in (3, 1, 1, 80, 1):
        k, v = _kv(b=3, t=t)
        ks.append(k)
        layer.append(k, v)
    index = torch.tensor([2, 2, 0])
    layer.reorder(index)
    torch.testing.assert_close(layer.k, torch.cat(ks, 2)[index], rtol=0, atol=0)
    k, v = _kv(b=3, t=1)
    assert torch.equal(layer.append(k, v)[0][:, :, -1:], k)


def test_gradients_flow_through_cached_keys_and_values():
    """Under autograd the appends concatenate (writing into a buffer that an earlier
    step's graph saved would break its backward); the gradients equal a plain pass's."""
    torch.manual_seed(0)
    mha = qkv.MultiHeadAttention(16, 4).double()
    x = torch.randn(2, 6, 16, dtype=torch.float64, requires_grad=True)
    cache = qkv.KVCache(1)
    steps = [mha(x[:, :3], cache=cache, causal=True)[0]]
    steps += [mha(x[:, i : i + 1], cache=cache, causal=True)[0] for i in range(3, 6)]
    upstream = torch.randn(2, 6, 16, dtype=torch.float64)
    (torch.cat(steps, 1) * upstream).sum().backward()
    got = x.grad.clone()
    x.grad = None
    (mha(x, causal=True)[0] * upstream).sum().backward()
    torch.testing.assert_close(got, x.grad)


def test_a_cache_filled_in_inference_mode_continues_outside_it():
    """Its buffers are inference tensors, which may not be written outside the mode."""
    layer, ks = LayerKV(), []
    with torch.inference_mode():
        for t in (2, 1):
            k, v = _kv(t=t)
            ks.append(k.clone())
            layer.append(k, v)
    k, v = _kv(t=1)
    ks.append(k)
    torch.testing.assert_close(layer.append(k, v)[0], torch.cat(ks, 2), rtol=0, atol=0)


def test_a_query_under_autograd_keeps_its_graph_when_keys_need_no_gradient():
    """Only the query projection trains (LoRA-style): the cached keys and values need no
    gradient, yet each step's graph saves a view of them. Writing the next step into the
    buffer in place bumped their version, and backward raised 'modified by an inplace
    operation'. Gradients now equal one causal pass's."""
    mha = qkv.MultiHeadAttention(16, 4).double()
    mha.k_proj.requires_grad_(False), mha.v_proj.requires_grad_(False)
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    cache = qkv.KVCache(1)
    steps = [mha(x[:, :2], cache=cache, causal=True)[0]]
    steps += [mha(x[:, i : i + 1], cache=cache, causal=True)[0] for i in range(2, 6)]
    upstream = torch.randn(2, 6, 16, dtype=torch.float64)
    (torch.cat(steps, 1) * upstream).sum().backward()
    got = mha.q_proj.weight.grad.clone()
    mha.q_proj.weight.grad = None
    (mha(x, causal=True)[0] * upstream).sum().backward()
    torch.testing.assert_close(got, mha.q_proj.weight.grad)


@pytest.mark.parametrize("when", ["first", "later", "static"])
@pytest.mark.parametrize("grad", [False, True], ids=["no-grad", "grad"])
def test_keys_and_values_of_different_lengths_are_refused(when, grad):
    """Under no_grad, values of one position after keys of three were written into all
    three places (broadcast) without a word; a first append, or a static cache, stored
    them unequal."""
    layer = LayerKV()
    if when == "later":
        layer.append(*_kv(t=3))
    k, v = _kv(t=3)
    store = layer.set_static if when == "static" else layer.append
    with torch.set_grad_enabled(grad), pytest.raises(ValueError, match=r"same positions"):
        store(k, v[:, :, :1])
    assert layer.length == (3 if when == "later" else 0) and not layer.static


def test_caches_of_the_wrong_kind_or_size_are_refused_by_name():
    """A module is given one layer's cache; anything else says what to pass instead."""
    mha = qkv.MultiHeadAttention(8, 2).double()
    x, memory = torch.randn(1, 3, 8, dtype=torch.float64), torch.randn(1, 4, 8, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"^pass one layer of a 2-layer KVCache: cache\[i\]$"):
        mha(x, cache=qkv.KVCache(2))
    with pytest.raises(ValueError, match=r"^cache must be a KVCache or LayerKV, got dict$"):
        mha(x, cache={})
    static = LayerKV()
    mha(x, memory, cache=static)  # cross-attention: the source's keys, stored once
    with pytest.raises(ValueError, match=r"given a cross-attention \(static\) cache"):
        mha(x, cache=static)
    with pytest.raises(ValueError, match=r"^cannot append to a static"):
        static.append(*_kv())
    with pytest.raises(ValueError, match=r"^num_layers must be >= 1, got 0$"):
        qkv.KVCache(0)


def test_a_decoder_layer_is_given_one_layers_cache():
    decoder = Decoder(lambda: DecoderLayer(8, 2, 16, cross=False), 2).double()
    layer, x = decoder.layers[0], torch.randn(1, 3, 8, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"^pass one layer of a 2-layer DecoderCache: cache\[i\]$"):
        layer(x, cache=decoder.new_cache())
    with pytest.raises(ValueError, match=r"^cache must be a LayerCache or DecoderCache, got list"):
        layer(x, cache=[])
    one = Decoder(lambda: DecoderLayer(8, 2, 16, cross=False), 1).double()
    whole, alone = one.new_cache(), one.new_cache()
    out, _, _ = one.layers[0](x, cache=whole)  # a 1-layer DecoderCache is that layer's
    want, _, _ = one.layers[0](x, cache=alone[0])
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    assert whole.length == alone.length == 3
    with pytest.raises(ValueError, match=r"^with num_layers, pass a layer factory"):
        Decoder(decoder.layers[0], 2)
    with pytest.raises(ValueError, match=r"^a stack needs at least one layer$"):
        Decoder([])
