"""Models built on the qkv blocks, and loading of pretrained checkpoints (Hugging Face
folders, GGUF files)."""

from qkv.engine import DecodingRules, sample_next
from qkv.models.checkpoint import Checkpoint, CheckpointError, load_checkpoint, save_checkpoint
from qkv.models.pretrained.bert import BertConfig, BertModel, BertOutput
from qkv.models.pretrained.gen_defaults import GenerationDefaults
from qkv.models.pretrained.gguf import GGUFModel, read_gguf, smollm2_path
from qkv.models.pretrained.gpt import GPT, GPTConfig, GPTOutput
from qkv.models.pretrained.hf_tokenizer import load_tokenizer, minilm_path, sentence_options
from qkv.models.pretrained.llama import Llama, LlamaConfig, LlamaOutput
from qkv.models.pretrained.sentence import encode
from qkv.models.pretrained.vit import ViT, ViTConfig, ViTOutput
from qkv.models.translators.config import RNNSeq2SeqConfig, TransformerSeq2SeqConfig
from qkv.models.translators.rnn import RNNSeq2Seq, RNNState
from qkv.models.translators.seq2seq import DecoderState, Seq2Seq, Seq2SeqAttention
from qkv.models.translators.transformer import TransformerSeq2Seq, TransformerState

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "DecoderState",
    "RNNSeq2Seq",
    "RNNSeq2SeqConfig",
    "RNNState",
    "Seq2Seq",
    "Seq2SeqAttention",
    "TransformerSeq2Seq",
    "TransformerSeq2SeqConfig",
    "TransformerState",
    "load_checkpoint",
    "save_checkpoint",
    "BertConfig",
    "BertModel",
    "BertOutput",
    "DecodingRules",
    "GPT",
    "GPTConfig",
    "GPTOutput",
    "GenerationDefaults",
    "GGUFModel",
    "Llama",
    "LlamaConfig",
    "LlamaOutput",
    "encode",
    "load_tokenizer",
    "minilm_path",
    "sample_next",
    "read_gguf",
    "sentence_options",
    "smollm2_path",
    "ViT",
    "ViTConfig",
    "ViTOutput",
]
