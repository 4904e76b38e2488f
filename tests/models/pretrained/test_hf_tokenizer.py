"""load_tokenizer and sentence_options on all-MiniLM-L6-v2 against transformers.

load_tokenizer honours tokenizer_config.json's text options as transformers' AutoTokenizer.

transformers 5 rebuilds the normaliser of BERT-family tokenizer classes (``BertTokenizer``,
``DistilBertTokenizer``, ``MPNetTokenizer``, ...) from ``do_lower_case``, ``strip_accents``
and ``tokenize_chinese_chars`` (with the class's defaults), whatever ``tokenizer.json``
says; a generic class (``PreTrainedTokenizerFast``) keeps ``tokenizer.json`` as it is.
"""

from __future__ import annotations

import json
import os
import random
import shutil

import pytest
import torch

from tests.models.pretrained.minilm_helpers import SENTENCES, minilm_fixtures, repooled

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from qkv.models import load_tokenizer, minilm_path, sentence_options  # noqa: E402

folder, ours, peer, batch = minilm_fixtures()

WORDS = [
    "Héllo",
    "World",
    "CAFÉ",
    "naïve",
    "École",
    "Ångström",
    "façade",
    "résumé",
    "Zürich",
    "注意力",
    "机器翻译",
    "is",
    "all",
    "you",
    "NEED",
    "Straße",
    "ÑANDÚ",
    "the",
    "Cat",
]

# name -> (changes to tokenizer_config.json (None: remove the key), to tokenizer.json's normalizer)
CASES = {
    "unchanged": ({}, {}),
    "cased_no_strip": ({"do_lower_case": False, "strip_accents": False}, {}),
    "cased_strip_follows_case": ({"do_lower_case": False, "strip_accents": None}, {}),
    "lower_keep_accents": ({"do_lower_case": True, "strip_accents": False}, {}),
    "cased_but_strip": ({"do_lower_case": False, "strip_accents": True}, {}),
    "no_chinese_split": ({"tokenize_chinese_chars": False}, {}),
    # keys absent: the class's defaults (lower-case), not the file's cased normaliser
    "defaults_over_the_file": (
        {"do_lower_case": None, "strip_accents": None, "tokenize_chinese_chars": None},
        {"lowercase": False, "strip_accents": False, "handle_chinese_chars": False},
    ),
    # no tokenizer_class: config.json's model_type "bert" picks BertTokenizer
    "class_from_model_type": ({"tokenizer_class": None, "do_lower_case": False}, {}),
    "distilbert_class": (
        {"tokenizer_class": "DistilBertTokenizerFast", "do_lower_case": False},
        {},
    ),
    # a generic class reads tokenizer.json as it is: the options are ignored
    "generic_class_keeps_the_file": (
        {"tokenizer_class": "PreTrainedTokenizerFast", "do_lower_case": False},
        {"lowercase": True},
    ),
}


def _texts() -> list[str]:
    texts = [" ".join(random.choices(WORDS, k=random.randint(1, 8))) for _ in range(12)]
    return ["Héllo World", *texts]


@pytest.mark.parametrize("case", sorted(CASES))
def test_text_options_of_the_tokenizer_config_match_auto_tokenizer(tmp_path, case):
    source = minilm_path()
    for name in ("tokenizer.json", "vocab.txt", "config.json", "special_tokens_map.json"):
        shutil.copy(source / name, tmp_path / name)
    config_changes, normalizer_changes = CASES[case]
    config = json.loads((source / "tokenizer_config.json").read_text())
    for key, value in config_changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    file = json.loads((source / "tokenizer.json").read_text())
    file["normalizer"].update(normalizer_changes)
    (tmp_path / "tokenizer.json").write_text(json.dumps(file))

    texts = _texts()
    want = transformers.AutoTokenizer.from_pretrained(tmp_path)(texts, padding=True)
    ours = load_tokenizer(tmp_path)
    got = ours.encode_batch(texts)
    assert [e.ids for e in got] == want["input_ids"]
    assert [e.attention_mask for e in got] == want["attention_mask"]
    if case == "cased_no_strip":  # the example of the report: unknown words, not "hello world"
        assert ours.encode(texts[0]).ids == [101, 100, 100, 102]


# ---- the checkpoint's own tokenizer files ---------------------------------------------


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


def test_unsupported_sentence_pooling_is_named(folder, tmp_path):
    repooled(folder, tmp_path, pooling_mode_lasttoken=True)
    with pytest.raises(ValueError, match="pooling_mode_mean_tokens, pooling_mode_lasttoken"):
        sentence_options(tmp_path)
    repooled(folder, tmp_path, pooling_mode_lasttoken=False)
    modules = json.loads((tmp_path / "modules.json").read_text())
    dense = {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}
    (tmp_path / "modules.json").write_text(json.dumps([*modules[:2], dense, modules[2]]))
    with pytest.raises(ValueError, match="modules.json: module Dense is not supported"):
        sentence_options(tmp_path)  # its projection would change every embedding
    (tmp_path / "modules.json").unlink()  # a plain model: mean pooling, not normalised
    assert sentence_options(tmp_path) == {"pooling": "mean", "normalize": False}
