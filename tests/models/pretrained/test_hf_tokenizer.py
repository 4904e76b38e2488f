"""load_tokenizer honours tokenizer_config.json's text options as transformers' AutoTokenizer.

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

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from qkv.models import load_tokenizer, minilm_path  # noqa: E402

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
