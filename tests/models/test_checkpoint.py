"""Checkpoint files: written atomically, readable as any file the user writes, no pickle."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from qkv.data.tokenizers import WordTokenizer
from qkv.models import GPT, GPTConfig, checkpoint
from qkv.models.checkpoint import (
    CheckpointError,
    build_model,
    load_checkpoint,
    save_checkpoint,
)
from tests.models.memory_helpers import GIB, MAX_RSS, run_bounded, write_safetensors


def _model():
    config = {
        "src_vocab_size": 11,
        "tgt_vocab_size": 13,
        "d_model": 16,
        "num_heads": 2,
        "num_encoder_layers": 1,
        "num_decoder_layers": 1,
        "ff_dim": 32,
        "pad_id": 0,
        "bos_id": 2,
        "eos_id": 3,
    }
    model = build_model("transformer", config)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()
    return model


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077], ids=oct)
def test_a_checkpoint_gets_the_umasks_mode(tmp_path, umask):
    before = os.umask(umask)
    try:
        path = save_checkpoint(tmp_path / "last.safetensors", _model())
        save_checkpoint(path, _model())  # replacing one too
    finally:
        os.umask(before)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask


def test_a_crash_while_writing_leaves_the_old_checkpoint(tmp_path, monkeypatch):
    path = save_checkpoint(tmp_path / "last.safetensors", old := _model())
    written = path.read_bytes()

    def half_then_die(tensors, filename, metadata=None):
        with open(filename, "wb") as f:
            f.write(written[: random.randint(1, len(written) - 1)])
        raise KeyboardInterrupt

    monkeypatch.setattr("safetensors.torch.save_file", half_then_die)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(path, _model())
    assert path.read_bytes() == written and os.listdir(tmp_path) == ["last.safetensors"]
    loaded = load_checkpoint(path).model.state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in old.state_dict().items())
    assert checkpoint.FORMAT in path.read_bytes()[:4096].decode("utf-8", "replace")


RNN_OPTIONS = {
    "src_vocab_size": 17,
    "tgt_vocab_size": 19,
    "embed_dim": 6,
    "hidden_dim": 10,
    "cell": "lstm",
    "num_layers": 2,
    "bidirectional": True,
    "attention": "luong",
    "score": "location",
    "window": "predictive",
    "window_size": 3,
    "input_feeding": False,
    "max_src_len": 14,
    "dropout": 0.125,
    "pad_id": 4,
    "bos_id": 1,
    "eos_id": 2,
}
TRANSFORMER_OPTIONS = {
    "src_vocab_size": 17,
    "tgt_vocab_size": 17,
    "d_model": 16,
    "num_heads": 4,
    "num_encoder_layers": 2,
    "num_decoder_layers": 1,
    "ff_dim": 24,
    "dropout": 0.25,
    "activation": "gelu",
    "positional": "learned",
    "max_len": 33,
    "norm_first": False,
    "share_vocab": True,
    "tie_embeddings": True,
    "pad_id": 3,
    "bos_id": 0,
    "eos_id": 5,
}


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16], ids=str)
@pytest.mark.parametrize("kind", ["rnn", "transformer"])
def test_a_model_comes_back_in_its_dtype_with_the_same_outputs(tmp_path, kind, dtype):
    """A float64 model came back as float32 (outputs ~1e-8 off), a bfloat16 one widened."""
    torch.manual_seed(0)
    options = RNN_OPTIONS if kind == "rnn" else TRANSFORMER_OPTIONS
    model = build_model(kind, options).to(dtype).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()
    loaded = load_checkpoint(save_checkpoint(tmp_path / "m.safetensors", model))
    assert loaded.model_config == options and loaded.model.config == model.config
    assert {p.dtype for p in loaded.model.state_dict().values()} == {dtype}
    if kind == "transformer":
        assert loaded.model.out.weight is loaded.model.tgt_embed.weight  # still tied
    src, tgt = torch.randint(6, 17, (3, 7)), torch.randint(6, 17, (3, 5))
    with torch.no_grad():
        expected, _ = model(src, tgt)
        got, _ = loaded.model.eval()(src, tgt)
    assert got.dtype == dtype and torch.equal(got, expected)


def _rewrite(tmp_path, change_header=None, change_tensors=None):
    """A valid RNN checkpoint, its qkv header and tensors changed, saved as bad.safetensors."""
    good = save_checkpoint(tmp_path / "good.safetensors", build_model("rnn", RNN_OPTIONS))
    with safe_open(str(good), "pt") as f:
        header = json.loads(f.metadata()["qkv"])
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    (change_header or (lambda h: None))(header)
    (change_tensors or (lambda t: None))(tensors)
    path = tmp_path / "bad.safetensors"
    save_file(tensors, str(path), metadata={"qkv": json.dumps(header)})
    return path


def _config(**changes):
    return lambda header: header["model_config"].update(changes)


@pytest.mark.parametrize(
    ("change_header", "change_tensors", "message"),
    [
        (_config(colour="red"), None, r"bad model config \(RNNSeq2SeqConfig: unknown .*'colour'"),
        (_config(hidden_dim="10"), None, r"bad model config .*hidden_dim = '10'"),
        (_config(hidden_dim=10**30), None, r"bad model config .*hidden_dim = 10+: must be <="),
        (lambda h: h.update(model_type="mamba"), None, r"bad model config .*unknown model type"),
        (_config(src_vocab_size=2**31 - 1), None, r"encoder\.embed\.weight is \(17, 6\) in the fi"),
        (None, lambda t: t.update({"model.bridge.h.bias": torch.arange(10)}), r"int64 in the"),
        (lambda h: h.pop("model_config"), None, r"corrupt qkv header: no 'model_config'"),
        (lambda h: h.update(tokenizers={"src": 3}), None, r"tokenizer 'src' is not a string"),
        (lambda h: h.update(optimizer={}), None, r"the optimizer has no param_groups"),
        (
            None,
            lambda t: t.update({"rng.torch": torch.zeros(3, dtype=torch.uint8)}),
            r"the Python RNG state is missing",
        ),
        (None, lambda t: t.update({"optim.x": torch.zeros(2)}), r"tensor name 'optim\.x'"),
    ],
    ids=[
        "unknown-key",
        "string-size",
        "huge-int",
        "model-type",
        "huge-vocab",
        "int-weights",
        "no-config",
        "tokenizer-type",
        "optimizer-groups",
        "rng-python",
        "optim-name",
    ],
)
def test_a_bad_config_or_weight_is_one_line_naming_the_file(
    tmp_path, change_header, change_tensors, message
):
    path = _rewrite(tmp_path, change_header, change_tensors)
    with pytest.raises(CheckpointError, match=f"^{path}: .*{message}") as err:
        load_checkpoint(path)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")], ids=str)
@pytest.mark.parametrize("kind", ["rnn", "transformer"])
def test_weights_that_are_not_finite_are_refused_naming_the_tensor(tmp_path, kind, bad):
    """A NaN or infinite weight loaded silently and translated to garbage."""
    model = build_model(kind, RNN_OPTIONS if kind == "rnn" else TRANSFORMER_OPTIONS)
    name, weight = random.choice(list(model.named_parameters()))
    with torch.no_grad():
        weight.view(-1)[random.randrange(weight.numel())] = bad
    optimizer = torch.optim.AdamW(model.parameters())
    path = save_checkpoint(
        tmp_path / "bad.safetensors", model, optimizer=optimizer, rng=checkpoint.rng_state()
    )
    saved = sorted(f"model.{k}" for k, v in model.state_dict().items() if not v.isfinite().all())
    assert f"model.{name}" in saved  # more than one when the weight is tied
    what = "NaN" if bad != bad else "inf"
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(path)
    line = f"{path}: corrupt weights: {saved[0]} holds 1 {what} of {weight.numel()} values"
    assert str(err.value).startswith(line) and "\n" not in str(err.value)
    assert ("more tensor" in str(err.value)) == (len(saved) > 1)
    kept = load_checkpoint(path, check_finite=False).model.get_parameter(name)
    assert torch.equal(kept.isfinite(), weight.isfinite())  # asked for, it loads as saved


@pytest.mark.parametrize("name", ["Adam", "SGD", "Rprop"])
def test_the_optimizer_state_comes_back_as_it_was_saved(tmp_path, name):
    """Adam's betas and Rprop's etas came back as lists (JSON), not the tuples saved."""
    torch.manual_seed(1)
    model = build_model("rnn", RNN_OPTIONS)
    kwargs = {"SGD": {"lr": 0.1, "momentum": 0.9}, "Adam": {"amsgrad": True}}.get(name, {})
    optimizer = getattr(torch.optim, name)(model.parameters(), **kwargs)
    logits, _ = model(torch.randint(6, 17, (2, 5)), torch.randint(6, 17, (2, 3)))
    (logits * torch.randn_like(logits)).sum().backward()
    optimizer.step()
    path = save_checkpoint(tmp_path / "o.safetensors", model, optimizer=optimizer)
    fresh = getattr(torch.optim, name)(model.parameters())
    fresh.load_state_dict(load_checkpoint(path).optimizer_state)
    saved, loaded = optimizer.state_dict(), fresh.state_dict()
    assert loaded["param_groups"] == saved["param_groups"]
    assert saved["state"].keys() == loaded["state"].keys()
    for pid, state in saved["state"].items():
        assert state.keys() == loaded["state"][pid].keys()
        assert all(
            torch.equal(torch.as_tensor(v), loaded["state"][pid][k]) for k, v in state.items()
        )


def test_what_a_killed_save_left_is_removed_by_the_next_save(tmp_path):
    path = tmp_path / "last.safetensors"
    code = (
        "import os, sys, safetensors.torch as st\n"
        "from qkv.models.checkpoint import save_checkpoint\n"
        "from tests.models.test_checkpoint import _model\n"
        "def die(tensors, filename, metadata=None):\n"
        "    with open(filename + '.part', 'wb') as f: f.write(b'x' * 1000)\n"
        "    os._exit(9)\n"  # like kill -9: no finally, no cleanup
        "st.save_file = die\n"
        f"save_checkpoint({str(path)!r}, _model())\n"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parents[2])
    assert run.returncode == 9
    (left,) = [p for p in tmp_path.iterdir()]
    assert left.name.startswith(".last.safetensors.") and left.is_dir()
    save_checkpoint(path, _model())  # fresh: another save may still be writing there
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([left.name, path.name])
    old = time.time() - checkpoint.STALE_TMP_S - 1
    for p in [left, *left.iterdir()]:
        os.utime(p, (old, old))
    save_checkpoint(path, _model())
    assert os.listdir(tmp_path) == [path.name]
    load_checkpoint(path)


def _translator(path: Path, **config) -> Path:
    """A tiny word-level translator checkpoint (with its tokenizers), its config changed
    by ``config`` in the header only: a file that claims what its weights do not hold."""
    words = WordTokenizer(["hi", "there"])
    options = {
        "src_vocab_size": words.vocab_size,
        "tgt_vocab_size": words.vocab_size,
        "d_model": 16,
        "num_heads": 2,
        "num_encoder_layers": 1,
        "num_decoder_layers": 1,
        "ff_dim": 32,
        "pad_id": words.pad_id,
        "bos_id": words.bos_id,
        "eos_id": words.eos_id,
    }
    tokenizers = {"src": words.to_json(), "tgt": words.to_json()}
    good = save_checkpoint(path, build_model("transformer", options), tokenizers=tokenizers)
    header = json.loads(_read(good)[0]["qkv"])
    header["model_config"].update(config)
    _resave(good, path, json.dumps(header))
    return path


def _read(path: Path) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    """The metadata and the tensors of a safetensors file."""
    with safe_open(str(path), "pt") as f:
        return f.metadata(), {k: f.get_tensor(k) for k in f.keys()}


def _resave(src: Path, dst: Path, header: str, change_tensors=None) -> Path:
    """``src``'s tensors (changed by ``change_tensors``) under the qkv header ``header``."""
    tensors = _read(src)[1]
    (change_tensors or (lambda t: None))(tensors)
    save_file(tensors, str(dst), metadata={"qkv": header})
    return dst


@pytest.mark.parametrize(
    "config, message",
    [
        # built ten million layers for hours (2.6 GB at 90 s)
        (
            {"num_encoder_layers": 10_000_000},
            "model_config.num_encoder_layers 10000000 does not match the 1 layer(s) of weights",
        ),
        # a positional table of 256 GiB: 17.2 GB allocated before the error
        ({"max_len": 2**31 - 1}, "(model_config: max_len 2147483647)"),
    ],
    ids=["layers", "max_len"],
)
def test_translate_refuses_sizes_the_weights_do_not_hold_before_allocating(
    tmp_path, config, message
):
    path = _translator(tmp_path / "claims.safetensors", **config)
    run = run_bounded(["-m", "qkv", "translate", str(path)], stdin="hi there\n")
    assert run.returncode == 2 and run.stderr.count("\n") == 1, run.stderr
    assert run.stderr.startswith(f"qkv translate: error: {path}: "), run.stderr
    assert message in run.stderr and run.max_rss < MAX_RSS, (run.stderr, run.max_rss)


QUERY = "model.encoder.layers.0.self_attn.q_proj.weight"


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize(
    "header, change_tensors, message",
    [
        (  # RecursionError
            lambda h: h[:-1] + f', "x": {_nested(100_000)}}}',
            None,
            "corrupt qkv header: not JSON that qkv reads: nested 100001 levels deep",
        ),
        (  # ValueError: Exceeds the limit (4300 digits) for integer string conversion
            lambda h: h[:-1] + f', "step": {"7" * 5000}}}',
            None,
            "corrupt qkv header: not JSON that qkv reads: an integer of 5,000 digits",
        ),
        (  # loaded; translate raised RecursionError reading the tokenizer
            lambda h: json.dumps({**json.loads(h), "tokenizers": {"src": _nested(100_000)}}),
            None,
            "tokenizer 'src' is not JSON that qkv reads: nested 100000 levels deep",
        ),
        (  # loaded; translating raised "weights are torch.float16, but its query is float32"
            lambda h: h,
            lambda t: t.update({QUERY: t[QUERY].half()}),
            f"corrupt weights: {QUERY} is torch.float16, the other weights are torch.float32",
        ),
        (  # NotImplementedError: "isfinite" not implemented for 'Float8_e4m3fn'
            lambda h: h,
            lambda t: t.update({QUERY: t[QUERY].to(torch.float8_e4m3fn)}),
            f"corrupt weights: {QUERY} is torch.float8_e4m3fn; the weights of a qkv model are",
        ),
    ],
    ids=["nested-header", "digits", "nested-tokenizer", "float16", "float8"],
)
def test_a_hostile_header_or_dtype_is_one_line_naming_the_file(
    tmp_path, header, change_tensors, message
):
    good = _translator(tmp_path / "good.safetensors")
    text = header(_read(good)[0]["qkv"])
    path = _resave(good, tmp_path / "bad.safetensors", text, change_tensors)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(path)
    assert str(err.value).startswith(f"{path}: ") and message in str(err.value)
    assert "\n" not in str(err.value) and len(str(err.value)) < 300


def test_tensors_that_are_not_needed_are_never_read(tmp_path):
    """An unknown tensor beside the weights was read whole before anything was checked,
    and so was an optimiser tensor larger than any weight (here 2 GiB of holes each)."""
    good = _translator(tmp_path / "good.safetensors")
    metadata, tensors = _read(good)
    for name in ("unused", "optim.0.exp_avg"):
        holes = {name: ((2 * GIB // 4,), torch.float32)}
        write_safetensors(tmp_path / f"{name}.safetensors", tensors, metadata=metadata, holes=holes)
    code = (
        "import sys\n"
        "from qkv.models.checkpoint import CheckpointError, load_checkpoint\n"
        "print(type(load_checkpoint(sys.argv[1]).model).__name__)\n"
        "try:\n"
        "    load_checkpoint(sys.argv[2])\n"
        "except CheckpointError as err:\n"
        "    print(err)\n"
    )
    files = [str(tmp_path / f"{name}.safetensors") for name in ("unused", "optim.0.exp_avg")]
    run = run_bounded(["-c", code, *files])
    assert run.returncode == 0 and run.max_rss < MAX_RSS, (run.stderr[-2000:], run.max_rss)
    loaded, refused = run.stdout.splitlines()
    assert loaded == "TransformerSeq2Seq"
    assert refused.startswith(f"{files[1]}: corrupt checkpoint: optimiser tensor 'optim.0.exp_avg'")


def test_a_gpt_checkpoint_of_the_old_block_layout_loads_its_weights(tmp_path):
    """GPT's blocks were ``decoder.layers.<i>.norm1/norm3/self_attn/ff`` and
    ``decoder.final_norm`` before GPT and Llama shared one decoder block: such a file's
    weights load under today's names; its optimiser state, in the old order of the
    parameters, is refused in one line."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=40, max_len=16, num_layers=2, num_heads=2, dim=16))
    path = tmp_path / "gpt.safetensors"
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randint(0, 40, (1, 5))).logits.sum().backward()
    optimizer.step()
    save_checkpoint(path, model, optimizer=optimizer)
    old = {
        name.replace("model.layers.", "model.decoder.layers.")
        .replace(".attn_norm.", ".norm1.")
        .replace(".ff_norm.", ".norm3.")
        .replace("model.final_norm.", "model.decoder.final_norm."): t
        for name, t in load_file(path).items()
    }
    with safe_open(path, "pt") as f:
        metadata = f.metadata()
    assert any(".norm1." in k for k in old) and "model.decoder.final_norm.weight" in old
    save_file(old, path, metadata=metadata)
    loaded = load_checkpoint(path, training_state=False).model
    ids = torch.randint(0, 40, (2, 7))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)
    with pytest.raises(CheckpointError, match="optimiser state, kept in the old order"):
        load_checkpoint(path)
