"""ViT and DeiT against transformers' on random small configs saved to a folder and loaded
back: logits, pooled output, hidden states and attention weights within 1e-5 in fp32, at
the configured image size and, with interpolated positions, at another; folders that do
not fit are refused in one line that names the file and the key."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
import torch

from qkv.errors import ConfigError, UserError
from qkv.models.pretrained.vit import ViT, ViTConfig, interpolate_positions

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

TOLERANCE = 1e-5
# (architecture, seed): every architecture, 1 and 3 channels, patches of 4 and 5, with and
# without pooler, one image that is not square (drawn from the seed)
CASES = [
    ("ViTModel", 0),
    ("ViTModel", 1),
    ("ViTForImageClassification", 2),
    ("ViTForImageClassification", 3),
    ("DeiTForImageClassificationWithTeacher", 4),
    ("DeiTForImageClassificationWithTeacher", 5),
    ("DeiTForImageClassification", 6),
    ("DeiTModel", 7),
]
IDS = [f"{arch}-seed{seed}" for arch, seed in CASES]
# the checks that do not depend on the architecture run on a ViT and a DeiT only
FEW = pytest.mark.parametrize("case", [CASES[0], CASES[4]], ids=[IDS[0], IDS[4]], indirect=True)


def _transformers():
    return pytest.importorskip("transformers", reason="transformers is the peer of these tests")


def _draw(architecture: str, seed: int) -> tuple[dict, bool, random.Random]:
    """A random small config (transformers' keys) and whether the model has a pooler."""
    rng = random.Random(seed)
    heads = rng.choice([1, 2, 4])
    side = rng.randint(20, 32)
    config = {
        "patch_size": rng.choice([4, 5]),
        "image_size": side if seed != 3 else [side, rng.randint(20, 32)],
        "num_channels": rng.choice([1, 3]),
        "num_hidden_layers": rng.randint(2, 4),
        "num_attention_heads": heads,
        "hidden_size": heads * rng.choice([4, 6, 8]),
        "intermediate_size": rng.randint(16, 48),
        "hidden_act": rng.choice(["gelu", "gelu_new", "relu"]),
        "layer_norm_eps": rng.choice([1e-12, 1e-6]),
        "qkv_bias": rng.random() < 0.75,
        "num_labels": rng.randint(2, 5),
        "pooler_output_size": rng.choice([None, heads * 4 + 3]),
    }
    pooler = architecture.endswith("Model") and seed % 2 == 0 or architecture == "DeiTModel"
    return config, pooler, rng


def _peer(architecture: str, seed: int):
    """The transformers model of a case, every weight moved off its initial value."""
    t = _transformers()
    config, pooler, _ = _draw(architecture, seed)
    kind = t.DeiTConfig if architecture.startswith("DeiT") else t.ViTConfig
    cls = getattr(t, architecture)
    hf_config = kind(**config, attn_implementation="eager")
    torch.manual_seed(seed)
    model = cls(hf_config, add_pooling_layer=pooler) if cls.__name__.endswith("Model") else None
    model = model if model is not None else cls(hf_config)
    with torch.no_grad():  # DeiT starts its tokens and positions at zero: make them count
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return model.eval()


@pytest.fixture(scope="module", params=CASES, ids=IDS)
def case(request, tmp_path_factory):
    architecture, seed = request.param
    peer = _peer(architecture, seed)
    folder = tmp_path_factory.mktemp(f"{architecture}-{seed}")
    peer.save_pretrained(folder)
    return architecture, seed, peer, folder


def _max_diffs(ours, ref) -> dict[str, float]:
    """The largest absolute difference of every output the two models share."""
    diffs = {}
    for name in ("logits", "pooler_output", "last_hidden_state", "cls_logits"):
        a, b = getattr(ours, name), getattr(ref, name, None)
        if b is None:  # transformers' classifiers do not return the last hidden state
            assert a is None or name == "last_hidden_state", name
            continue
        assert a is not None and a.shape == b.shape, name
        diffs[name] = (a - b).abs().max().item()
    if ours.distillation_logits is not None:
        diffs["distillation_logits"] = (
            (ours.distillation_logits - ref.distillation_logits).abs().max().item()
        )
    assert len(ours.hidden_states) == len(ref.hidden_states)
    assert len(ours.attentions) == len(ref.attentions)
    diffs["hidden_states"] = max(
        (a - b).abs().max().item()
        for a, b in zip(ours.hidden_states, ref.hidden_states, strict=True)
    )
    for a, b in zip(ours.attentions, ref.attentions, strict=True):
        assert a.shape == b.shape
    diffs["attentions"] = max(
        (a - b).abs().max().item() for a, b in zip(ours.attentions, ref.attentions, strict=True)
    )
    return diffs


def _compare(case, image_hw: tuple[int, int], interpolate: bool) -> dict[str, float]:
    architecture, seed, peer, folder = case
    ours = ViT.from_pretrained(folder)
    channels = peer.config.num_channels
    pixels = torch.randn(3, channels, *image_hw, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        out = ours(pixels, need_weights=True, interpolate_pos_encoding=interpolate)
        ref = peer(
            pixels,
            output_attentions=True,
            output_hidden_states=True,
            interpolate_pos_encoding=interpolate,
        )
    tokens = ours.config.num_special_tokens + (image_hw[0] // ours.config.patch_hw[0]) * (
        image_hw[1] // ours.config.patch_hw[1]
    )
    heads = ours.config.num_attention_heads
    assert out.attentions[0].shape == (3, heads, tokens, tokens)
    assert len(out.hidden_states) == ours.config.num_hidden_layers + 1
    diffs = _max_diffs(out, ref)
    assert max(diffs.values()) <= TOLERANCE, diffs
    return diffs


def test_outputs_match_transformers(case):
    architecture, _, peer, folder = case
    diffs = _compare(case, ViT.from_pretrained(folder).config.image_hw, interpolate=False)
    assert ("logits" in diffs) == ("For" in architecture)
    assert ("pooler_output" in diffs) == (getattr(peer, "pooler", None) is not None)
    if "logits" in diffs:
        names = tuple(peer.config.id2label[i] for i in range(peer.config.num_labels))
        assert ViT.from_pretrained(folder).config.labels == names


@FEW
def test_bfloat16_weights_give_bfloat16_outputs_near_float32(case):
    _, seed, _, folder = case
    ours, half = ViT.from_pretrained(folder), ViT.from_pretrained(folder, dtype=torch.bfloat16)
    assert half.positions.dtype == torch.bfloat16
    pixels = torch.randn(2, ours.config.num_channels, *ours.config.image_hw)
    with torch.no_grad():
        full, low = ours(pixels).last_hidden_state, half(pixels).last_hidden_state
    assert low.dtype == torch.bfloat16
    assert (low.float() - full).abs().max() <= 0.1 * full.abs().max()


def test_interpolated_positions_match_transformers(case):
    _, seed, peer, folder = case
    if not isinstance(peer.config.image_size, int):
        pytest.skip("transformers interpolates the positions of square images only")
    rng = random.Random(seed + 100)
    other = (rng.randint(14, 40), rng.randint(14, 40))
    if other == ViT.from_pretrained(folder).config.image_hw:
        other = (other[0] + 5, other[1])
    _compare(case, other, interpolate=True)


@FEW
def test_weights_are_optional_and_change_nothing(case):
    _, seed, _, folder = case
    ours = ViT.from_pretrained(folder)
    pixels = torch.randn(2, ours.config.num_channels, *ours.config.image_hw)
    with torch.no_grad():
        fast, slow = ours(pixels), ours(pixels, need_weights=True)
    assert fast.attentions == [] and len(slow.attentions) == ours.config.num_hidden_layers
    torch.testing.assert_close(fast.last_hidden_state, slow.last_hidden_state, atol=1e-5, rtol=0)


@FEW
def test_another_image_size_needs_interpolation(case):
    _, _, _, folder = case
    ours = ViT.from_pretrained(folder)
    h, w = ours.config.image_hw
    with pytest.raises(ValueError, match="interpolate_pos_encoding=True"):
        ours(torch.randn(1, ours.config.num_channels, h + 4, w))


def _edit_config(folder: Path, tmp_path: Path, **changes) -> Path:
    copy = tmp_path / "edited"
    copy.mkdir()
    for file in folder.iterdir():
        (copy / file.name).write_bytes(file.read_bytes())
    config = json.loads((copy / "config.json").read_text())
    config.update(changes)
    (copy / "config.json").write_text(json.dumps(config))
    return copy


@pytest.fixture
def deit_folder(tmp_path):
    peer = _peer("DeiTForImageClassificationWithTeacher", 4)
    peer.save_pretrained(tmp_path / "deit")
    return peer, tmp_path / "deit"


@pytest.mark.parametrize(
    "key",
    [
        "hidden_size",
        "image_size",
        "patch_size",
        "num_hidden_layers",
        "intermediate_size",
        "id2label",
    ],
)
def test_config_that_does_not_fit_the_weights_is_named(deit_folder, tmp_path, key):
    peer, folder = deit_folder
    c = peer.config
    wrong = {
        "hidden_size": c.hidden_size * 2,
        "image_size": c.image_size + c.patch_size,
        "patch_size": c.patch_size + 1,
        "num_hidden_layers": c.num_hidden_layers + 1,
        "intermediate_size": c.intermediate_size + 1,
        "id2label": {str(i): f"class {i}" for i in range(c.num_labels + 1)},
    }[key]
    edited = _edit_config(folder, tmp_path, **{key: wrong})
    with pytest.raises(ConfigError) as err:
        ViT.from_pretrained(edited)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(str(edited / "config.json")) and key in message
    assert "does not fit the weights" in message


@pytest.mark.parametrize("model_type", ["bert", "swin", None])
def test_another_model_type_is_refused_by_name(deit_folder, tmp_path, model_type):
    _, folder = deit_folder
    edited = _edit_config(folder, tmp_path, model_type=model_type)
    with pytest.raises(UserError, match=f"model_type {model_type!r} is not a Vision Transformer"):
        ViT.from_pretrained(edited)


def test_config_json_that_is_not_json_is_one_line(deit_folder, tmp_path):
    _, folder = deit_folder
    edited = _edit_config(folder, tmp_path)
    (edited / "config.json").write_text('{"model_type": "vit", ' + "[" * 500)
    with pytest.raises(ConfigError) as err:
        ViT.from_pretrained(edited)
    assert "\n" not in str(err.value) and "config.json" in str(err.value)


def test_missing_head_weight_is_named(deit_folder, tmp_path):
    safetensors = pytest.importorskip("safetensors.torch")
    _, folder = deit_folder
    edited = _edit_config(folder, tmp_path)
    state = safetensors.load_file(edited / "model.safetensors")
    del state["deit.embeddings.distillation_token"]
    safetensors.save_file(state, edited / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match="missing .*distillation_token"):
        ViT.from_pretrained(edited)


def test_a_fresh_model_classifies_and_its_positions_resize():
    torch.manual_seed(0)
    config = ViTConfig(
        image_size=16,
        patch_size=4,
        num_channels=1,
        hidden_size=12,
        num_hidden_layers=2,
        num_attention_heads=3,
        intermediate_size=24,
        num_labels=10,
    )
    model = ViT(config).eval()
    out = model(torch.randn(5, 1, 16, 16), need_weights=True)
    assert out.logits.shape == (5, 10) and out.pooler_output is None
    assert out.attentions[1].shape == (5, 3, 17, 17)
    rows = out.attentions[1].sum(-1)
    torch.testing.assert_close(rows, torch.ones_like(rows))
    same = interpolate_positions(model.positions, 1, config.grid, config.grid)
    assert same is model.positions
    bigger = interpolate_positions(model.positions, 1, config.grid, (6, 5))
    assert bigger.shape == (1, 31, 12)
    torch.testing.assert_close(bigger[:, :1], model.positions[:, :1], atol=0, rtol=0)
    assert model(torch.randn(2, 1, 24, 20), interpolate_pos_encoding=True).logits.shape == (2, 10)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"hidden_size": 10}, "not divisible by num_attention_heads"),
        ({"image_size": 3}, "smaller than patch_size"),
        ({"distillation_head": True, "num_labels": 3}, "distillation_head needs"),
        ({"hidden_act": "tanh"}, "hidden_act 'tanh' not supported"),
        ({"num_labels": 2, "labels": ("a",)}, "1 labels for num_labels 2"),
    ],
    ids=["heads", "image", "distillation", "activation", "labels"],
)
def test_impossible_configs_are_refused(changes, message):
    base = {"image_size": 16, "patch_size": 4, "hidden_size": 12, "num_attention_heads": 4}
    with pytest.raises(ValueError, match=message):
        ViTConfig(**{**base, **changes})


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("hidden_size", "16"),
        ("image_size", True),
        ("patch_size", [4, 4, 4]),
        ("hidden_act", "x" * 5000),
        ("id2label", {"a": "cat"}),
        ("num_attention_heads", 0),
    ],
    ids=["text-size", "bool-image", "three-sides", "long-activation", "bad-labels", "no-heads"],
)
def test_config_values_of_the_wrong_kind_are_one_short_line(deit_folder, tmp_path, key, value):
    _, folder = deit_folder
    edited = _edit_config(folder, tmp_path, **{key: value})
    with pytest.raises(ConfigError) as err:
        ViT.from_pretrained(edited)
    message = str(err.value)
    assert "\n" not in message and len(message) < 400 + len(str(edited))
    assert message.startswith(str(edited / "config.json")) and key in message
