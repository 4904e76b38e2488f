"""Decoding rules against transformers: the prompt mask inferred from pad tokens, and the
sampling filters.

GPT.generate without an attention mask infers one from pad tokens, as transformers does:
transformers' ``generate`` masks the prompt tokens equal to the pad token when the pad
token is set, occurs in the prompts, and is not an end token; otherwise every token is
real. Each case decodes the same left-padded prompts, given without a mask, with qkv and
with transformers, greedily, and compares the tokens.
"""

from __future__ import annotations

import json

import pytest
import torch

from tests.models.pretrained.gpt_helpers import random_gpt2_folder

transformers = pytest.importorskip("transformers")

from qkv.engine import filter_logits  # noqa: E402
from qkv.models import GPT, sample_next  # noqa: E402

VOCAB, T, N = 500, 15, 24
PAD = 7


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return random_gpt2_folder(
        tmp_path_factory.mktemp("gpt2_mask"), layers=2, heads=4, dim=64, vocab=VOCAB, positions=128
    )


def _prompts(pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Fresh random prompts (4, T) left-padded with ``pad`` (0, 4, 8 and 2 pads), and the
    mask of their real tokens (which never equal ``pad``)."""
    ids = torch.randint(0, VOCAB - 1, (4, T))
    ids = ids + (ids >= pad).long()  # every id but the pad
    mask = torch.ones_like(ids)
    for row, n_pad in enumerate([0, 4, 8, 2]):
        ids[row, :n_pad], mask[row, :n_pad] = pad, 0
    return ids, mask


def _both(path):
    peer = transformers.GPT2LMHeadModel.from_pretrained(path, attn_implementation="eager")
    return GPT.from_pretrained(path), peer.eval()


def _hf(peer, ids, **options):
    with torch.no_grad():
        return peer.generate(ids, max_new_tokens=N, do_sample=False, **options)


@pytest.mark.parametrize("beams", [1, 3], ids=["greedy", "beams3"])
def test_pad_tokens_of_the_call_are_masked_as_transformers(base, beams):
    ours, peer = _both(base)
    ids, mask = _prompts(PAD)
    ref = _hf(peer, ids, pad_token_id=PAD, num_beams=beams)
    out = ours.generate(ids, N, pad_token_id=PAD, num_beams=beams)
    assert torch.equal(out, ref), (out[:, T:] != ref[:, T:]).nonzero()[:5]
    # the same as with the mask given; and not what an unmasked prompt gives
    assert torch.equal(
        out, ours.generate(ids, N, attention_mask=mask, pad_token_id=PAD, num_beams=beams)
    )
    assert not torch.equal(
        out,
        ours.generate(
            ids, N, attention_mask=torch.ones_like(ids), pad_token_id=PAD, num_beams=beams
        ),
    )


def test_the_folders_pad_token_is_masked_as_transformers(base, tmp_path):
    ours, peer = _both(base)
    plain = ours.generate(_prompts(PAD)[0], N, pad_token_id=PAD)
    end = int(plain[1, T + 5])  # an end token that a row emits: finished rows pad with PAD
    for name in ("config.json", "model.safetensors"):
        (tmp_path / name).write_bytes((base / name).read_bytes())
    generation = {"pad_token_id": PAD, "eos_token_id": end}
    (tmp_path / "generation_config.json").write_text(json.dumps(generation))
    ours, peer = _both(tmp_path)
    ids, _ = _prompts(PAD)
    ref, out = _hf(peer, ids), ours.generate(ids, N)
    assert torch.equal(out, ref), (out.shape, ref.shape)


@pytest.mark.parametrize(
    "case", ["pad_is_an_end_token", "no_pad_but_an_end_token", "pad_not_in_the_prompts"]
)
def test_no_mask_is_inferred_where_transformers_infers_none(base, case):
    ours, peer = _both(base)
    ids, mask = _prompts(PAD)
    options = {
        "pad_is_an_end_token": dict(pad_token_id=PAD, eos_token_id=[3, PAD]),
        "no_pad_but_an_end_token": dict(eos_token_id=PAD),  # then the end token pads
        "pad_not_in_the_prompts": dict(pad_token_id=PAD),
    }[case]
    if case == "pad_not_in_the_prompts":
        ids = ids.masked_fill(mask == 0, PAD + 1)
    ref, out = _hf(peer, ids, **options), ours.generate(ids, N, **options)
    assert torch.equal(out, ref), (out.shape, ref.shape)
    everything = ours.generate(ids, N, attention_mask=torch.ones_like(ids), **options)
    assert torch.equal(out, everything)  # every prompt token was attended


# ---- sampling filters ----------------------------------------------------------------


@pytest.mark.parametrize("top_p", [0.5, 0.99, 0.999, 1.0])
def test_sampling_filters_keep_the_tokens_transformers_keeps(top_p):
    warpers = transformers.generation.logits_process
    logits = torch.randn(16, 50257) * 3  # GPT-2's vocabulary: long tails of tiny probabilities
    for temperature, top_k in [(1.0, None), (0.7, 2000)]:
        chain = [warpers.TemperatureLogitsWarper(temperature)]
        chain += [warpers.TopKLogitsWarper(top_k)] if top_k else []
        chain += [warpers.TopPLogitsWarper(top_p)] if top_p < 1.0 else []  # as generate does
        want = warpers.LogitsProcessorList(chain)(None, logits.clone())
        got = filter_logits(logits, temperature, top_k, top_p)
        assert torch.equal(torch.isfinite(got), torch.isfinite(want))
        assert torch.equal(got[torch.isfinite(got)], want[torch.isfinite(want)])


def test_sample_next_respects_top_k_and_top_p():
    logits = torch.randn(3, 50).repeat(200, 1)  # many draws of the same 3 distributions
    gen = torch.Generator().manual_seed(0)
    picks = sample_next(logits, temperature=1.0, top_k=5, generator=gen)
    allowed = logits.topk(5, dim=-1).indices
    assert (allowed == picks[:, None]).any(-1).all()
    probs = logits.softmax(-1)
    picks = sample_next(logits, temperature=1.0, top_p=0.5, generator=gen)
    chosen = probs.gather(-1, picks[:, None])
    mass_above = (probs * (probs > chosen)).sum(-1)  # more likely tokens than the pick
    assert (mass_above < 0.5).all()


def test_suppressed_tokens_are_never_chosen():
    from qkv.engine import DecodingRules, adjust_logits

    logits = torch.zeros(2, 6)
    logits[:, 1] = 50.0  # by far the most likely
    rules = DecodingRules(temperature=1.0, suppress_tokens=(1, 3))
    adjusted = adjust_logits(logits, torch.zeros(2, 1, dtype=torch.long), 0, rules)
    assert torch.isinf(adjusted[:, [1, 3]]).all() and torch.isfinite(adjusted[:, [0, 2]]).all()
    generator = torch.Generator().manual_seed(0)
    draws = sample_next(adjusted.repeat(100, 1), 1.0, generator=generator)
    assert not bool(torch.isin(draws, torch.tensor([1, 3])).any())
