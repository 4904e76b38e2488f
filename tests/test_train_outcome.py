"""What a run leaves and says when it ends: an overwritten run's files, the summary line
after a resume or an early stop, and which evaluation counts as better."""

from __future__ import annotations

from train_helpers import logged_rows, tiny_recipe, train_until_interrupted

from qkv.train import train


def test_a_new_run_interrupted_before_its_first_checkpoint_leaves_no_old_one(tmp_path):
    """--overwrite (a new run in a folder that holds one) kept the old last.safetensors
    until its first save: interrupted before it, the folder held the new run's log beside
    the old run's checkpoint, and --resume then continued the run it was told to replace,
    its log holding rows of both runs."""
    train(tiny_recipe(tmp_path, steps=8, save_every=8), progress=False)
    train_until_interrupted(tiny_recipe(tmp_path, steps=8, save_every=8, lr=1e-4), step=2)
    assert not (tmp_path / "last.safetensors").exists()
    assert not (tmp_path / "best.safetensors").exists()
    assert [r["step"] for r in logged_rows(tmp_path)] == [1, 2]
    again = train(tiny_recipe(tmp_path, steps=3, save_every=8, lr=1e-4), resume=True,
                  progress=False)  # fmt: skip
    assert again.steps == 3 and not again.already_done
    assert [r["step"] for r in logged_rows(tmp_path) if "loss" in r] == [1, 2, 3]
