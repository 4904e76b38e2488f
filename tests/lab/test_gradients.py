"""Quick ``gradients``: vanishing through tanh RNNs, none through self-attention; explosion
through linear and ReLU recurrences with ρ > 1 and in SGD training without clipping."""

from __future__ import annotations

import math

import numpy as np
import pytest

from qkv.lab.gradients import (
    EXPLODE_RHOS,
    QUICK,
    SPIKE,
    SPIKE_FIRST,
    SPIKE_WINDOW,
    Setting,
    Training,
    growth_rates,
    jacobian_norms,
    spikes,
)
from tests.lab.conftest import quick_result


@pytest.fixture(scope="module")
def result(lab_out):
    return quick_result("gradients", lab_out)


TINY_TRAINING = Training(
    pairs=60, min_len=2, max_len=6, embed=8, hidden=8, max_tokens=100, lr=1.0, clip=1.0, steps=3
)


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
    lab = run(tmp_path, setting=setting, training=TINY_TRAINING)
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


# --- explosion: linear and ReLU recurrences ------------------------------------------------


@pytest.mark.parametrize("rho", [1.1, 1.7], ids=["rho-1.1", "rho-1.7"])
def test_the_jacobian_of_a_linear_recurrence_is_rho_to_the_k(rho):
    """W_hh = ρQ with Q orthogonal: ∂h_T/∂h_{T−k} = W_hh^k, whose spectral norm is ρ^k."""
    setting = Setting(steps=25, hidden=6, input_dim=3, input_scale=0.5, heads=2, seeds=(0,))
    norms = jacobian_norms("linear", setting, seed=np.random.randint(1000), rho=rho).numpy()
    assert norms == pytest.approx(rho ** np.arange(25), rel=1e-9)


def test_growth_rates_recover_the_rate_of_a_geometric_sequence():
    rng = np.random.default_rng()
    rates = rng.uniform(-1, 1, size=4)
    runs = rng.uniform(0.1, 10, size=(4, 1)) * np.exp(np.outer(rates, np.arange(30)))
    runs[1, 7] = 0.0  # an underflow is left out of the fit
    assert growth_rates(runs) == pytest.approx(rates, abs=1e-9)


def test_a_linear_recurrence_grows_exactly_as_log_rho_per_step(result):
    curves = result["results"]["explosion"]["curves"]
    for rho in EXPLODE_RHOS:
        r = curves[f"linear ρ={rho}"]
        assert r["rate_per_seed"] == pytest.approx([math.log(rho)] * len(QUICK.seeds), abs=1e-9)
        assert r["log_rho"] == pytest.approx(math.log(rho))


def test_a_relu_recurrence_grows_with_log_rho_and_explodes_at_rho_2(result):
    """The ReLU zeroes about half the coordinates at each step: the rate is log ρ less a
    constant, so its slope against log ρ is near 1, and ρ = 2 explodes (interval above 0)."""
    curves = result["results"]["explosion"]["curves"]
    rows = [curves[f"relu ρ={rho}"] for rho in EXPLODE_RHOS]
    slope = np.polyfit([r["log_rho"] for r in rows], [r["rate"]["mean"] for r in rows], 1)[0]
    assert 0.7 <= slope <= 1.4
    assert rows[-1]["rate"]["low"] > 0
    assert all(r["rate"]["mean"] < r["log_rho"] for r in rows)


def test_the_verdict_is_headed_by_what_the_numbers_decide(result):
    from qkv.lab.gradients import _head

    r = result["results"]
    summary = {**r["summary"]}
    exploding, trained = r["explosion"]["curves"], r["training"]
    assert result["verdict"].startswith(_head(summary, exploding, trained) + ": ")
    flat = {m: {**row, "far_over_near": 1.0} for m, row in summary.items()}  # nothing vanishes
    assert _head(flat, exploding, trained).startswith("holds for") and "not for vanishing" in (
        _head(flat, exploding, trained)
    )
    tame = {**trained, "threshold": float("inf")}  # no norm above the threshold
    assert "exploding" in _head(summary, exploding, tame).split("not for")[-1]


def test_the_verdict_gives_the_growth_rates(result):
    curves = result["results"]["explosion"]["curves"]
    rho = EXPLODE_RHOS[-1]
    for kind in ("linear", "relu"):
        assert f"e^{curves[f'{kind} ρ={rho}']['rate']['mean']:.3f}" in result["verdict"]


# --- explosion in training: the no-attention GRU with and without clipping -------------------


def test_both_trainings_match_until_the_first_clipped_step(result):
    runs = result["results"]["training"]["runs"]
    threshold = result["results"]["training"]["threshold"]
    free, clipped = runs["no clipping"], runs["clipping"]
    first = next((i for i, n in enumerate(clipped["norm"]) if n > threshold), None)
    assert first is not None  # the clipped run was clipped at least once
    assert free["norm"][: first + 1] == pytest.approx(clipped["norm"][: first + 1], rel=1e-6)
    assert free["loss"][: first + 1] == pytest.approx(clipped["loss"][: first + 1], rel=1e-6)


def test_clipping_bounds_the_norm_applied_and_only_when_over(result):
    training = result["results"]["training"]
    threshold = training["threshold"]
    free, clipped = training["runs"]["no clipping"], training["runs"]["clipping"]
    assert free["norm_after_clipping"] == pytest.approx(free["norm"], rel=1e-6)
    for before, after in zip(clipped["norm"], clipped["norm_after_clipping"], strict=True):
        assert after == pytest.approx(min(before, threshold), rel=1e-5)
    for r in (free, clipped):
        assert r["max_norm"] == max(r["norm"])
        assert r["steps_over_threshold"] == sum(n > threshold for n in r["norm"])
        assert r["spikes"] == spikes(r["norm"])


def test_without_clipping_the_norm_grows_past_the_clipped_runs(result):
    runs = result["results"]["training"]["runs"]
    assert runs["no clipping"]["max_norm"] > 2 * runs["clipping"]["max_norm"]
    assert runs["no clipping"]["final_loss"] > runs["clipping"]["final_loss"]


def test_a_spike_is_a_norm_over_five_times_the_recent_median():
    rng = np.random.default_rng()
    norms = list(rng.uniform(1.0, 1.5, size=SPIKE_WINDOW + 10))
    at = SPIKE_WINDOW + rng.integers(0, 10)
    norms[at] = SPIKE * 1.5 + 0.1  # over 5x any median of values <= 1.5
    assert spikes(norms) == [at]
    norms[at] = SPIKE * 0.99  # under 5x any median of values >= 1
    assert spikes(norms) == []
    norms[SPIKE_FIRST] = SPIKE * 1.5 + 0.1  # early: the median of the steps so far
    norms[SPIKE_FIRST - 1] = 100.0  # too early to be measured against anything
    assert spikes(norms) == [SPIKE_FIRST]


def test_the_explosion_and_training_figures_are_written(result, lab_out):
    for name in ("gradient-explosion.png", "gradient-training.png"):
        assert (lab_out / "gradients" / name).stat().st_size > 10_000
    assert set(result["figures"]) >= {"gradient-explosion.png", "gradient-training.png"}
