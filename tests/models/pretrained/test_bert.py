"""BertModel on the all-MiniLM-L6-v2 checkpoint against transformers; configs and inputs
that cannot run are refused in one line that names what is wrong."""

from __future__ import annotations

import copy
import os
import random

import pytest
import torch

from tests.models.pretrained.minilm_helpers import minilm_fixtures

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from qkv.models import BertModel  # noqa: E402
from qkv.models.pretrained.bert import BertConfig  # noqa: E402
from qkv.models.pretrained.hf import load_state_dict  # noqa: E402

folder, ours, peer, batch = minilm_fixtures()


@pytest.mark.parametrize("need_weights", [True, False], ids=["with_maps", "fast_path"])
def test_hidden_states_and_attentions_match_transformers(ours, peer, batch, need_weights):
    _, ids, mask, types = batch
    with torch.no_grad():
        out = ours(ids, attention_mask=mask, token_type_ids=types, need_weights=need_weights)
        ref = peer(ids, attention_mask=mask, token_type_ids=types, output_attentions=True)
    real = mask.bool()
    hidden_diff = (out.last_hidden_state - ref.last_hidden_state)[real].abs().max()
    assert hidden_diff <= 1e-5
    torch.testing.assert_close(out.pooler_output, ref.pooler_output, atol=1e-5, rtol=0)
    if need_weights:
        assert len(out.attentions) == len(ref.attentions) == 6
        for layer, (w, w_ref) in enumerate(zip(out.attentions, ref.attentions)):
            assert w.shape == w_ref.shape == (ids.shape[0], 12, ids.shape[1], ids.shape[1])
            assert (w - w_ref).abs().max() <= 1e-6, f"layer {layer}"
    else:
        assert out.attentions == []


def test_float64_matches_transformers_float64(ours, peer, batch):
    _, ids, mask, types = batch
    ours64, peer64 = copy.deepcopy(ours).double(), copy.deepcopy(peer).double()
    with torch.no_grad():
        out = ours64(ids, attention_mask=mask, token_type_ids=types).last_hidden_state
        ref = peer64(ids, attention_mask=mask, token_type_ids=types).last_hidden_state
        out32 = ours(ids, attention_mask=mask, token_type_ids=types).last_hidden_state
    real = mask.bool()
    assert (out - ref)[real].abs().max() <= 1e-10
    assert (out32.double() - out)[real].abs().max() <= 1e-4  # fp32 error is small, not zero


def test_bin_weights_with_bert_prefix_load_the_same(folder, ours, batch, tmp_path):
    state = load_state_dict(folder)
    torch.save({f"bert.{k}": v for k, v in state.items()}, tmp_path / "pytorch_model.bin")
    (tmp_path / "config.json").write_bytes((folder / "config.json").read_bytes())
    loaded = BertModel.from_pretrained(tmp_path)
    _, ids, mask, _ = batch
    with torch.no_grad():
        a = loaded(ids, attention_mask=mask).last_hidden_state
        b = ours(ids, attention_mask=mask).last_hidden_state
    assert torch.equal(a, b)


def test_wrong_weight_names_are_listed(folder, tmp_path):
    state = load_state_dict(folder)
    del state["encoder.layer.3.output.dense.bias"]
    state["encoder.layer.0.attention.self.rotary.weight"] = torch.randn(3)
    torch.save(state, tmp_path / "pytorch_model.bin")
    (tmp_path / "config.json").write_bytes((folder / "config.json").read_bytes())
    with pytest.raises(ValueError) as info:
        BertModel.from_pretrained(tmp_path)
    message = str(info.value)
    assert "missing (1): encoder.layers.3.ff.linear2.bias" in message
    assert "unexpected (1)" in message and "rotary" in message
    empty = tmp_path / "empty"  # a config.json and no weights beside it
    empty.mkdir()
    (empty / "config.json").write_bytes((folder / "config.json").read_bytes())
    with pytest.raises(FileNotFoundError, match="no weights"):
        BertModel.from_pretrained(empty)


@pytest.mark.parametrize("need_weights", [True, False], ids=["with_maps", "fast_path"])
def test_a_row_of_only_padding_matches_transformers_default(folder, ours, batch, need_weights):
    """A sequence whose mask is all 0 sees no key. transformers' default (sdpa) then
    attends to nothing, as qkv does (zeros, never NaN), so even that row's states agree;
    its eager path attends uniformly instead, and differs from its own default there."""
    _, ids, mask, types = batch
    empty = random.randrange(ids.shape[0])
    mask = mask.clone()
    mask[empty] = 0
    sdpa = transformers.BertModel.from_pretrained(folder, attn_implementation="sdpa").eval()
    with torch.no_grad():
        out = ours(ids, attention_mask=mask, token_type_ids=types, need_weights=need_weights)
        ref = sdpa(ids, attention_mask=mask, token_type_ids=types)
    assert out.last_hidden_state.isfinite().all()
    compared = mask.bool()
    compared[empty] = True  # the real tokens of every row, and all of the empty row
    diff = (out.last_hidden_state - ref.last_hidden_state)[compared].abs().max()
    assert diff <= 1e-5
    torch.testing.assert_close(out.pooler_output, ref.pooler_output, atol=1e-5, rtol=0)
    if need_weights:  # the empty row's maps hold no attention at all
        assert all((w[empty] == 0).all() for w in out.attentions)


# ---- configs and inputs that cannot run ----------------------------------------------


BERT_SIZES = dict(
    vocab_size=50, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16
)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (dict(num_attention_heads=3), r"^hidden_size 8 is not divisible by num_attention_heads 3$"),
        (dict(position_style="roberta"), r"^pad_token_id is needed: positions start after it"),
        (dict(hidden_act="swish7"), r"^hidden_act 'swish7' not supported: \['gelu', "),
    ],
)
def test_bert_configs_that_cannot_be_built_say_why(changes, message):
    with pytest.raises(ValueError, match=message):
        BertConfig(**{**BERT_SIZES, "pad_token_id": None, **changes})


def test_input_ids_of_a_wrong_shape_are_named():
    bert = BertModel(BertConfig(**BERT_SIZES)).eval()
    with pytest.raises(ValueError, match=r"^input_ids must be \(B, T\), got \(5,\)$"):
        bert(torch.zeros(5, dtype=torch.long))
