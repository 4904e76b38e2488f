"""Bad configs and inputs of the pretrained-model classes: one line that names what is wrong."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from qkv.models import GPT, BertModel, GPTConfig
from qkv.models.pretrained.bert import BertConfig
from qkv.models.pretrained.bert_hf import layer_groups

GPT_SIZES = dict(vocab_size=50, max_len=8, num_layers=1, num_heads=2, dim=8)
BERT_SIZES = dict(
    vocab_size=50, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16
)


def _gpt() -> GPT:
    return GPT(GPTConfig(**GPT_SIZES)).eval()


def _prompt(t: int = 4) -> torch.Tensor:
    return torch.randint(0, 50, (1, t))


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda m: m(_prompt(9)), r"^sequence length 9 exceeds max_len 8$"),
        (lambda m: m.generate(_prompt(), 6), r"^prompt length 4 \+ max_new_tokens 6 = 10 exceeds"),
        (lambda m: m.generate(_prompt(), -1), r"^max_new_tokens must be >= 0, got -1$"),
        (lambda m: m.generate(_prompt(), -1, num_beams=2), r"^max_new_tokens must be >= 0"),
        (
            lambda m: m.generate(_prompt(), 2, num_beams=2, early_stopping="yes"),
            r"^early_stopping must be True, False or 'never', got 'yes'$",
        ),
    ],
    ids=[
        "forward-past-max-len",
        "generate-past-max-len",
        "greedy-negative",
        "beam-negative",
        "early-stopping",
    ],
)
def test_gpt_calls_that_cannot_run_say_why(call, message):
    with pytest.raises(ValueError, match=message) as err:
        call(_gpt())
    assert "\n" not in str(err.value)


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


def test_other_bad_model_arguments_say_why():
    with pytest.raises(ValueError, match=r"^dropout must be in \[0, 1\), got 1.0$"):
        GPTConfig(**GPT_SIZES, dropout=1.0)
    bert = BertModel(BertConfig(**BERT_SIZES)).eval()
    with pytest.raises(ValueError, match=r"^input_ids must be \(B, T\), got \(5,\)$"):
        bert(torch.zeros(5, dtype=torch.long))
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
