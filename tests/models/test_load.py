"""One loader for every model (:mod:`qkv.models.load`): a GGUF file, Hugging Face folders
of each family, and checkpoints of ``qkv train`` (language model, translator), each with
its tokenizer and what kind it is, told from the config or header before any weight is
read; what it cannot read is one line."""

from __future__ import annotations

import pytest
import torch

from qkv.errors import ModelFileError
from qkv.models import GPT, Llama
from qkv.models.load import (
    CAUSAL_LM,
    ENCODER,
    TRANSLATOR,
    checkpoint_file,
    describe,
    load,
    load_trained,
)
from qkv.train.loop import train
from qkv.train.recipe import recipe_from_dict
from tests.models.pretrained.gpt_helpers import random_gpt2_folder
from tests.train.helpers import trained_translator
from tests.train.test_language import tiny_lm


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    """The run folder of a 1-layer GPT trained for 6 steps by ``qkv train``."""
    folder = tmp_path_factory.mktemp("lm")
    train(recipe_from_dict(tiny_lm(folder, sample_tokens=0)), progress=False)
    return folder / "run"


def test_a_gguf_file_is_a_llama_with_its_tokenizer_and_context(tmp_path):
    pytest.importorskip("gguf", reason="needs the gguf package: pip install 'qkv[llm]'")
    from tests.models.pretrained.test_gguf import hf_weights, write_llama_gguf

    path = tmp_path / "tiny.gguf"
    write_llama_gguf(path, hf_weights(seed=1), "F32")
    assert describe(path) == (CAUSAL_LM, "a GGUF file")
    loaded = load(path)
    assert isinstance(loaded.model, Llama) and not loaded.model.training
    assert loaded.kind == CAUSAL_LM and loaded.model_type == "gguf"
    assert loaded.context == loaded.model.config.max_len and loaded.chat_template is None
    ids = loaded.encode("to tok")
    assert ids and loaded.decode(ids).strip() == "to tok"
    text = "".join(loaded.generate("to tok", 5, eos_token_id=[]))
    assert isinstance(text, str)


def test_a_gpt2_folder_is_a_causal_lm_whose_text_and_attention_come_out(tmp_path):
    pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    folder = random_gpt2_folder(tmp_path, layers=2, heads=2, dim=16, vocab=300, positions=32)
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(["the cat sat on the mat"] * 10, trainer)
    tok.save(str(folder / "tokenizer.json"))
    assert describe(folder) == (CAUSAL_LM, "model_type 'gpt2'")
    loaded = load(folder)
    assert isinstance(loaded.model, GPT) and loaded.context == 32
    maps, labels = loaded.attention("the cat")
    assert maps.shape[:2] == (2, 2) and "".join(labels) == "the cat"
    assert torch.all(maps.triu(1) == 0)
    with pytest.raises(ValueError, match="reads one text, not a pair"):
        loaded.attention("the", "cat")


def test_a_language_model_of_qkv_train_comes_with_its_tokenizer(lm_run):
    assert checkpoint_file(lm_run) == lm_run / "best.safetensors"
    assert describe(lm_run) == (CAUSAL_LM, "a qkv gpt checkpoint")
    loaded = load(lm_run)
    assert loaded.kind == CAUSAL_LM and loaded.model_type == "gpt"
    assert loaded.tokenizer.vocab_size == loaded.model.config.vocab_size
    assert loaded.context == loaded.model.config.max_len and loaded.context_policy == "crop"
    text = "".join(loaded.generate("the ", 20, seed=1, temperature=0.8))  # past 8 positions
    assert len(text) > 0


def test_a_translator_checkpoint_comes_with_its_two_tokenizers(tmp_path):
    path = trained_translator(tmp_path)
    assert describe(path)[0] == TRANSLATOR
    loaded = load_trained(path)
    assert loaded.kind == TRANSLATOR and loaded.source_tokenizer is not None
    assert loaded.tokenizer.vocab_size >= loaded.model.config.tgt_vocab_size


def test_an_encoder_folder_is_named_from_its_config_before_its_weights(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "bert"}', encoding="utf-8")
    assert describe(tmp_path) == (ENCODER, "model_type 'bert'")


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p / "none", "no such model file or folder"),
        (lambda p: p / "none.safetensors", "no such checkpoint file"),
        (lambda p: p, "without best.safetensors or last.safetensors"),
        (lambda p: (p / "x.bin").write_bytes(b"12") and p / "x.bin", "not a model file"),
        (lambda p: (p / "x.safetensors").write_bytes(b"12") and p / "x.safetensors", "not a qkv"),
    ],
    ids=["missing", "missing-checkpoint", "empty-folder", "other-file", "other-safetensors"],
)
def test_what_it_cannot_read_is_one_line(tmp_path, make, message):
    path = make(tmp_path)
    with pytest.raises(ModelFileError, match=message) as err:
        load(path)
    assert "\n" not in str(err.value)
