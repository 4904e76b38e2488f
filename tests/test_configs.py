"""Every shipped config is valid, and the toy ones build their model."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qkv.train.recipe import load_yaml

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml"))


def test_the_expected_configs_exist():
    names = {p.stem for p in CONFIGS}
    for required in (
        "multi30k-transformer",
        "multi30k-rnn-bahdanau",
        "multi30k-rnn-luong",
        "multi30k-rnn-none",
        "tatoeba-ko-en-transformer",
        "toy-transformer",
        "toy-rnn-bahdanau",
        "toy-rnn-luong",
        "toy-rnn-none",
    ):
        assert required in names


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_config_is_valid(path):
    recipe = load_yaml(path)
    assert recipe.name == path.stem
    if recipe.data.kind == "files":
        assert all(f.startswith("../shared/data/") for f in recipe.data.train + recipe.data.valid)


TOY = "data: {kind: toy, n_train: 50, n_valid: 5, n_test: 5}\ntrain: {steps: 1}\n"
FILES = "data: {kind: files, train: [a.de, a.en], valid: [b.de, b.en]}\n"
TSV = "data: {kind: tsv, path: kor.txt}\n"


def _train_error(capsys, tmp_path, content, *sets):
    """``qkv train`` on ``content``: the exit code and the one stderr line (asserted one)."""
    from qkv.cli import main

    config = tmp_path / "c.yaml"
    config.write_text(content)
    args = ["train", str(config), "--out", str(tmp_path / "out")]
    for item in sets:
        args += ["--set", item]
    code = main(args)
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    return code, err.strip()


@pytest.mark.parametrize(
    "content, sets, match",
    [
        ("- a\n- b\n", [], "c.yaml: expected a mapping of sections at the top, got a list"),
        ("5\n", [], "c.yaml: expected a mapping of sections at the top, got a int"),
        (TOY, ["train.steps=[1"], "--set train.steps: the value is not valid YAML (line 1, col"),
        (TOY, ["train.betas=[a, b]"], "train.betas[0]: expected float, got 'a'"),
        (TOY, ["train.betas=[0.9]"], "train.betas: expected a list of 2, got [0.9]"),
        (TOY, ["train.betas=[0.9, 0.98, 0.5]"], "train.betas: expected a list of 2"),
        (TOY, ["data.min_len=20", "data.max_len=5"], "data.min_len: the toy corpus needs 2 <="),
        (TOY, ["data.test=[va.de, va.en]"], "data.test: files are read only with kind 'files'"),
        (FILES, ["data.test=[va.de]"], "data.test: give two files [SOURCE, TARGET] (or none)"),
        (FILES, ["data.train=[1, 2]"], "data.train[0]: expected str, got 1"),
        ("name: x\ndata: {kind: toy\n", [], "line 3, column 1: expected ',' or '}', but got"),
        (TOY, ["train.betas=[1.5, 0.9]"], "train.betas: each must be in [0, 1), got (1.5, 0.9)"),
        (TOY, ["train.betas=[0.9, -0.1]"], "train.betas: each must be in [0, 1)"),
        (TOY, ["train.weight_decay=-1"], "train.weight_decay: must be >= 0, got -1.0"),
        (TOY, ["train.lr=.inf"], "train.lr: must be > 0 and finite, got inf"),
        (TOY, ["train.lr=.nan"], "train.lr: must be > 0 and finite, got nan"),
        (TOY, ["train.min_lr=-0.1"], "train.min_lr: must be in [0, train.lr = 0.001]"),
        (TOY, ["train.min_lr=0.01"], "train.min_lr: must be in [0, train.lr = 0.001]"),
        (TOY, ["train.clip_norm=-1"], "train.clip_norm: must be >= 0 (0: no clipping), got -1"),
        (TOY, ["train.max_seconds=.nan"], "train.max_seconds: must be >= 0, got nan"),
        (TOY, ["data.max_ratio=0.5"], "data.max_ratio: must be >= 1 (a pair's ratio is), got 0.5"),
        (TOY, ["train=5"], "--set train=5: train: expected a mapping, got int"),
        ("data: [toy]\n", [], "c.yaml: data: expected a mapping, got list"),
        # a second section replaced the first, silently: the lr of 0.1 was lost
        (
            "train: {lr: 0.1}\n" + TOY,
            [],
            "c.yaml: not valid YAML: line 3, column 1: "
            "duplicate key 'train', first at line 1, column 1",
        ),
        ("data: {kind: toy, kind: files}\n", [], "line 1, column 19: duplicate key 'kind'"),
        # a vocabulary of the special tokens alone: every word <unk>, a model that learns nothing
        (
            TOY,
            ["tokenizer.vocab_size=4"],
            "--set tokenizer.vocab_size=4: tokenizer.vocab_size: must be > 4",
        ),
        # out of what torch and the BPE trainer take: tracebacks, or a Rust abort (2**31)
        (
            TOY,
            ["tokenizer.kind=bpe", "tokenizer.vocab_size=1000000000000000000000"],
            "--set tokenizer.vocab_size=1000000000000000000000: tokenizer.vocab_size: must be <= "
            "1048576 for bpe",
        ),
        (TOY, ["train.seed=18446744073709551616"], "train.seed: must be in [-2**63, 2**64)"),
        (
            TOY,
            ["train.threads=100000000000"],
            "--set train.threads=100000000000: train.threads: must be <=",
        ),
        # toy-only keys did nothing for files: no pair was dropped for being long
        (
            FILES,
            ["data.max_len=50"],
            "--set data.max_len=50: "
            "data.max_len: read only with kind 'toy', "
            "not 'files' (data.max_tokens drops long pairs of files)",
        ),
        (
            TSV,
            ["data.n_train=500"],
            "--set data.n_train=500: data.n_train: read only with kind 'toy'",
        ),
        (
            TSV,
            ["data.src_column=-1"],
            "--set data.src_column=-1: data.src_column: must be >= 0, got -1",
        ),
        (
            TSV,
            ["data.src_column=0"],
            "c.yaml with --set data.src_column=0: data.tgt_column: must differ",
        ),
    ],
    ids=[
        "list",
        "scalar",
        "set-yaml",
        "betas-type",
        "betas-short",
        "betas-long",
        "min-max",
        "toy-files",
        "one-test-file",
        "file-types",
        "yaml-location",
        "beta-over-1",
        "beta-negative",
        "weight-decay-negative",
        "lr-inf",
        "lr-nan",
        "min-lr-negative",
        "min-lr-over-lr",
        "clip-negative",
        "max-seconds-nan",
        "max-ratio-below-1",
        "section-scalar",
        "section-list",
        "duplicate-section",
        "duplicate-key",
        "vocab-specials-only",
        "bpe-vocab-huge",
        "seed-huge",
        "threads-huge",
        "toy-key-for-files",
        "toy-key-for-tsv",
        "tsv-column-negative",
        "tsv-same-columns",
    ],
)
def test_bad_configs_are_one_line_exit_2(capsys, tmp_path, content, sets, match):
    code, err = _train_error(capsys, tmp_path, content, *sets)
    assert code == 2 and err.startswith("qkv train: error: ") and match in err
    assert not (tmp_path / "out").exists()  # refused before anything is written


def test_bad_yaml_message_keeps_where_it_started(capsys, tmp_path):
    _, err = _train_error(capsys, tmp_path, "name: x\ndata: {kind: toy\n")
    assert "(while parsing a flow mapping started at line 2, column 7)" in err


def test_a_directory_as_config(capsys, tmp_path):
    from qkv.cli import main

    assert main(["train", str(tmp_path)]) == 2
    assert "is a directory, not a YAML config file" in capsys.readouterr().err


def test_valid_tuples_still_convert():
    from qkv.train.recipe import recipe_from_dict

    r = recipe_from_dict(
        {
            "train": {"betas": [0.8, 0]},
            "data": {"kind": "files", "train": ["a", "b"], "valid": ["c", "d"], "test": []},
        }
    )
    assert r.train.betas == (0.8, 0.0) and r.data.train == ("a", "b") and r.data.test == ()


@settings(max_examples=30, deadline=None)
@given(
    mantissa=st.sampled_from(["1", "5", "2.5", "3.", ".5", "1_0"]),
    sign=st.sampled_from(["", "-", "+"]),
    exponent=st.integers(0, 8),
    e=st.sampled_from("eE"),
)
def test_floats_in_exponent_form_are_floats(tmp_path_factory, mantissa, sign, exponent, e):
    """``lr: 5e-4`` (YAML 1.2, and how learning rates are written) is a float, in the file,
    in ``--set`` and in the model section; PyYAML alone reads it as the string '5e-4'."""
    text = f"{mantissa}{e}{sign}{exponent}"
    small = f"{mantissa}{e}-{exponent + 2}"  # below 1: a valid dropout
    path = tmp_path_factory.mktemp("c") / "c.yaml"
    path.write_text(f"train: {{lr: {text}}}\nmodel: {{type: rnn, dropout: {small}}}\n")
    recipe = load_yaml(path, [f"train.min_lr={text}"])
    value = float(text.replace("_", ""))
    assert recipe.train.lr == recipe.train.min_lr == value
    assert recipe.model["dropout"] == float(small.replace("_", ""))
    assert isinstance(recipe.model["dropout"], float)
