"""Downloads against a local HTTP server on 127.0.0.1: resume, checksums, the CLI."""

from __future__ import annotations

import gzip
import hashlib
import io
import socket
import threading
import urllib.error
import zipfile
from argparse import Namespace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from qkv.data import download as dl


class _Handler(BaseHTTPRequestHandler):
    """Serves ``server.files``; honours Range; truncates paths listed in ``server.drop``."""

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        server = self.server
        name = self.path.lstrip("/")
        server.requests.append((name, self.headers.get("Range")))
        if name not in server.files:
            self.send_error(404)
            return
        body = server.files[name]
        start = 0
        header = self.headers.get("Range")
        if header and server.ranges:
            start = int(header.removeprefix("bytes=").split("-")[0])
            if start >= len(body):
                self.send_error(416)
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(len(body) - start))
        self.end_headers()
        if name in server.drop:  # send half, then hang up: the client must resume
            server.drop.discard(name)
            self.wfile.write(body[start : start + (len(body) - start) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(body[start:])

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.files, httpd.drop, httpd.requests, httpd.ranges = {}, set(), [], True
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    httpd.url = f"http://127.0.0.1:{httpd.server_address[1]}/"
    yield httpd
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch):
    monkeypatch.setattr(dl, "BACKOFF_S", 0.0)


# about 200 kB that gzip cannot shrink much: the download takes several chunks
CONTENT = b"".join(
    b"Hunde %d %s\n" % (i, hashlib.sha256(b"%d" % i).hexdigest().encode()) for i in range(3000)
)


@pytest.fixture
def fake(monkeypatch, server):
    """A one-file gzip corpus 'fake' whose checksum is that of CONTENT."""
    spec = dl.RemoteFile("text.de.gz", "text.de", hashlib.sha256(CONTENT).hexdigest())
    monkeypatch.setitem(dl.DATASETS, "fake", dl.Dataset(server.url, (spec,), "test data"))
    server.files["text.de.gz"] = gzip.compress(CONTENT, mtime=0)
    return server


def test_multi30k_from_a_local_mirror(server, shared_data, tmp_path):
    for spec in dl.DATASETS["multi30k"].files:
        raw = (shared_data / "multi30k" / spec.local).read_bytes()
        server.files[spec.remote] = gzip.compress(raw, compresslevel=1, mtime=0)
    server.drop.add("val.de.gz")
    folder = dl.download("multi30k", cache_dir=tmp_path, base_url=server.url)
    assert folder == tmp_path / "multi30k"
    for spec in dl.DATASETS["multi30k"].files:
        assert (folder / spec.local).read_bytes() == (
            shared_data / "multi30k" / spec.local
        ).read_bytes()
    resumed = [r for name, r in server.requests if name == "val.de.gz" and r]
    assert len(resumed) == 1 and int(resumed[0][len("bytes=") : -1]) > 0
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        s.local for s in dl.DATASETS["multi30k"].files
    )


def test_dropped_connection_resumes_with_range(fake, tmp_path):
    fake.drop.add("text.de.gz")
    folder = dl.download("fake", cache_dir=tmp_path)
    assert (folder / "text.de").read_bytes() == CONTENT
    half = len(fake.files["text.de.gz"]) // 2
    assert fake.requests == [("text.de.gz", None), ("text.de.gz", f"bytes={half}-")]


def test_existing_part_file_is_continued(fake, tmp_path):
    body = fake.files["text.de.gz"]
    (tmp_path / "fake").mkdir()
    (tmp_path / "fake" / "text.de.gz.part").write_bytes(body[:1000])
    dl.download("fake", cache_dir=tmp_path)
    assert fake.requests == [("text.de.gz", "bytes=1000-")]
    assert (tmp_path / "fake" / "text.de").read_bytes() == CONTENT
    assert not list((tmp_path / "fake").glob("*.part"))


def test_server_without_range_support_restarts(fake, tmp_path):
    fake.ranges = False
    (tmp_path / "fake").mkdir()
    (tmp_path / "fake" / "text.de.gz.part").write_bytes(b"stale bytes from another file")
    dl.download("fake", cache_dir=tmp_path)
    assert (tmp_path / "fake" / "text.de").read_bytes() == CONTENT


def test_checksum_mismatch_leaves_nothing(fake, tmp_path):
    fake.files["text.de.gz"] = gzip.compress(CONTENT.replace(b"Hunde", b"Katzen"))
    with pytest.raises(dl.DownloadError, match="checksum mismatch for text.de"):
        dl.download("fake", cache_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []  # not even the corpus folder


def test_cached_file_is_not_fetched_again(fake, tmp_path):
    dl.download("fake", cache_dir=tmp_path)
    dl.download("fake", cache_dir=tmp_path)
    assert len(fake.requests) == 1


def test_zip_member(monkeypatch, server, tmp_path):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("_about.txt", "about")
        archive.writestr("kor.txt", CONTENT)
    server.files["kor-eng.zip"] = buffer.getvalue()
    spec = dl.RemoteFile("kor-eng.zip", "kor.txt", hashlib.sha256(CONTENT).hexdigest(), "kor.txt")
    monkeypatch.setitem(dl.DATASETS, "zipped", dl.Dataset(server.url, (spec,), "test"))
    folder = dl.download("zipped", cache_dir=tmp_path)
    assert (folder / "kor.txt").read_bytes() == CONTENT


def test_http_errors_and_unknown_names(fake, tmp_path):
    del fake.files["text.de.gz"]
    with pytest.raises(dl.DownloadError, match="HTTP 404"):
        dl.download("fake", cache_dir=tmp_path)
    with pytest.raises(KeyError, match="multi30k"):
        dl.download("wmt14", cache_dir=tmp_path)


def test_default_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert dl.default_cache_dir() == tmp_path / "qkv"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert dl.default_cache_dir() == tmp_path / ".cache" / "qkv"


def test_run_cli(fake, tmp_path, capsys):
    from qkv.cli.data import run_cli
    from qkv.errors import UserError

    assert run_cli(Namespace(name="fake", cache=str(tmp_path), base_url=None)) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "fake")
    with pytest.raises(UserError, match="unknown corpus 'nope'; choose one of"):
        run_cli(Namespace(name="nope", cache=str(tmp_path), base_url=None))
    fake.files["text.de.gz"] = gzip.compress(b"other")
    with pytest.raises(UserError, match="checksum mismatch"):
        run_cli(Namespace(name="fake", cache=str(tmp_path / "2"), base_url=None))


def test_missing_local_file_fails_at_once(monkeypatch, tmp_path):
    calls = []
    real = dl.urllib.request.urlopen
    monkeypatch.setattr(
        dl.urllib.request, "urlopen", lambda *a, **k: calls.append(a) or real(*a, **k)
    )
    with pytest.raises(dl.DownloadError, match="train.en.gz: No such file or directory"):
        dl.download("multi30k", cache_dir=tmp_path, base_url=(tmp_path / "none").as_uri())
    assert len(calls) == 1  # not retried: waiting does not bring a local file


def test_cli_failure_is_one_line_without_a_blank_line(tmp_path):
    import subprocess
    import sys

    url = (tmp_path / "none").as_uri()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "qkv",
            "data",
            "download",
            "multi30k",
            "--cache",
            str(tmp_path),
            "--base-url",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        f"qkv data: error: {url}/train.en.gz: No such file or directory"
    ]


def test_failure_leaves_no_folder_it_made(fake, tmp_path):
    """Offline, ``--cache new/dir``: nothing is left, neither files nor empty folders."""
    del fake.files["text.de.gz"]
    with pytest.raises(dl.DownloadError, match="HTTP 404"):
        dl.download("fake", cache_dir=tmp_path / "new" / "cache")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "fake").mkdir()  # a folder that was there before stays
    (tmp_path / "fake" / "notes.txt").write_text("mine")
    with pytest.raises(dl.DownloadError, match="HTTP 404"):
        dl.download("fake", cache_dir=tmp_path)
    assert [p.name for p in (tmp_path / "fake").iterdir()] == ["notes.txt"]


@pytest.mark.parametrize("code, tries", [(socket.EAI_NONAME, 1), (socket.EAI_AGAIN, dl.RETRIES)])
def test_an_unknown_host_fails_at_once(monkeypatch, tmp_path, code, tries):
    """Offline, the name lookup fails: no name server knows the host, and waiting (10 s
    of backoff) does not change that; a lookup that only timed out is retried."""
    calls = []

    def offline(*args, **kwargs):
        calls.append(args)
        raise urllib.error.URLError(socket.gaierror(code, "lookup failed"))

    monkeypatch.setattr(dl.urllib.request, "urlopen", offline)
    with pytest.raises(dl.DownloadError, match="lookup failed"):
        dl.download("multi30k", cache_dir=tmp_path, base_url="https://no.such.host/")
    assert len(calls) == tries


@pytest.mark.parametrize("code, tries", [(socket.EAI_NONAME, 1), (socket.EAI_AGAIN, dl.RETRIES)])
def test_offline_the_message_says_the_host_cannot_be_looked_up(monkeypatch, tmp_path, code, tries):
    """Offline, the message was the URL and the resolver's words alone ('Name or service
    not known', 'Temporary failure in name resolution'): it now names the host and says
    that the machine seems offline."""
    monkeypatch.setattr(dl, "BACKOFF_S", 0.0)

    def offline(*args, **kwargs):
        raise urllib.error.URLError(socket.gaierror(code, "Name or service not known"))

    monkeypatch.setattr(dl.urllib.request, "urlopen", offline)
    with pytest.raises(dl.DownloadError) as err:
        dl.download("multi30k", cache_dir=tmp_path, base_url="https://no.such.host/x/")
    assert str(err.value).startswith("https://no.such.host/x/train.en.gz: ")
    assert str(err.value).endswith(
        "cannot look up the host no.such.host (Name or service not known); this machine "
        "seems to be offline, or its DNS or proxy settings are wrong"
    )
    assert ("failed after" in str(err.value)) == (tries > 1)
