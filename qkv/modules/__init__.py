"""Attention building blocks as ``torch.nn.Module`` s."""

from qkv.modules.attention import MultiHeadAttention
from qkv.modules.cache import DecoderCache, KVCache, LayerCache, LayerKV
from qkv.modules.positional import (
    ALiBi,
    AttentionPositional,
    LearnedPositionalEncoding,
    RotaryPositionalEncoding,
    SinusoidalPositionalEncoding,
    alibi_slopes,
)
from qkv.modules.rnn_attention import BahdanauAttention, LuongAttention
from qkv.modules.scores import AdditiveScore, DotScore, GeneralScore, ScaledDotScore, Score
from qkv.modules.transformer import (
    Decoder,
    DecoderLayer,
    Encoder,
    EncoderLayer,
    FeedForward,
)

__all__ = [
    "ALiBi",
    "AdditiveScore",
    "AttentionPositional",
    "BahdanauAttention",
    "Decoder",
    "DecoderCache",
    "DecoderLayer",
    "Encoder",
    "EncoderLayer",
    "FeedForward",
    "LayerCache",
    "LuongAttention",
    "DotScore",
    "GeneralScore",
    "KVCache",
    "LayerKV",
    "LearnedPositionalEncoding",
    "MultiHeadAttention",
    "RotaryPositionalEncoding",
    "ScaledDotScore",
    "Score",
    "SinusoidalPositionalEncoding",
    "alibi_slopes",
]
