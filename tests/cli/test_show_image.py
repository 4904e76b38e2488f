"""qkv show --digit / --image on a ViT trained a few steps by ``qkv train
configs/digits-vit.yaml``: the page holds the attention and probabilities of the same
forward pass, and bad input is one line with exit code 2 (the PNG reader itself:
tests/data/test_images.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from qkv.cli import main
from qkv.data.digits import load_digit_splits
from qkv.models.checkpoint import load_checkpoint
from qkv.viz.image_page import DECIMALS
from qkv.viz.payload import extract_payload
from tests.cli.helpers import one_line_error, run_main
from tests.train.helpers import CONFIG_FOLDER

PIL = pytest.importorskip("PIL.Image", reason="PNG files are read with Pillow")
pytest.importorskip("sklearn", reason="the digits are scikit-learn's")

SETS = ["train.steps=3", "train.eval_every=3", "train.warmup=1", "train.threads=1", "data.seed=5"]
VIT = ["model.hidden_size=8", "model.num_hidden_layers=2", "model.num_attention_heads=2",
       "model.intermediate_size=16"]  # fmt: skip


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """A tiny ViT and a tiny CNN, each trained 3 steps by qkv train."""
    root = tmp_path_factory.mktemp("show-image")
    found = {}
    for kind, extra in (("vit", VIT), ("cnn", ["model.channels=[4,8]"])):
        out = root / kind
        args = ["train", CONFIG_FOLDER / f"digits-{kind}.yaml", "--out", out]
        args += [a for s in SETS + extra for a in ("--set", s)]
        assert main([str(a) for a in args]) == 0
        found[kind] = out / "best.safetensors"
    return found


def _digit_png(path, pixels: np.ndarray, scale: int = 4) -> None:
    """The digit drawn dark on white, each pixel a ``scale`` x ``scale`` block."""
    grey = np.round(255 * (1 - np.kron(pixels, np.ones((scale, scale))))).astype(np.uint8)
    PIL.fromarray(grey, mode="L").save(path)


def test_digit_page_holds_the_attention_of_one_forward_pass(
    checkpoints, tmp_path, monkeypatch, capsys
):
    out = tmp_path / "digit.html"
    code, said, err = run_main(
        monkeypatch, capsys, "show", "--digit", 7, "--model", checkpoints["vit"], "--out", out
    )
    assert code == 0, err
    test = load_digit_splits(5)["test"]
    model = load_checkpoint(checkpoints["vit"], training_state=False).model.eval()
    with torch.no_grad():
        run = model(test.images[7:8], need_weights=True)
    maps = torch.stack([a[0] for a in run.attentions]).double().numpy()
    probs = run.logits[0].double().softmax(-1).numpy()
    payload = extract_payload(out.read_text(encoding="utf-8"))
    np.testing.assert_allclose(payload["weights"], maps, atol=10.0**-DECIMALS)
    assert payload["truth"] == str(int(test.labels[7])) and payload["source"] == "test image 7"
    best = int(probs.argmax())
    assert payload["top"][0][0] == str(best)
    assert payload["top"][0][1] == pytest.approx(probs[best], abs=10.0**-DECIMALS)
    assert f"predicted {best} ({best} {100 * probs[best]:.1f}%" in said
    assert f"true class {int(test.labels[7])}" in said


def test_digit_as_a_grid_of_heads(checkpoints, tmp_path, monkeypatch, capsys):
    out = tmp_path / "digit.png"
    code, _, err = run_main(
        monkeypatch, capsys, "show", "--digit", 0, "--model", checkpoints["vit"], "--out", out
    )
    assert code == 0, err
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_image_page_escapes_the_file_name(checkpoints, tmp_path, monkeypatch, capsys):
    digit = load_digit_splits(0)["test"].images[3, 0].double().numpy()
    name = "<img src=x onerror=alert(1)>.png"
    _digit_png(tmp_path / name, digit)
    out = tmp_path / "image.html"
    code, said, err = run_main(
        monkeypatch, capsys, "show", "--image", tmp_path / name, "--model", checkpoints["vit"],
        "--out", out,
    )  # fmt: skip
    assert code == 0, err
    page = out.read_text(encoding="utf-8")
    assert "<img" not in page
    assert extract_payload(page)["source"] == name and extract_payload(page)["truth"] is None


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda p: p.write_text("GIF89a, not a PNG"), "not a PNG file"),
        (lambda p: p.write_bytes(b"\x89PNG\r\n\x1a\nbroken"), "cannot decode the PNG"),
        (lambda p: PIL.new("L", (6, 6), 255).save(p), "smaller than the model's 8x8"),
        (lambda p: PIL.new("L", (40, 12), 255).save(p), "more than 2 times as long"),
        (lambda p: PIL.new("L", (16, 16), 200).save(p), "one flat grey"),
    ],
    ids=["not-png", "truncated", "too-small", "elongated", "flat"],
)
def test_bad_images_are_one_line(checkpoints, tmp_path, monkeypatch, capsys, make, match):
    path = tmp_path / "bad.png"
    make(path)
    code, _, err = run_main(
        monkeypatch, capsys, "show", "--image", path, "--model", checkpoints["vit"]
    )
    one_line_error(code, err, match)
    assert err.startswith(f"qkv show: error: --image {path}: ")


@pytest.mark.parametrize(
    "args, match",
    [
        (["--digit", "359"], "out of range: the test split has 359 images (0..358)"),
        (["--digit", "-1"], "out of range"),
        (["--digit", "1", "--image", "x.png"], "not both"),
        (["some text", "--digit", "1"], "give no TEXT"),
        (["--digit", "1", "--layer", "0"], "--layer is for text models"),
        (["--digit", "1", "--out", "page.txt"], "unknown output type"),
    ],
    ids=["past-the-end", "negative", "both", "text", "layer", "suffix"],
)
def test_bad_requests_are_one_line(checkpoints, monkeypatch, capsys, args, match):
    code, _, err = run_main(monkeypatch, capsys, "show", *args, "--model", checkpoints["vit"])
    one_line_error(code, err, match)


def test_a_cnn_or_no_model_is_refused(checkpoints, monkeypatch, capsys):
    code, _, err = run_main(
        monkeypatch, capsys, "show", "--digit", "1", "--model", checkpoints["cnn"]
    )
    one_line_error(code, err, "a CNN has no attention to show")
    code, _, err = run_main(monkeypatch, capsys, "show", "--digit", "1")
    one_line_error(code, err, "need --model CHECKPOINT")
    code, _, err = run_main(monkeypatch, capsys, "show")
    one_line_error(code, err, "give the TEXT to show")
