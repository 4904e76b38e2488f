"""A tiny untrained translator shared by the translate tests."""

from __future__ import annotations

import torch

from qkv.data.tokenizers import WordTokenizer
from qkv.models import TransformerSeq2Seq, TransformerSeq2SeqConfig

WORDS = ["고양이가", "쥐를", "개가", "잡았다", "잤다", "먹었다", "새가", "물고기를"]
TARGET = ["the", "cat", "dog", "bird", "fish", "caught", "slept", "ate"]


def tiny_translator(seed: int) -> tuple[TransformerSeq2Seq, WordTokenizer, WordTokenizer]:
    """A random 1-layer Transformer of 16 positions and its word tokenizers."""
    src, tgt = WordTokenizer(WORDS), WordTokenizer(TARGET)
    torch.manual_seed(seed)
    cfg = TransformerSeq2SeqConfig(
        src.vocab_size,
        tgt.vocab_size,
        d_model=16,
        num_heads=2,
        num_encoder_layers=1,
        num_decoder_layers=1,
        ff_dim=16,
        max_len=16,
        pad_id=0,
        bos_id=2,
        eos_id=3,
    )
    return TransformerSeq2Seq(cfg), src, tgt
