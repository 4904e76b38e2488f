"""GPT.generate takes a loaded folder's end and pad tokens by default, as transformers does.

One small random GPT-2 is saved without special tokens; copies of its weights get the
``config.json`` / ``generation_config.json`` of each case. The end token is one that the
model really emits (read from transformers' own output), so the stop is exercised.
"""

from __future__ import annotations

import json
import logging
import shutil

import pytest
import torch

from tests.models.pretrained.gpt_helpers import random_gpt2_folder

transformers = pytest.importorskip("transformers")

import qkv.models  # noqa: E402
from qkv.models import GPT  # noqa: E402
from qkv.models.pretrained.gen_defaults import GenerationDefaults  # noqa: E402

VOCAB, T, N = 1000, 17, 40


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    torch.manual_seed(0)
    return random_gpt2_folder(
        tmp_path_factory.mktemp("plain"), layers=3, heads=4, dim=64, vocab=VOCAB, positions=128
    )


@pytest.fixture(scope="module")
def prompts():
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (4, T), generator=gen)
    mask = torch.ones_like(ids)
    for row, n_pad in enumerate([0, 5, 9, 2]):
        mask[row, :n_pad] = 0  # left padding
    return ids, mask


@pytest.fixture(scope="module")
def plain(base, prompts):
    """transformers' greedy continuation of the prompts, without any end token: (4, N)."""
    ids, mask = prompts
    peer = _peer(base)
    assert peer.generation_config.eos_token_id is None
    with torch.no_grad():
        out = peer.generate(
            ids, attention_mask=mask, max_new_tokens=N, do_sample=False, pad_token_id=0
        )
    assert out.shape == (4, T + N)
    return out[:, T:]


def _peer(path):
    return transformers.GPT2LMHeadModel.from_pretrained(path, attn_implementation="eager").eval()


def _folder(base, path, config=None, generation=None):
    """``base``'s weights; ``config.json`` updated with ``config``; ``generation_config.json``
    holding ``generation`` (``None``: no such file)."""
    path.mkdir(parents=True, exist_ok=True)
    shutil.copy(base / "model.safetensors", path / "model.safetensors")
    raw = json.loads((base / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**raw, **(config or {})}))
    if generation is not None:
        (path / "generation_config.json").write_text(json.dumps(generation))
    return path


def _hf(peer, ids, mask=None, new=N, **options):
    """transformers' generate with no end or pad argument: the folder's defaults."""
    mask = torch.ones_like(ids) if mask is None else mask
    with torch.no_grad():
        return peer.generate(
            ids, attention_mask=mask, max_new_tokens=new, do_sample=False, **options
        )


def _ends_at(row, end):
    """The position of ``end`` in a row of new tokens, after which all is ``end``."""
    first = int((row == end).nonzero()[0])
    assert (row[first:] == end).all()
    return first


@pytest.mark.parametrize("where", ["config.json", "generation_config.json"])
def test_greedy_stops_at_the_folders_end_token_as_transformers(
    base, prompts, plain, where, tmp_path
):
    ids, mask = prompts
    end = int(plain[0, 3])  # a token that row 0 emits by step 3
    entry = {"eos_token_id": end}
    path = _folder(
        base,
        tmp_path,
        config=entry if where == "config.json" else None,
        generation=entry if where != "config.json" else None,
    )
    ours, peer = GPT.from_pretrained(path), _peer(path)
    assert ours.generation_defaults.eos_token_id == (end,)
    assert ours.generation_defaults.source.endswith(where)
    ref = _hf(peer, ids, mask)
    out = ours.generate(ids, N, attention_mask=mask)
    assert torch.equal(out, ref), (out.shape, ref.shape)
    first = _ends_at(out[0, T:], end)  # row 0 ended, and then padded with the end token
    assert first <= 3 and torch.equal(out[0, T : T + first + 1], plain[0, : first + 1])
    # one prompt: decoding stops at the end token, where it did not before
    alone = ours.generate(ids[:1], N)
    assert alone.shape == (1, T + first + 1) and alone[0, -1] == end
    assert torch.equal(alone, _hf(peer, ids[:1]))
    # an empty list: no end token, the full length, the continuation of the plain weights
    full = ours.generate(ids, N, attention_mask=mask, eos_token_id=[])
    assert full.shape == (4, T + N) and torch.equal(full[:, T:], plain)
    # explicit arguments still win over the folder's
    other = dict(eos_token_id=int(plain[2, 5]), pad_token_id=7)
    assert torch.equal(
        ours.generate(ids, N, attention_mask=mask, **other), _hf(peer, ids, mask, **other)
    )


def test_beam_search_takes_the_same_defaults(base, prompts, plain, tmp_path):
    ids, mask = prompts
    end = int(plain[1, 1])
    path = _folder(base, tmp_path, generation={"eos_token_id": [end, int(plain[2, 5])]})
    ours, peer = GPT.from_pretrained(path), _peer(path)
    for beams, options in [(3, {}), (4, dict(num_return_sequences=2, length_penalty=0.5))]:
        ref = _hf(peer, ids, mask, new=16, num_beams=beams, **options)
        out = ours.generate(ids, 16, attention_mask=mask, num_beams=beams, **options)
        assert out.shape == ref.shape and torch.equal(out, ref)
        endless = ours.generate(
            ids, 16, attention_mask=mask, num_beams=beams, eos_token_id=[], **options
        )
        assert endless.shape[1] == T + 16 and not torch.equal(endless[:, : out.shape[1]], out)


def test_generation_config_wins_over_config_json(base, prompts, plain, tmp_path):
    ids, mask = prompts
    in_config, in_generation = int(plain[0, 3]), int(plain[2, 5])
    assert in_config != in_generation
    path = _folder(
        base,
        tmp_path / "both",
        config={"eos_token_id": in_config},
        generation={"eos_token_id": in_generation, "pad_token_id": 5},
    )
    ours, peer = GPT.from_pretrained(path), _peer(path)
    assert ours.generation_defaults == GenerationDefaults(
        (in_generation,), 5, str(path / "generation_config.json")
    )
    out = ours.generate(ids, N, attention_mask=mask)
    assert torch.equal(out, _hf(peer, ids, mask))
    row = out[2, T:]  # row 2 ends at its end token, then continues with the folder's pad
    first = int((row == in_generation).nonzero()[0])
    assert first <= 5 and (row[first + 1 :] == 5).all() and len(row) > first + 1
    from_config = ours.generate(ids, N, attention_mask=mask, eos_token_id=in_config)
    assert not torch.equal(out, from_config)  # config.json's end token was not taken
    # a generation_config.json without eos_token_id: none, though config.json has one
    path = _folder(
        base,
        tmp_path / "pad-only",
        config={"eos_token_id": in_config},
        generation={"pad_token_id": 5},
    )
    ours, peer = GPT.from_pretrained(path), _peer(path)
    assert ours.generation_defaults.eos_token_id == ()
    out = ours.generate(ids, N, attention_mask=mask)
    assert out.shape == (4, T + N) and torch.equal(out, _hf(peer, ids, mask, pad_token_id=5))
    assert torch.equal(out[:, T:], plain)


def test_a_gpt_built_from_its_config_has_no_default_end(base, prompts, plain, tmp_path):
    ids, mask = prompts
    loaded = GPT.from_pretrained(_folder(base, tmp_path, config={"eos_token_id": int(plain[0, 3])}))
    built = GPT(loaded.config).eval()
    built.load_state_dict(loaded.state_dict())
    assert built.generation_defaults is None and loaded.generation_defaults is not None
    out = built.generate(ids, N, attention_mask=mask)
    assert out.shape == (4, T + N) and torch.equal(out[:, T:], plain)
    assert torch.equal(built.generate(ids, N, attention_mask=mask, eos_token_id=[]), out)
    assert built.generate(ids[:1], N).shape == (1, T + N)  # the loaded one stops early:
    assert loaded.generate(ids[:1], N).shape[1] < T + N


@pytest.mark.parametrize(
    "entry, kept, pad",
    [
        ({"eos_token_id": 50256}, (), None),  # GPT2Config's default in a small vocabulary
        ({"eos_token_id": [50256, "END"]}, ("END",), None),
        ({"eos_token_id": "END", "pad_token_id": -1}, ("END",), None),  # Hub configs do this
        ({"eos_token_id": -3, "pad_token_id": 11}, (), 11),
    ],
    ids=["gpt2-eos", "one-of-two", "pad-minus-one", "negative-eos"],
)
def test_ids_outside_the_vocabulary_are_ignored_with_a_warning(
    base, prompts, plain, tmp_path, caplog, entry, kept, pad
):
    ids, _ = prompts
    end = int(plain[0, 3])
    entry = {
        k: [end if i == "END" else i for i in v]
        if isinstance(v, list)
        else end
        if v == "END"
        else v
        for k, v in entry.items()
    }
    path = _folder(base, tmp_path, generation=entry)
    with caplog.at_level(logging.WARNING, logger="qkv.models.pretrained.gen_defaults"):
        ours = GPT.from_pretrained(path)
    assert "outside the vocabulary (0..999): ignored" in caplog.text
    assert "generation_config.json" in caplog.text
    want = tuple(end if i == "END" else i for i in kept)
    assert ours.generation_defaults.eos_token_id == want
    assert ours.generation_defaults.pad_token_id == pad
    # transformers tolerates them too (it warns): one prompt decodes the same tokens
    assert torch.equal(ours.generate(ids[:1], N), _hf(_peer(path), ids[:1]))


@pytest.mark.parametrize(
    "entry, key",
    [
        ({"eos_token_id": "</s>"}, "eos_token_id"),
        ({"eos_token_id": [3, 4.0]}, "eos_token_id"),
        ({"eos_token_id": 3, "pad_token_id": True}, "pad_token_id"),
        ({"eos_token_id": {"id": 3}}, "eos_token_id"),
    ],
)
def test_a_value_that_is_not_a_token_id_is_named(base, tmp_path, entry, key):
    path = _folder(base, tmp_path, generation=entry)
    with pytest.raises(ValueError, match=f"generation_config.json: {key} must be a token id"):
        GPT.from_pretrained(path)


def test_generation_config_json_that_is_not_an_object_is_refused(base, tmp_path):
    path = _folder(base, tmp_path, generation=[1, 2])
    with pytest.raises(ValueError, match="generation_config.json: expected a JSON object"):
        GPT.from_pretrained(path)


def test_defaults_given_to_a_built_gpt_decode_as_the_folder_in_transformers(
    base, prompts, plain, tmp_path
):
    ids, mask = prompts
    end, pad = int(plain[2, 4]), int(plain[0, 1])
    path = _folder(base, tmp_path, generation={"eos_token_id": end, "pad_token_id": pad})
    loaded = GPT.from_pretrained(path)
    built = GPT(loaded.config).eval()
    built.load_state_dict(loaded.state_dict())
    assert "GenerationDefaults" in qkv.models.__all__
    built.generation_defaults = qkv.models.GenerationDefaults(eos_token_id=(end,), pad_token_id=pad)
    out, ref = built.generate(ids, N, attention_mask=mask), _hf(_peer(path), ids, mask)
    assert torch.equal(out, ref), (out.shape, ref.shape)
    first = int((out[2, T:] == end).nonzero()[0])  # row 2 ended, then continued with pad
    assert first <= 4 and (out[2, T + first + 1 :] == pad).all()
