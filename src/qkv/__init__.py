"""qkv: attention from the Query-Key-Value formula up to a working translator.

The functional core (:mod:`qkv.functional`) computes attention on ``(B, H, T, D)``
tensors with several backends; :mod:`qkv.modules` holds the ``nn.Module`` s built on it;
:func:`load` reads a model (GGUF, Hugging Face folder, a checkpoint of ``qkv train``) and
:func:`generate` streams its text through the engine's one generation loop
(:mod:`qkv.engine`), whose runners :func:`explain_runner` explains.
"""

from qkv.attention import attention
from qkv.engine import explain_runner, generate
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
from qkv.models.load import load
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
    TorchMultiheadAttention,
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
    "TorchMultiheadAttention",
    "attention",
    "attention_lse",
    "available_backends",
    "causal_mask",
    "combine_masks",
    "explain_dispatch",
    "explain_runner",
    "from_torch_masks",
    "generate",
    "load",
    "merge_attention",
    "padding_mask",
    "scaled_dot_product_attention",
]
