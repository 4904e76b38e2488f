"""Bahdanau and Luong attention: formulas, masking, local windows."""

from __future__ import annotations

import pytest
import torch

from qkv.modules.rnn_attention import BahdanauAttention, LuongAttention, masked_softmax

B, TQ, TK, D = 3, 5, 7, 8
LENGTHS = torch.tensor([7, 4, 2])


pytestmark = pytest.mark.usefixtures("one_thread")


def _inputs(dtype=torch.float64):
    query = torch.randn(B, TQ, D, dtype=dtype)
    keys = torch.randn(B, TK, D, dtype=dtype)
    mask = torch.arange(TK).unsqueeze(0) < LENGTHS.unsqueeze(1)  # (B, Tk)
    return query, keys, mask


def _naive(scores, keys, allowed):
    """Float64 masked softmax written with -inf and explicit zeros for empty rows."""
    s = scores.double().masked_fill(~allowed, float("-inf"))
    empty = ~allowed.any(-1, keepdim=True)
    w = torch.softmax(s.masked_fill(empty, 0.0), -1).masked_fill(~allowed, 0.0)
    return w @ keys.double(), w


def test_masked_softmax_gives_zero_rows_for_fully_masked_rows():
    scores = torch.randn(2, 3, 4)
    mask = torch.tensor([[True, False, True, False], [False] * 4]).unsqueeze(1)
    w = masked_softmax(scores, mask)
    assert torch.allclose(w[0].sum(-1), torch.ones(3))
    assert torch.equal(w[1], torch.zeros(3, 4))
    assert torch.equal(w[0][:, [1, 3]], torch.zeros(3, 2))
    assert torch.equal(masked_softmax(scores, None), torch.softmax(scores, -1))  # no mask


def test_bahdanau_matches_the_additive_formula():
    torch.manual_seed(0)
    attn = BahdanauAttention(D, D, hidden_dim=6).double()
    query, keys, mask = _inputs()
    context, weights = attn(query, keys, mask)
    sc = attn.score
    e = sc.v(torch.tanh(sc.query_proj(query)[:, :, None] + sc.key_proj(keys)[:, None])).squeeze(-1)
    ref_context, ref_weights = _naive(e, keys, mask[:, None, :].expand(B, TQ, TK))
    torch.testing.assert_close(weights, ref_weights)
    torch.testing.assert_close(context, ref_context)


def test_bahdanau_step_and_precomputed_keys_agree_with_the_sequence_call():
    torch.manual_seed(1)
    attn = BahdanauAttention(D, D).double()
    query, keys, mask = _inputs()
    context, weights = attn(query, keys, mask)
    projected = attn.project_keys(keys)
    for t in range(TQ):
        c_t, w_t = attn(query[:, t], keys, mask, projected_keys=projected)
        assert c_t.shape == (B, D) and w_t.shape == (B, TK)
        torch.testing.assert_close(c_t, context[:, t])
        torch.testing.assert_close(w_t, weights[:, t])


@pytest.mark.parametrize("score", ["dot", "general", "concat", "location"])
def test_global_luong_rows_sum_to_one_over_real_tokens(score):
    torch.manual_seed(2)
    attn = LuongAttention(D, D, score=score, max_len=TK).double()
    query, keys, mask = _inputs()
    context, weights = attn(query, keys, mask)
    assert weights.shape == (B, TQ, TK) and context.shape == (B, TQ, D)
    torch.testing.assert_close(weights.sum(-1), torch.ones(B, TQ, dtype=torch.float64))
    assert torch.all(weights.masked_select(~mask[:, None, :].expand_as(weights)) == 0)
    torch.testing.assert_close(context, weights @ keys)


@pytest.mark.parametrize("score", ["dot", "general"])
def test_luong_scores_match_their_formulas(score):
    torch.manual_seed(3)
    attn = LuongAttention(D, D, score=score).double()
    query, keys, mask = _inputs()
    _, weights = attn(query, keys, mask)
    w_a = torch.eye(D, dtype=torch.float64) if score == "dot" else attn.score.proj.weight
    scores = torch.einsum("bqd,de,bke->bqk", query, w_a, keys)  # h_t^T W_a h_s
    _, ref = _naive(scores, keys, mask[:, None, :].expand(B, TQ, TK))
    torch.testing.assert_close(weights, ref)


def _concat_scores(attn, query, keys):
    """Luong's concat, v_a^T tanh(W_a [h_t; h_s] + b), with W_a one matrix over the pair."""
    sc = attn.score
    w_a = torch.cat([sc.query_proj.weight, sc.key_proj.weight], 1)  # (A, Dq + Dk)
    pairs = torch.cat(
        [query[:, :, None].expand(B, TQ, TK, D), keys[:, None].expand(B, TQ, TK, D)], -1
    )  # (B, Tq, Tk, 2D)
    return (torch.tanh(pairs @ w_a.T + sc.key_proj.bias) @ sc.v.weight.T).squeeze(-1)


def _location_scores(attn, query, keys):
    """Luong's location, (W_a h_t + b)_s for the first Tk rows."""
    return (query @ attn.score.proj.weight.T + attn.score.proj.bias)[..., : keys.shape[1]]


@pytest.mark.parametrize("score", ["concat", "location"])
def test_concat_and_location_scores_match_their_formulas(score):
    torch.manual_seed(9)
    attn = LuongAttention(D, D, score=score, max_len=TK + 3).double()
    query, keys, mask = _inputs()
    context, weights = attn(query, keys, mask)
    formula = _concat_scores if score == "concat" else _location_scores
    ref_context, ref = _naive(formula(attn, query, keys), keys, mask[:, None].expand(B, TQ, TK))
    torch.testing.assert_close(weights, ref)
    torch.testing.assert_close(context, ref_context)


@pytest.mark.parametrize("score", ["dot", "concat"])
def test_appending_padding_keys_changes_nothing(score):
    torch.manual_seed(4)
    attn = LuongAttention(D, D, score=score).double()
    query, keys, mask = _inputs()
    context, weights = attn(query, keys, mask)
    pad_keys = torch.cat([keys, torch.randn(B, 3, D, dtype=torch.float64)], 1)
    pad_mask = torch.cat([mask, torch.zeros(B, 3, dtype=torch.bool)], 1)
    context2, weights2 = attn(query, pad_keys, pad_mask)
    torch.testing.assert_close(context2, context)
    torch.testing.assert_close(weights2[..., :TK], weights)
    assert torch.all(weights2[..., TK:] == 0)


@pytest.mark.parametrize("half_width", [0, 1, 2])
def test_local_monotonic_is_zero_outside_its_window(half_width):
    torch.manual_seed(5)
    attn = LuongAttention(D, D, score="general", window="monotonic", window_size=half_width)
    attn = attn.double()
    query, keys, mask = _inputs()
    step = 1
    context, weights = attn(query, keys, mask, step=step)
    t = torch.arange(step, step + TQ).view(1, TQ, 1)
    s = torch.arange(TK).view(1, 1, TK)
    allowed = ((s - t).abs() <= half_width) & mask[:, None, :]  # (B, Tq, Tk)
    assert torch.all(weights.masked_select(~allowed) == 0)
    ref_context, ref_weights = _naive(attn.score(query, keys), keys, allowed)
    torch.testing.assert_close(weights, ref_weights)
    torch.testing.assert_close(context, ref_context)
    # rows whose window holds no real token are all zero, not NaN
    empty = ~allowed.any(-1)
    assert empty.any()
    assert torch.all(weights[empty] == 0) and torch.all(context[empty] == 0)


def test_local_monotonic_steps_match_the_sequence_call():
    torch.manual_seed(6)
    attn = LuongAttention(D, D, score="dot", window="monotonic", window_size=1).double()
    query, keys, mask = _inputs()
    _, weights = attn(query, keys, mask, step=0)
    for t in range(TQ):
        _, w_t = attn(query[:, t], keys, mask, step=t)
        torch.testing.assert_close(w_t, weights[:, t])


def test_local_predictive_is_a_gaussian_weighted_window_around_p_t():
    torch.manual_seed(7)
    half_width = 2
    attn = LuongAttention(D, D, score="general", window="predictive", window_size=half_width)
    attn = attn.double()
    query, keys, mask = _inputs()
    context, weights = attn(query, keys, mask)
    # p_t = S * sigmoid(v_p^T tanh(W_p h_t)) with S the real source length
    w_p, v_p = attn.position[0].weight, attn.position[2].weight
    p = LENGTHS.double().view(B, 1) * torch.sigmoid(torch.tanh(query @ w_p.T) @ v_p.T).squeeze(-1)
    torch.testing.assert_close(attn.centre(query, mask), p)
    dist = torch.arange(TK, dtype=torch.float64).view(1, 1, TK) - p.unsqueeze(-1)
    allowed = (dist.abs() <= half_width) & mask[:, None, :]
    assert torch.all(weights.masked_select(~allowed) == 0)
    _, window_softmax = _naive(attn.score(query, keys), keys, allowed)
    gauss = torch.exp(-(dist**2) / (2 * (half_width / 2) ** 2))
    torch.testing.assert_close(weights, window_softmax * gauss)
    torch.testing.assert_close(context, weights @ keys)
    assert torch.all(weights.sum(-1) <= 1 + 1e-12)


def test_local_predictive_position_network_receives_gradients():
    torch.manual_seed(8)
    attn = LuongAttention(D, D, score="general", window="predictive", window_size=3)
    query, keys, mask = _inputs(torch.float32)
    context, _ = attn(query, keys, mask)
    context.square().sum().backward()
    for name, p in attn.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_invalid_arguments_are_rejected():
    query, keys, mask = _inputs()
    with pytest.raises(ValueError, match="dot"):
        LuongAttention(D, D + 1, score="dot")
    with pytest.raises(ValueError, match="score"):
        LuongAttention(D, score="cosine")
    with pytest.raises(ValueError, match="window"):
        LuongAttention(D, window="gaussian")
    with pytest.raises(ValueError, match="location"):
        LuongAttention(D, score="location", max_len=TK - 1).double()(query, keys, mask)
    with pytest.raises(ValueError, match="key_mask"):
        BahdanauAttention(D).double()(query, keys, mask.long())
    with pytest.raises(ValueError, match="query"):
        BahdanauAttention(D).double()(query[0, 0], keys, mask)
    with pytest.raises(ValueError, match=r"^keys must be \(B, Tk, Dk\) with B=3, got \(4, 7, 8\)$"):
        BahdanauAttention(D).double()(query, torch.cat([keys, keys[:1]]), None)
    with pytest.raises(ValueError, match=r"^window_size \(D\) is too small for 'predictive': 0$"):
        LuongAttention(D, window="predictive", window_size=0)
    with pytest.raises(ValueError, match=r"^window_size \(D\) is too small for 'monotonic': -1$"):
        LuongAttention(D, window="monotonic", window_size=-1)


def test_bahdanau_refuses_projected_keys_of_another_shape():
    """Keys projected for one sentence, (1, Tk, A), broadcast silently over a batch of 3."""
    attn = BahdanauAttention(D, D).double()
    query, keys, mask = _inputs()
    projected = attn.project_keys(keys)
    for bad in (projected[:1], projected[:, :-1], projected[..., :-1]):
        with pytest.raises(ValueError, match=r"projected_keys must be \(B, Tk, A\)"):
            attn(query[:, 0], keys, mask, projected_keys=bad)
    context, _ = attn(query[:, 0], keys, mask, projected_keys=projected)
    torch.testing.assert_close(context, attn(query[:, 0], keys, mask)[0], rtol=0, atol=0)


@pytest.mark.parametrize("window", ["monotonic", "predictive"])
def test_local_windows_refuse_a_mask_that_is_not_a_prefix(window):
    """A left-padded mask put p_t (counted from position 0) among the padding, silently."""
    torch.manual_seed(10)
    attn = LuongAttention(D, D, score="dot", window=window, window_size=2).double()
    query, keys, mask = _inputs()
    with pytest.raises(ValueError, match="prefix"):
        attn(query, keys, mask.flip(-1))  # real tokens last
    global_attn = LuongAttention(D, D, score="dot").double()
    _, weights = global_attn(query, keys, mask.flip(-1))  # global attention has no positions
    assert torch.all(weights.masked_select(~mask.flip(-1)[:, None].expand_as(weights)) == 0)


@pytest.mark.parametrize("window", ["monotonic", "predictive"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_local_windows_of_half_models_count_positions_exactly(window, dtype):
    """Positions were counted in the query's dtype: bfloat16 holds integers exactly only
    up to 256 (float16 up to 2048), so past them every window was shifted or widened
    (local-m at step 530 of 600 source tokens: all 80 rows kept other positions than in
    float64). Each row now keeps exactly the positions within D of its centre."""
    d, tk, step = 3, 2600, 2530
    m = LuongAttention(16, score="general", window=window, window_size=d).to(dtype)
    q, k = torch.randn(2, 40, 16, dtype=dtype), torch.randn(2, tk, 16, dtype=dtype)
    mask = torch.arange(tk) < torch.tensor([[tk], [tk - 7]])
    _, w = m(q, k, mask, step=step)
    centre = m.centre(q, mask, step).double()
    if window == "monotonic":
        assert torch.equal(centre[0], torch.arange(step, step + 40, dtype=torch.float64))
    inside = (torch.arange(tk).double() - centre.unsqueeze(-1)).abs() <= d
    assert torch.equal(w > 0, inside & mask[:, None]), "the window kept other positions"
