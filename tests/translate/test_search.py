"""Greedy and beam search: exactness against enumeration, the model's own scores, batching."""

from __future__ import annotations

import itertools

import pytest
import torch

from qkv.models.translators.config import RNNSeq2SeqConfig, TransformerSeq2SeqConfig
from qkv.models.translators.rnn import RNNSeq2Seq
from qkv.models.translators.transformer import TransformerSeq2Seq
from qkv.translate.search import Hypothesis, beam, greedy, length_penalty

PAD, BOS, EOS = 0, 1, 2
SRC_V = 11


pytestmark = pytest.mark.usefixtures("one_thread")


def _rnn(tgt_vocab: int, **options) -> RNNSeq2Seq:
    cfg = RNNSeq2SeqConfig(
        src_vocab_size=SRC_V, tgt_vocab_size=tgt_vocab, embed_dim=12, hidden_dim=16, **options
    )
    return RNNSeq2Seq(cfg).double().eval()


def _transformer(tgt_vocab: int, **options) -> TransformerSeq2Seq:
    cfg = TransformerSeq2SeqConfig(
        src_vocab_size=SRC_V,
        tgt_vocab_size=tgt_vocab,
        d_model=16,
        num_heads=2,
        num_encoder_layers=2,
        num_decoder_layers=2,
        ff_dim=32,
        dropout=0.0,
        **options,
    )
    return TransformerSeq2Seq(cfg).double().eval()


MODELS = {
    "rnn-bahdanau": lambda v: _rnn(v, attention="bahdanau"),
    "rnn-luong-dot": lambda v: _rnn(v, attention="luong", score="dot", num_layers=2),
    "rnn-luong-local-m": lambda v: _rnn(v, attention="luong", window="monotonic", window_size=1),
    "rnn-luong-local-p": lambda v: _rnn(v, attention="luong", window="predictive", window_size=2),
    "rnn-none": lambda v: _rnn(v, attention="none", cell="lstm"),
    "transformer": lambda v: _transformer(v),
    "transformer-rotary": lambda v: _transformer(v, positional="rotary"),
}


@pytest.fixture(params=sorted(MODELS))
def make(request):
    torch.manual_seed(sorted(MODELS).index(request.param) + 100)
    return MODELS[request.param]


def _source(lengths: list[int]) -> torch.Tensor:
    width = max(lengths)
    ids = torch.randint(3, SRC_V, (len(lengths), width))
    return ids.masked_fill(torch.arange(width) >= torch.tensor(lengths).unsqueeze(1), PAD)


def _log_prob(model, src_row: torch.Tensor, hyp_tokens: list[int], eos: bool):
    """The model's own log P(Y | X) of a hypothesis, by teacher forcing, and its alignment."""
    out = hyp_tokens + ([EOS] if eos else [])
    tgt_in = torch.tensor([[BOS] + out[:-1]])
    logits, attn = model(src_row.unsqueeze(0), tgt_in)
    logp = torch.log_softmax(logits[0], -1)  # (T, V)
    total = logp[torch.arange(len(out)), torch.tensor(out)].sum().item()
    return total, None if attn.alignment is None else attn.alignment[0]


def _check_against_model(model, src_row, h: Hypothesis, alpha: float) -> None:
    n = int((src_row != PAD).sum())
    score, alignment = _log_prob(model, src_row[:n], h.tokens, h.eos)
    assert h.score == pytest.approx(score, abs=1e-9)
    assert h.normalized_score == pytest.approx(score / length_penalty(h.length, alpha))
    if alignment is None:
        assert h.alignment is None
    else:
        assert h.alignment.shape == (h.length, n)
        torch.testing.assert_close(h.alignment, alignment)


def test_greedy_scores_and_alignments_are_the_models_own(make):
    model = make(9)
    src = _source([4, 2, 5])
    hyps = greedy(model, src, max_len_offset=4)
    assert len(hyps) == 3
    for i, h in enumerate(hyps):
        _check_against_model(model, src[i], h, alpha=0.0)


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_beam_scores_and_alignments_are_the_models_own(make, alpha):
    model = make(9)
    src = _source([4, 2, 5])
    nbest = beam(model, src, beam_size=4, length_penalty=alpha, n_best=3, max_len_offset=3)
    for i, hyps in enumerate(nbest):
        assert len(hyps) == 3
        ranks = [h.normalized_score for h in hyps]
        assert ranks == sorted(ranks, reverse=True)
        assert len({(tuple(h.tokens), h.eos) for h in hyps}) == 3
        for h in hyps:
            _check_against_model(model, src[i], h, alpha)


def test_beam_of_one_is_greedy(make):
    model = make(10)
    src = _source([5, 3, 1, 4])
    for alpha in (0.0, 0.8):
        greedy_hyps = greedy(model, src, max_len_offset=6, length_penalty=alpha)
        beam_hyps = beam(model, src, beam_size=1, length_penalty=alpha, max_len_offset=6)
        for g, (b,) in zip(greedy_hyps, beam_hyps):
            assert (g.tokens, g.eos) == (b.tokens, b.eos)
            assert g.score == pytest.approx(b.score)
            assert g.normalized_score == pytest.approx(b.normalized_score)
            assert g.normalized_score == pytest.approx(g.score / length_penalty(g.length, alpha))


def _enumerate(model, src_row, max_len: int, alpha: float, words: list[int]):
    """Every hypothesis of at most ``max_len`` tokens, with its normalised score, best first."""
    found = []
    for n in range(max_len + 1):
        for body in itertools.product(words, repeat=n):
            for eos in (True, False):
                if (eos and n == max_len) or (not eos and n < max_len):
                    continue  # ends with EOS, or is cut at the maximum length
                length = n + int(eos)
                score, _ = _log_prob(model, src_row, list(body), eos)
                found.append((score / length_penalty(length, alpha), list(body), eos))
    return sorted(found, key=lambda f: -f[0])


@pytest.mark.parametrize("alpha", [0.0, 1.5])
def test_large_beam_finds_the_exhaustive_best(make, alpha):
    model = make(5)  # generable: tokens 3, 4 and EOS
    src = _source([3, 2])
    max_len = 3
    nbest = beam(model, src, beam_size=16, length_penalty=alpha, n_best=4, max_len=max_len)
    for i, hyps in enumerate(nbest):
        n = int((src[i] != PAD).sum())
        exhaustive = _enumerate(model, src[i, :n], max_len, alpha, words=[3, 4])
        assert len(exhaustive) == 15
        for h, (norm, tokens, eos) in zip(hyps, exhaustive[:4]):
            assert (h.tokens, h.eos) == (tokens, eos)
            assert h.normalized_score == pytest.approx(norm, abs=1e-9)


def test_batching_and_padding_do_not_change_the_search(make):
    model = make(9)
    lengths = [2, 6, 4]
    src = _source(lengths)
    wider = torch.cat([src, torch.full((3, 3), PAD)], 1)
    together = beam(model, wider, beam_size=3, n_best=2, length_penalty=0.6)
    for i, n in enumerate(lengths):
        (alone,) = beam(model, src[i : i + 1, :n], beam_size=3, n_best=2, length_penalty=0.6)
        for a, b in zip(alone, together[i]):
            assert (a.tokens, a.eos) == (b.tokens, b.eos)
            assert a.score == pytest.approx(b.score, abs=1e-9)
            if a.alignment is not None:
                torch.testing.assert_close(a.alignment, b.alignment)


def test_dropping_stopped_sentences_does_not_change_the_search(make, monkeypatch):
    """Sentences that stop early leave the batch; the others' hypotheses stay the same."""
    import qkv.translate.search

    model = make(40)  # a larger vocabulary: EOS is rarely chosen early
    lengths = [1, 1, 2, 1, 9, 1, 8, 1]  # short sources get short length limits: they stop first
    src = _source(lengths)
    run = dict(beam_size=3, n_best=3, length_penalty=0.6, max_len_ratio=1.0, max_len_offset=1)
    sizes, drop = [], qkv.translate.search._Beam._drop_stopped

    def spy(self, prev):
        sizes.append(self.b)
        return drop(self, prev)

    monkeypatch.setattr(qkv.translate.search._Beam, "_drop_stopped", spy)
    together = beam(model, src, **run)
    assert min(sizes) < len(lengths)  # the batch did shrink
    for i, n in enumerate(lengths):
        (alone,) = beam(model, src[i : i + 1, :n], **run)
        assert len(alone) == len(together[i])
        for a, b in zip(alone, together[i]):
            assert (a.tokens, a.eos) == (b.tokens, b.eos)
            assert a.score == pytest.approx(b.score, abs=1e-9)
            if a.alignment is not None:
                torch.testing.assert_close(a.alignment, b.alignment)


def test_kv_cache_and_recomputed_prefix_search_alike():
    torch.manual_seed(30)
    model = _transformer(9)

    class NoCache:
        pad_id, bos_id, eos_id = PAD, BOS, EOS

        def encode(self, src, src_mask=None):
            return model.encode(src, src_mask, use_cache=False)

        def decode_step(self, state, prev):
            return model.decode_step(state, prev)

    src = _source([4, 5, 2])
    cached = beam(model, src, beam_size=3, n_best=3)
    recomputed = beam(NoCache(), src, beam_size=3, n_best=3)
    for hyps_a, hyps_b in zip(cached, recomputed):
        for a, b in zip(hyps_a, hyps_b):
            assert (a.tokens, a.eos) == (b.tokens, b.eos)
            assert a.score == pytest.approx(b.score, abs=1e-9)


class _Counting:
    """Wraps a model, counts decoding steps and optionally forces EOS to be likely."""

    def __init__(self, model, eos_bonus: float = 0.0):
        self.model, self.eos_bonus, self.steps = model, eos_bonus, 0
        self.pad_id, self.bos_id, self.eos_id = model.pad_id, model.bos_id, model.eos_id

    def encode(self, src, src_mask=None):
        return self.model.encode(src, src_mask)

    def decode_step(self, state, prev):
        self.steps += 1
        logits, state, attn = self.model.decode_step(state, prev)
        logits = logits.clone()
        logits[:, EOS] += self.eos_bonus
        return logits, state, attn


def test_search_stops_when_every_beam_has_ended():
    torch.manual_seed(31)
    counting = _Counting(_rnn(9, attention="luong"), eos_bonus=50.0)
    src = _source([5, 4])
    hyps = beam(counting, src, beam_size=3, n_best=1, max_len_offset=20)
    assert all(h[0].tokens == [] and h[0].eos for h in hyps)
    assert counting.steps <= 2  # not the 27 steps the maximum length allows
    counting.steps = 0
    assert all(h.eos and h.tokens == [] for h in greedy(counting, src, max_len_offset=20))
    assert counting.steps == 1


def test_min_and_max_length_are_respected():
    torch.manual_seed(32)
    counting = _Counting(_rnn(9, attention="bahdanau"), eos_bonus=50.0)
    src = _source([3, 5])
    for hyps in beam(counting, src, beam_size=2, n_best=2, min_len=4, max_len=6):
        assert all(4 <= len(h.tokens) <= 6 for h in hyps)
        assert all(h.eos for h in hyps if len(h.tokens) < 6)
    for h in greedy(counting, src, min_len=4, max_len=6):
        assert len(h.tokens) == 4 and h.eos
    for h, s in zip(greedy(_rnn(9), src, max_len_ratio=1.0, max_len_offset=0), [3, 5]):
        assert h.length <= s and (h.eos or len(h.tokens) == s)  # limit = 1.0 * S + 0


def test_search_stays_within_the_decoders_positions():
    torch.manual_seed(33)
    model = _Counting(_transformer(9, max_len=8), eos_bonus=-50.0)  # EOS never wins
    model.config = model.model.config
    src = _source([5, 3])  # the default limit, 1.5 * S + 10, is past the 8 positions
    for h in greedy(model, src):
        assert len(h.tokens) == 8 and not h.eos
    for hyps in beam(model, src, beam_size=2, n_best=2):
        assert all(len(h.tokens) == 8 and not h.eos for h in hyps)


def test_bad_arguments_are_rejected():
    model = _rnn(9)
    src = _source([3])
    with pytest.raises(ValueError, match="n_best"):
        beam(model, src, beam_size=2, n_best=3)
    with pytest.raises(ValueError, match="beam_size"):
        beam(model, src, beam_size=0)
    with pytest.raises(ValueError, match="max_len"):
        greedy(model, src, max_len=0)


def test_an_empty_batch_gives_no_hypotheses(make):
    model = make(9)
    src = torch.randint(3, SRC_V, (0, 4))
    assert greedy(model, src) == []
    assert beam(model, src, beam_size=3, n_best=2) == []


def test_ids_and_sizes_that_cannot_work_are_named():
    """An EOS outside the vocabulary was never generated: every search ran to its limit."""
    model = _rnn(9)
    src = _source([3, 2])
    for search in (greedy, lambda *a, **kw: beam(*a, beam_size=2, **kw)):
        with pytest.raises(ValueError, match="eos_id 9 is outside the target vocabulary 0..8"):
            search(model, src, eos_id=9)
        with pytest.raises(ValueError, match="bos_id -1 is outside the target vocabulary"):
            search(model, src, bos_id=-1)
    with pytest.raises(ValueError, match="beam_size must be an int, got 2.0"):
        beam(model, src, beam_size=2.0)
    with pytest.raises(ValueError, match="n_best must be an int, got 1.5"):
        beam(model, src, beam_size=2, n_best=1.5)
