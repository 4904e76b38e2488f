"""GPT.forward with given position_ids against transformers.GPT2LMHeadModel's."""

from __future__ import annotations

import os

import pytest
import torch

from tests.models.pretrained.gpt_helpers import random_gpt2_folder

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

transformers = pytest.importorskip("transformers")

from qkv.models import GPT  # noqa: E402

VOCAB, B, T, POSITIONS = 400, 3, 13, 64


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    path = random_gpt2_folder(
        tmp_path_factory.mktemp("gpt2_positions"),
        layers=2,
        heads=4,
        dim=64,
        vocab=VOCAB,
        positions=POSITIONS,
    )
    peer = transformers.GPT2LMHeadModel.from_pretrained(path, attn_implementation="eager")
    return GPT.from_pretrained(path), peer.eval()


def _left_padded() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random ids (B, T), a mask with 0, 4 and 7 pads on the left, and the positions
    ``cumsum(mask) - 1`` clamped at 0."""
    ids = torch.randint(0, VOCAB, (B, T))
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
    ids = torch.randint(0, VOCAB, (B, T))
    positions = torch.randint(0, T, shape)
    with pytest.raises(ValueError, match=rf"position_ids must be \(B, T\) = \({B}, {T}\)"):
        ours(ids, position_ids=positions)


def test_position_ids_outside_the_positions_or_not_integers_are_named(pair):
    ours, _ = pair
    ids = torch.randint(0, VOCAB, (B, T))
    too_far = _shifted(B)
    too_far[1, 3] = POSITIONS
    with pytest.raises(ValueError, match=f"position id {POSITIONS} is outside 0..{POSITIONS - 1}"):
        ours(ids, position_ids=too_far)
    with pytest.raises(ValueError, match="position_ids must hold integers, got torch.float32"):
        ours(ids, position_ids=_shifted(B).float())
