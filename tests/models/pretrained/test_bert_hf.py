"""BertModel on random folders of the BERT family (RoBERTa, ELECTRA, MPNet, ...) vs
transformers; what a folder's config asks for that qkv cannot build is refused by name."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

transformers = pytest.importorskip("transformers")

from safetensors.torch import save_file  # noqa: E402

from qkv.models import BertModel, load_tokenizer, minilm_path  # noqa: E402
from qkv.models.load import load  # noqa: E402
from qkv.models.pretrained.bert import relative_buckets  # noqa: E402
from qkv.models.pretrained.bert_hf import layer_groups  # noqa: E402

VOCAB, POSITIONS = 120, 40
SPECIAL = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]  # RoBERTa's, pad id 1
SIZES = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=48,
    max_position_embeddings=POSITIONS,
    layer_norm_eps=1e-5,
)
DISTILBERT = dict(
    vocab_size=VOCAB,
    dim=32,
    n_layers=2,
    n_heads=4,
    hidden_dim=48,
    max_position_embeddings=POSITIONS,
)
FAMILIES = {  # name -> (config, bare model, model with a task head, head's encoder attribute)
    "roberta": (
        lambda: transformers.RobertaConfig(**SIZES, pad_token_id=1),
        transformers.RobertaModel,
        transformers.RobertaForSequenceClassification,
        "roberta",
    ),
    "xlm-roberta": (
        lambda: transformers.XLMRobertaConfig(**SIZES, pad_token_id=1),
        transformers.XLMRobertaModel,
        transformers.XLMRobertaForMaskedLM,
        "roberta",
    ),
    "camembert": (
        lambda: transformers.CamembertConfig(**SIZES, pad_token_id=1),
        transformers.CamembertModel,
        transformers.CamembertForMaskedLM,
        "roberta",
    ),
    "electra": (  # embeddings narrower than the encoder: a projection in between
        lambda: transformers.ElectraConfig(
            **SIZES, embedding_size=16, hidden_act="gelu_pytorch_tanh"
        ),
        transformers.ElectraModel,
        transformers.ElectraForPreTraining,
        "electra",
    ),
    "mpnet": (  # a relative-position bias in every layer
        lambda: transformers.MPNetConfig(**SIZES),
        transformers.MPNetModel,
        transformers.MPNetForMaskedLM,
        "mpnet",
    ),
    "albert": (  # narrow embeddings, and both layers share one set of weights
        lambda: transformers.AlbertConfig(**SIZES, embedding_size=16),
        transformers.AlbertModel,
        transformers.AlbertForMaskedLM,
        "albert",
    ),
    "albert-groups": (  # four layers in two groups of weights, embeddings as wide as layers
        lambda: transformers.AlbertConfig(
            **{**SIZES, "num_hidden_layers": 4}, num_hidden_groups=2, embedding_size=32
        ),
        transformers.AlbertModel,
        transformers.AlbertForPreTraining,
        "albert",
    ),
    "distilbert": (
        lambda: transformers.DistilBertConfig(**DISTILBERT),
        transformers.DistilBertModel,
        transformers.DistilBertForMaskedLM,
        "distilbert",
    ),
}


def _save(model, path):
    with torch.no_grad():  # random init is tiny; bigger weights make every layer count
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(path)
    return transformers.AutoModel.from_pretrained(path, attn_implementation="eager").eval()


def _batch(config, longest: int):
    """Right-padded random ids, one row per length in a random order."""
    pad = config.pad_token_id
    lengths = torch.randperm(longest)[:4] + 1
    lengths[0] = longest
    ids = torch.randint(3, VOCAB, (4, longest))
    ids[ids == pad] = pad + 1
    mask = torch.arange(longest)[None, :] < lengths[:, None]  # (4, T)
    return ids.masked_fill(~mask, pad), mask


def _assert_same_hidden(folder, peer, config, longest: int) -> None:
    """qkv's BertModel from ``folder`` gives ``peer``'s last hidden state on real tokens."""
    ids, mask = _batch(config, longest)
    with torch.no_grad():
        got = BertModel.from_pretrained(folder)(ids, attention_mask=mask).last_hidden_state
        want = peer(input_ids=ids, attention_mask=mask.long()).last_hidden_state
    torch.testing.assert_close(got[mask], want[mask], atol=2e-5, rtol=1e-5)


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory):
    make_config, bare, head, attribute = FAMILIES[request.param]
    folder = tmp_path_factory.mktemp(request.param)
    peer = _save(bare(make_config()), folder)
    return request.param, folder, peer, (head, attribute, make_config)


def test_outputs_and_attentions_match_transformers(family):
    name, folder, peer, _ = family
    ours = BertModel.from_pretrained(folder)
    ids, mask = _batch(peer.config, ours.config.max_length)
    with torch.no_grad():
        got = ours(ids, attention_mask=mask, need_weights=True)
        want = peer(input_ids=ids, attention_mask=mask.long(), output_attentions=True)
    real = mask[..., None].expand_as(got.last_hidden_state)
    torch.testing.assert_close(
        got.last_hidden_state[real], want.last_hidden_state[real], atol=2e-5, rtol=1e-5
    )
    assert len(got.attentions) == len(want.attentions) == peer.config.num_hidden_layers
    for a, b in zip(got.attentions, want.attentions):
        torch.testing.assert_close(a, b, atol=2e-6, rtol=1e-5)
    assert (got.pooler_output is None) == (getattr(peer, "pooler", None) is None)


def test_input_longer_than_the_positions_is_refused(family):
    _, folder, _, _ = family
    ours = BertModel.from_pretrained(folder)
    longest = ours.config.max_length
    assert longest == POSITIONS - (2 if ours.config.position_style == "roberta" else 0)
    with pytest.raises(ValueError, match=f"exceeds the {longest} positions"):
        ours(torch.full((1, longest + 1), 5))


@pytest.mark.parametrize("rows", ["per_row", "shared"])
def test_given_position_ids_match_transformers(family, rows):
    _, folder, peer, _ = family
    ours = BertModel.from_pretrained(folder)
    ids, mask = _batch(peer.config, 12)
    positions = torch.randint(0, POSITIONS, (4 if rows == "per_row" else 1, 12))
    with torch.no_grad():
        got = ours(ids, attention_mask=mask, position_ids=positions).last_hidden_state
        want = peer(input_ids=ids, attention_mask=mask.long(), position_ids=positions)
        default = ours(ids, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(got[mask], want.last_hidden_state[mask], atol=2e-5, rtol=1e-5)
    assert (got[mask] - default[mask]).abs().max() > 1e-2  # the positions were used
    beyond = positions.clone()
    beyond[0, 3] = POSITIONS
    with pytest.raises(ValueError, match=f"position id {POSITIONS} is outside 0..{POSITIONS - 1}"):
        ours(ids, position_ids=beyond)
    with pytest.raises(ValueError, match=r"position_ids must have input_ids' shape \(4, 12\)"):
        ours(ids, position_ids=positions[..., :5])


def test_checkpoint_with_a_task_head_loads_its_encoder(family, tmp_path):
    _, _, _, (head, attribute, make_config) = family
    model = head(make_config())
    model.save_pretrained(tmp_path)
    _assert_same_hidden(tmp_path, getattr(model.eval(), attribute), model.config, 9)


def test_other_architectures_are_refused_by_name(tmp_path):
    config = transformers.DebertaV2Config(**SIZES)
    transformers.DebertaV2Model(config).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="model_type 'deberta-v2' is not a BERT-family encoder"):
        BertModel.from_pretrained(tmp_path)
    config = transformers.AlbertConfig(**SIZES, embedding_size=16, inner_group_num=2)
    transformers.AlbertModel(config).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="inner_group_num=2 is not supported"):
        BertModel.from_pretrained(tmp_path)


def test_albert_layers_share_their_weights(tmp_path):
    config = transformers.AlbertConfig(
        **{**SIZES, "num_hidden_layers": 6}, num_hidden_groups=3, embedding_size=16
    )
    transformers.AlbertModel(config).save_pretrained(tmp_path)
    layers = BertModel.from_pretrained(tmp_path).encoder.layers
    assert [layers[i] is layers[i + 1] for i in range(5)] == [True, False] * 2 + [True]
    assert sum(p.numel() for p in layers.parameters()) == 3 * sum(
        p.numel() for p in layers[0].parameters()
    )


def test_roberta_tokenizer_truncates_to_the_usable_positions(tmp_path):
    for file in ("tokenizer.json", "special_tokens_map.json"):
        shutil.copy(minilm_path() / file, tmp_path / file)
    config = {"model_type": "roberta", "max_position_embeddings": 20, "pad_token_id": 1}
    (tmp_path / "config.json").write_text(json.dumps(config))
    encoding = load_tokenizer(tmp_path).encode(" ".join(["word"] * 40))
    assert len(encoding.ids) == 20 - 2


def _roberta_folder(path):
    """A RoBERTa folder with a byte-level BPE tokenizer trained here on a few sentences."""
    tokenizers = pytest.importorskip("tokenizers")
    bpe = tokenizers.ByteLevelBPETokenizer()
    text = ["Attention weighs every key for each query.", "Keys and values come in pairs."]
    bpe.train_from_iterator(text * 20, vocab_size=300, special_tokens=SPECIAL)
    tokenizer = transformers.RobertaTokenizerFast(tokenizer_object=bpe._tokenizer)
    tokenizer.add_special_tokens(dict(zip(["bos_token", "pad_token", "eos_token"], SPECIAL)))
    tokenizer.save_pretrained(path)
    config = transformers.RobertaConfig(**{**SIZES, "vocab_size": len(tokenizer)}, pad_token_id=1)
    return _save(transformers.RobertaModel(config), path), tokenizer


def test_show_maps_of_a_roberta_folder_match_transformers(tmp_path):
    peer, peer_tokenizer = _roberta_folder(tmp_path)
    text = "Each query weighs the keys, and values follow."
    maps, tokens = load(tmp_path).attention(text)
    ids = peer_tokenizer(text, return_tensors="pt")
    assert tokens == peer_tokenizer.convert_ids_to_tokens(ids["input_ids"][0])
    with torch.no_grad():
        want = torch.stack(peer(**ids, output_attentions=True).attentions)[:, 0]
    torch.testing.assert_close(maps, want, atol=2e-6, rtol=1e-5)


def test_relative_buckets_match_mpnet_beyond_the_longest_distance():
    encoder = transformers.models.mpnet.modeling_mpnet.MPNetEncoder
    t = 300  # distances past max_distance = 128 share the last bucket of each side
    pos = torch.arange(t)
    want = encoder.relative_position_bucket(pos[None, :] - pos[:, None])
    got = relative_buckets(t)
    assert torch.equal(got, want)
    assert got.unique().tolist() == [b for b in range(32) if b != 16]  # no key at distance -0


@pytest.mark.parametrize("act", ["silu", "swish", "quick_gelu", "gelu_fast"])
def test_other_activations_match_transformers(act, tmp_path):
    peer = _save(transformers.BertModel(transformers.BertConfig(**SIZES, hidden_act=act)), tmp_path)
    _assert_same_hidden(tmp_path, peer, peer.config, 12)


def test_a_causal_bert_attends_causally(tmp_path):
    config = transformers.BertConfig(**SIZES, is_decoder=True)
    peer = _save(transformers.BertModel(config), tmp_path)
    ids, mask = _batch(peer.config, 12)
    with torch.no_grad():
        got = BertModel.from_pretrained(tmp_path)(ids, attention_mask=mask, need_weights=True)
        want = peer(input_ids=ids, attention_mask=mask.long(), output_attentions=True)
    torch.testing.assert_close(
        got.last_hidden_state[mask], want.last_hidden_state[mask], atol=2e-5, rtol=1e-5
    )
    assert (got.attentions[0][..., torch.ones(12, 12).triu(1).bool()] == 0).all()
    (tmp_path / "config.json").write_text(
        json.dumps(
            {**json.loads((tmp_path / "config.json").read_text()), "add_cross_attention": True}
        )
    )
    with pytest.raises(ValueError, match="add_cross_attention"):
        BertModel.from_pretrained(tmp_path)


@pytest.mark.parametrize("saved", [torch.float16, torch.bfloat16])
def test_dtype_of_the_loaded_model(saved, tmp_path):
    peer = _save(transformers.BertModel(transformers.BertConfig(**SIZES)).to(saved), tmp_path)
    assert BertModel.from_pretrained(tmp_path).embeddings.word.weight.dtype == torch.float32
    auto = BertModel.from_pretrained(tmp_path, dtype="auto")
    assert {p.dtype for p in auto.parameters()} == {saved}
    ids, mask = _batch(peer.config, 9)
    with torch.no_grad():
        want = peer.float()(input_ids=ids, attention_mask=mask.long()).last_hidden_state
        got = BertModel.from_pretrained(tmp_path, dtype=torch.float64)(ids, attention_mask=mask)
    assert got.last_hidden_state.dtype == torch.float64
    torch.testing.assert_close(got.last_hidden_state[mask].float(), want[mask], atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match="dtype must be"):
        BertModel.from_pretrained(tmp_path, dtype=torch.int8)
    with pytest.raises(ValueError, match="unknown BertConfig field.*torch_dtype"):
        BertModel.from_pretrained(tmp_path, torch_dtype=torch.float16)


def test_sizes_that_do_not_fit_and_foreign_token_ids_are_named(tmp_path):
    _save(transformers.BertModel(transformers.BertConfig(**SIZES)), tmp_path)
    ours = BertModel.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match=f"token id {VOCAB} is outside .* \\(0..{VOCAB - 1}\\)"):
        ours(torch.tensor([[1, VOCAB, 2]]))
    with pytest.raises(ValueError, match=r"attention_mask must have input_ids' shape \(1, 3\)"):
        ours(torch.tensor([[1, 2, 3]]), attention_mask=torch.ones(1, 2))
    with pytest.raises(ValueError, match="token type id 2 is outside 0..1"):
        ours(torch.tensor([[1, 2, 3]]), token_type_ids=torch.tensor([[0, 1, 2]]))
    config = json.loads((tmp_path / "config.json").read_text())
    del config["intermediate_size"]  # back to BERT's default of 3072
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        ValueError,
        match=r"intermediate_size 3072 does not match .* is \(48, 32\) there, \(3072, 32\)",
    ):
        BertModel.from_pretrained(tmp_path)


def test_albert_layer_groups_are_consecutive_and_checked():
    assert layer_groups(4, 2) == [0, 0, 1, 1]  # ALBERT: consecutive layers share weights
    with pytest.raises(ValueError, match=r"^num_hidden_groups must be in 1\.\.4, got 5$"):
        layer_groups(4, 5)


def test_relative_position_embeddings_are_refused_by_name(tmp_path):
    config = {
        "model_type": "bert",
        "vocab_size": 50,
        "hidden_size": 8,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "intermediate_size": 16,
        "position_embedding_type": "relative_key",
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    save_file({"unused": torch.zeros(1)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"position_embedding_type 'relative_key' is not suppo"):
        BertModel.from_pretrained(tmp_path)
