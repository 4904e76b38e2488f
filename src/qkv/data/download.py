"""Download public corpora into a local cache: resumable, checksummed, never half-written.

Each file is fetched into ``NAME.part`` (continued with an HTTP ``Range`` request when a
partial file is there or the connection drops), decompressed into a second ``.part``
file while its SHA-256 is computed, and moved into place with :func:`os.replace` only when
the checksum of the decompressed content matches the one recorded here. A mismatch
removes the partial files and raises :class:`DownloadError`, so a cache file that exists
is always complete and correct. Only the standard library (``urllib``) is used.

Corpora (see ``DATASETS``):

- ``multi30k``: English–German image captions (Elliott et al., 2016), train/val/
  test_2016_flickr; research and educational use only (Flickr30K terms).
- ``tatoeba-ko-en``: Korean–English Tatoeba pairs via manythings.org, CC-BY 2.0 (France);
  the checksum is that of the 2023-02-20 release, and manythings.org replaces the file
  with each release, so a newer release fails the check rather than silently changing
  the data.
- ``tinyshakespeare``: the 1,115,394 characters of Shakespeare that char-rnn (Karpathy)
  and nanoGPT's ``shakespeare_char`` train on, from char-rnn's repository (public-domain
  plays; char-rnn is MIT-licensed).
"""

from __future__ import annotations

import gzip
import hashlib
import http.client
import logging
import os
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qkv.errors import DownloadError
from qkv.files import cache_root

__all__ = ["DownloadError", "RemoteFile", "Dataset", "DATASETS", "default_cache_dir"]
__all__ += ["download", "fetch_hint"]

log = logging.getLogger(__name__)

CHUNK = 1 << 16
RETRIES = 5
TIMEOUT_S = 60.0
BACKOFF_S = 1.0  # wait before retry k: k × BACKOFF_S seconds
USER_AGENT = "qkv-data-download/0.1 (urllib)"


@dataclass(frozen=True)
class RemoteFile:
    """One file of a corpus.

    Attributes:
        remote: file name under the corpus' base URL.
        local: name of the decompressed file in the cache.
        sha256: SHA-256 of the decompressed content.
        member: for a zip archive, the member to extract; None for gzip or plain files.
    """

    remote: str
    local: str
    sha256: str
    member: str | None = None


@dataclass(frozen=True)
class Dataset:
    """A downloadable corpus: base URL and files."""

    base_url: str
    files: tuple[RemoteFile, ...]
    licence: str


_MULTI30K_SHA256 = {
    "train.en": "460a15fbd157e34a7a9957ee388c1ca247fe47af3ef25fb50442af6c274e0fc6",
    "train.de": "2c2b73fd2b548fbcde3a875e0a78d6ee94d498bfdee6bd3eae3945779e9ddf72",
    "val.en": "1f2a23d992769b5b3d209b0a10dd0b77c08cceb1f20dfb97ed0aafa49d107227",
    "val.de": "660e09eb7e1da2f856ea13ee5ad3cf6d36b3d5b0b733c857e94c5747a3dfc660",
    "test_2016_flickr.en": "399a4382932c1aadd3ceb9bef1008d388a64c76d4ae4e9d4728c6f4301cac182",
    "test_2016_flickr.de": "4be6b5b3236b79c25475c6bb829800a7ce559e9ba7a1f6c2394fe4d40be46d16",
}

DATASETS: dict[str, Dataset] = {
    "multi30k": Dataset(
        base_url="https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/",
        files=tuple(RemoteFile(f"{name}.gz", name, sha) for name, sha in _MULTI30K_SHA256.items()),
        licence="research and educational use only (Flickr30K terms); cite Elliott et al. 2016",
    ),
    "tatoeba-ko-en": Dataset(
        base_url="https://www.manythings.org/anki/",
        files=(
            RemoteFile(
                "kor-eng.zip",
                "kor.txt",
                "6c9d8de3e500306997e4083274fb0038ef521651ffb2b7923e4e607a59d09dbc",
                member="kor.txt",
            ),
        ),
        licence="CC-BY 2.0 (France); Tatoeba via manythings.org",
    ),
    "tinyshakespeare": Dataset(
        base_url="https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/",
        files=(
            RemoteFile(
                "input.txt",
                "input.txt",
                "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed",
            ),
        ),
        licence="Shakespeare's plays (public domain), collected for char-rnn (MIT), A. Karpathy",
    ),
}

Progress = Callable[[str, int, "int | None"], None]
_COMMON_NAMES = {"input.txt"}  # names that mean a corpus only inside the corpus's own folder


def fetch_hint(path: Path) -> str:
    """``"; `qkv data download CORPUS` fetches it ..."`` for a missing file of a corpus in
    :data:`DATASETS` (a file name of that corpus; a name as common as ``input.txt`` only
    in a folder named after the corpus), else ``""``."""
    for corpus, dataset in DATASETS.items():
        if not any(spec.local == path.name for spec in dataset.files):
            continue
        if path.name in _COMMON_NAMES and path.parent.name != corpus:
            continue
        folder = default_cache_dir() / corpus
        then = "" if path.parent.expanduser() == folder else f", then give --set data.root={folder}"
        return f"; `qkv data download {corpus}` fetches the corpus into {folder}{then}"
    return ""


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/qkv`` if set, else ``~/.cache/qkv``."""
    return cache_root()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def _fetch_once(url: str, part: Path, progress: Progress | None) -> None:
    """One HTTP request that continues ``part`` from its current size (Range)."""
    have = part.stat().st_size if part.exists() else 0
    headers = {"User-Agent": USER_AGENT}
    if have:
        headers["Range"] = f"bytes={have}-"
    request = urllib.request.Request(url, headers=headers)
    try:
        response = urllib.request.urlopen(request, timeout=TIMEOUT_S)
    except urllib.error.HTTPError as err:
        if err.code == 416 and have:  # nothing left to send: the part is complete
            return
        raise
    with response:
        resumed = response.status == 206
        if have and not resumed:
            log.info("%s: server ignored the Range request, starting again", url)
            have = 0
        length = response.headers.get("Content-Length")
        total = have + int(length) if length is not None else None
        with part.open("ab" if resumed else "wb") as out:
            while block := response.read(CHUNK):
                out.write(block)
                have += len(block)
                if progress is not None:
                    progress(part.name.removesuffix(".part"), have, total)
        if total is not None and have < total:
            raise ConnectionError(f"connection closed after {have} of {total} bytes")


def _lasting(url: str, err: Exception) -> bool:
    """Whether waiting cannot mend ``err``: a missing local file, or a host name that no
    name server knows (offline, or mistyped; a server that is only slow to answer, the
    resolver's EAI_AGAIN, is retried)."""
    reason = getattr(err, "reason", None)
    unknown = isinstance(reason, socket.gaierror) and reason.errno == socket.EAI_NONAME
    return url.startswith("file:") or unknown


def _fetch(url: str, part: Path, progress: Progress | None) -> None:
    """Download ``url`` into ``part``, resuming after dropped connections."""
    last: Exception | None = None
    for attempt in range(1, RETRIES + 1):
        try:
            _fetch_once(url, part, progress)
            return
        except urllib.error.HTTPError as err:
            raise DownloadError(f"{url}: HTTP {err.code} {err.reason}") from None
        except (OSError, http.client.HTTPException) as err:  # refused, reset, IncompleteRead
            if _lasting(url, err):
                raise DownloadError(f"{url}: {_why(url, err)}") from None
            log.info("%s: attempt %d failed (%s), resuming", url, attempt, err)
            last = err
            if attempt < RETRIES:
                time.sleep(BACKOFF_S * attempt)
    raise DownloadError(f"{url}: failed after {RETRIES} attempts: {_why(url, last)}")


def _why(url: str, err: Exception | None) -> str:
    """Why a request failed, in words: a host name that cannot be looked up says that the
    machine is probably offline (the resolver's 'Name or service not known' alone does not)."""
    reason = getattr(err, "reason", None) or err
    text = getattr(reason, "strerror", None) or reason
    if isinstance(reason, socket.gaierror):
        host = urllib.parse.urlsplit(url).hostname
        return (
            f"cannot look up the host {host} ({text}); this machine seems to be offline, "
            "or its DNS or proxy settings are wrong"
        )
    return str(text)


def _decompress(part: Path, spec: RemoteFile, target_part: Path) -> str:
    """Write the decompressed content of ``part`` to ``target_part``; return its SHA-256."""
    digest = hashlib.sha256()
    try:
        if spec.member is not None:
            with zipfile.ZipFile(part) as archive:
                source: Any = archive.open(spec.member)
                digest = _copy(source, target_part, digest)
        elif spec.remote.endswith(".gz"):
            with gzip.open(part, "rb") as source:
                digest = _copy(source, target_part, digest)
        else:
            with part.open("rb") as source:
                digest = _copy(source, target_part, digest)
    except (OSError, EOFError, KeyError, zipfile.BadZipFile) as err:
        raise DownloadError(f"{spec.remote}: cannot unpack the download: {err}") from None
    return digest.hexdigest()


def _copy(source: Any, target: Path, digest: Any) -> Any:
    with source, target.open("wb") as out:
        while block := source.read(CHUNK):
            digest.update(block)
            out.write(block)
    return digest


def _download_file(
    base_url: str, spec: RemoteFile, folder: Path, progress: Progress | None
) -> Path:
    """Fetch, unpack and verify one file; return its final path."""
    final = folder / spec.local
    if final.exists() and _sha256(final) == spec.sha256:
        log.info("%s: already in the cache", final)
        return final
    part = folder / f"{spec.remote}.part"
    unpacked = folder / f"{spec.local}.unpacked.part"
    url = base_url.rstrip("/") + "/" + spec.remote
    _fetch(url, part, progress)
    try:
        actual = _decompress(part, spec, unpacked)
    except DownloadError:
        part.unlink(missing_ok=True)
        unpacked.unlink(missing_ok=True)
        raise
    if actual != spec.sha256:
        part.unlink(missing_ok=True)
        unpacked.unlink(missing_ok=True)
        raise DownloadError(
            f"{url}: checksum mismatch for {spec.local} (expected sha256 {spec.sha256[:16]}…, "
            f"got {actual[:16]}…); nothing was written to the cache"
        )
    os.replace(unpacked, final)
    part.unlink(missing_ok=True)
    return final


def download(
    name: str,
    cache_dir: str | Path | None = None,
    base_url: str | None = None,
    progress: Progress | None = None,
) -> Path:
    """Download a public corpus into the cache and return its folder.

    Args:
        name: a key of ``DATASETS`` (``"multi30k"``, ``"tatoeba-ko-en"``).
        cache_dir: cache root (default :func:`default_cache_dir`); files go to
            ``cache_dir / name``.
        base_url: replaces the corpus' official base URL (for mirrors and tests).
        progress: optional callback ``progress(file_name, bytes_done, bytes_total | None)``.

    Returns:
        The folder holding the decompressed, verified files.

    Raises:
        KeyError: unknown corpus name.
        DownloadError: network, server or checksum failure.
    """
    if name not in DATASETS:
        raise KeyError(f"unknown corpus {name!r}; choose one of: {', '.join(sorted(DATASETS))}")
    dataset = DATASETS[name]
    folder = Path(cache_dir if cache_dir is not None else default_cache_dir()) / name
    created = _missing_folders(folder)
    folder.mkdir(parents=True, exist_ok=True)
    try:
        for spec in dataset.files:
            _download_file(base_url or dataset.base_url, spec, folder, progress)
    except BaseException:
        _remove_if_empty(created)  # a failure offline leaves no empty cache folders behind
        raise
    log.info("%s: %d files in %s (licence: %s)", name, len(dataset.files), folder, dataset.licence)
    return folder


def _missing_folders(folder: Path) -> list[Path]:
    """``folder`` and those of its parents that do not exist yet, deepest first."""
    missing = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    return missing


def _remove_if_empty(folders: list[Path]) -> None:
    """Remove the folders (deepest first) that are still empty; stop at the first that is not."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return
