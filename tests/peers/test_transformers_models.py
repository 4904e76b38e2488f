"""Hugging Face transformers' model tests for BERT and GPT-2
(``huggingface/transformers``, ``tests/models/bert/test_modeling_bert.py`` with its
``BertModelTester``, ``tests/models/gpt2/test_modeling_gpt2.py`` with its
``GPT2ModelTester``, and ``tests/test_modeling_common.py``) ported to qkv's models, on
every CPU backend of qkv's attention.

As the model testers do, each model is a small random config (vocab 99, width 32, 2
layers, 4 heads, feed-forward 37 for BERT) with the testers' batch and length (13 x 7 for
BERT, 14 x 7 for GPT-2) and their random attention masks (holes anywhere, the first token
always attended). transformers saves the folder; qkv's ``from_pretrained`` reads it; the
peer is transformers' own model of the same folder. Weights are drawn with a standard
deviation of 0.1 (the testers' 0.02 leaves attention almost uniform).

One convention differs: given an attention mask, qkv's GPT counts positions over the real
tokens only (as transformers' ``generate`` does), where transformers' forward numbers
every token; the GPT-2 ports pass transformers' positions (``past + arange(T)``) to qkv.
"""

from __future__ import annotations

import inspect
import os

import pytest
import torch

from qkv.models import GPT, BertModel
from tests.models.pretrained.gpt_helpers import random_gpt2_folder
from tests.peers.peer_helpers import CPU_BACKENDS, set_backend

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

transformers = pytest.importorskip("transformers")

VOCAB = 99
BERT_BATCH, GPT_BATCH, SEQ = 13, 14, 7
BERT_CONFIG = dict(  # BertModelTester's sizes
    vocab_size=VOCAB,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=37,
    hidden_act="gelu",
    hidden_dropout_prob=0.1,
    attention_probs_dropout_prob=0.1,
    max_position_embeddings=512,
    type_vocab_size=16,
    initializer_range=0.1,
)
ATOL = 1e-5
PEERS = ["eager", "sdpa"]  # transformers' attention implementations, both compared


def ids_tensor(shape, vocab_size):
    """The testers' ``ids_tensor``: uniform random token ids."""
    return torch.randint(0, vocab_size, shape)


def random_attention_mask(shape):
    """The testers' ``random_attention_mask``: random 0/1 with the first token always 1, so
    every row attends to something, also under a causal mask."""
    mask = ids_tensor(shape, 2)
    mask[:, 0] = 1
    return mask


def arange_positions(past, n):
    """transformers' default GPT-2 positions for ``n`` tokens after ``past`` cached ones."""
    return torch.arange(past, past + n)[None, :]


def _bert_folder(path, **changes):
    config = transformers.BertConfig(**{**BERT_CONFIG, **changes})
    transformers.BertModel(config).save_pretrained(path)
    return path


def _peer(cls, folder, implementation):
    return cls.from_pretrained(folder, attn_implementation=implementation).eval()


@pytest.fixture(scope="module")
def bert_folder(tmp_path_factory):
    return _bert_folder(tmp_path_factory.mktemp("bert"))


@pytest.fixture(scope="module")
def bert_peers(bert_folder):
    return {impl: _peer(transformers.BertModel, bert_folder, impl) for impl in PEERS}


def _bert_inputs():
    ids = ids_tensor((BERT_BATCH, SEQ), VOCAB)
    mask = random_attention_mask((BERT_BATCH, SEQ))
    types = ids_tensor((BERT_BATCH, SEQ), BERT_CONFIG["type_vocab_size"])
    return ids, mask, types


# --- BERT: BertModelTester.create_and_check_model, test_attention_outputs ------------------


@pytest.mark.parametrize("peer_impl", PEERS)
@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_bert_model(bert_folder, bert_peers, backend, peer_impl):
    """huggingface/transformers tests/models/bert/test_modeling_bert.py,
    BertModelTester.create_and_check_model (via BertModelTest.test_model): token types
    and a random attention mask; the last hidden state (every position: padded queries
    are computed by both) and the pooler output within 1e-5 of transformers' eager and
    SDPA models, with the testers' shapes."""
    ours = set_backend(BertModel.from_pretrained(bert_folder), backend)
    ids, mask, types = _bert_inputs()
    with torch.no_grad():
        got = ours(ids, attention_mask=mask, token_type_ids=types)
        want = bert_peers[peer_impl](input_ids=ids, attention_mask=mask, token_type_ids=types)
    assert got.last_hidden_state.shape == (BERT_BATCH, SEQ, BERT_CONFIG["hidden_size"])
    assert got.pooler_output.shape == (BERT_BATCH, BERT_CONFIG["hidden_size"])
    torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state, atol=ATOL, rtol=0)
    torch.testing.assert_close(got.pooler_output, want.pooler_output, atol=ATOL, rtol=0)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_bert_attention_outputs(bert_folder, bert_peers, backend):
    """huggingface/transformers tests/test_modeling_common.py,
    ModelTesterMixin.test_attention_outputs (for BERT): one (B, H, T, T) map per layer,
    equal to transformers' eager attentions within 1e-5, exactly 0 on the padded keys,
    rows summing to 1."""
    ours = set_backend(BertModel.from_pretrained(bert_folder), backend)
    ids, mask, types = _bert_inputs()
    with torch.no_grad():
        got = ours(ids, attention_mask=mask, token_type_ids=types, need_weights=True)
        want = bert_peers["eager"](
            ids, attention_mask=mask, token_type_ids=types, output_attentions=True
        )
    heads = BERT_CONFIG["num_attention_heads"]
    assert len(got.attentions) == len(want.attentions) == BERT_CONFIG["num_hidden_layers"]
    for w, w_ref in zip(got.attentions, want.attentions):
        assert w.shape == (BERT_BATCH, heads, SEQ, SEQ)
        torch.testing.assert_close(w, w_ref, atol=ATOL, rtol=0)
        assert (w.masked_select(mask[:, None, None, :] == 0) == 0).all()
        torch.testing.assert_close(w.sum(-1), torch.ones(BERT_BATCH, heads, SEQ))


# --- BERT: create_and_check_model_as_decoder (causal, no cross-attention) ------------------


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_bert_model_as_decoder(tmp_path, backend):
    """huggingface/transformers tests/models/bert/test_modeling_bert.py,
    BertModelTester.create_and_check_model_as_decoder, without encoder_hidden_states: an
    ``is_decoder`` BERT attends causally; hidden states within 1e-5 of transformers' at
    every position. Its cross-attention half (``add_cross_attention``) is refused by qkv,
    by name."""
    folder = _bert_folder(tmp_path / "decoder", is_decoder=True)
    ours = set_backend(BertModel.from_pretrained(folder), backend)
    peer = _peer(transformers.BertModel, folder, "eager")
    ids, mask, types = _bert_inputs()
    with torch.no_grad():
        got = ours(ids, attention_mask=mask, token_type_ids=types).last_hidden_state
        want = peer(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    crossed = _bert_folder(tmp_path / "cross", is_decoder=True, add_cross_attention=True)
    with pytest.raises(ValueError, match="add_cross_attention=true .* is not supported"):
        BertModel.from_pretrained(crossed)


@pytest.mark.parametrize("position_embedding_type", ["relative_key", "relative_key_query"])
def test_bert_model_various_embeddings(tmp_path, position_embedding_type):
    """huggingface/transformers tests/models/bert/test_modeling_bert.py,
    BertModelTest.test_model_various_embeddings: qkv reads absolute positions only and
    refuses the relative ones by name (the absolute case is test_bert_model)."""
    folder = _bert_folder(tmp_path, position_embedding_type=position_embedding_type)
    with pytest.raises(ValueError, match=f"position_embedding_type '{position_embedding_type}'"):
        BertModel.from_pretrained(folder)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_bert_batching_equivalence(bert_folder, backend):
    """huggingface/transformers tests/test_modeling_common.py,
    ModelTesterMixin.test_batching_equivalence (for BERT): each row of a batched run
    equals that row run alone, within 1e-5, hidden states and pooler."""
    ours = set_backend(BertModel.from_pretrained(bert_folder), backend)
    ids, mask, types = _bert_inputs()
    with torch.no_grad():
        batched = ours(ids, attention_mask=mask, token_type_ids=types)
        for i in range(BERT_BATCH):
            alone = ours(
                ids[i : i + 1], attention_mask=mask[i : i + 1], token_type_ids=types[i : i + 1]
            )
            torch.testing.assert_close(
                batched.last_hidden_state[i : i + 1], alone.last_hidden_state, atol=ATOL, rtol=0
            )
            torch.testing.assert_close(
                batched.pooler_output[i : i + 1], alone.pooler_output, atol=ATOL, rtol=0
            )


# --- GPT-2: GPT2ModelTester ----------------------------------------------------------------


@pytest.fixture(scope="module")
def gpt_folder(tmp_path_factory):
    return random_gpt2_folder(
        tmp_path_factory.mktemp("gpt2"), layers=2, heads=4, dim=32, vocab=VOCAB, positions=512
    )


@pytest.fixture(scope="module")
def gpt_peers(gpt_folder):
    return {impl: _peer(transformers.GPT2LMHeadModel, gpt_folder, impl) for impl in PEERS}


@pytest.mark.parametrize("peer_impl", PEERS)
@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_gpt2_model(gpt_folder, gpt_peers, backend, peer_impl):
    """huggingface/transformers tests/models/gpt2/test_modeling_gpt2.py,
    GPT2ModelTester.create_and_check_gpt2_model and create_and_check_lm_head_model: a
    random attention mask, transformers' default positions; logits within 1e-5 of its
    eager and SDPA models at every position. GPT-2's token_type_ids (added through the
    token embedding) are not an input of qkv's GPT."""
    ours = set_backend(GPT.from_pretrained(gpt_folder), backend)
    ids = ids_tensor((GPT_BATCH, SEQ), VOCAB)
    mask = random_attention_mask((GPT_BATCH, SEQ))
    with torch.no_grad():
        got = ours(ids, attention_mask=mask, position_ids=arange_positions(0, SEQ)).logits
        want = gpt_peers[peer_impl](ids, attention_mask=mask).logits
    assert got.shape == (GPT_BATCH, SEQ, VOCAB)
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_gpt2_attention_outputs(gpt_folder, gpt_peers, backend):
    """huggingface/transformers tests/test_modeling_common.py,
    ModelTesterMixin.test_attention_outputs (for GPT-2): causal maps per layer within
    1e-5 of transformers' eager attentions, 0 above the diagonal and on padded keys."""
    ours = set_backend(GPT.from_pretrained(gpt_folder), backend)
    ids = ids_tensor((GPT_BATCH, SEQ), VOCAB)
    mask = random_attention_mask((GPT_BATCH, SEQ))
    with torch.no_grad():
        got = ours(
            ids, attention_mask=mask, need_weights=True, position_ids=arange_positions(0, SEQ)
        ).attentions
        want = gpt_peers["eager"](ids, attention_mask=mask, output_attentions=True).attentions
    assert len(got) == len(want) == 2
    future = torch.ones(SEQ, SEQ, dtype=torch.bool).triu(1)
    for w, w_ref in zip(got, want):
        assert w.shape == (GPT_BATCH, 4, SEQ, SEQ)
        torch.testing.assert_close(w, w_ref, atol=ATOL, rtol=0)
        assert (w[..., future] == 0).all()
        assert (w.masked_select(mask[:, None, None, :] == 0) == 0).all()


def _hf_cached(peer, ids, mask, past=None):
    """transformers' forward with its key/value cache: ``(logits, cache)``. The cache
    argument is ``cache`` in newer versions, ``past_key_values`` before."""
    name = "cache" if "cache" in inspect.signature(peer.forward).parameters else "past_key_values"
    out = peer(
        ids, attention_mask=mask, use_cache=True, **({name: past} if past is not None else {})
    )
    return out.logits, out[name]


def _past_check(ours, peer, ids, mask, next_ids, next_mask):
    """qkv with a cache, qkv without, transformers with its cache (past_key_values): the
    new tokens' logits agree within 1e-5."""
    full_ids = torch.cat([ids, next_ids], dim=-1)
    full_mask = None if mask is None else torch.cat([mask, next_mask], dim=-1)
    t, n = ids.shape[1], next_ids.shape[1]
    with torch.no_grad():
        cache = ours.new_cache()
        ours(ids, attention_mask=mask, cache=cache, position_ids=arange_positions(0, t))
        with_cache = ours(
            next_ids, attention_mask=full_mask, cache=cache, position_ids=arange_positions(t, n)
        ).logits
        no_cache = ours(
            full_ids, attention_mask=full_mask, position_ids=arange_positions(0, t + n)
        ).logits[:, -n:]
        _, past = _hf_cached(peer, ids, mask)
        hf_past, _ = _hf_cached(peer, next_ids, full_mask, past)
        hf_no_past = peer(full_ids, attention_mask=full_mask).logits[:, -n:]
    torch.testing.assert_close(with_cache, no_cache, atol=ATOL, rtol=0)
    torch.testing.assert_close(with_cache, hf_past, atol=ATOL, rtol=0)
    torch.testing.assert_close(no_cache, hf_no_past, atol=ATOL, rtol=0)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_gpt2_model_past(gpt_folder, gpt_peers, backend):
    """huggingface/transformers tests/models/gpt2/test_modeling_gpt2.py,
    GPT2ModelTester.create_and_check_gpt2_model_past: one new token after a cached
    prompt, without a mask; qkv's cache against its own full pass and transformers'
    past_key_values, within 1e-5 on the logits (upstream: 1e-3 on a random slice)."""
    ours = set_backend(GPT.from_pretrained(gpt_folder), backend)
    ids = ids_tensor((GPT_BATCH, SEQ), VOCAB)
    _past_check(ours, gpt_peers["eager"], ids, None, ids_tensor((GPT_BATCH, 1), VOCAB), None)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_gpt2_model_attention_mask_past(gpt_folder, gpt_peers, backend):
    """huggingface/transformers tests/models/gpt2/test_modeling_gpt2.py,
    GPT2ModelTester.create_and_check_gpt2_model_attention_mask_past: the second half of
    the prompt masked; the cache is filled from the prompt, then a masked token of the
    prompt is changed for the full pass only: being masked, it changes nothing."""
    ours = set_backend(GPT.from_pretrained(gpt_folder), backend)
    peer = gpt_peers["eager"]
    ids = ids_tensor((GPT_BATCH, SEQ), VOCAB)
    mask = torch.ones(GPT_BATCH, SEQ, dtype=torch.long)
    mask[:, SEQ // 2 :] = 0
    next_ids, next_mask = (
        ids_tensor((GPT_BATCH, 1), VOCAB),
        torch.ones(GPT_BATCH, 1, dtype=torch.long),
    )
    full_mask = torch.cat([mask, next_mask], dim=-1)
    changed = ids.clone()
    changed[:, int(torch.randint(SEQ // 2, SEQ, ()))] = ids_tensor((GPT_BATCH,), VOCAB)
    with torch.no_grad():
        cache = ours.new_cache()
        ours(ids, attention_mask=mask, cache=cache, position_ids=arange_positions(0, SEQ))
        with_cache = ours(
            next_ids, attention_mask=full_mask, cache=cache, position_ids=arange_positions(SEQ, 1)
        ).logits
        no_cache = ours(
            torch.cat([changed, next_ids], -1),
            attention_mask=full_mask,
            position_ids=arange_positions(0, SEQ + 1),
        ).logits[:, -1:]
        _, past = _hf_cached(peer, ids, mask)
        hf_past, _ = _hf_cached(peer, next_ids, full_mask, past)
    torch.testing.assert_close(with_cache, no_cache, atol=ATOL, rtol=0)
    torch.testing.assert_close(with_cache, hf_past, atol=ATOL, rtol=0)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_gpt2_model_past_large_inputs(gpt_folder, gpt_peers, backend):
    """huggingface/transformers tests/models/gpt2/test_modeling_gpt2.py,
    GPT2ModelTester.create_and_check_gpt2_model_past_large_inputs: three new tokens at
    once, with a random mask over prompt and new tokens."""
    ours = set_backend(GPT.from_pretrained(gpt_folder), backend)
    ids = ids_tensor((GPT_BATCH, SEQ), VOCAB)
    mask = random_attention_mask((GPT_BATCH, SEQ))
    next_ids, next_mask = ids_tensor((GPT_BATCH, 3), VOCAB), ids_tensor((GPT_BATCH, 3), 2)
    _past_check(ours, gpt_peers["eager"], ids, mask, next_ids, next_mask)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("option", ["scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"])
def test_gpt2_attention_options(gpt_folder, tmp_path, backend, option):
    """huggingface/transformers tests/models/gpt2/test_modeling_gpt2.py,
    GPT2ModelTest.test_gpt2_scale_attn_by_inverse_layer_idx and
    .test_gpt2_reorder_and_upcast_attn (forward half of create_and_check_forward_and_backwards):
    the option read from the folder, logits within 1e-5 of transformers'."""
    config = transformers.GPT2Config.from_pretrained(gpt_folder)
    setattr(config, option, True)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path)
    ours = set_backend(GPT.from_pretrained(tmp_path), backend)
    peer = _peer(transformers.GPT2LMHeadModel, tmp_path, "eager")
    ids = ids_tensor((GPT_BATCH, SEQ), VOCAB)
    mask = random_attention_mask((GPT_BATCH, SEQ))
    with torch.no_grad():
        got = ours(ids, attention_mask=mask, position_ids=arange_positions(0, SEQ)).logits
        torch.testing.assert_close(got, peer(ids, attention_mask=mask).logits, atol=ATOL, rtol=0)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_gpt2_batch_generation(gpt_folder, gpt_peers, backend):
    """huggingface/transformers tests/models/gpt2/test_modeling_gpt2.py,
    GPT2ModelLanguageGenerationTest.test_batch_generation, on the random model (the
    upstream one downloads gpt2 and its tokenizer): greedy continuations of a left-padded
    batch equal those of each prompt alone, and transformers' batched generate."""
    ours = set_backend(GPT.from_pretrained(gpt_folder), backend)
    lengths = [SEQ, 3]
    ids = ids_tensor((2, SEQ), VOCAB)
    mask = torch.ones(2, SEQ, dtype=torch.long)
    mask[1, : SEQ - lengths[1]] = 0
    ids = ids.masked_fill(mask == 0, 0)
    new = 6
    batched = ours.generate(ids, new, attention_mask=mask)
    with torch.no_grad():
        want = gpt_peers["eager"].generate(
            ids, attention_mask=mask, max_new_tokens=new, do_sample=False, pad_token_id=0
        )
    assert torch.equal(batched, want)
    for row, n in enumerate(lengths):
        alone = ours.generate(ids[row : row + 1, SEQ - n :], new)
        assert torch.equal(batched[row : row + 1, SEQ - n :], alone)
