"""BertModel on the all-MiniLM-L6-v2 checkpoint against transformers and sentence-transformers."""

from __future__ import annotations

import copy
import json
import os
import random
import shutil

import pytest
import torch

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from qkv.models import BertModel, encode, load_tokenizer, minilm_path, sentence_options  # noqa: E402
from qkv.models.pretrained.hf import load_state_dict  # noqa: E402

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

POOLS = {"cls": "cls_token", "max": "max_tokens"}  # sentence-transformers' config names


@pytest.fixture(scope="module")
def folder():
    return minilm_path()


@pytest.fixture(scope="module")
def ours(folder):
    return BertModel.from_pretrained(folder)


@pytest.fixture(scope="module")
def peer(folder):
    return transformers.BertModel.from_pretrained(folder, attn_implementation="eager").eval()


@pytest.fixture(scope="module")
def batch(folder):
    texts = random.sample(SENTENCES, len(SENTENCES))  # a fresh order every run
    encodings = load_tokenizer(folder).encode_batch(texts)
    ids = torch.tensor([e.ids for e in encodings])
    mask = torch.tensor([e.attention_mask for e in encodings])
    types = torch.tensor([e.type_ids for e in encodings])
    return texts, ids, mask, types


@pytest.mark.parametrize("lower", [True, False])
def test_a_folder_with_only_vocab_txt_tokenizes_as_bert_tokenizer(folder, tmp_path, lower):
    for name in ("vocab.txt", "config.json"):
        shutil.copy(folder / name, tmp_path / name)
    config = {"do_lower_case": lower, "model_max_length": 64, "tokenize_chinese_chars": True}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    ours = load_tokenizer(tmp_path)
    peer = transformers.BertTokenizer(str(tmp_path / "vocab.txt"), do_lower_case=lower)
    texts = [*random.sample(SENTENCES, len(SENTENCES)), "Café naïve ÉCOLE", "注意力 is all"]
    texts += ["a [MASK] b", "[CLS] x [SEP][PAD] y [UNK]"]  # special tokens stay whole
    pairs = list(zip(texts, reversed(texts)))
    want = peer(texts, padding=True, truncation=True, max_length=64)
    got = ours.encode_batch(texts)
    assert [e.ids for e in got] == want["input_ids"]
    assert [e.attention_mask for e in got] == want["attention_mask"]
    want = peer(*zip(*pairs), padding=True, truncation=True, max_length=64)
    got = ours.encode_batch(pairs)
    assert [e.ids for e in got] == want["input_ids"]
    assert [e.type_ids for e in got] == want["token_type_ids"]


def test_tokenization_matches_the_checkpoint(folder, batch):
    texts, ids, mask, types = batch
    ref = transformers.AutoTokenizer.from_pretrained(folder)(
        texts, padding=True, truncation=True, max_length=256, return_tensors="pt"
    )
    assert torch.equal(ids, ref["input_ids"])
    assert torch.equal(mask, ref["attention_mask"])
    assert torch.equal(types, ref["token_type_ids"])
    lengths = mask.sum(1).tolist()
    assert max(lengths) > 100 and min(lengths) == 2  # the long text and the empty string
    assert lengths[texts.index("")] == 2


@pytest.mark.parametrize("files", ["tokenizer.json", "vocab.txt"])
def test_padding_and_truncation_sides_of_the_tokenizer_config(folder, tmp_path, files):
    shutil.copy(folder / files, tmp_path / files)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.update(padding_side="left", truncation_side="left", model_max_length=9)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    texts = random.sample(SENTENCES, len(SENTENCES))
    got = load_tokenizer(tmp_path).encode_batch(texts)
    want = transformers.AutoTokenizer.from_pretrained(tmp_path)(
        texts, padding=True, truncation=True
    )
    assert [e.ids for e in got] == want["input_ids"]
    assert [e.attention_mask for e in got] == want["attention_mask"]
    assert got[texts.index("Why?")].attention_mask[0] == 0  # padded on the left
    config["padding_side"] = "up"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="padding_side must be 'left' or 'right', got 'up'"):
        load_tokenizer(tmp_path)


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


@pytest.mark.parametrize("pooling", ["mean", "cls", "max"])
def test_sentence_embeddings_match_sentence_transformers(folder, ours, pooling, tmp_path):
    st = pytest.importorskip("sentence_transformers")
    if pooling != "mean":  # the same encoder with another pooling and no Normalize module
        folder = _repooled(
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


def test_unsupported_sentence_pooling_is_named(folder, tmp_path):
    _repooled(folder, tmp_path, pooling_mode_lasttoken=True)
    with pytest.raises(ValueError, match="pooling_mode_mean_tokens, pooling_mode_lasttoken"):
        sentence_options(tmp_path)
    _repooled(folder, tmp_path, pooling_mode_lasttoken=False)
    modules = json.loads((tmp_path / "modules.json").read_text())
    dense = {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}
    (tmp_path / "modules.json").write_text(json.dumps([*modules[:2], dense, modules[2]]))
    with pytest.raises(ValueError, match="modules.json: module Dense is not supported"):
        sentence_options(tmp_path)  # its projection would change every embedding
    (tmp_path / "modules.json").unlink()  # a plain model: mean pooling, not normalised
    assert sentence_options(tmp_path) == {"pooling": "mean", "normalize": False}


def _repooled(folder, tmp_path, **modes):
    """A copy of ``folder`` in ``tmp_path`` with ``modes`` changed in its Pooling config."""
    shutil.copytree(folder, tmp_path, dirs_exist_ok=True)
    file = tmp_path / "1_Pooling" / "config.json"
    file.write_text(json.dumps({**json.loads(file.read_text()), **modes}))
    return tmp_path


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
    with pytest.raises(FileNotFoundError, match="no weights"):
        BertModel.from_pretrained(tmp_path / "..")


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
