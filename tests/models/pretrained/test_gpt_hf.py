"""GPT.from_pretrained against transformers: old names, shards, GPT-2 options, half
precision, other architectures, a classifier's decoder, dropout for fine-tuning."""

from __future__ import annotations

import copy
import json
import os

import pytest
import torch

from tests.models.pretrained.gpt_helpers import gpt2_fixtures

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

transformers = pytest.importorskip("transformers")

from qkv.models import GPT  # noqa: E402
from qkv.models.pretrained.hf import load_state_dict  # noqa: E402

VOCAB = 1000


folder, peer, ours = gpt2_fixtures(
    "gpt2_loading", layers=2, heads=4, dim=64, vocab=VOCAB, positions=256
)


def test_loading_old_names_and_listing_wrong_ones(folder, ours, tmp_path):
    state = load_state_dict(folder)
    old = {
        f"transformer.{k}" if not k.startswith("transformer.") else k: v for k, v in state.items()
    }
    old["transformer.h.0.attn.bias"] = torch.ones(1, 1, 256, 256).tril()  # old mask buffer
    torch.save(old, tmp_path / "pytorch_model.bin")
    (tmp_path / "config.json").write_bytes((folder / "config.json").read_bytes())
    ids = torch.randint(0, VOCAB, (1, 9))
    assert torch.equal(GPT.from_pretrained(tmp_path)(ids).logits, ours(ids).logits)

    key = next(k for k in old if k.endswith("h.1.mlp.c_fc.bias"))
    del old[key]
    old["transformer.h.2.attn.rotary"] = torch.zeros(2)
    torch.save(old, tmp_path / "pytorch_model.bin")
    with pytest.raises(ValueError) as info:
        GPT.from_pretrained(tmp_path)
    assert "layers.1.ff.linear1.bias" in str(info.value)
    assert "layers.2.attn.rotary" in str(info.value)


@pytest.mark.parametrize("safe", [True, False])
def test_sharded_checkpoints_load_the_same(peer, ours, tmp_path, safe):
    peer.save_pretrained(tmp_path, max_shard_size="50KB", safe_serialization=safe)
    index = next(tmp_path.glob("*.index.json"))
    shards = json.loads(index.read_text())["weight_map"].values()
    assert len(set(shards)) > 2
    ids = torch.randint(0, VOCAB, (2, 11))
    assert torch.equal(GPT.from_pretrained(tmp_path)(ids).logits, ours(ids).logits)
    (tmp_path / sorted(set(shards))[1]).unlink()
    with pytest.raises(FileNotFoundError, match="shard .* not found"):
        GPT.from_pretrained(tmp_path)


@pytest.mark.parametrize(
    "options",
    [
        dict(scale_attn_weights=False),
        dict(scale_attn_by_inverse_layer_idx=True),
        dict(scale_attn_by_inverse_layer_idx=True, reorder_and_upcast_attn=True),
        dict(activation_function="silu"),
        dict(activation_function="quick_gelu"),
    ],
)
def test_gpt2_options_match_transformers(folder, options, tmp_path):
    config = transformers.GPT2Config.from_pretrained(folder)
    for key, value in options.items():
        setattr(config, key, value)
    peer = transformers.GPT2LMHeadModel(config).eval()
    peer.save_pretrained(tmp_path)
    ids = torch.randint(0, VOCAB, (2, 13))
    ours = GPT.from_pretrained(tmp_path)
    with torch.no_grad():
        want, got = peer(ids).logits, ours(ids).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    # the option matters: the same weights without it give other logits
    plain = json.loads((folder / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(plain))
    assert (GPT.from_pretrained(tmp_path)(ids).logits - want).abs().max() > 1e-3


def test_half_precision_folders_and_foreign_token_ids(peer, ours, tmp_path):
    copy.deepcopy(peer).half().save_pretrained(tmp_path)
    assert GPT.from_pretrained(tmp_path).lm_head.weight.dtype == torch.float32
    half = GPT.from_pretrained(tmp_path, dtype="auto")
    assert {p.dtype for p in half.parameters()} == {torch.float16}
    ids = torch.randint(0, VOCAB, (2, 7))
    torch.testing.assert_close(half(ids).logits.float(), ours(ids).logits, atol=0.05, rtol=0)
    with pytest.raises(ValueError, match=f"token id {VOCAB + 5} is outside"):
        ours(torch.tensor([[3, VOCAB + 5]]))


def test_other_architectures_are_refused_by_name(folder, tmp_path):
    config = json.loads((folder / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "model_type": "gpt_neo"}))
    with pytest.raises(ValueError, match="model_type 'gpt_neo' is not GPT-2 format"):
        GPT.from_pretrained(tmp_path)
    del config["n_embd"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="lacks n_embd"):
        GPT.from_pretrained(tmp_path)


def test_a_classifier_checkpoint_loads_its_decoder(folder, tmp_path):
    config = transformers.GPT2Config.from_pretrained(folder)
    classifier = transformers.GPT2ForSequenceClassification(config).eval()
    classifier.save_pretrained(tmp_path)
    ids = torch.randint(0, VOCAB, (2, 11))
    with torch.no_grad():
        hidden = classifier.transformer(ids).last_hidden_state
        want = hidden @ classifier.transformer.wte.weight.T  # GPT's tied LM head
        got = GPT.from_pretrained(tmp_path)(ids).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("p", [0.1, 0.25])
def test_dropout_for_fine_tuning_is_gpt2s(folder, tmp_path, p):
    config = json.loads((folder / "config.json").read_text())
    drops = dict.fromkeys(["resid_pdrop", "embd_pdrop", "attn_pdrop"], p)
    (tmp_path / "config.json").write_text(json.dumps({**config, **drops}))
    (tmp_path / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes())
    peer = transformers.GPT2LMHeadModel.from_pretrained(tmp_path, attn_implementation="eager")
    ours = GPT.from_pretrained(tmp_path)
    assert not ours.training and ours.config.dropout == p
    # GPT-2 drops out the embeddings, attention weights and the two residual branches only
    block = peer.transformer.h[0]
    want = [
        peer.transformer.drop.p,
        block.attn.attn_dropout.p,
        block.attn.resid_dropout.p,
        block.mlp.dropout.p,
        0.0,
    ]
    layer = ours.layers[0]
    got = [
        ours.drop.p,
        layer.self_attn.dropout,
        layer.drop.p,  # the attention branch's
        layer.drop.p,  # and the feed-forward branch's
        layer.ff.dropout.p,
    ]
    assert got == want


def test_an_untied_lm_head_is_its_own_weight(folder, tmp_path):
    config = json.loads((folder / "config.json").read_text())
    config = transformers.GPT2Config(**{**config, "tie_word_embeddings": False})
    peer = transformers.GPT2LMHeadModel(config).eval()
    assert not torch.equal(peer.lm_head.weight, peer.transformer.wte.weight)
    peer.save_pretrained(tmp_path)
    ours = GPT.from_pretrained(tmp_path)
    assert ours.lm_head.weight is not ours.tok_emb.weight
    assert torch.equal(ours.lm_head.weight, peer.lm_head.weight)
    ids = torch.randint(0, VOCAB, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, peer(ids).logits, atol=1e-5, rtol=1e-5)
        assert torch.equal(
            ours.generate(ids, 6),
            peer.generate(ids, max_new_tokens=6, min_new_tokens=6, do_sample=False),
        )


def test_differing_gpt2_dropouts_use_resid_pdrop_and_say_so(folder, tmp_path, caplog):
    config = json.loads((folder / "config.json").read_text())
    drops = {"resid_pdrop": 0.2, "embd_pdrop": 0.1, "attn_pdrop": 0.3}
    (tmp_path / "config.json").write_text(json.dumps({**config, **drops}))
    (tmp_path / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes())
    with caplog.at_level("WARNING"):
        ours = GPT.from_pretrained(tmp_path)
    assert ours.config.dropout == 0.2
    assert "differ" in caplog.text and "resid_pdrop" in caplog.text
