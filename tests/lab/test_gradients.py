"""Quick ``gradients``: vanishing through tanh RNNs, none through self-attention."""

from __future__ import annotations

import math

import pytest

from tests.lab.conftest import quick_result


@pytest.fixture(scope="module")
def result(lab_out):
    return quick_result("gradients", lab_out)


def test_rho_half_loses_three_orders_of_magnitude_in_50_steps(result):
    # ‖∂h_T/∂h_{T-50}‖ (spectral norm, median over seeds) of the ρ = 0.5 tanh RNN ≤ 1e-3
    assert result["results"]["summary"]["tanh ρ=0.5"]["k=50"] <= 1e-3


def test_rho_one_and_a_half_keeps_far_more_gradient(result):
    # ρ = 1.5 keeps at least 1000× more gradient after 50 steps than ρ = 0.5 (it grows or
    # decays much less; tanh saturation stops it from exploding)
    s = result["results"]["summary"]
    gap = math.log10(s["tanh ρ=1.5"]["k=50"]) - math.log10(s["tanh ρ=0.5"]["k=50"])
    assert gap >= 3


def test_norm_falls_monotonically_with_rho(result):
    s = result["results"]["summary"]
    values = [s[f"tanh ρ={rho}"]["k=50"] for rho in (0.5, 0.9, 1.0, 1.1, 1.5)]
    assert values == sorted(values)


def test_self_attention_does_not_decay_with_distance(result):
    # median norm over the last 20 distances vs distances 1..10: within 10×
    ratio = result["results"]["summary"]["self-attention"]["far_over_near"]
    assert 0.1 <= ratio <= 10


def test_figure_written(result, lab_out):
    assert (lab_out / "gradients" / "gradient-norms.png").stat().st_size > 10_000


def test_the_verdict_follows_the_ratio(result):
    from qkv.lab.gradients import _distance_effect

    ratio = result["results"]["summary"]["self-attention"]["far_over_near"]
    assert f"{ratio:.2f} ({_distance_effect(ratio)})" in result["verdict"]
    assert _distance_effect(1.0) == "no decay with distance"
    assert _distance_effect(0.01) == "it decays with distance"
    assert _distance_effect(30.0) == "it grows with distance"


def test_the_figure_spans_the_measured_norms_and_not_much_more():
    """The y range follows the norms measured (a short run ends near 1e-22, a long one far
    lower): every quartile lies inside it, within three decades of its ends."""
    import numpy as np

    from qkv.lab.gradients import _norm_range

    rng = np.random.default_rng()
    results = {}
    for name in ("a", "b"):
        low = 10.0 ** rng.uniform(-80, -5, size=30)
        results[name] = {"q25": low, "q75": low * 10 ** rng.uniform(0, 3, size=30)}
    results["a"]["q25"][3] = 0.0  # an underflow: not part of the range
    lo, hi = _norm_range(results)
    values = np.concatenate([r[k] for r in results.values() for k in ("q25", "q75")])
    values = values[values > 0]
    assert lo < values.min() and values.max() < hi
    assert math.log10(values.min() / lo) <= 3 and math.log10(hi / values.max()) <= 3


@pytest.mark.parametrize(
    "steps, near, far, ks",
    [(3, "near_1_1", "far_last_1", [1, 2]), (12, "near_1_5", "far_last_6", [1, 10, 11])],
    ids=["3-steps", "12-steps"],
)
def test_a_short_custom_setting_reports_the_distances_it_has(tmp_path, steps, near, far, ks):
    """Fewer than 51 steps: k=50 was a KeyError and med[steps-20:] a wrong window; the
    verdict reports the longest distance measured and the windows used, which stay apart."""
    import numpy as np

    from qkv.lab.gradients import Setting, run, table

    setting = Setting(steps=steps, hidden=8, input_dim=4, input_scale=0.5, heads=2, seeds=(0, 1))
    lab = run(tmp_path, setting=setting)
    summary, curves = lab.results["summary"], lab.results["curves"]
    k = steps - 1
    for label, row in summary.items():
        med = curves[label]["median"]
        assert len(med) == steps and len(curves[label][f"per_seed_at_{k}"]) == 2
        assert [c for c in row if c.startswith("k=")] == [f"k={d}" for d in ks]
        assert row[f"k={k}"] == med[k]
        n_near, n_far = int(near.rsplit("_", 1)[1]), int(far.rsplit("_", 1)[1])
        assert 1 + n_near <= steps - n_far  # near 1..n_near, far the last n_far: apart
        assert row[near] == pytest.approx(np.median(med[1 : 1 + n_near]))
        assert row[far] == pytest.approx(np.median(med[steps - n_far :]))
        assert row["far_over_near"] == pytest.approx(row[far] / row[near])
    assert f"{summary['tanh ρ=0.5'][f'k={k}']:.1e} of the gradient after {k} steps" in lab.verdict
    assert f"distance {k} reported, not 50" in lab.verdict
    assert f"far/near is distances {steps - n_far}-{steps - 1} over 1-{n_near}" in lab.verdict
    assert table(lab).columns == ["model", *(f"k={d}" for d in ks), "far/near"]
    assert lab.config["steps"] == steps


@pytest.mark.parametrize("steps", [-1, 0, 1, 2])
def test_a_setting_too_short_for_a_near_and_a_far_distance_is_refused(steps):
    from qkv.lab.gradients import Setting

    with pytest.raises(ValueError, match=f"Setting.steps: must be >= 3, got {steps}"):
        Setting(steps=steps, hidden=8, input_dim=4, input_scale=0.5, heads=2, seeds=(0,))
