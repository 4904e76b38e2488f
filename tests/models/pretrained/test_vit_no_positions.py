"""A ViT without positions (``position_embeddings=False``): no position parameter, and
its class token reads the patches as a set, so shuffling the patches changes no logit
(float64); the same ViT with positions changes; the flag survives a checkpoint."""

from __future__ import annotations

import pytest
import torch

from qkv.models.checkpoint import load_checkpoint, save_checkpoint
from qkv.models.pretrained.vit import ViT, ViTConfig

SMALL = dict(
    image_size=8,
    patch_size=2,
    num_channels=1,
    hidden_size=16,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=32,
    num_labels=10,
)


def _shuffle_patches(images: torch.Tensor, order: torch.Tensor, patch: int) -> torch.Tensor:
    """Move the patches of ``(B, C, H, W)`` images: patch ``order[i]`` goes to place ``i``."""
    b, c, h, w = images.shape
    rows, cols = h // patch, w // patch
    # (B, C, rows, P, cols, P) -> (B, rows * cols, C, P, P)
    tiles = images.reshape(b, c, rows, patch, cols, patch).permute(0, 2, 4, 1, 3, 5)
    tiles = tiles.reshape(b, rows * cols, c, patch, patch)[:, order]
    tiles = tiles.reshape(b, rows, cols, c, patch, patch).permute(0, 3, 1, 4, 2, 5)
    return tiles.reshape(b, c, h, w)


@pytest.mark.parametrize("positions", [False, True], ids=["no-positions", "positions"])
def test_shuffled_patches_change_the_logits_only_with_positions(positions):
    torch.manual_seed(0)
    model = ViT(ViTConfig(**SMALL, position_embeddings=positions)).double().eval()
    images = torch.rand(3, 1, 8, 8, dtype=torch.float64)
    order = torch.randperm(16)
    assert not torch.equal(order, torch.arange(16))
    shuffled = _shuffle_patches(images, order, 2)
    with torch.no_grad():
        plain, moved = model(images).logits, model(shuffled).logits
    difference = (plain - moved).abs().max().item()
    if positions:
        assert difference > 1e-3
    else:
        assert difference < 1e-12


def test_without_positions_the_model_has_no_position_parameter():
    with_positions = ViT(ViTConfig(**SMALL))
    without = ViT(ViTConfig(**SMALL, position_embeddings=False))
    assert "positions" in dict(with_positions.named_parameters())
    assert "positions" not in dict(without.named_parameters())
    lost = sum(p.numel() for p in with_positions.parameters())
    lost -= sum(p.numel() for p in without.parameters())
    assert lost == (1 + 16) * 16  # one position per token (class token + 16 patches)
    with pytest.raises(ValueError, match="no positions"):
        without.positions_for(8, 8)


def test_the_flag_is_checked_and_survives_a_checkpoint(tmp_path):
    with pytest.raises(ValueError, match="position_embeddings"):
        ViTConfig(**SMALL, position_embeddings="no")
    torch.manual_seed(1)
    model = ViT(ViTConfig(**SMALL, position_embeddings=False)).eval()
    path = save_checkpoint(tmp_path / "vit.safetensors", model)
    loaded = load_checkpoint(path, training_state=False).model.eval()
    assert loaded.config.position_embeddings is False
    images = torch.rand(2, 1, 8, 8)
    with torch.no_grad():
        assert torch.equal(model(images).logits, loaded(images).logits)
