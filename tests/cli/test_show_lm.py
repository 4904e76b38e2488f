"""``qkv show --model CHECKPOINT "TEXT"`` for a language model trained by ``qkv train``:
the causal attention of every layer and head from the model's own forward pass, and bad
input as one line, exit 2."""

from __future__ import annotations

import pytest
import torch

from qkv.models.load import load
from qkv.train.loop import train
from qkv.train.recipe import recipe_from_dict
from tests.cli.helpers import one_line_error, run_main
from tests.train.test_language import tiny_lm


@pytest.fixture(scope="module", params=["gpt", "llama"])
def run(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    d = tiny_lm(folder, request.param, steps=2, sample_tokens=0)
    d["model"]["num_layers"] = 2
    train(recipe_from_dict(d), progress=False)
    return folder / "run"


def test_the_maps_are_causal_distributions_of_every_layer_and_head(run):
    loaded = load(run)
    maps, tokens = loaded.attention("the\ncat ")
    assert maps.shape == (2, 2, 8, 8) and tokens[3] == "↵" and tokens[7] == " "
    assert torch.allclose(maps.sum(-1), torch.ones(2, 2, 8))
    assert torch.all(maps.triu(1) == 0)
    again = loaded.model.double()(
        torch.tensor([loaded.tokenizer.encode("the\ncat ")]), need_weights=True
    )  # float64: the same weights
    assert torch.allclose(maps.double(), torch.stack([a[0] for a in again.attentions]), atol=1e-5)


def test_show_writes_the_viewer(run, tmp_path, monkeypatch, capsys):
    out = tmp_path / "lm.html"
    code, stdout, err = run_main(
        monkeypatch, capsys, "show", "--model", run, "the cat", "--out", out
    )
    assert code == 0, err
    assert out.stat().st_size > 1000 and stdout.startswith(f"wrote {out}")
    assert len(stdout.strip().splitlines()) == 1 + 2  # one line per layer


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["the cat sat on the mat"], "the model reads at most 8"),
        (["the", "--layer", "5"], "--layer 5 out of range"),
        (["the", "cat"], "reads one text, not a pair"),
    ],
    ids=["longer-than-positions", "layer", "pair"],
)
def test_bad_input_is_one_line_exit_2(run, tmp_path, monkeypatch, capsys, args, match):
    out = tmp_path / "lm.html"
    code, _, err = run_main(monkeypatch, capsys, "show", "--model", run, *args, "--out", out)
    if "reads at most" in match and "llama" in str(run):  # rotary positions: no limit
        assert code == 0 and out.exists(), err
        return
    one_line_error(code, err, match)
