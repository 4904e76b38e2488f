"""GPT against transformers.GPT2LMHeadModel on small random GPT-2s saved to disk: logits,
attention, generation and given position ids; calls and configs that cannot run are
refused in one line that names what is wrong."""

from __future__ import annotations

import copy
import os

import pytest
import torch

from tests.models.pretrained.gpt_helpers import gpt2_fixtures, random_gpt2_folder

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

transformers = pytest.importorskip("transformers")

from qkv.models import GPT, GPTConfig  # noqa: E402

VOCAB = 1000
PAIR_VOCAB, B, T, POSITIONS = 400, 3, 13, 64  # the GPT-2 of the position-id tests


folder, peer, ours = gpt2_fixtures("gpt2", layers=4, heads=4, dim=128, vocab=VOCAB, positions=256)


def _padded_batch(side: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ids (4, 17) and a mask with 0, 5, 9 and 2 pads on ``side``."""
    ids = torch.randint(0, VOCAB, (4, 17))
    mask = torch.ones_like(ids)
    for row, n_pad in enumerate([0, 5, 9, 2]):
        pads = slice(0, n_pad) if side == "left" else slice(17 - n_pad, 17)
        mask[row, pads] = 0
    return ids, mask


def _hf_positions(mask: torch.Tensor) -> torch.Tensor:
    """Hugging Face generate's rule: count real tokens; pads at 0."""
    return (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)


@pytest.mark.parametrize("side", ["left", "right"])
def test_logits_and_attentions_match_transformers(ours, peer, side):
    ids, mask = _padded_batch(side)
    with torch.no_grad():
        out = ours(ids, attention_mask=mask, need_weights=True)
        # right padding: HF's default positions (arange) are the real-token positions;
        # left padding: pass the positions HF's own generate() would use.
        positions = _hf_positions(mask) if side == "left" else None
        ref = peer(ids, attention_mask=mask, position_ids=positions, output_attentions=True)
    real = mask.bool()
    assert out.logits.shape == (4, 17, VOCAB)
    assert (out.logits - ref.logits)[real].abs().max() <= 1e-5
    assert len(out.attentions) == 4
    for w, w_ref in zip(out.attentions, ref.attentions):
        w_real, ref_real = w.transpose(1, 2)[real], w_ref.transpose(1, 2)[real]  # (N, H, Tk)
        assert (w_real - ref_real).abs().max() <= 1e-6
    if side == "left":  # the padded positions do not move a row's real tokens
        alone = ours(ids[2:3, 9:]).logits
        torch.testing.assert_close(out.logits[2:3, 9:], alone, atol=1e-5, rtol=0)


def test_float64_matches_transformers_float64(ours, peer):
    ids, mask = _padded_batch("left")
    ours64, peer64 = copy.deepcopy(ours).double(), copy.deepcopy(peer).double()
    with torch.no_grad():
        out = ours64(ids, attention_mask=mask).logits
        ref = peer64(ids, attention_mask=mask, position_ids=_hf_positions(mask)).logits
    assert (out - ref)[mask.bool()].abs().max() <= 1e-10


def test_greedy_generation_matches_transformers(ours, peer):
    ids, mask = _padded_batch("left")
    with torch.no_grad():
        ref = peer.generate(
            ids, attention_mask=mask, max_new_tokens=50, do_sample=False, pad_token_id=0
        )
    out = ours.generate(ids, 50, attention_mask=mask)
    assert out.shape == (4, 17 + 50)
    assert torch.equal(out, ref), (out[:, 17:] != ref[:, 17:]).nonzero()[:5]


def test_generation_ends_at_eos_as_transformers_does(ours, peer):
    ids, mask = _padded_batch("left")
    plain = ours.generate(ids, 40, attention_mask=mask)[:, 17:]  # (4, 40)
    # end tokens that the rows really produce, at different steps (some rows may never)
    ends = [int(plain[0, 3]), int(plain[2, 11])]
    with torch.no_grad():
        ref = peer.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=40,
            do_sample=False,
            eos_token_id=ends,
            pad_token_id=0,
        )
    out = ours.generate(ids, 40, attention_mask=mask, eos_token_id=ends, pad_token_id=0)
    assert torch.equal(out, ref), (out.shape, ref.shape)
    new = out[:, 17:]
    for row in range(4):
        hits = torch.isin(new[row], torch.tensor(ends)).nonzero()
        if len(hits):  # after its first end token a row holds only padding
            first = int(hits[0])
            assert torch.equal(new[row, : first + 1], plain[row, : first + 1])
            assert (new[row, first + 1 :] == 0).all()
        else:
            assert torch.equal(new[row], plain[row, : new.shape[1]])
    # one row that ends: generation stops there, and the default padding is the end id
    alone = ours.generate(ids[:1], 40, eos_token_id=int(plain[0, 3]))
    first = int((alone[0, 17:] == plain[0, 3]).nonzero()[0])
    assert alone.shape == (1, 17 + first + 1)


@pytest.mark.parametrize(
    "rules",
    [
        dict(repetition_penalty=1.5),
        dict(repetition_penalty=0.7),
        dict(no_repeat_ngram_size=1),
        dict(no_repeat_ngram_size=3),
        dict(min_new_tokens=12),
        dict(repetition_penalty=1.2, no_repeat_ngram_size=2, min_new_tokens=5),
    ],
    ids=["penalty", "reward", "ngram1", "ngram3", "min-new", "all"],
)
def test_decoding_rules_match_transformers(ours, peer, rules):
    acted = 0
    for _ in range(4):  # random prompts; the rule must change the output for some of them
        ids, mask = _padded_batch("left")
        plain = ours.generate(ids, 30, attention_mask=mask)
        end = dict(eos_token_id=[int(plain[0, 17 + 2]), int(plain[3, 17 + 4])], pad_token_id=0)
        with torch.no_grad():
            ref = peer.generate(
                ids, attention_mask=mask, max_new_tokens=30, do_sample=False, **end, **rules
            )
        out = ours.generate(ids, 30, attention_mask=mask, **end, **rules)
        assert torch.equal(out, ref), (out.shape, ref.shape)
        acted += not torch.equal(out, ours.generate(ids, 30, attention_mask=mask, **end))
    assert acted


@pytest.mark.parametrize(
    "beams, options",
    [
        (2, {}),
        (4, dict(num_return_sequences=3)),
        (3, dict(length_penalty=0.0)),
        (3, dict(length_penalty=2.0, early_stopping="never")),
        (4, dict(early_stopping=True, num_return_sequences=2)),
        (3, dict(repetition_penalty=1.3, no_repeat_ngram_size=2, min_new_tokens=4)),
    ],
    ids=["plain", "n-best", "no-penalty", "never", "early", "rules"],
)
def test_beam_search_matches_transformers(ours, peer, beams, options):
    ids, mask = _padded_batch("left")
    plain = ours.generate(ids, 16, attention_mask=mask)[:, 17:]
    end = dict(eos_token_id=[int(plain[1, 1]), int(plain[2, 5])], pad_token_id=3)
    with torch.no_grad():
        ref = peer.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=16,
            num_beams=beams,
            do_sample=False,
            **end,
            **options,
        )
    out = ours.generate(ids, 16, attention_mask=mask, num_beams=beams, **end, **options)
    assert out.shape == ref.shape and torch.equal(out, ref)
    rows = options.get("num_return_sequences", 1)
    assert out.shape[0] == 4 * rows and torch.equal(out[::rows, :17], ids)
    if rows == 1:  # beam search does not just repeat greedy search
        assert not torch.equal(out, ours.generate(ids, 16, attention_mask=mask, **end))


def test_beam_search_without_end_tokens(ours, peer):
    ids = torch.randint(0, VOCAB, (2, 9))
    ids[0, 4] = 0  # a real token 0: transformers must not take it for padding (pad_token_id)
    with torch.no_grad():
        ref = peer.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=12,
            num_beams=3,
            do_sample=False,
            pad_token_id=0,
        )
    assert torch.equal(ours.generate(ids, 12, num_beams=3), ref)
    with pytest.raises(ValueError, match="num_return_sequences"):
        ours.generate(ids, 5, num_beams=2, num_return_sequences=3)
    with pytest.raises(ValueError, match="deterministic"):
        ours.generate(ids, 5, num_beams=2, temperature=1.0)


@pytest.mark.parametrize(
    "bad, match",
    [
        (dict(temperature=-0.7), "temperature must be >= 0"),
        (dict(repetition_penalty=0.0), "repetition_penalty"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_k=0), "top_k"),
        (dict(no_repeat_ngram_size=-1), "no_repeat_ngram_size"),
    ],
)
def test_bad_decoding_rules_are_refused_by_name(ours, bad, match):
    with pytest.raises(ValueError, match=match):
        ours.generate(torch.zeros(1, 3, dtype=torch.long), 2, **bad)


@pytest.mark.parametrize("pad", [-1, VOCAB])
def test_a_padding_id_outside_the_vocabulary_is_named(ours, pad):
    ids = torch.randint(0, VOCAB, (2, 5))
    with pytest.raises(ValueError, match=f"pad_token_id {pad} is outside the vocabulary"):
        ours.generate(ids, 4, eos_token_id=int(ids[0, 0]), pad_token_id=pad)


def test_cache_and_recompute_generate_the_same(ours):
    ids, mask = _padded_batch("left")
    cached = ours.generate(ids, 20, attention_mask=mask, use_cache=True)
    recomputed = ours.generate(ids, 20, attention_mask=mask, use_cache=False)
    assert torch.equal(cached, recomputed)
    kwargs = dict(temperature=1.0, top_k=50, top_p=0.9, seed=7, attention_mask=mask)
    sampled_cached = ours.generate(ids, 20, use_cache=True, **kwargs)
    sampled_recomputed = ours.generate(ids, 20, use_cache=False, **kwargs)
    assert torch.equal(sampled_cached, sampled_recomputed)


def test_incremental_logits_equal_one_pass(ours):
    ids = torch.randint(0, VOCAB, (2, 20))
    full = ours(ids).logits
    cache = ours.new_cache()
    steps = [ours(ids[:, :8], cache=cache).logits]
    for t in range(8, 20):
        out = ours(ids[:, t : t + 1], cache=cache)
        assert out.cache is cache and cache.length == t + 1
        steps.append(out.logits)
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=0)


def test_seeded_sampling_is_reproducible(ours):
    ids = torch.randint(0, VOCAB, (2, 5))
    a = ours.generate(ids, 15, temperature=1.0, seed=123)
    b = ours.generate(ids, 15, temperature=1.0, seed=123)
    c = ours.generate(ids, 15, temperature=1.0, seed=124)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert torch.equal(a[:, :5], ids)
    greedy = ours.generate(ids, 10)
    assert torch.equal(ours.generate(ids, 10, temperature=0.7, top_k=1, seed=1), greedy)
    assert torch.equal(ours.generate(ids, 10, temperature=0.7, top_p=1e-6, seed=1), greedy)


@pytest.mark.parametrize(
    "options", [dict(), dict(top_k=20, top_p=0.8, temperature=0.7)], ids=["plain", "filtered"]
)
def test_sampling_several_sequences_per_prompt_matches_transformers(ours, peer, options):
    ids, mask = _padded_batch("left")
    seed = int(torch.randint(0, 2**31, ()))
    torch.manual_seed(seed)  # both libraries draw from the global generator, in the same order
    with torch.no_grad():
        ref = peer.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=12,
            do_sample=True,
            pad_token_id=0,
            num_return_sequences=3,
            **{"top_k": 0, **options},
        )
    torch.manual_seed(seed)
    out = ours.generate(
        ids, 12, attention_mask=mask, num_return_sequences=3, **{"temperature": 1.0, **options}
    )
    assert out.shape == (12, 17 + 12) and torch.equal(out, ref)
    assert not torch.equal(out[0::3], out[1::3])  # independent samples of each prompt
    with pytest.raises(ValueError, match="greedy decoding gives one continuation"):
        ours.generate(ids, 5, num_return_sequences=2)


def test_config_and_length_errors(ours):
    with pytest.raises(ValueError, match="divisible"):
        GPTConfig(dim=10, num_heads=3)
    with pytest.raises(ValueError, match="250 \\+ max_new_tokens 10 = 260 exceeds .* 256"):
        ours.generate(torch.zeros(1, 250, dtype=torch.long), 10, num_beams=2)  # up front
    with pytest.raises(ValueError, match=r"attention_mask must have the prompts' shape \(1, 4\)"):
        ours.generate(torch.zeros(1, 4, dtype=torch.long), 2, attention_mask=torch.ones(1, 3))
    with pytest.raises(ValueError, match=r"input_ids must be \(B, T\)"):
        ours.generate(torch.zeros(4, dtype=torch.long), 2)
    prompts = torch.zeros(2, 3, dtype=torch.long)
    assert torch.equal(
        ours.generate(prompts, 0, num_beams=2, num_return_sequences=2),
        prompts.repeat_interleave(2, 0),
    )
    with pytest.raises(ValueError, match="attention_mask"):
        ours(torch.zeros(1, 4, dtype=torch.long), attention_mask=torch.ones(1, 3))


# ---- given position ids --------------------------------------------------------------


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    path = random_gpt2_folder(
        tmp_path_factory.mktemp("gpt2_positions"),
        layers=2,
        heads=4,
        dim=64,
        vocab=PAIR_VOCAB,
        positions=POSITIONS,
    )
    peer = transformers.GPT2LMHeadModel.from_pretrained(path, attn_implementation="eager")
    return GPT.from_pretrained(path), peer.eval()


def _left_padded() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random ids (B, T), a mask with 0, 4 and 7 pads on the left, and the positions
    ``cumsum(mask) - 1`` clamped at 0."""
    ids = torch.randint(0, PAIR_VOCAB, (B, T))
    mask = torch.ones_like(ids)
    for row, n_pad in enumerate([0, 4, 7]):
        mask[row, :n_pad] = 0
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


def _shifted(rows: int) -> torch.Tensor:
    """Positions ``(rows, T)``: each row counts up from a random start."""
    start = torch.randint(0, POSITIONS - T, (rows, 1))
    return start + torch.arange(T)


@pytest.mark.parametrize("kind", ["left_padding_cumsum", "shifted_rows", "shifted_shared"])
def test_given_positions_give_transformers_logits(pair, kind):
    ours, peer = pair
    ids, mask, positions = _left_padded()
    if kind != "left_padding_cumsum":
        mask = torch.ones_like(ids)
        positions = _shifted(B if kind == "shifted_rows" else 1)
    with torch.no_grad():
        out = ours(ids, attention_mask=mask, position_ids=positions).logits
        ref = peer(ids, attention_mask=mask, position_ids=positions).logits
    real = mask.bool()
    assert (out - ref)[real].abs().max() <= 1e-5
    if kind != "left_padding_cumsum":  # the positions changed the logits
        assert (out - ours(ids).logits).abs().max() > 1e-3


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "left_padded"])
def test_given_positions_with_a_cache_equal_one_pass(pair, padded):
    ours, peer = pair
    ids, mask, positions = _left_padded()
    if not padded:
        mask, positions = torch.ones_like(ids), _shifted(B)
    split = 9  # the cache holds the first 9 tokens, then 4 more
    with torch.no_grad():
        whole = ours(ids, attention_mask=mask, position_ids=positions).logits
        cache = ours.new_cache()
        first = ours(ids[:, :split], mask[:, :split], cache, position_ids=positions[:, :split])
        rest = ours(ids[:, split:], mask, cache, position_ids=positions[:, split:])
        ref = peer(ids, attention_mask=mask, position_ids=positions).logits
    stepwise = torch.cat([first.logits, rest.logits], 1)
    real = mask.bool()
    torch.testing.assert_close(stepwise[real], whole[real], atol=1e-5, rtol=0)
    assert (stepwise - ref)[real].abs().max() <= 1e-5


@pytest.mark.parametrize(
    "shape", [(B, T + 1), (2, T), (B, 1, T), (T,)], ids=["long", "two_rows", "3d", "1d"]
)
def test_position_ids_of_a_wrong_shape_are_named(pair, shape):
    ours, _ = pair
    ids = torch.randint(0, PAIR_VOCAB, (B, T))
    positions = torch.randint(0, T, shape)
    with pytest.raises(ValueError, match=rf"position_ids must be \(B, T\) = \({B}, {T}\)"):
        ours(ids, position_ids=positions)


def test_position_ids_outside_the_positions_or_not_integers_are_named(pair):
    ours, _ = pair
    ids = torch.randint(0, PAIR_VOCAB, (B, T))
    too_far = _shifted(B)
    too_far[1, 3] = POSITIONS
    with pytest.raises(ValueError, match=f"position id {POSITIONS} is outside 0..{POSITIONS - 1}"):
        ours(ids, position_ids=too_far)
    with pytest.raises(ValueError, match="position_ids must hold integers, got torch.float32"):
        ours(ids, position_ids=_shifted(B).float())


# ---- calls and configs that cannot run -----------------------------------------------


GPT_SIZES = dict(vocab_size=50, max_len=8, num_layers=1, num_heads=2, dim=8)


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


def test_a_dropout_of_one_is_refused():
    with pytest.raises(ValueError, match=r"^dropout must be in \[0, 1\), got 1.0$"):
        GPTConfig(**GPT_SIZES, dropout=1.0)
