"""qkv.files: a file is replaced whole or not at all, and errors name it, not its temporary."""

from __future__ import annotations

import errno

import pytest

from qkv.files import replacing, write_text_atomic


def test_an_error_on_the_temporary_file_names_the_target(tmp_path):
    target = tmp_path / "missing" / "result.json"  # its folder does not exist
    with pytest.raises(FileNotFoundError) as info:
        write_text_atomic(target, "{}")
    assert info.value.filename == str(target) and info.value.errno == errno.ENOENT
    assert "result.json" in str(info.value) and ".tmp" not in str(info.value)


def test_other_errors_pass_through_and_the_old_file_stays(tmp_path):
    target, other = tmp_path / "a.txt", tmp_path / "b"
    target.write_text("old")
    with pytest.raises(FileNotFoundError) as info, replacing(target) as tmp:
        tmp.write_text("half")
        (other / "x").read_text()  # an error about another file keeps its own name
    assert info.value.filename == str(other / "x")
    assert target.read_text() == "old" and sorted(tmp_path.iterdir()) == [target]
    with replacing(target) as tmp:
        tmp.write_text("new")
    assert target.read_text() == "new" and sorted(tmp_path.iterdir()) == [target]
