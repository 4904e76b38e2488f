"""Recipes that cannot train are refused when the config is read, in one line."""

from __future__ import annotations

import json

import pytest
from train_helpers import tiny_dict

from qkv.cli import main
from qkv.recipe import ConfigError, recipe_from_dict


def test_share_vocab_without_a_joint_tokenizer_is_refused_by_name(tmp_path, capsys):
    """It was a ValueError traceback (exit 1) from the model's config, once the two
    tokenizers were built (their vocabulary sizes differ)."""
    d = tiny_dict(tmp_path / "out")
    d["model"]["share_vocab"] = True
    with pytest.raises(ConfigError, match=r"^model.share_vocab: .*set tokenizer.joint: true$"):
        recipe_from_dict(d)
    config = tmp_path / "c.yaml"
    config.write_text(json.dumps(d))
    assert main(["train", str(config)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"qkv train: error: {config}: model.share_vocab")
    d["tokenizer"]["joint"] = True
    assert recipe_from_dict(d).model["share_vocab"] is True
