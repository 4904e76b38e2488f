"""Attention building blocks as ``torch.nn.Module`` s."""

from qkv.modules.attention import MultiHeadAttention
from qkv.modules.cache import DecoderCache, KVCache, LayerCache, LayerKV
from qkv.modules.decoder import CausalSelfAttention, DecoderBlock
from qkv.modules.feedforward import SwiGLU
from qkv.modules.linear import Linear
from qkv.modules.norms import RMSNorm
from qkv.modules.positional import (
    ALiBi,
    AttentionPositional,
    DynamicRopeScaling,
    LearnedPositionalEncoding,
    LinearRopeScaling,
    Llama3RopeScaling,
    RopeScaling,
    RotaryPositionalEncoding,
    SinusoidalPositionalEncoding,
    alibi_slopes,
    apply_rotary,
)
from qkv.modules.rnn_attention import BahdanauAttention, LuongAttention
from qkv.modules.scores import AdditiveScore, DotScore, GeneralScore, ScaledDotScore, Score
from qkv.modules.torch_compat import TorchMultiheadAttention
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
    "CausalSelfAttention",
    "Decoder",
    "DecoderBlock",
    "DecoderCache",
    "DynamicRopeScaling",
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
    "Linear",
    "LearnedPositionalEncoding",
    "LinearRopeScaling",
    "Llama3RopeScaling",
    "MultiHeadAttention",
    "RMSNorm",
    "RopeScaling",
    "RotaryPositionalEncoding",
    "ScaledDotScore",
    "Score",
    "SinusoidalPositionalEncoding",
    "SwiGLU",
    "TorchMultiheadAttention",
    "alibi_slopes",
    "apply_rotary",
]
