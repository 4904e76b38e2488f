"""Data: the built-in toy corpus, real corpora, tokenizers, batching and downloads.

- :mod:`qkv.data.toy`: seeded Korean→English grammar with gold word alignments.
- :mod:`qkv.data.corpus`: read and validate parallel corpora (two files or a TSV).
- :mod:`qkv.data.tokenizers`: BPE, character and word tokenizers with one interface.
- :mod:`qkv.data.batching`: token-budget batches with length bucketing and padding.
- :mod:`qkv.data.download`: resumable, checksummed downloads of public corpora
  (``from qkv.data.download import download``; not re-exported, so that the name
  ``qkv.data.download`` stays the module).
"""

from qkv.data.batching import Batch, TokenBatcher, collate
from qkv.data.corpus import CorpusError, CorpusReport, ParallelCorpus, read_parallel, read_tsv
from qkv.data.download import DownloadError
from qkv.data.tokenizers import (
    BPETokenizer,
    CharTokenizer,
    Tokenizer,
    WordTokenizer,
    tokenizer_from_json,
    train_tokenizers,
)
from qkv.data.toy import ToyConfig, ToyPair, generate_pair, make_splits, toy_splits

__all__ = [
    "Batch",
    "TokenBatcher",
    "collate",
    "CorpusError",
    "CorpusReport",
    "ParallelCorpus",
    "read_parallel",
    "read_tsv",
    "DownloadError",
    "BPETokenizer",
    "CharTokenizer",
    "Tokenizer",
    "WordTokenizer",
    "tokenizer_from_json",
    "train_tokenizers",
    "ToyConfig",
    "ToyPair",
    "generate_pair",
    "make_splits",
    "toy_splits",
]
