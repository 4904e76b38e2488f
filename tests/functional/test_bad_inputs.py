"""Bad arguments to scaled_dot_product_attention: one line that names the argument."""

from __future__ import annotations

import pytest
import torch

import qkv

# "meta" stands for another device (a GPU) on a machine that has none.
CASES = {
    "k-on-another-device": (dict(k="meta"), r"k on meta"),
    "v-on-another-device": (dict(v="meta"), r"v on meta"),
    "mask-on-another-device": (dict(mask="meta"), r"mask is on meta"),
    "float-mask-on-another-device": (dict(mask="meta-float"), r"mask is on meta"),
    "q-a-list": (dict(q="list"), r"^q must be a tensor, got list$"),
    "k-an-array": (dict(k="numpy"), r"^k must be a tensor, got ndarray$"),
    "scale-a-string": (dict(scale="a"), r"^scale must be a number"),
    "scale-nan": (dict(scale=float("nan")), r"^scale must be a finite number"),
    "dropout-a-string": (dict(dropout_p="0.1"), r"^dropout_p must be a number in \[0, 1\)"),
    "causal-a-string": (dict(causal="no"), r"^causal must be True or False, got 'no'$"),
    "causal-none": (dict(causal=None), r"^causal must be True or False, got None$"),
    "k-float64": (dict(k="float64"), r"^q, k, v must share one floating dtype: torch.float32, "),
    "integer-qkv": (dict(q="int", k="int", v="int"), r"^q, k, v must share one floating dtype"),
    "mask-a-list": (dict(mask="list"), r"^mask must be a tensor or None, got list$"),
    "mask-of-integers": (dict(mask="int"), r"^mask must be boolean .* or float, got torch.int64$"),
}


def _arguments(change: dict):
    q, k, v = torch.randn(2, 4, 3, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 6)
    args = {"q": q, "k": k, "v": v, "mask": torch.rand(3, 5) > 0.5}
    for name, how in change.items():
        if how == "meta":
            args[name] = args[name].to("meta")
        elif how == "meta-float":
            args[name] = torch.randn(3, 5, device="meta")
        elif how == "list":
            args[name] = args[name].tolist()
        elif how == "numpy":
            args[name] = args[name].numpy()
        elif how == "float64":
            args[name] = args[name].double()
        elif how == "int":
            args[name] = (args[name] * 10).long()
    options = {
        key: value for key, value in change.items() if key in ("scale", "dropout_p", "causal")
    }
    return args, options


@pytest.mark.parametrize("backend", ["auto", "reference", "sdpa", "chunked"])
@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_argument_is_named_in_one_line(case, backend):
    change, message = CASES[case]
    args, options = _arguments(change)
    with pytest.raises(ValueError, match=message) as caught:
        qkv.scaled_dot_product_attention(**args, **options, backend=backend)
    assert "\n" not in str(caught.value)
    if options:  # attention_lse takes no dropout_p, explain_dispatch no scale
        return
    with pytest.raises(ValueError, match=message):
        qkv.attention_lse(**args, backend="chunked" if backend == "sdpa" else backend)
    with pytest.raises(ValueError, match=message):
        qkv.explain_dispatch(args["q"], args["k"], args["v"], args["mask"])


@pytest.mark.parametrize("backend", ["reference", "sdpa", "chunked"])
def test_nan_reaches_the_rows_the_docstring_says(backend):
    """A NaN key or value makes every row that sees it NaN; a NaN query gives a NaN row
    with the reference and what torch's own SDPA gives (zeros on the CPU) otherwise."""
    q, k, v = (torch.randn(2, 3, 5, 8) for _ in range(3))
    mask = torch.ones(5, 5, dtype=torch.bool).tril()  # row i sees keys 0..i
    bad_k, bad_v, bad_q = k.clone(), v.clone(), q.clone()
    bad_k[1, 2, 3, 0] = bad_v[1, 2, 3, 0] = bad_q[0, 1, 2, 4] = float("nan")
    for kk, vv in ((bad_k, v), (k, bad_v)):
        for masks in ({"mask": mask}, {"causal": True}):
            out = qkv.scaled_dot_product_attention(q, kk, vv, **masks, backend=backend)
            rows = out.isnan().any(-1)
            assert rows[1, 2, 3:].all() and rows.sum() == rows[1, 2].sum()
    for masks in ({"mask": mask}, {}):  # torch's math path, then its fused CPU kernel
        out = qkv.scaled_dot_product_attention(bad_q, k, v, **masks, backend=backend)
        peer = torch.nn.functional.scaled_dot_product_attention(bad_q, k, v, masks.get("mask"))
        fused = backend != "reference" and not masks
        want = torch.zeros(8) if fused else torch.full((8,), float("nan"))
        torch.testing.assert_close(out[0, 1, 2], want, equal_nan=True)
        torch.testing.assert_close(
            peer[0, 1, 2], torch.zeros(8) if not masks else want, equal_nan=True
        )
        assert out.isnan().any(-1).sum() == (not fused)


def test_bad_helper_arguments_are_named_in_one_line():
    q = k = v = torch.randn(1, 2, 4, 8)
    with pytest.raises(ValueError, match=r"^weight_rows must be a slice with step 1, got "):
        qkv.scaled_dot_product_attention(q, k, v, need_weights=True, weight_rows=slice(0, 4, 2))
    with pytest.raises(ValueError, match=r"^lengths must be 1-d \(B,\), got shape \(2, 1\)$"):
        qkv.padding_mask(torch.tensor([[3], [1]]))
    with pytest.raises(ValueError, match=r"^a 3-d attn_mask \(B\*H, Tq, Tk\) needs num_heads$"):
        qkv.functional.from_torch_masks(torch.zeros(4, 3, 3, dtype=torch.bool))
