"""Files written for later (memory, caches, traces, results): whole or not at all.

A file written in place is truncated first, so a crash, a Ctrl-C or a full disk midway leaves half
a file that the next reader refuses, and what the old one held is lost with it. Here the new
content goes to a temporary file in the same folder (so the rename cannot cross file systems),
flushed to the disk, then renamed over the old one: a reader sees the old file or the new one,
never a mix. On any failure the temporary is removed and the old file is left as it was.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike[str], mode: str = "w", *,
                encoding: str = "utf-8") -> Iterator[IO[Any]]:
    """A file object (``mode`` ``"w"`` text or ``"wb"`` binary) whose content replaces ``path``
    when the ``with`` block ends without an exception; if it raises, ``path`` is untouched.

    For content produced piece by piece (a download); :func:`write_atomic` for content in memory.
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open writes a whole file: mode 'w' or 'wb', not {mode!r}")
    path = Path(path)
    # Hidden and unique per writer: two processes saving the same file never share a temporary,
    # and a listing or glob of the folder does not pick one up.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        # "x": created here, with the permissions a plain open() would give (mkstemp's are 0600).
        with open(tmp, mode.replace("w", "x"), encoding=None if "b" in mode else encoding) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())  # the data on disk before the rename makes it the file
        os.replace(tmp, path)
    except BaseException:  # Ctrl-C midway too: never leave the temporary behind
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _sync_folder(path.parent)


def write_atomic(path: str | os.PathLike[str], data: bytes | str, *, encoding: str = "utf-8") -> Path:
    """Replace ``path``'s content with ``data`` (``str`` is encoded with ``encoding``), whole or
    not at all: on any error ``path`` keeps its old content (or stays absent) and the error is
    raised. Returns ``path``."""
    with atomic_open(path, "wb" if isinstance(data, bytes) else "w", encoding=encoding) as f:
        f.write(data)
    return Path(path)


def _sync_folder(folder: Path) -> None:
    # Makes the rename itself survive a power cut. Best effort: some systems (Windows) cannot
    # open a folder, and the file is already whole either way.
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
