"""Writing a page or an image whole: a temporary file beside it, renamed over it.

An interrupted write (Ctrl-C during ``qkv show``, a full disk) leaves the previous file
as it was and no temporary file. An error still names the path the user gave, never the
temporary one (the command line prints that name).
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path

from qkv._files import replacing

__all__ = ["writing"]


@contextlib.contextmanager
def writing(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary path to write; it replaces ``path`` when the block ends without error.

    The parent folders are made first. A folder at ``path`` is an
    :class:`IsADirectoryError` naming ``path``; other errors on the temporary file are
    raised again naming ``path`` (:func:`qkv._files.replacing`).
    """
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    with replacing(path) as tmp:
        yield tmp
