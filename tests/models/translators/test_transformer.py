"""Transformer translator: cached decoding, padding invariance, tying, attention maps."""

from __future__ import annotations

import math

import pytest
import torch

from qkv.models.translators.config import RNNSeq2SeqConfig, TransformerSeq2SeqConfig
from qkv.models.translators.rnn import RNNSeq2Seq
from qkv.models.translators.transformer import TransformerSeq2Seq, TransformerState
from tests.models.translators.seq2seq_helpers import (
    PAD,
    assert_every_parameter_gets_gradient,
    padded_batch,
    train_copy,
)

V, E, H, LAYERS = 13, 16, 4, 2
VARIANTS = {
    "sinusoidal-pre-ln": dict(positional="sinusoidal", norm_first=True),
    "sinusoidal-post-ln": dict(positional="sinusoidal", norm_first=False),
    "learned-pre-ln-untied": dict(positional="learned", tie_embeddings=False),
    "rotary-post-ln": dict(positional="rotary", norm_first=False),
    "rotary-shared-vocab": dict(positional="rotary", share_vocab=True, tgt_vocab_size=V),
}


pytestmark = pytest.mark.usefixtures("one_thread")


def _model(name: str, dtype=torch.float64, **extra) -> TransformerSeq2Seq:
    options = dict(
        src_vocab_size=V,
        tgt_vocab_size=V + 3,
        d_model=E,
        num_heads=H,
        num_encoder_layers=LAYERS,
        num_decoder_layers=LAYERS,
        ff_dim=32,
        dropout=0.0,
    )
    options.update(VARIANTS[name])
    options.update(extra)
    return TransformerSeq2Seq(TransformerSeq2SeqConfig(**options)).to(dtype).eval()


@pytest.fixture(params=sorted(VARIANTS))
def name(request) -> str:
    torch.manual_seed(sorted(VARIANTS).index(request.param))
    return request.param


def _tgt(model, b: int, t: int) -> torch.Tensor:
    return torch.randint(3, model.config.tgt_vocab_size, (b, t))


@pytest.mark.parametrize("use_cache", [True, False], ids=["kv-cache", "recompute-prefix"])
def test_teacher_forcing_equals_step_by_step_decoding(name, use_cache):
    model = _model(name)
    src = padded_batch([5, 2, 4], V)
    tgt_in = _tgt(model, 3, 6)
    logits, attn = model(src, tgt_in)
    state = model.encode(src, use_cache=use_cache)
    for t in range(tgt_in.shape[1]):
        prev = tgt_in[:, t] if t % 2 else tgt_in[:, : t + 1]  # a token, or a prefix (its last)
        step_logits, state, step_attn = model.decode_step(state, prev)
        torch.testing.assert_close(step_logits, logits[:, t], rtol=0, atol=1e-10)
        torch.testing.assert_close(step_attn.alignment[:, 0], attn.alignment[:, t])
        for layer in range(LAYERS):
            torch.testing.assert_close(step_attn.cross[layer][:, :, 0], attn.cross[layer][:, :, t])
            torch.testing.assert_close(
                step_attn.decoder[layer][:, :, 0, : t + 1], attn.decoder[layer][:, :, t, : t + 1]
            )
    assert isinstance(state, TransformerState) and state.step == tgt_in.shape[1]
    if use_cache:
        assert state.cache.length == tgt_in.shape[1] and state.cache.cross_kv.length == 5


@pytest.mark.parametrize("use_cache", [True, False], ids=["kv-cache", "recompute-prefix"])
def test_a_reordered_state_is_the_state_of_the_reordered_batch(name, use_cache):
    """``reorder`` (rows of other sources too, repeated) moves everything a state holds:
    memory, mask, caches or prefix, and the encoder maps kept with ``need_weights``."""
    model = _model(name)
    src, tgt = padded_batch([5, 2, 4], V), _tgt(model, 3, 3)
    index = torch.tensor([2, 0, 2, 1])
    state = model.encode(src, use_cache=use_cache, need_weights=True)
    moved = model.encode(src[index], use_cache=use_cache, need_weights=True)
    for t in range(2):
        model.decode_step(state, tgt[:, t])
        model.decode_step(moved, tgt[index, t])
    state.reorder(index)
    for got, want in zip(state.encoder_attention, moved.encoder_attention, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    logits, _, attn = model.decode_step(state, tgt[index, 2])
    want_logits, _, want_attn = model.decode_step(moved, tgt[index, 2])
    torch.testing.assert_close(logits, want_logits, rtol=0, atol=1e-12)
    torch.testing.assert_close(attn.alignment, want_attn.alignment, rtol=0, atol=1e-12)


def test_padding_never_changes_outputs_or_attention(name):
    model = _model(name)
    lengths = [4, 1, 6, 3]
    src = padded_batch(lengths, V)
    tgt_in = _tgt(model, 4, 5)
    logits, attn = model(src, tgt_in)
    wider = torch.cat([src, torch.full((4, 2), PAD)], 1)
    logits_w, attn_w = model(wider, tgt_in)
    torch.testing.assert_close(logits_w, logits, rtol=0, atol=1e-10)
    for i, n in enumerate(lengths):
        alone, attn_1 = model(src[i : i + 1, :n], tgt_in[i : i + 1])
        torch.testing.assert_close(alone[0], logits[i], rtol=0, atol=1e-10)
        torch.testing.assert_close(attn_1.alignment[0], attn.alignment[i, :, :n])
        for layer in range(LAYERS):
            enc = attn.encoder[layer][i, :, :n, :n]
            torch.testing.assert_close(attn_1.encoder[layer][0], enc)
        assert torch.all(attn_w.alignment[i, :, n:] == 0)


def test_attention_maps_have_every_layer_and_head():
    torch.manual_seed(20)
    model = _model("sinusoidal-pre-ln")
    src = padded_batch([3, 6], V)
    _, attn = model(src, _tgt(model, 2, 4))
    assert len(attn.encoder) == len(attn.decoder) == len(attn.cross) == LAYERS
    assert attn.encoder[0].shape == (2, H, 6, 6)
    assert attn.decoder[0].shape == (2, H, 4, 4)
    assert attn.cross[0].shape == (2, H, 4, 6)
    torch.testing.assert_close(attn.alignment, attn.cross[-1].mean(1))
    real = (src != PAD)[:, None, None, :]  # (B, 1, 1, S)
    for w in attn.cross:
        torch.testing.assert_close(w.sum(-1), torch.ones(2, H, 4, dtype=w.dtype))
        assert torch.all(w.masked_select(~real.expand_as(w)) == 0)
    assert torch.all(attn.decoder[0].triu(1) == 0)  # causal
    _, none = model(src, _tgt(model, 2, 4), need_weights=False)
    assert none.alignment is None and none.cross == []


def test_gradients_reach_every_parameter(name):
    model = _model(name, torch.float32).train()
    src = padded_batch([4, 6, 2], V)
    assert_every_parameter_gets_gradient(model, src, _tgt(model, 3, 5))


def test_embeddings_are_tied_and_shared_as_configured():
    shared = _model("rotary-shared-vocab")
    assert shared.src_embed is shared.tgt_embed
    assert shared.out.weight is shared.tgt_embed.weight
    untied = _model("learned-pre-ln-untied")
    assert untied.src_embed is not untied.tgt_embed
    assert untied.out.weight is not untied.tgt_embed.weight
    assert untied.out.weight.shape == (V + 3, E) and untied.src_embed.weight.shape == (V, E)
    names = {n for n, _ in shared.named_parameters()}
    assert "tgt_embed.weight" not in names and "out.weight" not in names  # one tensor, one name


def test_sinusoidal_embeddings_are_scaled_by_sqrt_model_width():
    torch.manual_seed(21)
    model = _model("sinusoidal-pre-ln")
    src = padded_batch([5], V)
    x = model._embed(src, target=False)
    pe = model.src_pos.pe[:5].double()
    torch.testing.assert_close(x[0], model.src_embed.weight[src[0]] * math.sqrt(E) + pe)
    learned = _model("learned-pre-ln-untied")
    x = learned._embed(src, target=False)
    ref = learned.src_embed.weight[src[0]] + learned.src_pos.weight[:5]
    torch.testing.assert_close(x[0], ref)


def test_config_from_dict_names_bad_fields():
    base = {"src_vocab_size": 10, "tgt_vocab_size": 12}
    cfg = TransformerSeq2SeqConfig.from_dict(base)
    assert TransformerSeq2SeqConfig.from_dict(cfg.to_dict()) == cfg
    bad = {
        "d_modle": 8,
        "num_heads": 3,  # does not divide d_model=256
        "positional": "alibi",
        "share_vocab": True,  # different vocabulary sizes
        "dropout": -0.1,
        "norm_first": 1,
        "num_decoder_layers": 0,
    }
    for field, value in bad.items():
        with pytest.raises(ValueError, match=field):
            TransformerSeq2SeqConfig.from_dict({**base, field: value})
    with pytest.raises(ValueError, match="num_heads"):  # rotary needs an even head size
        TransformerSeq2SeqConfig(**base, d_model=12, num_heads=4, positional="rotary")
    for field in ("d_model", "ff_dim", "max_len", "tgt_vocab_size"):  # 10**30: C++ overflow
        with pytest.raises(ValueError, match=rf"{field} = {10**30}: must be <= 2147483647"):
            TransformerSeq2SeqConfig.from_dict({**base, field: 10**30})


@pytest.mark.slow
def test_copy_task_is_learned():
    torch.manual_seed(0)
    cfg = TransformerSeq2SeqConfig(
        src_vocab_size=12,
        tgt_vocab_size=12,
        d_model=64,
        num_heads=4,
        num_encoder_layers=1,
        num_decoder_layers=1,
        ff_dim=128,
        dropout=0.0,
    )
    loss = train_copy(TransformerSeq2Seq(cfg), steps=150, lr=5e-3, batch_size=64)
    assert loss < 0.1, f"held-out copy loss {loss:.3f} (initially about 2.5)"


@pytest.mark.parametrize("kind", ["transformer", "rnn"])
def test_bad_inputs_are_named(kind):
    if kind == "rnn":
        model = RNNSeq2Seq(
            RNNSeq2SeqConfig(src_vocab_size=V, tgt_vocab_size=V + 3, embed_dim=8, hidden_dim=8)
        )
    else:
        model = _model("sinusoidal-pre-ln")
    src = padded_batch([4, 2], V)
    for tgt in (torch.tensor([3, 4]), torch.zeros(2, 0, dtype=torch.long), _tgt(model, 3, 4)):
        with pytest.raises(ValueError, match=r"tgt_in must be \(B, T\) token ids with T >= 1"):
            model(src, tgt)
    with pytest.raises(ValueError, match=f"target token id {V + 3} is outside 0..{V + 2}"):
        model(src, torch.full((2, 3), V + 3))
    with pytest.raises(ValueError, match=f"source token id {V} is outside 0..{V - 1}"):
        model(src.masked_fill(src == src.max(), V), _tgt(model, 2, 3))
