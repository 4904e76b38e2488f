"""Broken Hugging Face folders: each is refused in one line that names what and where."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

from tests.models.pretrained.folder_helpers import copy_folder, random_bert_folder, refused
from tests.models.pretrained.gpt_helpers import random_gpt2_folder

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

from qkv.models import GPT, BertModel, GPTConfig  # noqa: E402
from qkv.models.pretrained.hf import load_state_dict  # noqa: E402

VOCAB = 90


@pytest.fixture(scope="module")
def bert_folder(tmp_path_factory):
    return random_bert_folder(tmp_path_factory.mktemp("bert"), VOCAB)


@pytest.fixture(scope="module")
def gpt_folder(tmp_path_factory):
    return random_gpt2_folder(
        tmp_path_factory.mktemp("gpt2"),
        layers=2,
        heads=2,
        dim=16,
        vocab=VOCAB,
        positions=32,
        init=0.02,
    )


@pytest.mark.parametrize(
    "key, value, expected",
    [
        ("num_attention_heads", 0, "an integer >= 1"),  # was a ZeroDivisionError
        ("num_attention_heads", "2", "an integer >= 1"),  # a TypeError
        ("hidden_size", 16.0, "an integer >= 1"),  # a TypeError deep in torch
        ("num_hidden_layers", None, "an integer >= 1"),
        ("is_decoder", "yes", "true or false"),  # loaded, and attended causally
        ("layer_norm_eps", "1e-12", "a number > 0"),  # loaded, failed when run
        ("hidden_act", ["gelu"], "a string"),  # unhashable list
        ("pad_token_id", VOCAB, "outside the vocabulary"),  # torch's AssertionError
    ],
    ids=lambda x: str(x)[:12],
)
def test_mistyped_bert_config_values_are_named(bert_folder, tmp_path, key, value, expected):
    folder = copy_folder(bert_folder, tmp_path / "m", **{key: value})
    refused(BertModel.from_pretrained, folder, str(folder / "config.json"), key, expected)


@pytest.mark.parametrize(
    "key, value, expected",
    [
        ("n_head", "2", "an integer >= 1"),  # a TypeError
        ("n_embd", 16.0, "an integer >= 1"),
        ("n_inner", "64", "an integer >= 1 or null"),
        ("layer_norm_epsilon", None, "a number > 0"),  # loaded, failed when run
        ("scale_attn_weights", "no", "true or false"),  # loaded, and scaled the scores
        ("tie_word_embeddings", None, "true or false"),
    ],
    ids=lambda x: str(x)[:12],
)
def test_mistyped_gpt2_config_values_are_named(gpt_folder, tmp_path, key, value, expected):
    folder = copy_folder(gpt_folder, tmp_path / "m", **{key: value})
    refused(GPT.from_pretrained, folder, str(folder / "config.json"), key, expected)


def test_bad_gpt_config_fields_are_named():
    with pytest.raises(ValueError, match="GPTConfig.num_heads must be an integer >= 1, got '4'"):
        GPTConfig(num_heads="4")
    with pytest.raises(ValueError, match="GPTConfig.tie_embeddings must be true or false"):
        GPTConfig(tie_embeddings=1)


def test_pickled_code_in_pytorch_model_bin_is_never_run(bert_folder, tmp_path):
    class Payload:
        def __reduce__(self):
            return (os.mkdir, (str(tmp_path / "ran"),))

    folder = tmp_path / "m"
    folder.mkdir()
    shutil.copy(bert_folder / "config.json", folder)
    torch.save({"embeddings.word_embeddings.weight": Payload()}, folder / "pytorch_model.bin")
    refused(BertModel.from_pretrained, folder, "pytorch_model.bin", "not a weights-only")
    assert not (tmp_path / "ran").exists()


def test_integer_weights_arerefused(bert_folder, tmp_path):
    folder = copy_folder(bert_folder, tmp_path / "m")
    state = load_state_dict(folder)
    name = "encoder.layer.1.attention.self.query.weight"
    state[name] = torch.randint(-3, 4, state[name].shape, dtype=torch.int8)  # quantized
    safetensors_torch.save_file(state, folder / "model.safetensors")
    refused(BertModel.from_pretrained, folder, "layers.1.self_attn.q_proj.weight", "torch.int8")


def _sharded(gpt_folder, to):
    model = transformers.GPT2LMHeadModel.from_pretrained(gpt_folder)
    model.save_pretrained(to, max_shard_size="4KB")
    index = to / "model.safetensors.index.json"
    content = json.loads(index.read_text())
    assert len(set(content["weight_map"].values())) > 2
    return index, content


def test_sharded_folder_loads_the_same(gpt_folder, tmp_path):
    _sharded(gpt_folder, tmp_path)
    ids = torch.randint(0, VOCAB, (2, 9))
    whole, sharded = GPT.from_pretrained(gpt_folder), GPT.from_pretrained(tmp_path)
    assert torch.equal(sharded(ids).logits, whole(ids).logits)


def test_broken_shard_indexes_are_named(gpt_folder, tmp_path):
    index, content = _sharded(gpt_folder, tmp_path)
    index.write_text("[]")  # was an AttributeError
    refused(GPT.from_pretrained, tmp_path, str(index), "no weight_map")
    weight_map = content["weight_map"]
    first = sorted(weight_map)[0]
    index.write_text(json.dumps({"weight_map": {**weight_map, first: 5}}))  # a TypeError
    refused(GPT.from_pretrained, tmp_path, str(index), f"the shard of '{first}' is 5")
    shards = sorted(set(weight_map.values()))
    moved = next(n for n, s in weight_map.items() if s == shards[0])
    index.write_text(json.dumps({"weight_map": {**weight_map, moved: shards[1]}}))  # loaded
    refused(GPT.from_pretrained, tmp_path, str(index), moved, "not where the index says")


def test_wrong_weight_names_are_one_line_with_the_first_few(bert_folder, tmp_path):
    folder = copy_folder(bert_folder, tmp_path / "m")
    state = load_state_dict(folder)
    for name in [n for n in state if ".attention." in n]:  # 10 weights in each of 2 layers
        state[name.replace(".attention.", ".attn.")] = state.pop(name)
    safetensors_torch.save_file(state, folder / "model.safetensors")
    message = refused(BertModel.from_pretrained, folder, "missing (20): ", "unexpected (20): ")
    assert "(12 more); unexpected" in message and message.endswith("(12 more)")


TRIMMED = {  # family -> (its config with transformers' defaults for the keys then dropped)
    "roberta": lambda s: transformers.RobertaConfig(
        **s, hidden_size=16, num_attention_heads=2, intermediate_size=24, pad_token_id=1
    ),
    "electra": lambda s: transformers.ElectraConfig(
        **s, hidden_size=256, num_attention_heads=4, intermediate_size=1024, embedding_size=128
    ),
    "albert": lambda s: transformers.AlbertConfig(
        **s,
        hidden_size=64,
        num_attention_heads=4,
        intermediate_size=96,
        embedding_size=128,
        hidden_act="gelu_new",
        num_hidden_groups=1,
    ),
    "distilbert": lambda s: transformers.DistilBertConfig(
        vocab_size=VOCAB, dim=16, n_heads=2, hidden_dim=24, n_layers=6
    ),
}
DROPPED = {
    "roberta": ["pad_token_id"],  # 0, not 1: the positions were numbered wrongly
    "electra": ["hidden_size", "num_attention_heads", "intermediate_size", "embedding_size"],
    "albert": ["hidden_act", "embedding_size", "num_hidden_groups"],  # gelu, not gelu_new
    "distilbert": ["n_layers"],
}


@pytest.mark.parametrize("family", sorted(TRIMMED))
def test_keys_a_config_omits_take_the_familys_defaults(family, tmp_path):
    sizes = dict(num_hidden_layers=1, max_position_embeddings=32)
    model = transformers.AutoModel.from_config(TRIMMED[family]({"vocab_size": VOCAB, **sizes}))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    for key in DROPPED[family]:
        del config[key]
    (tmp_path / "config.json").write_text(json.dumps(config))
    peer = transformers.AutoModel.from_pretrained(tmp_path, attn_implementation="eager").eval()
    ids = torch.randint(3, min(VOCAB, model.config.vocab_size), (3, 10))
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[1, 6:] = False
    ids = ids.masked_fill(~mask, model.config.pad_token_id)
    with torch.no_grad():
        want = peer(input_ids=ids, attention_mask=mask.long()).last_hidden_state
        got = BertModel.from_pretrained(tmp_path)(ids, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(got[mask], want[mask], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("key", ["dtype", "torch_dtype"])
@pytest.mark.parametrize("kind", ["bert", "gpt"])
def test_auto_dtype_is_the_one_config_json_names(bert_folder, gpt_folder, tmp_path, key, kind):
    saved = bert_folder if kind == "bert" else gpt_folder
    folder = copy_folder(saved, tmp_path / "f", **{key: "bfloat16"})
    config = json.loads((folder / "config.json").read_text())
    config.pop("dtype" if key == "torch_dtype" else "torch_dtype", None)  # transformers 4's name
    (folder / "config.json").write_text(json.dumps(config))
    assert {t.dtype for t in load_state_dict(folder).values()} == {torch.float32}
    peer = transformers.AutoModel.from_pretrained(folder, dtype="auto")
    ours = (BertModel if kind == "bert" else GPT).from_pretrained(folder, dtype="auto")
    assert peer.dtype == torch.bfloat16  # transformers' rule: config.json first
    assert {p.dtype for p in ours.parameters()} == {torch.bfloat16}


def test_dtype_may_be_named_as_in_transformers(gpt_folder):
    assert GPT.from_pretrained(gpt_folder, dtype="bfloat16").lm_head.weight.dtype == torch.bfloat16
    assert GPT.from_pretrained(gpt_folder, dtype="float16").lm_head.weight.dtype == torch.float16
    for bad in ("int8", "bfloat", "Tensor"):
        with pytest.raises(ValueError, match=f"dtype must be .* got '{bad}'"):
            GPT.from_pretrained(gpt_folder, dtype=bad)


def test_weights_under_other_names_are_named(gpt_folder, tmp_path):
    folder = copy_folder(gpt_folder, tmp_path / "f")
    (folder / "model.safetensors").rename(folder / "gpt2-small.safetensors")
    (folder / "tf_model.h5").write_bytes(b"HDF")
    with pytest.raises(FileNotFoundError) as info:
        GPT.from_pretrained(folder)
    message = str(info.value)
    assert f"no weights in {folder}" in message and "\n" not in message
    assert "found gpt2-small.safetensors, tf_model.h5, which qkv does not read" in message


def test_a_training_checkpoint_is_not_taken_for_weights(gpt_folder, tmp_path):
    folder = copy_folder(gpt_folder, tmp_path / "f")
    (folder / "model.safetensors").unlink()
    torch.save({"model": load_state_dict(gpt_folder), "step": 3}, folder / "pytorch_model.bin")
    refused(GPT.from_pretrained, folder, "pytorch_model.bin: 'model' holds a dict, not a tensor")
