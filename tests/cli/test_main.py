"""The command line's own parsing errors: one line, exit code 2."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest

import qkv
from qkv.cli import _parse, build_parser, main


@pytest.mark.parametrize(
    ("argv", "command", "says"),
    [
        (["translate", "m.safetensors", "--beam", "x"], "qkv translate", "--beam: invalid int"),
        (["translate"], "qkv translate", "required: checkpoint"),
        (["no-such-command"], "qkv", "invalid choice: 'no-such-command'"),
        (["show", "text", "--layer", "2.5"], "qkv show", "argument --layer: invalid int value"),
        (["data"], "qkv data", "required: SUBCOMMAND"),
        (["lab", "heads", "--no-such-flag"], "qkv", "unrecognized arguments: --no-such-flag"),
    ],
)
def test_bad_arguments_are_one_line_naming_the_command_and_exit_2(argv, command, says, capsys):
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err, err
    assert err.startswith(f"{command}: error: ") and f"(see {command} --help)" in err


@pytest.mark.parametrize(
    ("out", "says"),
    [
        ("taken", "taken: is a file, where a folder is needed"),
        ("taken/inside", "taken/inside: a part of this path is a file, not a folder"),
    ],
)
def test_a_file_where_an_output_folder_goes_is_named_as_such(out, says, tmp_path, capsys):
    taken = tmp_path / "taken"
    taken.write_text("not a folder")
    assert main(["lab", "word-order", "--quick", "--out", str(tmp_path / out)]) == 2
    err = capsys.readouterr().err
    assert err == f"qkv lab: error: {tmp_path}/{says}\n"
    assert taken.read_text() == "not a folder"


def _subcommands(parser):
    """(name, parser) of every command and subcommand below ``parser``."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield name, sub
                yield from _subcommands(sub)


def test_every_argument_says_what_it_is_in_help():
    """``qkv show --help`` listed TEXT, TEXT_B, --layer and --head with no word on them;
    so did train's CONFIG and --set, and translate's CHECKPOINT, --beam and --batch-size."""
    bare = [
        f"{name} {action.dest}"
        for name, sub in _subcommands(build_parser())
        for action in sub._actions
        if not isinstance(action, (argparse._HelpAction, argparse._SubParsersAction))
        and not action.help
    ]
    assert bare == []


def test_version_prints_the_version(capsys):
    """``qkv --version`` was an error (unrecognized arguments); it prints the version."""
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out == f"qkv {qkv.__version__}\n"


def test_words_after_the_options_of_translate_are_sentences_and_options_stay_checked():
    args = _parse(build_parser(), ["translate", "m.safetensors", "--beam", "2", "a b", "c"])
    assert args.sentences == ["a b", "c"] and args.beam == 2
    assert _parse(build_parser(), ["translate", "m", "a", "--beam", "2", "b"]).sentences == [
        "a",
        "b",
    ]
    for argv in (["translate", "m", "--beam", "2", "a", "--nope"], ["show", "t", "u", "v"]):
        with pytest.raises(SystemExit) as stop:
            _parse(build_parser(), argv)
        assert stop.value.code == 2


def _python_m_qkv(*args: str, world_size: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, WORLD_SIZE=world_size)
    cmd = [sys.executable, "-m", "qkv", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)


def test_a_process_of_torchrun_exits_with_all_its_output_and_its_code(tmp_path):
    """Under torchrun (WORLD_SIZE > 1) ``python -m qkv`` ends without the interpreter's
    finalization: what it wrote to a pipe still arrives, and its exit code is main's."""
    ran = _python_m_qkv("walkthrough", "나는 너를 사랑해", world_size="2")
    assert ran.returncode == 0, ran.stderr
    assert "사랑해" in ran.stdout and ran.stdout.endswith("\n")
    plain = _python_m_qkv("walkthrough", "나는 너를 사랑해", world_size="1")
    assert ran.stdout == plain.stdout
    bad = _python_m_qkv("train", str(tmp_path / "none.yaml"), world_size="2")
    assert bad.returncode == 2
    assert bad.stderr == f"qkv train: error: {tmp_path / 'none.yaml'}: no such config file\n"


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["generate", "DIR", "--chat", "Write"], {"model": "DIR", "prompt": "Write", "chat": True}),
        (["chat", "--system", "be brief", "M"], {"model": "M", "system": "be brief"}),
        (["show", "A", "--out", "x.html", "B"], {"text": "A", "text_b": "B", "out": "x.html"}),
        (["translate", "C", "S1", "--beam", "2", "S2"], {"sentences": ["S1", "S2"], "beam": 2}),
        (["evaluate", "--beam", "2", "C", "--split", "test"], {"checkpoint": "C", "beam": 2}),
        (["train", "--set", "a=1", "C.yaml", "--set", "b=2"], {"config": "C.yaml"}),
        (["sample", "--tokens", "3", "C", "--seed", "1"], {"checkpoint": "C", "tokens": 3}),
        (["walkthrough", "--heads", "2", "S S"], {"sentence": "S S", "heads": 2}),
        (["lab", "--quick", "heads"], {"name": "heads", "quick": True}),
        (["bench", "--quick", "llama"], {"name": "llama", "quick": True}),
        (["data", "download", "--cache", "X", "multi30k"], {"name": "multi30k", "cache": "X"}),
        (["demo", "--quick"], {"quick": True}),
    ],
    ids=lambda v: v[0] if isinstance(v, list) else "",
)
def test_every_command_takes_its_options_anywhere(argv, expected):
    """`qkv generate DIR --chat "Write ..."` was 'unrecognized arguments': argparse stops a
    command's positional arguments at its first option. Each command now reads its
    arguments intermixed."""
    args = vars(_parse(build_parser(), argv))
    assert {key: args[key] for key in expected} == expected
