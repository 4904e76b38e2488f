"""The command line's own parsing errors: one line, exit code 2."""

from __future__ import annotations

import pytest

from qkv.cli import main


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
