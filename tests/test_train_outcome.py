"""What a run leaves and says when it ends: an overwritten run's files, the summary line
after a resume or an early stop, and which evaluation counts as better."""

from __future__ import annotations

import json

from qkv.models.checkpoint import load_checkpoint
from qkv.train.loop import train
from tests.train_helpers import logged_rows, tiny_dict, tiny_recipe, train_until_interrupted


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
    again = train(
        tiny_recipe(tmp_path, steps=3, save_every=8, lr=1e-4), resume=True, progress=False
    )
    assert again.steps == 3 and not again.already_done
    assert [r["step"] for r in logged_rows(tmp_path) if "loss" in r] == [1, 2, 3]


def _summary(capsys, config, *flags) -> str:
    from qkv.cli import main

    assert main(["train", str(config), *flags]) == 0
    return capsys.readouterr().out.strip().splitlines()[-1]


def test_the_summary_after_a_resume_counts_the_steps_this_run_trained(tmp_path, capsys):
    """Resumed at step 4 to step 6, the last line said 'trained 6 steps in S s' with the
    seconds and tokens/s of the 2 steps this process trained (and '1 steps' for one)."""
    config = tmp_path / "c.yaml"
    config.write_text(json.dumps(tiny_dict(tmp_path / "run", steps=4)))
    assert _summary(capsys, config).startswith("trained 4 steps in ")
    config.write_text(json.dumps(tiny_dict(tmp_path / "run", steps=6)))
    line = _summary(capsys, config, "--resume")
    assert line.startswith("trained 2 steps (from step 4 to 6) in "), line
    config.write_text(json.dumps(tiny_dict(tmp_path / "run", steps=7)))
    line = _summary(capsys, config, "--resume")
    assert line.startswith("trained 1 step (from step 6 to 7) in "), line


def test_the_summary_says_why_a_run_stopped_before_train_steps(tmp_path, capsys):
    """A run stopped by train.patience or train.max_seconds said only 'trained N steps',
    as if train.steps were N."""
    config = tmp_path / "c.yaml"
    config.write_text(json.dumps(tiny_dict(tmp_path / "run", steps=400, max_seconds=0.5)))
    line = _summary(capsys, config)
    steps = int(line.split()[1])
    assert steps < 400, "the run was not stopped by its time budget: the test shows nothing"
    assert f"; stopped at step {steps} after " in line and "train.max_seconds is 0.5" in line
    config.write_text(json.dumps(tiny_dict(tmp_path / "run", steps=4)))
    assert "stopped" not in _summary(capsys, config, "--overwrite")


def test_at_equal_bleu_the_lower_validation_loss_is_better(tmp_path, monkeypatch):
    """Early in a run every greedy BLEU is 0.00: the first evaluation stayed the best
    checkpoint (the least trained model) and train.patience stopped the run while its
    validation loss still fell. Validations scripted: (loss, BLEU) at steps 2, 4, ..."""
    import qkv.train.loop

    scores = iter([(3.0, 0.0), (2.5, 0.0), (2.9, 1.0), (2.8, 1.0), (2.85, 1.0), (2.9, 1.0)])
    monkeypatch.setattr(qkv.train.loop, "validate", lambda *args: next(scores))
    recipe = tiny_recipe(tmp_path, steps=14, eval_every=2, patience=2)
    result = train(recipe, progress=False)
    assert (result.steps, result.best_step, result.best_bleu) == (12, 8, 1.0)
    assert "2 evaluations without a better BLEU" in result.done_because
    best = load_checkpoint(tmp_path / "best.safetensors").extra["train"]
    assert (best["step"], best["best_loss"]) == (8, 2.8)


def test_ctrl_c_says_which_step_resume_continues_from(tmp_path, monkeypatch, capsys):
    """Ctrl-C printed 'interrupted' alone: not which step last.safetensors holds, nor that
    --resume continues from it (or that nothing was saved yet)."""
    import qkv.train.loop
    from qkv.cli import main

    config = tmp_path / "c.yaml"
    out = tmp_path / "run"
    config.write_text(json.dumps(tiny_dict(out, steps=9, save_every=3)))
    after_step = qkv.train.loop._Loop.after_step

    def interrupt_after(at: int):
        def step(loop):
            verdict = after_step(loop)
            if loop.state.step == at:
                raise KeyboardInterrupt
            return verdict

        return step

    for at, flags in ((2, []), (5, ["--overwrite"])):  # before the first save, then after
        monkeypatch.setattr(qkv.train.loop._Loop, "after_step", interrupt_after(at))
        assert main(["train", str(config), *flags]) == 130
        err = capsys.readouterr().err.strip().splitlines()
        if at == 2:
            assert err[-2:] == [
                f"qkv train: no checkpoint in {out} yet: a new run starts from step 0",
                "interrupted",
            ]
        else:
            saved = load_checkpoint(out / "last.safetensors").extra["train"]["step"]
            assert saved == 3
            assert err[-2:] == [
                f"qkv train: {out / 'last.safetensors'} holds step 3; --resume continues from it",
                "interrupted",
            ]


def test_the_resume_note_of_a_folder_whose_checkpoint_is_unreadable(tmp_path):
    from qkv.train.run_folder import resume_note

    (tmp_path / "last.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}garbage")
    assert resume_note(tmp_path) == (
        f"{tmp_path / 'last.safetensors'} is not a qkv checkpoint that --resume can read"
    )


def test_a_resume_keeps_a_best_checkpoint_saved_after_its_last(tmp_path, caplog):
    """Killed between saves (best at step 6, last at step 4), the resumed run took the best
    of step 4's state, older than the file: with the lr near 0 (the weights of step 4) it
    said 'best at step 4' while best.safetensors held step 6's model."""
    from qkv.models.checkpoint import saved_extra

    train_until_interrupted(tiny_recipe(tmp_path, steps=10, eval_every=2, save_every=4), step=6)
    assert saved_extra(tmp_path / "last.safetensors")["train"]["step"] == 4
    best = saved_extra(tmp_path / "best.safetensors")["train"]
    assert best["step"] == 6 == best["best_step"]  # the step-6 evaluation was the best
    frozen = tiny_recipe(tmp_path, steps=10, eval_every=2, save_every=4, lr=1e-12)
    with caplog.at_level("WARNING", logger="qkv.train.checks"):
        result = train(frozen, resume=True, progress=False)
    assert "best.safetensors holds step 6, after the resumed step 4" in caplog.text
    kept = saved_extra(tmp_path / "best.safetensors")["train"]
    assert result.best_step == kept["best_step"] == 6 and result.best_bleu == kept["best_bleu"]
