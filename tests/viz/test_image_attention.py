"""qkv.viz.image_attention: ``image_attention_of`` bundles the attention and the class
probabilities of one forward pass of a ViT on a grey image (given to every channel)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from qkv.models.pretrained.vit import ViT, ViTConfig
from qkv.viz.image_attention import image_attention_of

LABELS = ("zero", "one", "two")


@pytest.mark.parametrize("channels, distilled", [(1, False), (3, True)], ids=["grey", "rgb-deit"])
def test_the_bundle_holds_one_forward_pass_of_the_vit(channels, distilled):
    seed = int(torch.randint(0, 2**31, ()))
    torch.manual_seed(seed)
    config = ViTConfig(
        image_size=8,
        patch_size=4,
        num_channels=channels,
        hidden_size=8,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=16,
        distillation_token=distilled,
        num_labels=len(LABELS),
        labels=LABELS,
    )
    model = ViT(config).eval()
    pixels = np.random.default_rng(seed).random((8, 8))
    got = image_attention_of(model, pixels, LABELS, truth="one", source="test image 4")
    x = torch.as_tensor(pixels, dtype=torch.float32).expand(1, channels, 8, 8)
    with torch.no_grad():
        want = model(x, need_weights=True)
    special = 1 + distilled
    assert got.maps.shape == (2, 2, special + 4, special + 4) and got.special == special
    np.testing.assert_allclose(got.maps, torch.stack([a[0] for a in want.attentions]).numpy())
    probs = want.logits[0].double().softmax(-1).numpy()
    np.testing.assert_allclose(got.probabilities, probs, rtol=1e-12)
    assert got.labels == LABELS and got.predicted == int(probs.argmax())
    assert (got.truth, got.source, got.patch, got.grid) == ("one", "test image 4", (4, 4), (2, 2))
    np.testing.assert_array_equal(got.image, pixels)
    assert torch.is_grad_enabled()  # the call's no_grad ends with it
