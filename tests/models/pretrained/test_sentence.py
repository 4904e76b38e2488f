"""Sentence embeddings of all-MiniLM-L6-v2 against sentence-transformers, for each pooling."""

from __future__ import annotations

import json
import os
import random

import pytest
import torch

from tests.models.pretrained.minilm_helpers import SENTENCES, minilm_fixtures, repooled

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from qkv.models import encode, load_tokenizer, sentence_options  # noqa: E402

folder, ours, peer, batch = minilm_fixtures()


POOLS = {"cls": "cls_token", "max": "max_tokens"}  # sentence-transformers' config names


@pytest.mark.parametrize("pooling", ["mean", "cls", "max"])
def test_sentence_embeddings_match_sentence_transformers(folder, ours, pooling, tmp_path):
    st = pytest.importorskip("sentence_transformers")
    if pooling != "mean":  # the same encoder with another pooling and no Normalize module
        folder = repooled(
            folder,
            tmp_path,
            pooling_mode_mean_tokens=False,
            **{f"pooling_mode_{POOLS[pooling]}": True},
        )
        modules = json.loads((folder / "modules.json").read_text())[:2]
        (folder / "modules.json").write_text(json.dumps(modules))
    options = sentence_options(folder)
    assert options == {"pooling": pooling, "normalize": pooling == "mean"}
    texts = random.sample(SENTENCES, len(SENTENCES))
    ref = st.SentenceTransformer(str(folder), device="cpu").encode(texts, convert_to_tensor=True)
    emb = encode(texts, ours, load_tokenizer(folder), batch_size=3, **options)
    assert emb.shape == (len(texts), 384)
    torch.testing.assert_close(emb, ref.float(), atol=2e-6, rtol=1e-5)
    # batching and padding do not change an embedding
    alone = encode(texts[:1], ours, load_tokenizer(folder), **options)
    torch.testing.assert_close(alone[0], emb[0], atol=2e-6, rtol=1e-5)
