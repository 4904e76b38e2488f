"""RNN encoder–decoders: one interface, exact incremental decoding, padding invariance."""

from __future__ import annotations

import logging

import pytest
import torch

from qkv.data.tokenizers import WordTokenizer
from qkv.models.translators.config import RNNSeq2SeqConfig
from qkv.models.translators.rnn import RNNSeq2Seq, RNNState
from qkv.translate.evaluate import translate_texts
from tests.models.translators.seq2seq_helpers import (
    PAD,
    assert_every_parameter_gets_gradient,
    padded_batch,
    train_copy,
)

V = 13
CONFIGS = {
    "none-gru": dict(attention="none"),
    "none-lstm-2layers": dict(attention="none", cell="lstm", num_layers=2),
    "bahdanau-gru": dict(attention="bahdanau"),
    "bahdanau-rnn-unidirectional": dict(attention="bahdanau", cell="rnn", bidirectional=False),
    "bahdanau-lstm-2layers": dict(attention="bahdanau", cell="lstm", num_layers=2),
    "luong-general-feeding": dict(attention="luong", score="general"),
    "luong-dot-no-feeding": dict(attention="luong", score="dot", input_feeding=False),
    "luong-concat-lstm": dict(attention="luong", score="concat", cell="lstm"),
    "luong-location": dict(attention="luong", score="location", max_src_len=16),
    "luong-local-m": dict(attention="luong", window="monotonic", window_size=1),
    "luong-local-p-no-feeding": dict(
        attention="luong", window="predictive", window_size=2, input_feeding=False
    ),
}
LOCAL = {"luong-local-m", "luong-local-p-no-feeding"}


pytestmark = pytest.mark.usefixtures("one_thread")


def _model(name: str, dtype=torch.float64, **extra) -> RNNSeq2Seq:
    cfg = RNNSeq2SeqConfig(
        src_vocab_size=V,
        tgt_vocab_size=V + 2,
        embed_dim=12,
        hidden_dim=16,
        **CONFIGS[name],
        **extra,
    )
    return RNNSeq2Seq(cfg).to(dtype).eval()


@pytest.fixture(params=sorted(CONFIGS))
def name(request) -> str:
    torch.manual_seed(sorted(CONFIGS).index(request.param))
    return request.param


def test_teacher_forcing_equals_step_by_step_decoding(name):
    model = _model(name)
    src = padded_batch([5, 2, 4], V)
    tgt_in = torch.randint(3, V + 2, (3, 6))
    logits, attn = model(src, tgt_in)
    assert logits.shape == (3, 6, V + 2)
    state = model.encode(src)
    for t in range(tgt_in.shape[1]):
        prev = tgt_in[:, t] if t % 2 else tgt_in[:, : t + 1]  # a token, or a prefix (its last)
        step_logits, state, step_attn = model.decode_step(state, prev)
        torch.testing.assert_close(step_logits, logits[:, t], rtol=0, atol=1e-12)
        if attn.alignment is not None:
            torch.testing.assert_close(step_attn.alignment[:, 0], attn.alignment[:, t])
    assert isinstance(state, RNNState) and state.step == tgt_in.shape[1]


def test_padding_never_changes_outputs_or_attention(name):
    model = _model(name)
    lengths = [4, 1, 6, 3]
    src = padded_batch(lengths, V)
    tgt_in = torch.randint(3, V + 2, (4, 5))
    logits, attn = model(src, tgt_in)
    # 1) more padding columns
    wider = torch.cat([src, torch.full((4, 3), PAD)], 1)
    logits_w, attn_w = model(wider, tgt_in)
    torch.testing.assert_close(logits_w, logits, rtol=0, atol=1e-12)
    # 2) each sentence alone, without the longer ones around it
    for i, n in enumerate(lengths):
        alone, attn_1 = model(src[i : i + 1, :n], tgt_in[i : i + 1])
        torch.testing.assert_close(alone[0], logits[i], rtol=0, atol=1e-12)
        if attn.alignment is not None:
            torch.testing.assert_close(attn_1.alignment[0], attn.alignment[i, :, :n])
            assert torch.all(attn.alignment[i, :, n:] == 0)
            assert torch.all(attn_w.alignment[i, :, n:] == 0)


def test_attention_rows_sum_to_one_over_real_source_tokens(name):
    model = _model(name)
    src = padded_batch([3, 6, 1], V)
    _, attn = model(src, torch.randint(3, V + 2, (3, 4)))
    if attn.alignment is None:
        assert name.startswith("none") and attn.cross == []
        return
    assert attn.alignment.shape == (3, 4, 6)
    torch.testing.assert_close(attn.cross[0][:, 0], attn.alignment)
    assert torch.all(attn.alignment.masked_select(src.unsqueeze(1) == PAD) == 0)
    sums = attn.alignment.sum(-1)
    if name in LOCAL:
        # a window may miss the source, and local-p is damped by its Gaussian
        assert torch.all(sums <= 1 + 1e-12)
    else:
        torch.testing.assert_close(sums, torch.ones_like(sums))


def test_gradients_reach_every_parameter(name):
    model = _model(name, torch.float32).train()
    src = padded_batch([4, 6, 2], V)
    assert_every_parameter_gets_gradient(model, src, torch.randint(3, V + 2, (3, 5)))


def test_beam_reorder_and_expand_the_state():
    torch.manual_seed(11)
    model = _model("luong-concat-lstm")
    src = padded_batch([3, 5], V)
    state = model.encode(src)
    state.reorder(torch.tensor([1, 1, 0]))
    alone = model.encode(src[1:2, :5])
    tokens = torch.tensor([7, 7, 4])
    logits, _, _ = model.decode_step(state, tokens)
    logits_alone, _, _ = model.decode_step(alone, tokens[:1])
    torch.testing.assert_close(logits[0], logits_alone[0])
    torch.testing.assert_close(logits[1], logits[0], rtol=0, atol=0)
    assert state.memory.shape[0] == 3 and state.hidden[0].shape[1] == 3


def test_source_mask_is_checked_and_derived_from_pad_id():
    torch.manual_seed(12)
    model = _model("bahdanau-gru")
    src = padded_batch([4, 2], V)
    tgt_in = torch.randint(3, V + 2, (2, 3))
    derived, _ = model(src, tgt_in)
    given, _ = model(src, tgt_in, src_mask=src != PAD)
    torch.testing.assert_close(derived, given, rtol=0, atol=0)
    holes = torch.tensor([[True, False, True, True], [True, True, False, False]])
    with pytest.raises(ValueError, match="prefix"):
        model(src, tgt_in, src_mask=holes)
    with pytest.raises(ValueError, match="real"):
        model(src, tgt_in, src_mask=torch.zeros_like(holes))
    with pytest.raises(ValueError, match="src_mask"):
        model(src, tgt_in, src_mask=(src != PAD).long())


def test_config_from_dict_round_trips_and_names_bad_fields():
    cfg = RNNSeq2SeqConfig.from_dict({"src_vocab_size": 9, "tgt_vocab_size": 7, "cell": "lstm"})
    assert RNNSeq2SeqConfig.from_dict(cfg.to_dict()) == cfg
    bad = {
        "hidden_size": 3,  # unknown key
        "cell": "transformer",
        "num_layers": 0,
        "dropout": 1.0,
        "hidden_dim": 63,  # odd with a bidirectional encoder
        "window": "monotonic",  # with the default attention it is fine ...
        "bidirectional": "yes",
        "eos_id": 0,  # same as pad_id
        "tgt_vocab_size": 2,  # special ids do not fit
    }
    for field, value in bad.items():
        d = {"src_vocab_size": 9, "tgt_vocab_size": 7, field: value}
        if field == "window":
            d["attention"] = "bahdanau"  # ... but not without Luong attention
        with pytest.raises(ValueError, match=field):
            RNNSeq2SeqConfig.from_dict(d)
    with pytest.raises(ValueError, match="src_vocab_size"):
        RNNSeq2SeqConfig.from_dict({"tgt_vocab_size": 7})


@pytest.mark.parametrize("field", ["hidden_dim", "embed_dim", "src_vocab_size", "max_src_len"])
def test_config_names_a_size_past_int32(field):
    """hidden_dim 10**30 passed the config and ended in torch's C++ overflow traceback."""
    d = {"src_vocab_size": 9, "tgt_vocab_size": 7, field: 10 ** int(torch.randint(10, 31, ()))}
    with pytest.raises(ValueError, match=rf"RNNSeq2SeqConfig\.{field} = .*must be <= 2147483647"):
        RNNSeq2SeqConfig.from_dict(d)
    RNNSeq2SeqConfig.from_dict({**d, field: 2**31 - 2})  # large but valid: no error


COPY = {
    "none": (dict(attention="none", cell="lstm"), 0.2),
    "bahdanau": (dict(attention="bahdanau"), 0.05),
    "luong": (dict(attention="luong", score="general"), 0.05),
    "luong-local-m": (dict(attention="luong", window="monotonic", window_size=2), 0.05),
    "luong-local-p": (dict(attention="luong", window="predictive", window_size=3), 0.05),
}


@pytest.mark.slow
@pytest.mark.parametrize("decoder", sorted(COPY))
def test_copy_task_is_learned_by_every_decoder(decoder):
    """150 steps on a copy task (vocabulary 12, length <= 6) drive the loss near zero.

    The bottleneck decoder has to carry the sentence in one vector; it learns too, but
    more slowly, which is the point of attention.
    """
    torch.manual_seed(0)
    options, bound = COPY[decoder]
    cfg = RNNSeq2SeqConfig(
        src_vocab_size=12, tgt_vocab_size=12, embed_dim=32, hidden_dim=64, **options
    )
    loss = train_copy(RNNSeq2Seq(cfg), steps=150, lr=1e-2, batch_size=64)
    assert loss < bound, f"held-out copy loss {loss:.3f} (initially about 2.5)"


@pytest.mark.parametrize("attention", ["none", "bahdanau", "luong"])
def test_a_source_longer_than_max_src_len_is_cut_with_a_warning(attention, caplog):
    """An RNN read any length: a 50,000-word line ran the encoder 50,000 steps and let the
    decoder run 75,000 (past 60 s in ``qkv translate``). It is cut to ``max_src_len`` tokens
    with the Transformer's warning, and translates as its first ``max_src_len`` tokens."""
    src = WordTokenizer(["eins", "zwei", "drei", "vier"])
    tgt = WordTokenizer(["one", "two", "three", "four"])
    torch.manual_seed(0)
    cfg = RNNSeq2SeqConfig(
        src.vocab_size, tgt.vocab_size, embed_dim=8, hidden_dim=8, attention=attention,
        max_src_len=12, pad_id=0, bos_id=2, eos_id=3,
    )  # fmt: skip
    model = RNNSeq2Seq(cfg).eval()
    words = " ".join(["eins", "zwei", "drei", "vier", "fünf"] * 100)  # 500 tokens
    first = " ".join(words.split()[:12])
    with caplog.at_level(logging.WARNING):
        [long], [cut] = translate_texts(model, src, tgt, [words, first], beam=2)
    assert "line 1: 500 source tokens, more than the 12 the model reads" in caplog.text
    assert "line 2" not in caplog.text
    assert (long.text, long.score) == (cut.text, cut.score)
    if attention != "none":
        assert long.alignment.shape[-1] == 12


def test_configs_saved_without_max_src_len_read_256_tokens():
    """A checkpoint's config without the field gets the default cap, for every attention."""
    for attention in ("none", "bahdanau", "luong"):
        cfg = RNNSeq2SeqConfig.from_dict(
            {"src_vocab_size": 9, "tgt_vocab_size": 9, "attention": attention}
        )
        assert cfg.max_source_len == cfg.max_src_len == 256
        assert cfg.max_target_len is None  # the search's length rule bounds the output
