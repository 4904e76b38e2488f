"""Quick ``parallelism``: the chain measured from the autograd graph, FLOPs against hand
formulas, timings in a fresh process per thread count, and the machine's load recorded."""

from __future__ import annotations

import math
import random
import time

import pytest
import torch

from qkv.lab.parallelism import (
    QUICK,
    Setting,
    build_pair,
    count_flops,
    dependency_chain,
)
from tests.lab.conftest import quick_result


@pytest.fixture(scope="module")
def result(lab_out):
    return quick_result("parallelism", lab_out)


def _sizes() -> tuple[int, int, int, int, int]:
    """Fresh small sizes: batch, length, width, layers, heads."""
    heads = random.choice([1, 2, 4])
    return (
        random.randint(1, 3),
        random.randint(3, 11),
        heads * random.randint(2, 6),
        random.randint(1, 3),
        heads,
    )


def test_the_gru_chain_grows_as_layers_times_length_and_attention_stays_per_layer(result):
    """Measured on the backward graph: L·T dependent products for the GRU (each layer's
    input projection waits for the whole layer below), 6 per layer for self-attention (the
    Q/K/V projection, scores, weighted sum, output projection, two feed-forward products)."""
    rows = result["results"]["structure"]["rows"]
    for row in rows:
        assert row["gru_chain_products"] == QUICK.layers * row["length"]
        assert row["attention_chain_products"] == 6 * QUICK.layers
    gru_nodes = [row["gru_chain_nodes"] for row in rows]
    attention_nodes = [row["attention_chain_nodes"] for row in rows]
    assert gru_nodes == sorted(gru_nodes) and gru_nodes[0] < gru_nodes[-1]
    assert len(set(attention_nodes)) == 1


@pytest.mark.parametrize("trial", range(3))
def test_the_chain_of_other_sizes(trial):
    batch, length, width, layers, heads = _sizes()
    setting = Setting((length,), batch, width, layers, heads, repeats=1)
    gru, attention = build_pair(setting)
    x = torch.randn(batch, length, width)
    assert dependency_chain(gru, x)["products"] == layers * length
    assert dependency_chain(attention, x)["products"] == 6 * layers
    longer = torch.randn(batch, 2 * length, width)
    assert dependency_chain(attention, longer)["products"] == 6 * layers


@pytest.mark.parametrize("trial", range(3))
def test_flops_counted_match_the_hand_formulas(trial):
    """GRU: 3 gates × (input + hidden product) = 12·B·T·E² per layer forward; backward
    twice that, less the input gradient of layer 1 (x needs none: 6·B·T·E²) and the
    gradient of each zero initial state (6·B·E² per layer). Attention per layer: Q/K/V and
    output projections 8·B·T·E², scores and weighted sum 4·B·T²·E, feed-forward 4·B·T·E·F;
    backward twice that, less x's input gradient, plus 2·B·T²·E per layer (SDPA's backward
    is five products of the T×T size, not four)."""
    b, t, e, n_layers, heads = _sizes()
    gru, attention = build_pair(Setting((t,), b, e, n_layers, heads, repeats=1))
    x = torch.randn(b, t, e)
    f = attention.ff_dim
    gru_forward = 12 * n_layers * b * t * e * e
    attention_forward = n_layers * (8 * b * t * e * e + 4 * b * t * t * e + 4 * b * t * e * f)
    assert count_flops(gru, x) == {
        "forward": gru_forward,
        "backward": 2 * gru_forward - 6 * b * t * e * e - 6 * n_layers * b * e * e,
    }
    assert count_flops(attention, x) == {
        "forward": attention_forward,
        "backward": 2 * attention_forward - 6 * b * t * e * e + 2 * n_layers * b * t * t * e,
    }


def test_the_recorded_flops_are_the_counted_ones(result):
    rows = result["results"]["structure"]["rows"]
    e, b = QUICK.width, QUICK.batch
    for row in rows:
        assert row["gru_flops_forward"] == 12 * QUICK.layers * b * row["length"] * e * e
    # attention's share of the work grows with T (its T² term), the GRU's per token does not
    shares = [r["attention_flops_forward"] / r["gru_flops_forward"] for r in rows]
    assert shares == sorted(shares) and shares[0] < shares[-1]


def test_parameter_counts_match_within_five_percent(result):
    p = result["results"]["structure"]["parameters"]
    assert abs(p["gru"] - p["attention"]) <= 0.05 * p["gru"]


def test_each_thread_count_ran_in_its_own_process_with_its_threads(result):
    runs = result["results"]["timing"]["runs"]
    assert runs["cpu-1thread"]["threads"] == 1
    assert runs["cpu-2threads"]["threads"] == 2
    for r in runs.values():
        assert [row["length"] for row in r["rows"]] == list(QUICK.lengths)
        assert all(row["gru_seconds"] > 0 and row["attention_seconds"] > 0 for row in r["rows"])


def test_speedups_are_the_ratio_of_the_two_timings(result):
    timing = result["results"]["timing"]
    one, two = timing["runs"]["cpu-1thread"]["rows"], timing["runs"]["cpu-2threads"]["rows"]
    for row, a, b in zip(timing["speedup"], one, two, strict=True):
        for name in ("gru", "attention"):
            assert row[name] == pytest.approx(a[f"{name}_seconds"] / b[f"{name}_seconds"])


def test_the_load_and_the_others_cpu_time_are_recorded_and_decide_trust(result):
    machine = result["results"]["timing"]["machine"]
    assert machine["cores"] >= 1 and len(machine["load_before"]) == 3
    assert 0.0 <= machine["others_share"] <= 1.0 or math.isnan(machine["others_share"])
    quiet = machine["load_before"][0] <= 0.5 * machine["cores"]
    quiet = quiet and machine["others_share"] <= machine["others_limit"] == 0.1
    assert machine["trustworthy"] == quiet
    said = "timings NOT trustworthy" in result["verdict"]
    assert said == (not machine["trustworthy"])


def _sample(load: float, busy: float, own: float, clock: float, cores: int = 2) -> dict:
    return {
        "load_average": [load, 0.0, 0.0],
        "cores": cores,
        "busy_s": busy,
        "own_s": own,
        "clock_s": clock,
    }


@pytest.mark.parametrize(
    "before, after, trusted, others",
    [
        # 10 s on 2 cores: the timings used 9 CPU seconds, others 1 of 20 (5%)
        (_sample(0.2, 100.0, 5.0, 0.0), _sample(1.9, 110.0, 14.0, 10.0), True, 0.05),
        # the same, with another job taking 3 CPU seconds (15%)
        (_sample(0.2, 100.0, 5.0, 0.0), _sample(1.9, 112.0, 14.0, 10.0), False, 0.15),
        # busy before the timings
        (_sample(1.5, 100.0, 5.0, 0.0), _sample(1.9, 109.0, 14.0, 10.0), False, 0.0),
        # unknown machine time (no /proc/stat)
        (_sample(0.2, math.nan, 5.0, 0.0), _sample(0.2, math.nan, 14.0, 10.0), False, math.nan),
    ],
    ids=["quiet", "another-job", "busy-before", "unknown"],
)
def test_quiet_means_a_low_load_before_and_little_cpu_for_others_during(
    before, after, trusted, others
):
    from qkv.lab.parallelism import _quiet

    machine = _quiet(before, after)
    assert machine["trustworthy"] is trusted
    assert machine["limit"] == 0.5 * before["cores"]
    if math.isnan(others):
        assert math.isnan(machine["others_share"])
    else:
        assert machine["others_share"] == pytest.approx(others)


def test_machine_load_reads_this_processes_cpu_time():
    from qkv.lab.parallelism import machine_load

    first = machine_load()
    end = time.process_time() + 0.2
    while time.process_time() < end:  # 0.2 s of this process's CPU
        pass
    second = machine_load()
    assert second["own_s"] - first["own_s"] >= 0.19
    assert second["clock_s"] > first["clock_s"]
    if not math.isnan(first["busy_s"]):  # the machine was busy at least as long as this
        assert second["busy_s"] - first["busy_s"] >= 0.15


def test_the_verdict_separates_chain_work_and_time(result, lab_out):
    verdict = result["verdict"]
    last = result["results"]["structure"]["rows"][-1]
    assert f"{last['gru_chain_products']} at T={last['length']}" in verdict
    assert f"stays {last['attention_chain_products']} for self-attention" in verdict
    assert "2-thread speed-up GRU" in verdict
    if not torch.cuda.is_available():
        assert verdict.endswith("GPU half unmeasured (no GPU here)")
    assert (lab_out / "parallelism" / "time-vs-length.png").stat().st_size > 10_000


def test_a_gpu_run_is_reported(result):
    """With a GPU timed the verdict gives its time ratio instead of 'unmeasured'."""
    from qkv.lab.parallelism import _verdict

    with_gpu = {**result["results"]}
    runs = dict(with_gpu["timing"]["runs"])
    runs["cuda"] = runs["cpu-1thread"]
    with_gpu["timing"] = {**with_gpu["timing"], "runs": runs}
    verdict = _verdict(with_gpu)
    assert "unmeasured" not in verdict
    row = runs["cuda"]["rows"][-1]
    ratio = row["gru_seconds"] / row["attention_seconds"]
    assert verdict.endswith(f"GPU at T={row['length']}: GRU/attention time {ratio:.2f}")
    from qkv.lab.common import LabRun
    from qkv.lab.parallelism import table

    lab = LabRun("parallelism", True, {}, [0], with_gpu)
    shown = table(lab)
    assert (
        shown.columns[-1] == "GPU ms"
        and len(table(LabRun("p", True, {}, [0], result["results"])).columns) == 5
    )
    assert (
        shown.rows[-1][-1]
        == f"{1e3 * row['gru_seconds']:.1f} / {1e3 * row['attention_seconds']:.1f}"
    )


def test_build_pair_outputs_keep_shape():
    gru, attn = build_pair(QUICK)
    x = torch.randn(2, 5, QUICK.width)
    assert gru(x).shape == attn(x).shape == (2, 5, QUICK.width)


def test_a_setting_without_one_and_more_threads_is_refused(tmp_path):
    from qkv.lab.parallelism import run

    setting = Setting((4,), 1, 8, 1, 2, repeats=1, threads=(2,))
    with pytest.raises(ValueError, match="Setting.threads"):
        run(tmp_path, setting=setting)
