"""Models built on the qkv blocks, and loading of pretrained Hugging Face checkpoints."""

from qkv.models.bert import BertConfig, BertModel, BertOutput, encode
from qkv.models.gpt import GPT, GPTConfig, GPTOutput, sample_next
from qkv.models.hf import load_tokenizer, minilm_path

__all__ = [
    "BertConfig",
    "BertModel",
    "BertOutput",
    "GPT",
    "GPTConfig",
    "GPTOutput",
    "encode",
    "load_tokenizer",
    "minilm_path",
    "sample_next",
]
