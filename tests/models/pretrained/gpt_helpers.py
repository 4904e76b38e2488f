"""Helpers shared by the GPT tests: a GPT-2 folder that transformers writes from a small
random config (nothing is downloaded)."""

from __future__ import annotations

from pathlib import Path

import pytest

from qkv.models import GPT


def random_gpt2_folder(
    path: Path,
    *,
    layers: int,
    heads: int,
    dim: int,
    vocab: int,
    positions: int,
    init: float = 0.1,
) -> Path:
    """``save_pretrained`` of a random ``GPT2LMHeadModel`` into ``path``, with no end or
    start token; ``init``: the weights' standard deviation (GPT-2's is 0.02; larger makes
    the next token depend more on the context)."""
    import transformers

    config = transformers.GPT2Config(
        n_layer=layers,
        n_head=heads,
        n_embd=dim,
        vocab_size=vocab,
        n_positions=positions,
        initializer_range=init,
        bos_token_id=None,
        eos_token_id=None,
    )
    transformers.GPT2LMHeadModel(config).save_pretrained(path)
    return path


def gpt2_fixtures(name: str, **sizes):
    """The module fixtures ``folder`` (a random GPT-2 folder of ``sizes``, see
    :func:`random_gpt2_folder`), ``peer`` (transformers' eager model of it) and ``ours``
    (qkv's GPT of it): ``folder, peer, ours = gpt2_fixtures("gpt2", layers=...)``."""

    @pytest.fixture(scope="module")
    def folder(tmp_path_factory):
        return random_gpt2_folder(tmp_path_factory.mktemp(name), **sizes)

    @pytest.fixture(scope="module")
    def peer(folder):
        import transformers

        model = transformers.GPT2LMHeadModel.from_pretrained(folder, attn_implementation="eager")
        return model.eval()

    @pytest.fixture(scope="module")
    def ours(folder):
        return GPT.from_pretrained(folder)

    return folder, peer, ours
