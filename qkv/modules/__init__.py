"""Attention building blocks as ``torch.nn.Module`` s."""

from qkv.modules.attention import MultiHeadAttention
from qkv.modules.cache import KVCache, LayerKV
from qkv.modules.positional import (
    ALiBi,
    AttentionPositional,
    LearnedPositionalEncoding,
    RotaryPositionalEncoding,
    SinusoidalPositionalEncoding,
    alibi_slopes,
)
from qkv.modules.scores import AdditiveScore, DotScore, GeneralScore, ScaledDotScore, Score

__all__ = [
    "ALiBi",
    "AdditiveScore",
    "AttentionPositional",
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
