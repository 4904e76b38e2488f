"""The attention of generated tokens (:mod:`qkv.engine.generated_attention`): greedy
tokens with the KV cache, the attention rows of those same cached passes assembled into
causal maps, and each head's share of attention on the first and previous token."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from qkv.engine import generate_with_attention, sink_and_previous_shares
from qkv.models import Llama, LlamaConfig

PROMPT_IDS, N = [5, 9, 2, 33], 7


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(5)
    config = LlamaConfig(vocab_size=101, dim=32, num_layers=2, num_heads=4, num_kv_heads=2)
    return Llama(config).eval()


def test_tokens_are_greedy_and_rows_equal_one_full_pass(model):
    ids = torch.tensor([PROMPT_IDS])  # (1, T)
    new_ids, maps = generate_with_attention(model, ids, N)
    greedy = model.generate(ids, N, eos_token_id=[])[0, ids.shape[1] :].tolist()
    assert new_ids == greedy
    # float64: the random weights make softmax peaky, so float32 rounding of the cached and
    # the full pass would differ by up to 3e-4; in float64 only the maps' float32 is left
    model = copy.deepcopy(model).double()
    new_ids, maps = generate_with_attention(model, ids, N)
    full = torch.cat([ids, torch.tensor([new_ids])], dim=1)  # (1, T + N)
    with torch.no_grad():
        reference = torch.stack([a[0] for a in model(full, need_weights=True).attentions])
    total = full.shape[1]
    assert maps.shape == (model.config.num_layers, model.config.num_heads, total, total)
    torch.testing.assert_close(maps, reference.float(), atol=1e-5, rtol=0)
    assert maps.triu(1).abs().max() == 0
    torch.testing.assert_close(maps.sum(-1), torch.ones(maps.shape[:3]))


def test_shares_are_means_over_the_rows_from_the_third():
    """The second row's previous token is the first: counted as both, a head's two shares
    added up to more than 1 ("h6 sink 1.00 prev 0.17"). They are now means over the rows
    from the third on, where the first and the previous token are two keys."""
    maps = torch.rand(3, 2, 6, 6).tril()
    maps = maps / maps.sum(-1, keepdim=True)  # (L, H, T, T): causal rows
    sink, previous = sink_and_previous_shares(maps)
    for layer in range(3):
        for head in range(2):
            rows = [maps[layer, head, i] for i in range(2, 6)]
            assert sink[layer, head] == pytest.approx(np.mean([r[0].item() for r in rows]))
            expected = np.mean([maps[layer, head, i, i - 1].item() for i in range(2, 6)])
            assert previous[layer, head] == pytest.approx(expected)
    assert ((sink >= 0) & (previous >= 0) & (sink + previous <= 1 + 1e-6)).all()


@settings(max_examples=50, deadline=None)
@given(t=st.integers(3, 12), seed=st.integers(0, 2**31 - 1))
def test_a_heads_two_shares_never_add_up_to_more_than_one(t, seed):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(2, 3, t, t, generator=g) * 8  # peaky rows too
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    maps = scores.masked_fill(~causal, float("-inf")).softmax(-1)
    sink, previous = sink_and_previous_shares(maps)
    assert (sink + previous <= 1 + 1e-6).all()
