"""The specdec cache directory (``$SPECDEC_CACHE``, default ``~/.cache/specdec``) and the small
JSON caches kept in it (cost curves, kernel choices, acceptance tables).

A JSON cache heals itself: a missing, corrupt or foreign file reads as "not cached" and is
measured again; a cache that cannot be written only costs the re-measurement next time.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from specdec.errors import SpecdecError
from specdec.files import write_atomic

T = TypeVar("T")


def cache_root() -> Path:
    """The cache folder (not created)."""
    return Path(os.environ.get("SPECDEC_CACHE") or Path.home() / ".cache" / "specdec")


def writable_dir(path: Path) -> Path:
    """Create ``path`` if needed; a clear error when it cannot be written."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".probe{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise SpecdecError(f"cannot write to the specdec cache folder {path} ({exc.strerror or exc}); "
                           "set SPECDEC_CACHE to a writable folder") from exc
    return path


def safe_name(text: str) -> str:
    """``text`` as a file name: letters, digits and ``-._`` only."""
    return "".join(c if c.isalnum() or c in "-._" else "_" for c in text)[:150]


class JsonCache:
    """One JSON value under ``<cache>/<kind>/<key>.json``, written atomically."""

    def __init__(self, kind: str, key: str) -> None:
        self.path = cache_root() / kind / f"{safe_name(key)}.json"

    def load(self, parse: Callable[[Any], T]) -> T | None:
        """The cached value passed through ``parse``; ``None`` when absent or unreadable.

        ``parse`` should raise (``ValueError``, ``KeyError``, ``TypeError``...) on a value of the
        wrong shape; such a file is treated as absent and replaced by the next :meth:`store`.
        """
        try:
            return parse(json.loads(self.path.read_text(encoding="utf-8")))
        except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError):
            return None

    def store(self, value: Any) -> None:
        """Write ``value``; if the cache cannot be written, warn once and carry on uncached."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self.path, json.dumps(value))
        except OSError as exc:
            _warn_unwritable(self.path.parent, exc)


_warned: set[Path] = set()


def _warn_unwritable(folder: Path, exc: OSError) -> None:
    if folder not in _warned:
        _warned.add(folder)
        print(f"specdec: warning: cannot write the cache folder {folder} ({exc.strerror or exc}); "
              "measurements will be repeated next time (set SPECDEC_CACHE to a writable folder)",
              file=sys.stderr, flush=True)
