"""``qkv translate`` and ``qkv evaluate`` refuse a checkpoint whose weights are not
finite: one line naming the file and the tensor, exit code 2, nothing on stdout."""

from __future__ import annotations

import random

import torch

from qkv.models.checkpoint import load_checkpoint, save_checkpoint
from tests.test_evaluate import _cli, _one_line_error, ckpt  # noqa: F401 (ckpt: a fixture)


def test_a_nan_weight_is_one_line_naming_file_and_tensor(ckpt, tmp_path, monkeypatch, capsys):  # noqa: F811
    loaded = load_checkpoint(ckpt)
    name, weight = random.choice(list(loaded.model.named_parameters()))
    with torch.no_grad():
        weight.view(-1)[random.randrange(weight.numel())] = float("nan")
    bad = save_checkpoint(
        tmp_path / "nan.safetensors", loaded.model, tokenizers=loaded.tokenizers, extra=loaded.extra
    )
    first = min(f"model.{k}" for k, v in loaded.model.state_dict().items() if v.isnan().any())
    text = tmp_path / "s.txt"
    text.write_text("고양이가 쥐를 잡았다\n", encoding="utf-8")
    for args in (["translate", bad], ["evaluate", bad, "--src", text, "--ref", text]):
        code, out, err = _cli(monkeypatch, capsys, *args, stdin=b"x\n")
        _one_line_error(code, err, f"{bad}: corrupt weights: {first} holds 1 NaN of")
        assert out == ""
    code, out, _ = _cli(monkeypatch, capsys, "translate", ckpt, stdin=b"x\n")
    assert code == 0 and len(out.splitlines()) == 1  # the finite original still translates
