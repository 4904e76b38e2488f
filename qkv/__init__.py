"""qkv: attention from the Query-Key-Value formula up to a working translator.

The functional core (:mod:`qkv.functional`) computes attention on ``(B, H, T, D)``
tensors with several backends; :mod:`qkv.modules` holds the ``nn.Module`` s built on it.
"""

from qkv.attention import attention
from qkv.functional import (
    attention_lse,
    available_backends,
    causal_mask,
    combine_masks,
    explain_dispatch,
    from_torch_masks,
    merge_attention,
    padding_mask,
    scaled_dot_product_attention,
)
from qkv.modules import (
    AdditiveScore,
    ALiBi,
    BahdanauAttention,
    DotScore,
    GeneralScore,
    KVCache,
    LearnedPositionalEncoding,
    LuongAttention,
    MultiHeadAttention,
    RotaryPositionalEncoding,
    ScaledDotScore,
    SinusoidalPositionalEncoding,
)

__version__ = "0.1.0"

__all__ = [
    "ALiBi",
    "AdditiveScore",
    "BahdanauAttention",
    "LuongAttention",
    "DotScore",
    "GeneralScore",
    "KVCache",
    "LearnedPositionalEncoding",
    "MultiHeadAttention",
    "RotaryPositionalEncoding",
    "ScaledDotScore",
    "SinusoidalPositionalEncoding",
    "attention",
    "attention_lse",
    "available_backends",
    "causal_mask",
    "combine_masks",
    "explain_dispatch",
    "from_torch_masks",
    "merge_attention",
    "padding_mask",
    "scaled_dot_product_attention",
]
