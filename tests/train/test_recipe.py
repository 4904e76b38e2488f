"""qkv.train.recipe: every shipped config is valid, and recipes that cannot train are
refused when the config is read (YAML file, ``--set`` items, values), in one line."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from qkv.cli import main
from qkv.data.download import DATASETS
from qkv.train.recipe import ConfigError, DataConfig, OptimConfig, load_yaml, recipe_from_dict
from tests.train.helpers import CONFIG_FOLDER, TINY, tiny_dict

CONFIGS = sorted(CONFIG_FOLDER.glob("*.yaml"))


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
    # real data is read where `qkv data download NAME` puts it, and every file is one it fetches
    raw = yaml.safe_load(path.read_text())["data"]
    if "root" in raw:
        corpus = Path(raw["root"]).name
        assert raw["root"] == f"~/.cache/qkv/{corpus}"
        fetched = {spec.local for spec in DATASETS[corpus].files}
        named = raw.get("train", []) + raw.get("valid", []) + raw.get("test", [])
        named += raw.get("files", []) + ([raw["path"]] if "path" in raw else [])
        assert named and set(named) <= fetched


def test_unknown_keys_and_bad_values_name_the_key():
    with pytest.raises(ConfigError, match="train.lrr: unknown key"):
        recipe_from_dict({"train": {"lrr": 1}})
    with pytest.raises(ConfigError, match="train.lr: must be > 0"):
        recipe_from_dict({"train": {"lr": -1.0}})
    with pytest.raises(ConfigError, match=r"^model.num_heads: must divide d_model=30, got 4$"):
        recipe_from_dict({"model": {"type": "transformer", "d_model": 30, "num_heads": 4}})
    with pytest.raises(ConfigError, match=r"^model.d_model: must be >= 1, got -1$"):
        recipe_from_dict({"model": {"type": "transformer", "d_model": -1}})
    with pytest.raises(ConfigError, match=r"^model.d_modl: unknown key for type rnn; known: "):
        recipe_from_dict({"model": {"type": "rnn", "d_modl": 4}})
    with pytest.raises(ConfigError, match=r"^model.pad_id: set from the tokenizer"):
        recipe_from_dict({"model": {"type": "rnn", "pad_id": 4}})
    with pytest.raises(ConfigError, match="model.type"):
        recipe_from_dict({"model": {"type": "lstm"}})
    with pytest.raises(ConfigError, match="data.kind"):
        recipe_from_dict({"data": {"kind": "web"}})
    with pytest.raises(ConfigError, match="train.steps: expected int"):
        recipe_from_dict({"train": {"steps": "many"}})


def test_yaml_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(TINY))
    r = load_yaml(path, ["train.lr=0.5", "model.d_model=64", "name=other"])
    assert r.train.lr == 0.5 and r.model["d_model"] == 64 and r.name == "other"
    with pytest.raises(ConfigError, match=r"--set train.nope=1: train.nope: unknown key"):
        load_yaml(path, ["train.nope=1"])


def test_share_vocab_without_a_joint_tokenizer_is_refused_by_name(tmp_path, capsys):
    """It was a ValueError traceback (exit 1) from the model's config, once the two
    tokenizers were built (their vocabulary sizes differ)."""
    d = tiny_dict(tmp_path / "out")
    d["model"]["share_vocab"] = True
    with pytest.raises(ConfigError, match=r"^model.share_vocab: .*set tokenizer.joint: true$"):
        recipe_from_dict(d)
    config = tmp_path / "c.yaml"
    config.write_text(json.dumps(d))
    assert main(["train", str(config)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"qkv train: error: {config}: model.share_vocab")
    d["tokenizer"]["joint"] = True
    assert recipe_from_dict(d).model["share_vocab"] is True


def test_a_section_left_empty_takes_its_defaults(tmp_path):
    """``data:`` with every key commented out is YAML null: it was refused ('data:
    expected a mapping, got NoneType'), and ``--set data.kind=toy`` on it said 'data is
    not a section'. An empty section now means its defaults, as a missing one does."""
    config = tmp_path / "c.yaml"
    config.write_text("data:\n  # kind: toy\ntrain:\n", encoding="utf-8")
    recipe = load_yaml(config)
    assert recipe.data == DataConfig() and recipe.train == OptimConfig()
    recipe = load_yaml(config, ["data.n_train=500", "train.steps=3"])
    assert recipe.data.n_train == 500 and recipe.train.steps == 3
    config.write_text("data: 5\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="data: expected a mapping, got int"):
        load_yaml(config)


@pytest.mark.parametrize(
    "content, sets, where",
    [
        ("train: {lr: 0.01}\n", ["train.lr=abc"], "--set train.lr=abc: train.lr: expected float"),
        (
            "train: {lr: 0.01}\n",
            ["train.steps=2", "train.betas=[a, 1]"],
            "--set train.betas=[a, 1]: train.betas[0]: expected float, got 'a'",
        ),
        (
            "model: {type: rnn}\n",
            ["model.dropout=2"],
            "--set model.dropout=2: model.dropout: must be in [0, 1), got 2",
        ),
        (
            "data: {kind: toy, max_len: 6}\n",
            ["data.min_len=7", "train.lr=1"],
            "--set data.min_len=7: data.min_len: the toy corpus needs",
        ),
        # another key's check that this --set fails: the file and every --set are named
        (
            "data: {kind: toy, min_len: 4}\n",
            ["data.max_len=3"],
            "c.yaml with --set data.max_len=3: data.min_len: the toy corpus needs",
        ),
        # the file alone is wrong: the --set of another key in its section is not blamed
        (
            "model: {type: transformer, num_heads: 3}\n",
            ["model.dropout=0.2"],
            "c.yaml: model.num_heads: must divide d_model=256, got 3",
        ),
        (
            "train: {lr: -1}\n",
            ["train.lr=-2", "train.lr=0.5", "train.steps=0"],
            "--set train.steps=0: train.steps: must be > 0",
        ),
    ],
    ids=[
        "value",
        "one-of-two",
        "model-field",
        "cross-key-own",
        "cross-key-other",
        "file-error",
        "last-set-wins",
    ],
)
def test_a_bad_value_given_by_set_is_named_as_the_set(tmp_path, content, sets, where):
    """Every error was prefixed with the YAML file's name, also for a value that came from
    --set: 'c.yaml: train.lr: expected float, got 'abc'' sent the user to a file whose
    train.lr was fine."""
    config = tmp_path / "c.yaml"
    config.write_text(content, encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        load_yaml(config, sets)
    message = str(err.value).replace(str(config), "c.yaml")
    assert message.startswith(where), message


@pytest.mark.parametrize("item", ["=3", "train..lr=1", "train.=1", ".lr=1", " =1"])
def test_a_set_without_a_key_is_named(tmp_path, item):
    """'--set =3' said 'c.yaml: : unknown key', '--set train..lr=1' 'train.: unknown key'."""
    config = tmp_path / "c.yaml"
    config.write_text("train: {lr: 0.01}\n", encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        load_yaml(config, ["train.steps=3", item])
    expected = f"--set {item!r}: expected SECTION.KEY=VALUE, e.g. train.lr=3e-4"
    assert str(err.value).endswith(expected)


def test_config_files_and_sets_that_cannot_be_read_are_named(tmp_path):
    good, bad = tmp_path / "c.yaml", tmp_path / "bad.yaml"
    good.write_text("train:\n  lr: 0.1\n")
    bad.write_bytes(b"train:\n  lr: 0.1 \xff\n")
    (tmp_path / "folder.yaml").mkdir()
    cases = [
        (tmp_path / "missing.yaml", [], "missing.yaml: no such config file"),
        (bad, [], "bad.yaml: not valid UTF-8 (byte 18)"),
        (tmp_path / "folder.yaml", [], "folder.yaml: is a directory, not a YAML config file"),
        (good, ["trainlr"], "c.yaml: --set 'trainlr': expected KEY=VALUE"),
        (good, ["train.lr.x=1"], "c.yaml: --set train.lr.x: lr is not a section"),
    ]
    for path, sets, message in cases:
        with pytest.raises(ConfigError) as err:
            load_yaml(path, sets)
        assert str(err.value) == f"{tmp_path}/{message}"


@pytest.mark.parametrize(
    ("section", "values", "message"),
    [
        ("data", {"path": "a.tsv"}, "data.path: read only with kind 'tsv', not 'toy'"),
        ("data", {"kind": "tsv"}, "data.path: a TSV file is needed for kind 'tsv'"),
        ("train", {"betas": 0.9}, "train.betas: expected a list, got 0.9"),
        ("train", {"clip_norm": -1}, "train.clip_norm: must be >= 0 (0: no clipping), got -1.0"),
        ("train", {"label_smoothing": 1.0}, "train.label_smoothing: must be in [0, 1), got 1.0"),
    ],
)
def test_values_that_cannot_train_name_their_key(section, values, message):
    with pytest.raises(ConfigError) as err:
        recipe_from_dict({section: values})
    assert str(err.value) == message


TOY = "data: {kind: toy, n_train: 50, n_valid: 5, n_test: 5}\ntrain: {steps: 1}\n"


FILES = "data: {kind: files, train: [a.de, a.en], valid: [b.de, b.en]}\n"


TSV = "data: {kind: tsv, path: kor.txt}\n"


def _train_error(capsys, tmp_path, content, *sets):
    """``qkv train`` on ``content``: the exit code and the one stderr line (asserted one)."""
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
    assert main(["train", str(tmp_path)]) == 2
    assert "is a directory, not a YAML config file" in capsys.readouterr().err


def test_valid_tuples_still_convert():
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


def _bounded_train(tmp_path, config, *sets, address_space=2 * 2**30):
    """``qkv train CONFIG`` in a subprocess whose address space is bounded (a plain run
    needs about 0.65 GiB): its exit code and stderr (from a file, which may be large)."""
    stderr = tmp_path / "stderr.txt"
    args = [sys.executable, "-m", "qkv", "train", str(config), "--out", str(tmp_path / "out")]
    for item in sets:
        args += ["--set", item]

    def bound():
        resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))

    with stderr.open("wb") as err:
        done = subprocess.run(args, stdout=subprocess.DEVNULL, stderr=err, preexec_fn=bound)
    return done.returncode, stderr.read_bytes()[:100_000].decode("utf-8", "replace")


def test_an_alias_bomb_is_refused_in_one_short_line(tmp_path):
    """A 500-byte config whose aliases expand to 9**8 lists: the error quoted the expanded
    value (hundreds of MB on one 'line', or a MemoryError traceback under a 2 GiB bound).
    Aliases are refused where they are written."""
    levels = ["&a [" + ", ".join(["lol"] * 9) + "]"]
    for name, below in zip("bcdefghi", "abcdefgh"):
        levels.append(f"&{name} [" + ", ".join([f"*{below}"] * 9) + "]")
    config = tmp_path / "bomb.yaml"
    config.write_text("train:\n  lr: [" + ", ".join(levels) + "]\n", encoding="utf-8")
    assert config.stat().st_size < 600
    code, err = _bounded_train(tmp_path, config)
    assert code == 2, err[:300]
    assert len(err) < 400 and err.count("\n") == 1, err[:300]
    assert err.startswith(f"qkv train: error: {config}: not valid YAML: line 2, column ")
    assert "found the alias *a: configs do not read aliases" in err


@pytest.mark.parametrize(
    "content, sets, match",
    [
        ("train: {lr: '" + "x" * 300_000 + "'}\n", [], "train.lr: expected float, got 'xxx"),
        (TOY, ["train.lr=" + "y" * 100_000], "train.lr: expected float, got 'yyy"),
        ("train:\n  ? " + "k" * 100_000 + "\n  : 1\n", [], "train.kkk"),
        (TOY, ["model.type=rnn", f"model.cell=[{'1, ' * 5_000}1]"], "model.cell: must be one of"),
        (TOY, ["train.betas=[" + "0.5, " * 5_000 + "1]"], "train.betas: expected a list of 2"),
    ],
    ids=["file-string", "set-string", "long-key", "model-list", "long-list"],
)
def test_values_quoted_in_errors_are_cut_short(capsys, tmp_path, content, sets, match):
    """Errors quoted the whole value: one 'line' as long as the value."""
    code, err = _train_error(capsys, tmp_path, content, *sets)
    assert code == 2 and match in err and len(err) < 600, err[:600]


DEEP = "[" * 50_000
# after the section under test: a recipe that YAML 1.1 reads as valid stops at its missing
# files (exit 2, another message) instead of training 5,400 steps
ABSENT = "data: {kind: files, train: [absent.de, absent.en], valid: [absent.de, absent.en]}\n"


@pytest.mark.parametrize(
    "content, sets, match",
    [
        (f"train: {{betas: {DEEP}}}\n", [], "line 1, column 64: lists and mappings nested more"),
        (TOY, [f"train.betas={DEEP}"], "--set train.betas: the value is not valid YAML (line 1"),
        ("train: {steps: 1" + "0" * 5000 + "}\n", [], "an integer of 5001 digits"),
        (TOY, ["train.seed=" + "7" * 5000], "--set train.seed: the value is not valid YAML"),
        ("train: {steps: !!int 9" + "0" * 5000 + "}\n", [], "an integer of 5001 digits"),
        ("train: {steps: !!float abc}\n", [], "line 1, column 16: 'abc' is not a !!float value"),
        ("train: {steps: 1:30:00}\n" + ABSENT, [], "train.steps: expected int, got '1:30:00'"),
        ("tokenizer: {joint: yes}\n" + ABSENT, [], "tokenizer.joint: expected bool, got 'yes'"),
        ("train: {bf16: on}\n" + ABSENT, [], "train.bf16: must be true, false or 'auto', got 'on'"),
    ],
    ids=[
        "nested-file",
        "nested-set",
        "digits-file",
        "digits-set",
        "digits-tag",
        "tag-value",
        "base-60",
        "yes",
        "on",
    ],
)
def test_yaml_that_python_cannot_hold_is_one_line(capsys, tmp_path, content, sets, match):
    """50,000 nested '[' gave a RecursionError traceback, a 5,000-digit integer
    'ValueError: Exceeds the limit (4300 digits)', ``!!float abc`` a ValueError; YAML 1.1's
    ``1:30:00`` was the number 5400 and ``yes``/``on`` were true. Configs now follow YAML
    1.2's core schema, where those are strings that the key refuses."""
    code, err = _train_error(capsys, tmp_path, content, *sets)
    assert code == 2 and err.startswith("qkv train: error: ") and match in err, err[:400]
    assert len(err) < 400


def test_the_yaml_1_2_core_schema(tmp_path):
    """What YAML 1.1 read otherwise: ``010`` was 8, ``1:30`` 90, ``no`` false."""
    config = tmp_path / "c.yaml"
    config.write_text(
        "name: no\ndata: {n_train: 010, n_valid: 0x1F, n_test: 0o17, seed: 20_000}\n"
        "tokenizer: {joint: True}\ntrain: {lr: 5e-4, max_seconds: .inf, min_lr: ~}\n",
        encoding="utf-8",
    )
    with pytest.raises(ConfigError, match="train.min_lr: expected float, got None"):
        load_yaml(config)
    recipe = load_yaml(config, ["train.min_lr=0", "train.max_seconds=1"])
    assert recipe.name == "no" and recipe.tokenizer.joint is True
    data = recipe.data
    assert (data.n_train, data.n_valid, data.n_test, data.seed) == (10, 31, 15, 20_000)
    assert recipe.train.lr == 5e-4


def test_a_config_that_is_not_a_regular_file_is_refused(tmp_path):
    """``qkv train /dev/zero`` read the device until memory ran out (a MemoryError
    traceback under a 2 GiB bound)."""
    code, err = _bounded_train(tmp_path, "/dev/zero")
    assert code == 2, err[:300]
    assert err == "qkv train: error: /dev/zero: not a regular file, not a YAML config file\n"


def test_a_config_file_larger_than_a_recipe_is_refused(tmp_path):
    config = tmp_path / "big.yaml"
    config.write_bytes(b"# " + b"x" * 2**20 + b"\n")
    with pytest.raises(ConfigError, match=r"big.yaml: larger than 1 MiB, not a recipe$"):
        load_yaml(config)
