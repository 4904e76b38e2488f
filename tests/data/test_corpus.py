"""Reading and validating parallel corpora."""

from __future__ import annotations

import io
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qkv.data.corpus import (
    CHARS_PER_WORD,
    CorpusError,
    decode_lines,
    filter_pairs,
    read_lines,
    read_parallel,
    read_stdin,
    read_stream,
    read_tsv,
)
from tests.models.memory_helpers import MAX_RSS, run_bounded


def _write(path, lines, end="\n"):
    path.write_text(end.join(lines) + end, encoding="utf-8")
    return path


def test_line_count_mismatch_names_both_files(tmp_path):
    a = _write(tmp_path / "a.ko", ["하나", "둘", "셋"])
    b = _write(tmp_path / "b.en", ["one", "two"])
    with pytest.raises(CorpusError) as info:
        read_parallel(a, b)
    message = str(info.value)
    assert str(a) in message and str(b) in message and "3" in message and "2" in message
    assert "\n" not in message


def test_invalid_utf8_names_file_and_line(tmp_path):
    bad = tmp_path / "bad.de"
    bad.write_bytes(b"eins\nzw\xc3\xb6i\n" + b"dr\xffei\nvier\n")
    good = _write(tmp_path / "good.en", ["one", "two", "three", "four"])
    with pytest.raises(CorpusError, match=r"bad\.de: line 3, byte 3: not valid UTF-8"):
        read_parallel(bad, good)
    with pytest.raises(CorpusError, match="cannot read"):
        read_lines(tmp_path / "missing.txt")


def test_filters_are_counted(tmp_path):
    src = ["ein Hund", "", "ja", "a b c d e f g h", "zwei Katzen schlafen", "   "]
    tgt = ["a dog", "nothing", "yes it is really true that", "x y z", "two cats sleep", "x"]
    corpus = read_parallel(
        _write(tmp_path / "s", src), _write(tmp_path / "t", tgt), max_len=6, max_ratio=2.5
    )
    assert corpus.src == ["ein Hund", "zwei Katzen schlafen"]
    assert corpus.tgt == ["a dog", "two cats sleep"]
    r = corpus.report
    assert (r.total, r.kept, r.empty, r.too_long, r.ratio) == (6, 2, 2, 1, 1)
    assert "kept 2 of 6" in r.summary()


def test_a_side_without_spaces_is_too_long_by_its_characters():
    """One 300,000-character "word" passed a 100-word limit, then took minutes in BPE
    training; the character bound drops it, and keeps an unsegmented Chinese sentence."""
    junk = "ab" * 150_000
    chinese = "我们昨天在公园里看见了一只很大的狗" * 8  # 136 characters, no spaces
    near = "x" * (CHARS_PER_WORD * 10)  # exactly at the bound for max_len 10
    corpus = filter_pairs(
        ["a dog", junk, chinese, near, near + "x"],
        [junk, "junk", "a big dog", "x", "y"],
        source="t",
        max_len=10,
        max_ratio=None,
    )
    assert corpus.src == [chinese, near]
    assert corpus.report.too_long == 3
    assert len(filter_pairs([junk], ["y"], source="t", max_len=None).src) == 1


def test_line_separators_inside_sentences_do_not_split(tmp_path):
    # U+2028 and U+0085 are line breaks for str.splitlines but ordinary text for a corpus
    src = _write(tmp_path / "s", ["a\u2028b", "c\x85d"], end="\r\n")
    tgt = _write(tmp_path / "t", ["x", "y"])
    corpus = read_parallel(src, tgt, max_ratio=None)
    assert corpus.src == ["a\u2028b", "c\x85d"]


def test_a_byte_order_mark_is_not_part_of_the_first_sentence(tmp_path):
    """Windows editors save UTF-8 with a byte order mark (U+FEFF) in front."""
    src = tmp_path / "s.ko"
    src.write_bytes("\ufeff하나\n둘\n".encode())
    tgt = _write(tmp_path / "t.en", ["one", "two"])
    assert read_parallel(src, tgt, max_ratio=None).src == ["하나", "둘"]
    assert read_lines(src)[0] == "하나"


def test_cr_only_line_ends_are_refused(tmp_path):
    """A file with classic Mac OS line ends (CR, no LF) was read as one line: two such
    files passed the line-count check as one giant pair, and evaluated as one sentence."""
    mac = tmp_path / "mac.de"
    mac.write_bytes(b"eins\rzwei\rdrei\r")
    with pytest.raises(CorpusError, match=r"mac\.de: lines end in CR only .*convert them to LF"):
        read_parallel(mac, mac)
    mac.write_bytes(b"eins\r")  # one line with a CR end is still one line
    assert read_lines(mac) == ["eins"]
    mac.write_bytes(b"ei\rns\nzwei\n")  # a CR inside a line of an LF file is text
    assert read_lines(mac) == ["ei\rns", "zwei"]


def test_a_compressed_corpus_is_named_as_such(tmp_path):
    """Multi30k's official files are gzip-compressed; given as they are, the message was
    "line 1, byte 2: not valid UTF-8 (byte 0x8b)", which hides what is wrong."""
    import gzip

    packed = tmp_path / "train.de.gz"
    packed.write_bytes(gzip.compress(b"ein Hund\n"))
    with pytest.raises(CorpusError, match=r"train\.de\.gz: is gzip-compressed; decompress it"):
        read_lines(packed)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return tmp_path_factory.mktemp("lines") / "f.txt"


@settings(max_examples=50, deadline=None)
@given(st.lists(st.text(st.characters(blacklist_characters="\n\r\0", codec="utf-8")), max_size=20))
def test_read_lines_round_trips(scratch, lines):
    path = scratch
    path.write_bytes("".join(line + "\n" for line in lines).encode("utf-8"))
    assert read_lines(path) == [
        line.removeprefix("\ufeff") if i == 0 else line for i, line in enumerate(lines)
    ]


def test_tsv_columns_and_errors(tmp_path):
    path = _write(tmp_path / "c.tsv", ["Go.\t가.\tCC-BY #1", "", "Hi.\t안녕.\tCC-BY #2"])
    corpus = read_tsv(path, src_column=1, tgt_column=0)
    assert corpus.pairs() == [("가.", "Go."), ("안녕.", "Hi.")]
    assert corpus.report.empty == 1
    broken = _write(tmp_path / "broken.tsv", ["Go.\t가.", "Hi."])
    with pytest.raises(CorpusError, match=r"broken\.tsv: line 2 has 1 tab-separated columns"):
        read_tsv(broken)
    with pytest.raises(CorpusError, match="different columns"):
        read_tsv(path, src_column=1, tgt_column=1)


def test_filter_pairs_rejects_unequal_lists():
    with pytest.raises(CorpusError, match="1 source but 2 target"):
        filter_pairs(["a"], ["b", "c"], source="lists")


def test_multi30k(shared_data):
    m30k = shared_data / "multi30k"
    corpus = read_parallel(m30k / "val.de", m30k / "val.en", max_ratio=None)
    assert len(corpus) == corpus.report.total == 1014
    assert corpus.src[0].startswith("Eine Gruppe")


def test_tatoeba_tsv_matches_the_split_files(shared_data):
    tatoeba = shared_data / "ko-en" / "tatoeba"
    from_tsv = read_tsv(tatoeba / "kor.txt", src_column=1, tgt_column=0, max_ratio=None)
    from_files = read_parallel(tatoeba / "kor-eng.ko", tatoeba / "kor-eng.en", max_ratio=None)
    assert from_tsv.report.total == 5749
    assert from_tsv.pairs() == from_files.pairs()
    assert any("\uac00" <= ch <= "\ud7a3" for ch in from_tsv.src[0])
    # the default ratio filter removes only a handful of real pairs
    assert read_tsv(tatoeba / "kor.txt", src_column=1, tgt_column=0).report.ratio < 20


def test_devices_and_files_larger_than_the_bound_are_refused_unread(tmp_path):
    """A corpus at /dev/zero or /dev/urandom, or a sparse 3 GiB file (no disk, no time to
    write), was read whole: a MemoryError traceback under a 2 GiB address space (an
    out-of-memory kill without one). Devices are refused by their kind, large files by
    their size, and a file of NUL bytes after its first chunk."""
    big = tmp_path / "big.de"
    with big.open("wb") as f:
        f.truncate(3 * 2**30)
    zeros = tmp_path / "zeros.de"
    with zeros.open("wb") as f:
        f.truncate(2**29)
    code = (
        "import sys\nfrom qkv.data.corpus import CorpusError, read_lines, read_tsv\n"
        "for path in sys.argv[1:]:\n"
        "    try:\n        read_tsv(path) if path == '/dev/zero' else read_lines(path)\n"
        "    except CorpusError as err:\n        print(err)\n"
    )
    run = run_bounded(["-c", code, "/dev/zero", str(big), str(zeros)])
    assert run.returncode == 0, run.stderr[-500:]
    assert run.stdout.splitlines() == [
        "/dev/zero: not a regular file (a device, pipe or socket); "
        "give a text file with one sentence per line",
        f"{big}: 3 GiB, more than the 1 GiB qkv reads from one corpus (cut it first)",
        f"{zeros}: not text: a NUL byte at line 1, byte 1",
    ]
    assert run.max_rss < MAX_RSS


def test_a_recipe_reading_a_device_is_one_line(tmp_path):
    """``qkv train`` with ``data.train: [/dev/urandom, ...]``: the key and the file named."""
    config = tmp_path / "files.yaml"
    config.write_text(
        "data: {kind: files, train: [/dev/urandom, /dev/zero], valid: [/dev/zero, /dev/zero]}\n"
        "train: {steps: 1}\n",
        encoding="utf-8",
    )
    run = run_bounded(["-m", "qkv", "train", str(config), "--out", str(tmp_path / "run")])
    assert run.returncode == 2, run.stderr[-500:]
    assert run.stderr == (
        "qkv train: error: data.train: /dev/urandom: not a regular file (a device, pipe or "
        "socket); give a text file with one sentence per line\n"
    )
    assert run.max_rss < MAX_RSS


def test_the_bound_and_the_text_check_on_streams(tmp_path):
    path = _write(tmp_path / "a.de", ["ein Hund", "zwei Hunde"])
    assert read_lines(path, max_bytes=20) == ["ein Hund", "zwei Hunde"]
    with pytest.raises(CorpusError, match=r"a\.de: 20 bytes, more than the 19 bytes qkv reads"):
        read_lines(path, max_bytes=19)
    with open("/dev/zero", "rb") as stream:
        with pytest.raises(CorpusError, match=r"^stdin: not text: a NUL byte at line 1, byte 1$"):
            read_stream(stream, "stdin")
    with open("/dev/zero", "rb") as stream:  # the bound holds before the text check reads
        with pytest.raises(CorpusError, match=r"^stdin: not text"):
            read_stream(stream, "stdin", max_bytes=10)
    text = ("가" * 30_000).encode("utf-8")  # the first chunk ends inside a character
    assert read_stream(io.BytesIO(text), "stdin") == text
    with pytest.raises(CorpusError, match=r"^stdin: line 2, byte 3: not valid UTF-8 \(byte 0xff\)"):
        read_stream(io.BytesIO(b"ab\ncd\xff" + b"e" * 2**20), "stdin")
    with pytest.raises(CorpusError, match=r"^stdin: not text: a NUL byte at line 1, byte 2$"):
        decode_lines(b"a\0b\n", "stdin")
    with pytest.raises(CorpusError, match=r"^stdin: line 1, byte 2: not valid UTF-8"):
        decode_lines("a가".encode()[:-1], "stdin")  # cut at the very end: still an error


def test_stdin_is_read_as_lines_with_the_corpus_bound(monkeypatch):
    """stdin's bytes (its ``buffer``) are read as a file is: CRLF and a BOM dropped, a
    NUL byte or bytes that are not UTF-8 refused naming line and byte; a closed stdin
    (``<&-``: ``sys.stdin`` is None) names what the lines should have been."""
    raw = "\ufeff고양이\r\n\u2028 dog\n\n".encode()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(raw), encoding="utf-8"))
    assert read_stdin() == ["고양이", "\u2028 dog", ""]
    monkeypatch.setattr(sys, "stdin", io.StringIO("a\nb\n"))  # a text stream, no buffer
    assert read_stdin() == ["a", "b"]
    for data, message in (
        (b"a\nb \xff c\n", "stdin: line 2, byte 3: not valid UTF-8 (byte 0xff)"),
        (b"\0" * 100, "stdin: not text: a NUL byte at line 1, byte 1"),
    ):
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))
        with pytest.raises(CorpusError) as info:
            read_stdin()
        assert str(info.value).startswith(message)
    monkeypatch.setattr(sys, "stdin", None)
    with pytest.raises(CorpusError) as info:
        read_stdin("the reference translations")
    assert str(info.value) == (
        "stdin: is closed; give the reference translations on stdin, one per line"
    )
