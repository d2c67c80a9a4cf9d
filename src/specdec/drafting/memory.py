"""Memory across generations: continuations seen in this model's earlier outputs.

llama.cpp's dynamic n-gram cache and SuffixDecoding's global tree keep what a model wrote before,
so a server answering similar requests can draft from its earlier answers. Here it is a bounded
table n-gram -> next-token counts (2 <= n <= ``max_ngram`` = 6: longer keys than the context
index's 4, since a remembered match cannot be extended backwards to show it is long; the least recently used n-grams go
first), filled with each finished generation and consulted by the n-gram drafter where its
continuation looks likelier than the current context's. Optional (``Model.enable_memory``, ``--memory``) and saved as JSON
only when asked.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

from specdec import options
from specdec.errors import SpecdecError

FORMAT = "specdec-memory"


def _memory_file(path: str) -> str | None:
    where = Path(path)
    return None if where.parent.is_dir() and not where.is_dir() else "must be a file in an existing folder"


# A model option (set once per process, not per request): the n-gram drafters of every generation
# read and feed the same memory.
options.register([options.Option(
    "memory", str, None, "let the n-gram drafters also draft from earlier outputs kept in FILE (read if it "
                         "exists, written back at the end; bounded)", _memory_file, nullable=True, scope="model",
    metavar="FILE", server=False, bench=False)], owner=None)
VERSION = 1


class NgramMemory:
    """Next-token counts after every n-gram of earlier outputs, bounded, shared by threads."""

    def __init__(self, max_ngram: int = 6, capacity: int = 200_000, min_ngram: int = 2) -> None:
        if capacity < 1 or not 1 <= min_ngram <= max_ngram:
            raise SpecdecError(f"memory needs capacity >= 1 and 1 <= min n <= max n, got {capacity}, "
                               f"{min_ngram}, {max_ngram}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.capacity = capacity
        self._table: OrderedDict[tuple[int, ...], dict[int, int]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._table)

    def add(self, tokens: Sequence[int]) -> None:
        """Remember what followed every n-gram of ``tokens``."""
        tokens = list(tokens)
        with self._lock:
            for end in range(self.min_ngram, len(tokens)):
                nxt = tokens[end]
                for n in range(self.min_ngram, min(self.max_ngram, end) + 1):
                    key = tuple(tokens[end - n:end])
                    counts = self._table.get(key)
                    if counts is None:
                        counts = self._table[key] = {}
                    else:
                        self._table.move_to_end(key)
                    counts[nxt] = counts.get(nxt, 0) + 1
            while len(self._table) > self.capacity:
                self._table.popitem(last=False)

    def lookup(self, tail: Sequence[int]) -> tuple[int, dict[int, int]] | None:
        """(n, next-token counts) for the longest remembered suffix of ``tail``, if any."""
        with self._lock:
            for n in range(min(self.max_ngram, len(tail)), self.min_ngram - 1, -1):
                key = tuple(tail[-n:])
                counts = self._table.get(key)
                if counts:
                    self._table.move_to_end(key)
                    return n, dict(counts)
        return None

    def save(self, path: str | Path) -> None:
        with self._lock:  # a server saves while generations add
            entries = [[list(k), [[t, c] for t, c in v.items()]] for k, v in self._table.items()]
        data = {"format": FORMAT, "version": VERSION, "max_ngram": self.max_ngram, "min_ngram": self.min_ngram,
                "capacity": self.capacity, "entries": entries}
        try:
            Path(path).write_text(json.dumps(data), encoding="utf-8")
        except OSError as exc:
            raise SpecdecError(f"cannot save the memory to {path}: {exc.strerror or exc}") from None

    @classmethod
    def load(cls, path: str | Path, capacity: int | None = None) -> NgramMemory:
        """A memory saved by :meth:`save`; a missing file gives an empty one (it is created on save)."""
        path = Path(path)
        if not path.exists():
            return cls(capacity=capacity or 200_000)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if data.get("format") != FORMAT or data.get("version") != VERSION:
                raise ValueError("not a specdec memory file of this version")
            memory = cls(int(data["max_ngram"]), capacity or int(data["capacity"]), int(data["min_ngram"]))
            for key, counts in data["entries"]:
                memory._table[tuple(int(t) for t in key)] = {int(t): int(c) for t, c in counts}
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
            raise SpecdecError(f"{path} is not a usable memory file ({exc}); delete it to start afresh") from None
        while len(memory._table) > memory.capacity:
            memory._table.popitem(last=False)
        return memory
