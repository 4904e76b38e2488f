"""Input layouts, token checks, head entropy and the per-layer summary."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from qkv.viz import as_maps, head_entropy, plot_alignment, save_html, summary
from qkv.viz.maps import prepare, summarize_map


def test_layouts_agree(make_maps):
    maps = make_maps(3, 2, 5, 5)
    ref = as_maps(maps)
    assert ref.shape == (3, 2, 5, 5) and ref.dtype == np.float64
    np.testing.assert_array_equal(as_maps(torch.from_numpy(maps)), ref)
    np.testing.assert_array_equal(as_maps(list(maps)), ref)
    np.testing.assert_array_equal(as_maps([torch.from_numpy(m)[None] for m in maps]), ref)
    np.testing.assert_array_equal(as_maps(maps[:, None]), ref)  # (L, 1, H, T, T)
    np.testing.assert_array_equal(as_maps(maps[None]), ref)  # (1, L, H, T, T): batch first
    assert as_maps(maps[0]).shape == (1, 2, 5, 5)
    assert as_maps(maps[0, 0]).shape == (1, 1, 5, 5)
    # nested lists of numbers are an array: were 'layer 0 has shape (5,), expected (H, Tq, Tk)'
    np.testing.assert_array_equal(as_maps(maps[0, 0].tolist()), ref[:1, :1])
    np.testing.assert_array_equal(as_maps(tuple(maps[0].tolist())), ref[:1])
    np.testing.assert_array_equal(as_maps(maps.tolist()), ref)


def test_tensor_with_grad_and_bfloat16(make_maps):
    t = torch.tensor(make_maps(1, 2, 4, 4), requires_grad=True)
    assert as_maps(t).shape == (1, 2, 4, 4)
    low = as_maps(t.detach().to(torch.bfloat16))
    np.testing.assert_allclose(low, t.detach().numpy(), atol=4e-3)


@pytest.mark.parametrize(
    "bad, match",
    [
        (np.ones((2, 2, 3, 3, 3, 3)), "expected"),
        (np.ones((2, 3, 2, 4, 4)), "with a batch of 3, or .* with a batch of 2"),
        ([np.ones((2, 4, 4)), np.ones((2, 5, 5))], "differ in shape"),
        ((torch.ones(3, 2, 4, 4),) * 2, r"\(3, 2, 4, 4\), .* \(a batch of 3; select one batch"),
        ([], "empty list"),
        ([[0.5, 0.5], [1.0]], "nested lists of different lengths"),
        (np.full((1, 1, 2, 2), np.nan), "NaN"),
    ],
    ids=[
        "six-dims",
        "batch-3",
        "ragged-layers",
        "hf-layers-batch-3",
        "no-layers",
        "ragged-rows",
        "nan",
    ],
)
def test_bad_maps_are_rejected(bad, match):
    with pytest.raises(ValueError, match=match):
        as_maps(bad)


def test_token_checks(make_maps):
    maps = make_maps(1, 1, 3, 4)
    am = prepare(maps, src_tokens=list("abcd"), tgt_tokens=list("xyz"))
    assert (am.kind, am.query_tokens, am.key_tokens) == ("cross", tuple("xyz"), tuple("abcd"))
    with pytest.raises(ValueError, match="self-attention"):
        prepare(maps, list("abc"))
    with pytest.raises(ValueError, match="cross-attention"):
        prepare(maps, src_tokens=list("abc"), tgt_tokens=list("xyz"))
    with pytest.raises(ValueError, match="not both"):
        prepare(maps, list("abc"), src_tokens=list("abcd"), tgt_tokens=list("xyz"))
    assert prepare(make_maps(1, 1, 2, 2), [1, None]).key_tokens == ("1", "None")
    with pytest.raises(ValueError, match=r"^no tokens for maps of 2 queries x 2 keys: give tokens"):
        prepare(make_maps(1, 1, 2, 2))  # nothing given: not a "cross-attention" mistake
    with pytest.raises(ValueError, match="cross-attention needs both"):
        prepare(maps, src_tokens=list("abcd"))


def test_entropy_of_known_rows():
    uniform = np.full((4, 4), 0.25)
    onehot = np.eye(4)
    masked = np.vstack([np.eye(4)[:3], np.zeros((1, 4))])  # last query fully masked
    ent = head_entropy(np.stack([uniform, onehot, masked])[None])
    np.testing.assert_allclose(ent, [[np.log(4), 0.0, 0.0]], atol=1e-12)


def _shifted(t: int, shift: int) -> np.ndarray:
    """A head where query i puts 0.9 on key i + shift (clamped) and spreads the rest."""
    w = np.full((t, t), 0.1 / (t - 1))
    for i in range(t):
        w[i, min(max(i + shift, 0), t - 1)] = 0.9
    return w


def test_summary_names_focused_head_and_pattern(make_maps):
    tokens = ["[CLS]", "나는", "학교에", "간다", ".", "[SEP]"]
    noisy = make_maps(2, 3, 6, 6, seed=1) ** 0.2  # flattened: high entropy
    noisy /= noisy.sum(-1, keepdims=True)
    noisy[0, 1] = _shifted(6, -1)
    noisy[1, 2] = np.eye(6) * 0.9 + 0.1 / 6
    lines = summary(noisy, tokens)
    assert len(lines) == 2
    assert lines[0].startswith("layer 0: head 1 ") and "previous token" in lines[0]
    assert lines[1].startswith("layer 1: head 2 ") and "itself" in lines[1]


def test_summary_first_token_and_cross(make_maps):
    cls = np.zeros((1, 1, 5, 5))
    cls[..., 0] = 1.0
    assert "'[CLS]'" in summary(cls, ["[CLS]", "a", "b", "c", "d"])[0]
    cross = make_maps(1, 2, 3, 4)
    (line,) = summary(cross, src_tokens=["s0", "s1", "s2", "s3"], tgt_tokens=["t0", "t1", "t2"])
    assert line.startswith("layer 0: head ") and "previous" not in line


def test_summarize_map_names_no_layer_or_head(make_maps):
    cls = np.zeros((1, 1, 4, 5))
    cls[..., 0] = 1.0
    line = summarize_map(prepare(cls, src_tokens=list("abcde"), tgt_tokens=list("wxyz")))
    assert line == "entropy 0.00 nats; looks at the first token 'a' (100% of queries)"
    with pytest.raises(ValueError, match="not one map"):
        summarize_map(prepare(make_maps(1, 2, 3, 3), list("abc")))


def test_tokens_that_are_not_utf8_are_named(make_maps, tmp_path):
    """A token with a lone surrogate (undecodable bytes read with surrogateescape) was a
    bare UnicodeEncodeError from writing the page ('position 7645'), and a TypeError from
    matplotlib's font code in a heatmap; now a ValueError naming the token."""
    bad = ["ok", "b\udcff"]
    with pytest.raises(ValueError, match=r"^tokens: token 1 'b\\udcff' is not valid UTF-8"):
        save_html(tmp_path / "x.html", make_maps(1, 1, 2, 2), bad)
    with pytest.raises(ValueError, match=r"^src_tokens: token 1 .* not valid UTF-8"):
        plot_alignment(make_maps(1, 1, 1, 2)[0, 0], bad, ["y"])
    with pytest.raises(ValueError, match=r"^tgt_tokens: token 0 .* not valid UTF-8"):
        prepare(make_maps(1, 1, 1, 2), src_tokens=["a", "b"], tgt_tokens=["\ud800"])
    assert not (tmp_path / "x.html").exists()


def test_summary_of_maps_without_a_positive_weight(make_maps):
    """A layer whose every weight is 0 (every query masked) was summed up as 'head 0
    (entropy inf nats) looks most at 'a' (key 0, 0% of the attention)'."""
    maps = make_maps(2, 2, 3, 3)
    maps[1] = 0.0
    lines = summary(maps, list("abc"))
    assert lines[0].startswith("layer 0: head ") and "inf" not in lines[0]
    assert (
        lines[1] == "layer 1: no attention: every weight is zero or negative (all queries masked?)"
    )
    one = prepare(np.zeros((1, 1, 2, 3)), src_tokens=list("abc"), tgt_tokens=list("xy"))
    assert summarize_map(one).startswith("no attention:")


def test_sparse_complex_and_meta_tensors(make_maps):
    """A sparse tensor was numpy's 'can't convert Sparse layout tensor to numpy'; complex
    weights lost their imaginary part with only a ComplexWarning; a meta tensor was
    'Cannot copy out of meta tensor; no data!'."""
    pytest.importorskip("matplotlib")
    t = torch.from_numpy(make_maps(1, 1, 3, 4)[0, 0])
    np.testing.assert_array_equal(as_maps(t.to_sparse())[0, 0], t.numpy())
    fig = plot_alignment(t.to_sparse(), list("abcd"), list("xyz"))
    np.testing.assert_array_equal(fig.axes[0].images[0].get_array(), t.numpy())
    for bad in (t.to(torch.complex64), t.numpy() * 1j, [t.numpy()[None] * 1j]):
        with pytest.raises(ValueError, match="^attention maps: complex values; give real"):
            as_maps(bad)
    with pytest.raises(ValueError, match="complex values"):
        plot_alignment(t.numpy() + 0j, list("abcd"), list("xyz"))
    with pytest.raises(ValueError, match="meta device holds no values"):
        as_maps(torch.empty(2, 2, device="meta"))
