"""Files: where qkv keeps them between runs, and writing them so that an interruption never
leaves half of one (below every layer, so any of them may ask)."""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path

__all__ = ["cache_root", "naming", "replacing", "write_text_atomic", "writing"]


def cache_root() -> Path:
    """``$XDG_CACHE_HOME/qkv`` if set, else ``~/.cache/qkv``."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "qkv"


def naming(err: OSError, path: str | os.PathLike[str]) -> OSError:
    """``err`` again, of the same type, naming ``path`` (the file the user knows of) in
    place of a temporary or staged file; raise it ``from None``."""
    return type(err)(err.errno, err.strerror, str(path))


@contextlib.contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """A temporary path beside ``path`` that replaces it when the block ends without error.

    An interrupted write (Ctrl-C, a full disk) leaves the previous file whole and no
    temporary file behind; a reader never sees half a file. An ``OSError`` about the
    temporary file is raised again naming ``path``, the file the user knows of.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    except OSError as err:
        if err.filename not in (str(tmp), tmp):
            raise
        raise naming(err, path) from None
    finally:
        tmp.unlink(missing_ok=True)


def write_text_atomic(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` as UTF-8 (whatever the locale), atomically."""
    path = Path(path)
    with replacing(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return path


@contextlib.contextmanager
def writing(path: str | os.PathLike[str]) -> Iterator[Path]:
    """:func:`replacing` for a file the user named (a page, an image, a lab result): its
    folders are made first, and a folder at ``path`` is an :class:`IsADirectoryError`
    naming ``path``."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    with replacing(path) as tmp:
        yield tmp
