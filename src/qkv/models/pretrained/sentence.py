"""Sentence embeddings from a BERT-family encoder: pool the last hidden state, normalise.

Reimers & Gurevych 2019, "Sentence-BERT" (https://arxiv.org/abs/1908.10084): a sentence's
embedding is the mean (or first, or element-wise largest) of its tokens' last hidden
states, over the real tokens only; with :func:`qkv.models.sentence_options` of a
sentence-transformers folder, :func:`encode` gives ``SentenceTransformer.encode``'s vectors.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from qkv.models.pretrained.bert import BertModel

__all__ = ["encode"]


@torch.no_grad()
def encode(
    texts: Sequence[str],
    model: BertModel,
    tokenizer: Any,
    pooling: str = "mean",
    normalize: bool = True,
    batch_size: int = 32,
) -> Tensor:
    """Sentence embeddings: pool each text's last hidden state over its real tokens.

    ``pooling="mean"`` averages the token vectors (sentence-transformers, Reimers &
    Gurevych 2019), ``"cls"`` takes the first token, ``"max"`` the element-wise maximum.

    Args:
        texts: the sentences.
        model: a :class:`BertModel`.
        tokenizer: from :func:`qkv.models.load_tokenizer` (pads each batch).
        pooling: ``"mean"``, ``"cls"`` or ``"max"``.
        normalize: scale each embedding to unit L2 norm (cosine similarity = dot product).
        batch_size: texts per forward pass (sorted by length to waste little padding).

    Returns:
        ``(N, E)`` float tensor, in the order of ``texts``.
    """
    if pooling not in ("mean", "cls", "max"):
        raise ValueError(f"pooling must be 'mean', 'cls' or 'max', got {pooling!r}")
    texts = list(texts)
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    device = next(model.parameters()).device
    result = torch.empty(len(texts), model.config.hidden_size, device=device)
    for start in range(0, len(texts), batch_size):
        index = order[start : start + batch_size]
        ids, mask, types = _tokenize([texts[i] for i in index], tokenizer, device)
        hidden = model(ids, attention_mask=mask, token_type_ids=types).last_hidden_state
        result[index] = _pool(hidden, mask, pooling).to(result.dtype)
    return F.normalize(result, dim=-1) if normalize else result


def _tokenize(texts: list[str], tokenizer: Any, device: torch.device) -> tuple[Tensor, ...]:
    encodings = tokenizer.encode_batch(texts)
    ids = torch.tensor([e.ids for e in encodings], device=device)  # (B, T)
    mask = torch.tensor([e.attention_mask for e in encodings], device=device)  # (B, T)
    types = torch.tensor([e.type_ids for e in encodings], device=device)  # (B, T)
    return ids, mask, types


def _pool(hidden: Tensor, mask: Tensor, pooling: str) -> Tensor:
    """Pool ``(B, T, E)`` over the real tokens of ``mask`` ``(B, T)`` -> ``(B, E)``."""
    if pooling == "cls":
        return hidden[:, 0]
    real = mask.unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
    if pooling == "max":
        return hidden.masked_fill(real == 0, float("-inf")).amax(1)
    return (hidden * real).sum(1) / real.sum(1).clamp(min=1e-9)
