"""Both seq2seq models and both searches name what is wrong with the token ids they get."""

from __future__ import annotations

import pytest
import torch

from qkv.models.translators.config import RNNSeq2SeqConfig, TransformerSeq2SeqConfig
from qkv.models.translators.rnn import RNNSeq2Seq
from qkv.models.translators.transformer import TransformerSeq2Seq
from qkv.translate.search import beam, greedy
from tests.models.translators.seq2seq_helpers import BOS, EOS, PAD, padded_batch

V = 13
SPECIAL = {"src_vocab_size": V, "tgt_vocab_size": V, "pad_id": PAD, "bos_id": BOS, "eos_id": EOS}


def _model(kind: str):
    if kind == "transformer":
        config = TransformerSeq2SeqConfig(
            d_model=8, num_heads=2, ff_dim=16, num_encoder_layers=1, num_decoder_layers=1, **SPECIAL
        )
        return TransformerSeq2Seq(config).eval()
    return RNNSeq2Seq(RNNSeq2SeqConfig(embed_dim=8, hidden_dim=8, **SPECIAL)).eval()


KINDS = ["transformer", "rnn"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_one_dimensional_source_is_named_as_the_source(kind):
    """The RNN checked the target first: its message spoke of tgt_in for a 1-d src."""
    src = padded_batch([4], V)[0]  # (S,)
    tgt_in = padded_batch([3], V)
    with pytest.raises(ValueError, match=r"^src must be \(B, S\) token ids, got shape \(4,\)$"):
        _model(kind)(src, tgt_in)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bool], ids=["float", "bool"])
def test_ids_that_are_not_integers_are_named(kind, dtype):
    """A float source failed inside the embedding with torch's message about 'indices'."""
    model, src, tgt_in = _model(kind), padded_batch([4, 2], V), padded_batch([3, 3], V)
    with pytest.raises(ValueError, match=rf"^src must be integer token ids .*got {dtype}$"):
        model(src.to(dtype), tgt_in)
    with pytest.raises(ValueError, match=rf"^tgt_in must be integer token ids .*got {dtype}$"):
        model(src, tgt_in.to(dtype))
    for search in (greedy, beam):
        with pytest.raises(ValueError, match=r"^src must be integer token ids"):
            search(model, src.to(dtype))
