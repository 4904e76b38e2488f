"""Transformer layers and stacks: parity with torch.nn, incremental decoding, padding."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from qkv.modules.positional import RotaryPositionalEncoding
from qkv.modules.transformer import (
    Decoder,
    DecoderCache,
    DecoderLayer,
    Encoder,
    EncoderLayer,
    FeedForward,
)

E, H, FF = 32, 4, 64
TOL = {torch.float32: 1e-5, torch.float64: 1e-10}
DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.float64, id="fp64")]
NORMS = [pytest.param(False, id="post_ln"), pytest.param(True, id="pre_ln")]


def _lengths_mask(lengths: list[int], t: int) -> torch.Tensor:
    return torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]  # (B, T), True = real


def _jitter(layer: nn.Module) -> nn.Module:
    """Nudge every weight by noise of the layer's own dtype: float64 weights then hold
    values that float32 cannot, so a copy through float32 would show."""
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(torch.randn_like(p) * 1e-3)
    return layer


def _random_bool_mask(tq: int, tk: int) -> torch.Tensor:
    mask = torch.rand(tq, tk) < 0.7
    mask[torch.arange(tq), torch.randint(0, tk, (tq,))] = True  # every row sees some key
    return mask


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm_first", NORMS)
@pytest.mark.parametrize(
    "activation",
    ["relu", "gelu", nn.GELU(approximate="tanh"), F.silu, nn.SiLU()],
    ids=["relu", "gelu", "gelu_tanh", "F.silu", "nn.SiLU"],
)
def test_encoder_layer_matches_torch(norm_first, dtype, activation):
    torch_layer = nn.TransformerEncoderLayer(
        E, H, FF, dropout=0.0, activation=activation, batch_first=True, norm_first=norm_first
    )
    torch_layer = _jitter(torch_layer.to(dtype)).eval()
    ours = EncoderLayer.from_torch(torch_layer).eval()
    assert torch.equal(ours.ff.linear1.weight, torch_layer.linear1.weight)
    assert torch.equal(ours.norm2.weight, torch_layer.norm2.weight)
    x = torch.randn(3, 9, E, dtype=dtype)
    key_mask = _lengths_mask([9, 5, 2], 9)
    attn = _random_bool_mask(9, 9)
    ref = torch_layer(x, src_mask=~attn, src_key_padding_mask=~key_mask)
    out, weights = ours(x, key_mask=key_mask, mask=attn, need_weights=True)
    torch.testing.assert_close(out, ref, atol=TOL[dtype], rtol=0)
    # the masks reached the weights: nothing on padded or masked keys
    hidden = ~(key_mask[:, None, None, :] & attn)
    assert weights.shape == (3, H, 9, 9)
    assert torch.all(weights.masked_select(hidden.expand_as(weights)) == 0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm_first", NORMS)
def test_decoder_layer_matches_torch(norm_first, dtype):
    torch_layer = nn.TransformerDecoderLayer(
        E, H, FF, dropout=0.0, batch_first=True, norm_first=norm_first
    )
    torch_layer = _jitter(torch_layer.to(dtype)).eval()
    ours = DecoderLayer.from_torch(torch_layer).eval()
    assert torch.equal(ours.ff.linear2.weight, torch_layer.linear2.weight)
    assert torch.equal(ours.norm3.bias, torch_layer.norm3.bias)
    x, memory = torch.randn(3, 7, E, dtype=dtype), torch.randn(3, 11, E, dtype=dtype)
    tgt_mask, mem_mask = _lengths_mask([7, 4, 6], 7), _lengths_mask([11, 3, 8], 11)
    causal = torch.ones(7, 7, dtype=torch.bool).triu(1)  # torch: True = hidden
    ref = torch_layer(
        x,
        memory,
        tgt_mask=causal,
        tgt_key_padding_mask=~tgt_mask,
        memory_key_padding_mask=~mem_mask,
        tgt_is_causal=True,
    )
    out, self_w, cross_w = ours(
        x, memory, key_mask=tgt_mask, memory_key_mask=mem_mask, need_weights=True
    )
    torch.testing.assert_close(out, ref, atol=TOL[dtype], rtol=0)
    future = ~torch.ones(7, 7, dtype=torch.bool).tril()
    assert torch.all(self_w[..., future] == 0)
    assert torch.all(cross_w[0, :, :, 11:] == 0) and torch.all(cross_w[1, :, :, 3:] == 0)


@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("kind", ["encoder", "decoder"])
def test_from_torch_keeps_train_or_eval_mode(kind, training):
    """An eval-mode torch layer (dropout 0.1 by default) came back in training mode and
    dropped activations at random: its outputs differed from torch's on every call."""
    torch_cls, cls = {
        "encoder": (nn.TransformerEncoderLayer, EncoderLayer),
        "decoder": (nn.TransformerDecoderLayer, DecoderLayer),
    }[kind]
    torch_layer = torch_cls(E, H, FF, batch_first=True).train(training)
    ours = cls.from_torch(torch_layer)
    assert all(m.training == training for m in ours.modules())
    if training:
        return
    x, memory = torch.randn(2, 5, E), torch.randn(2, 6, E)
    if kind == "encoder":
        expected, out = torch_layer(x), ours(x)[0]
    else:
        future = torch.ones(5, 5, dtype=torch.bool).triu(1)  # torch: True = hidden
        expected = torch_layer(x, memory, tgt_mask=future, tgt_is_causal=True)
        out = ours(x, memory)[0]
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=0)


def _decoder(cross: bool, positional=None, norm_first=True) -> Decoder:

    def layer() -> DecoderLayer:
        return DecoderLayer(
            E,
            H,
            FF,
            norm_first=norm_first,
            cross=cross,
            positional=positional,
            num_kv_heads=2,
            activation="gelu_tanh",
        )

    return Decoder(layer, 3, final_norm=nn.LayerNorm(E)).double().eval()


@pytest.mark.parametrize("cross", [True, False], ids=["enc_dec", "decoder_only"])
@pytest.mark.parametrize("rope", [False, True], ids=["no_rope", "rope"])
def test_incremental_decoding_equals_teacher_forcing(cross, rope):
    positional = RotaryPositionalEncoding(E // H) if rope else None
    decoder = _decoder(cross, positional, norm_first=not rope)
    b, t, s = 3, 8, 5
    x = torch.randn(b, t, E, dtype=torch.float64)
    memory = torch.randn(b, s, E, dtype=torch.float64) if cross else None
    mem_mask = _lengths_mask([5, 2, 4], s) if cross else None
    key_mask = _lengths_mask([8, 8, 6], t)
    full = decoder(x, memory, memory_key_mask=mem_mask, key_mask=key_mask, need_weights=True)

    cache = decoder.new_cache()
    steps = []
    for i, n in enumerate([3, 1, 1, 2, 1]):  # a prompt, then tokens one or two at a time
        start = cache.length
        out = decoder(
            x[:, start : start + n],
            memory,
            memory_key_mask=mem_mask,
            key_mask=key_mask[:, : start + n],
            need_weights=True,
            cache=cache,
        )
        assert out.cache is cache and cache.length == start + n
        for layer, w in enumerate(out.self_attentions):
            ref = full.self_attentions[layer][:, :, start : start + n, : start + n]
            torch.testing.assert_close(w, ref, atol=1e-10, rtol=0, msg=f"step {i} layer {layer}")
        steps.append(out.hidden)
    torch.testing.assert_close(torch.cat(steps, 1), full.hidden, atol=1e-10, rtol=0)
    assert len(full.self_attentions) == 3
    assert len(full.cross_attentions) == (3 if cross else 0)


def test_cache_reorder_follows_beams():
    decoder = _decoder(cross=True)
    x = torch.randn(4, 6, E, dtype=torch.float64)
    memory = torch.randn(4, 5, E, dtype=torch.float64)
    index = torch.tensor([2, 2, 0, 3])
    cache = decoder.new_cache()
    first = decoder(x[:, :4], memory, cache=cache).hidden
    cache.reorder(index)
    second = decoder(x[index, 4:], memory[index], cache=cache).hidden
    x_re = torch.cat([x[index, :4], x[index, 4:]], 1)
    full = decoder(x_re, memory[index]).hidden
    torch.testing.assert_close(first[index], full[:, :4], atol=1e-10, rtol=0)
    torch.testing.assert_close(second, full[:, 4:], atol=1e-10, rtol=0)
    assert isinstance(cache, DecoderCache) and cache.cross_kv[0].static


@pytest.mark.parametrize("norm_first", NORMS)
def test_padding_does_not_change_real_tokens(norm_first):
    encoder = Encoder(
        (lambda: EncoderLayer(E, H, FF, norm_first=norm_first, activation="gelu"), 2)
    ).double()
    decoder = _decoder(cross=True, norm_first=norm_first)
    x = torch.randn(2, 6, E, dtype=torch.float64)
    pads = torch.randn(2, 4, E, dtype=torch.float64) * 10  # pad vectors of any value
    key_mask = _lengths_mask([6, 6], 10)
    short = encoder(x).hidden
    padded = encoder(torch.cat([x, pads], 1), key_mask=key_mask).hidden
    torch.testing.assert_close(padded[:, :6], short, atol=1e-10, rtol=0)

    y = torch.randn(2, 5, E, dtype=torch.float64)
    y_pads = torch.randn(2, 3, E, dtype=torch.float64)
    dec_short = decoder(y, x).hidden
    dec_padded = decoder(
        torch.cat([y, y_pads], 1),
        torch.cat([x, pads], 1),
        key_mask=_lengths_mask([5, 5], 8),
        memory_key_mask=key_mask,
    ).hidden
    torch.testing.assert_close(dec_padded[:, :5], dec_short, atol=1e-10, rtol=0)


def test_encoder_maps_come_from_the_same_pass():
    encoder = Encoder(lambda: EncoderLayer(E, H, FF, norm_first=True), num_layers=3)
    encoder = Encoder(list(encoder.layers), final_norm=nn.LayerNorm(E)).double()
    x = torch.randn(2, 7, E, dtype=torch.float64)
    key_mask = _lengths_mask([7, 3], 7)
    with_maps = encoder(x, key_mask=key_mask, need_weights=True)
    without = encoder(x, key_mask=key_mask)
    torch.testing.assert_close(with_maps.hidden, without.hidden, atol=1e-10, rtol=0)
    assert without.attentions == [] and len(with_maps.attentions) == 3
    for w in with_maps.attentions:
        assert w.shape == (2, H, 7, 7)
        torch.testing.assert_close(w.sum(-1), torch.ones(2, H, 7, dtype=torch.float64))
        assert torch.all(w[1, :, :, 3:] == 0)
    assert not any("weight" in name for name, _ in encoder.named_buffers())


def test_feed_forward_and_errors():
    ff = FeedForward(E, FF, activation="gelu_tanh").double()
    x = torch.randn(2, 3, E, dtype=torch.float64)
    h = ff.linear1(x)
    ref = ff.linear2(0.5 * h * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (h + 0.044715 * h**3))))
    torch.testing.assert_close(ff(x), ref, atol=1e-12, rtol=0)
    with pytest.raises(ValueError, match="unknown activation"):
        FeedForward(E, FF, activation="swish")
    with pytest.raises(ValueError, match="memory is required"):
        DecoderLayer(E, H, FF)(x.float())
    with pytest.raises(ValueError, match="memory is required"):
        DecoderLayer(E, H, FF, cross=False)(x.float(), x.float())
    with pytest.raises(ValueError, match="cache has"):
        _decoder(cross=False)(x, cache=DecoderCache(2))
