"""Quick ``vision``: a ViT with and without positions and a CNN trained a few steps on the
digits; shuffled patches, ink shares and attention distances checked against direct
computations, and the verdict built from the numbers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.lab.conftest import quick_result


@pytest.fixture(scope="module")
def result(lab_out):
    pytest.importorskip("sklearn", reason="the digits are scikit-learn's")
    return quick_result("vision", lab_out)


def test_every_model_is_measured_on_the_whole_test_split(result):
    models = result["results"]["models"]
    assert set(models) == {"vit", "vit-no-positions", "cnn"}
    assert result["results"]["test_images"] == 359
    for rows in models.values():
        for row in rows:
            assert 0 <= row["accuracy"] <= 100 and row["seconds"] > 0
    assert result["figures"] == ["vision-ink-share.png", "vision-accuracy.png"]


def test_without_positions_shuffling_the_patches_changes_no_prediction(result):
    for row in result["results"]["models"]["vit-no-positions"]:
        assert row["shuffled_accuracy"] == row["accuracy"]


def test_the_ink_shares_are_shares_and_chance_is_the_ink_in_the_images(result):
    from qkv.data.digits import load_digit_splits
    from qkv.lab.vision import INK

    test = load_digit_splits(0)["test"]
    looks = result["results"]["models"]["vit"][0]["looks"]
    assert looks["chance"] == pytest.approx(float((test.images >= INK).double().mean()))
    for share in [*looks["layer"], *looks["rollout"], *np.ravel(looks["head"])]:
        assert 0 <= share <= 1


def test_shuffle_patches_moves_whole_blocks():
    from qkv.lab.vision import shuffle_patches

    images = torch.arange(2 * 64, dtype=torch.float64).reshape(2, 1, 8, 8)
    orders = torch.stack([torch.randperm(16), torch.arange(16)])
    moved = shuffle_patches(images, orders)
    assert torch.equal(moved[1], images[1])
    for place in range(16):
        src = int(orders[0, place])
        r, c, sr, sc = 2 * (place // 4), 2 * (place % 4), 2 * (src // 4), 2 * (src % 4)
        assert torch.equal(
            moved[0, 0, r : r + 2, c : c + 2], images[0, 0, sr : sr + 2, sc : sc + 2]
        )


def test_ink_share_and_distance_against_direct_sums():
    from qkv.lab.vision import attention_distance, ink_share

    gen = torch.Generator().manual_seed(3)
    images = torch.rand(5, 1, 8, 8, generator=gen, dtype=torch.float64)
    rows = torch.rand(5, 16, generator=gen, dtype=torch.float64).numpy()
    share, chance = ink_share(rows, images, 2)
    want = []
    for b in range(5):
        a = rows[b] / rows[b].sum()
        pixels = sum(
            a[(y // 2) * 4 + x // 2] / 4 * float(images[b, 0, y, x] >= 0.5)
            for y in range(8)
            for x in range(8)
        )
        want.append(pixels)
    assert share == pytest.approx(np.mean(want), abs=1e-12)
    assert chance == pytest.approx(float((images >= 0.5).double().mean()), abs=1e-12)
    square = torch.rand(16, 16, generator=gen, dtype=torch.float64).numpy()
    got = attention_distance(square, (4, 4), 2)
    direct = np.mean(
        [
            sum(square[i, j] / square[i].sum() * 2 * np.hypot(i // 4 - j // 4, i % 4 - j % 4)
                for j in range(16))
            for i in range(16)
        ]
    )  # fmt: skip
    assert got == pytest.approx(direct, abs=1e-12)


def test_neighbour_distance_against_a_direct_sum():
    from qkv.lab.vision import even_distance, neighbour_distance

    cells = [(r, c) for r in range(4) for c in range(4)]
    per_patch = []
    for r, c in cells:
        near = [(y, x) for y, x in cells if abs(y - r) <= 1 and abs(x - c) <= 1]
        per_patch.append(np.mean([2 * np.hypot(y - r, x - c) for y, x in near]))
    assert neighbour_distance((4, 4), 2) == pytest.approx(np.mean(per_patch), abs=1e-12)
    assert neighbour_distance((4, 4), 2) < even_distance((4, 4), 2)


def test_accuracies_come_from_the_images_each_model_got_right(result):
    from qkv.lab.stats import Interval

    for name, rows in result["results"]["models"].items():
        for row in rows:
            assert len(row["correct"]) == 359 and set(row["correct"]) <= {0, 1}
            assert row["accuracy"] == pytest.approx(100 * np.mean(row["correct"]))
            assert row["shuffled_accuracy"] == pytest.approx(100 * np.mean(row["shuffled_correct"]))
            assert row["curve"] and row["best_step"] in [p["step"] for p in row["curve"]]
        summary = Interval(**result["results"]["summary"][name]["accuracy"])
        assert summary.mean == pytest.approx(np.mean([r["accuracy"] for r in rows]))
        assert summary.low <= summary.mean <= summary.high  # over the test images


def _floats(value):
    """``value`` as the lab computed it: result.json writes inf and NaN as strings."""
    if isinstance(value, dict):
        return {k: _floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_floats(v) for v in value]
    return float(value) if value in ("inf", "-inf", "nan") else value


def _with(summary, **changes):
    """``summary`` with some models' entries changed (``vit={"accuracy": ...}``)."""
    out = {name: dict(entry) for name, entry in _floats(summary).items()}
    for name, entry in changes.items():
        out[name].update(entry)
    return out


def test_the_accuracy_difference_is_paired_over_the_same_images():
    from qkv.lab.stats import Interval
    from qkv.lab.vision import accuracy_difference

    rng = np.random.default_rng()
    a = [{"correct": rng.integers(0, 2, 200).tolist()} for _ in range(3)]
    same = Interval(**accuracy_difference(a, a))
    assert same.mean == same.low == same.high == 0  # every replicate draws the same images
    b = [{"correct": [1] * 200} for _ in range(3)]
    gap = Interval(**accuracy_difference(a, b))
    want = np.mean([100 * (np.mean(r["correct"]) - 1) for r in a])
    assert gap.mean == pytest.approx(want) and gap.low < gap.mean < gap.high < 0


def test_the_verdict_follows_the_intervals(result):
    from qkv.lab.stats import Interval
    from qkv.lab.vision import _verdict

    summary = _floats(result["results"]["summary"])
    verdict = result["verdict"]
    assert Interval(**summary["vit"]["accuracy"]).format(1) + "%" in verdict
    assert Interval(**result["results"]["vit_minus_cnn"]).format(1) + " points" in verdict
    assert f"ink is {100 * summary['vit']['chance']:.0f}% of the image" in verdict
    layers = len(summary["vit"]["distance"])
    near = summary["vit"]["neighbour_distance"]
    far = _with(
        summary,
        vit={"distance": [{"mean": near + 1, "low": near + 0.5, "high": near + 2}] * layers},
    )
    close = _with(
        summary, vit={"distance": [{"mean": near, "low": near - 0.5, "high": near + 1}] * layers}
    )
    better, worse = (
        {"mean": 2.0, "low": 0.5, "high": 3.5},
        {"mean": -2.0, "low": -3.5, "high": -0.5},
    )
    both = _verdict(far, better, None)
    assert both.startswith("holds:") and "the ViT is more accurate" in both
    cnn = _verdict(far, worse, None)
    assert cnn.startswith("holds for relating distant parts, not for helping accuracy")
    assert "the CNN is more accurate" in cnn
    tie = _verdict(close, {"mean": -1.0, "low": -2.5, "high": 0.5}, None)
    assert tie.startswith("does not hold") and "neither is more accurate" in tie
