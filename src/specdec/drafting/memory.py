"""Memory across generations: the earlier outputs themselves, indexed, so that a draft can copy them.

SuffixDecoding's global tree and llama.cpp's dynamic n-gram cache keep what a model wrote before,
so a server answering similar requests drafts from its earlier answers. Here the earlier outputs
are kept whole (at most ``capacity`` tokens; the oldest output goes first) with an index of their
``key``-grams, and a lookup finds the occurrences with the *longest* match of the context (up to
:data:`MAX_MATCH` tokens, compared backwards from each occurrence of the context's last
``key``-gram, as a suffix tree's deepest node would), so the n-gram drafter follows a remembered
answer token by token for as long as it keeps agreeing. Optional (``Model.enable_memory``,
``--memory``; a server keeps one per API key) and saved as JSON only when asked.
"""

from __future__ import annotations

import bisect
import json
import threading
from array import array
from collections.abc import Sequence
from pathlib import Path

from specdec import options
from specdec.errors import SpecdecError
from specdec.files import write_atomic

FORMAT = "specdec-memory"
VERSION = 2  # earlier outputs kept whole (version 1 kept n-gram counts)
DEFAULT_CAPACITY = 200_000  # tokens of earlier outputs (about 20 MB with the index)
MAX_MATCH = 64  # how far back a remembered match is measured
MAX_CANDIDATES = 256  # latest occurrences of the context's key n-gram whose match lengths are compared


def _memory_file(path: str) -> str | None:
    where = Path(path)
    return None if where.parent.is_dir() and not where.is_dir() else "must be a file in an existing folder"


# A model option (set once per process, not per request): the n-gram drafters of every generation
# read and feed the same memory.
options.register([options.Option(
    "memory", str, None, "let the n-gram drafters also draft from earlier outputs kept in FILE (read if it "
                         "exists, written back at the end; bounded)", _memory_file, nullable=True, scope="model",
    metavar="FILE", server=False, bench=False)], owner=None)

# Where a remembered output continues: the output's tokens and the position after the match.
Occurrence = tuple[Sequence[int], int]


class NgramMemory:
    """Earlier outputs (at most ``capacity`` tokens) and an index of their ``key``-grams; shared by threads."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY, key: int = 2) -> None:
        if capacity < 1 or key < 1:
            raise SpecdecError(f"memory needs a capacity >= 1 token and a key n-gram >= 1, got {capacity}, {key}")
        self.capacity = capacity
        self.key = key
        # Every output gets a base offset in one growing number line, so an index entry is one int
        # (base + position) and the oldest output's entries lead every list (eviction cuts fronts).
        self._bases: list[int] = []
        self._outputs: list[array] = []
        self._next = 0
        self._tokens = 0
        self._index: dict[tuple[int, ...], list[int]] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """Tokens remembered."""
        return self._tokens

    @property
    def outputs(self) -> int:
        return len(self._outputs)

    def add(self, tokens: Sequence[int]) -> None:
        """Remember an output (with a few tokens of its prompt before it, for its first tokens' context)."""
        tokens = array("i", tokens)
        if len(tokens) <= self.key:
            return
        if len(tokens) > self.capacity:
            tokens = tokens[-self.capacity:]
        with self._lock:
            base = self._next
            self._next += len(tokens) + 1
            self._bases.append(base)
            self._outputs.append(tokens)
            self._tokens += len(tokens)
            k = self.key
            for end in range(k, len(tokens)):
                self._index.setdefault(tuple(tokens[end - k:end]), []).append(base + end)
            while self._tokens > self.capacity:
                self._forget_oldest()

    def _forget_oldest(self) -> None:
        base, tokens = self._bases.pop(0), self._outputs.pop(0)
        self._tokens -= len(tokens)
        limit = base + len(tokens)
        k = self.key
        for end in range(k, len(tokens)):
            key = tuple(tokens[end - k:end])
            entries = self._index.get(key)
            if entries is None:
                continue
            del entries[:bisect.bisect_left(entries, limit)]
            if not entries:
                del self._index[key]

    def matches(self, tail: Sequence[int]) -> tuple[list[Occurrence], int]:
        """The remembered occurrences with the longest match of ``tail``'s end (at least ``key``
        tokens; at most :data:`MAX_MATCH`) and that length; ``([], 0)`` where nothing matches."""
        k = self.key
        if len(tail) < k:
            return [], 0
        with self._lock:
            entries = self._index.get(tuple(tail[-k:]))
            if not entries:
                return [], 0
            found: list[Occurrence] = []
            best = 0
            for entry in entries[-MAX_CANDIDATES:]:
                at = bisect.bisect_right(self._bases, entry) - 1
                tokens, end = self._outputs[at], entry - self._bases[at]
                if end >= len(tokens):
                    continue  # the output ends there: nothing to copy
                n = k
                limit = min(MAX_MATCH, end, len(tail))
                while n < limit and tokens[end - 1 - n] == tail[-1 - n]:
                    n += 1
                if n > best:
                    best, found = n, []
                if n == best:
                    found.append((tokens, end))
            return found, best

    def lookup(self, tail: Sequence[int]) -> tuple[int, dict[int, int]] | None:
        """(match length, next-token counts) of the longest remembered match of ``tail``, if any."""
        found, n = self.matches(tail)
        if not found:
            return None
        counts: dict[int, int] = {}
        for tokens, end in found:
            counts[tokens[end]] = counts.get(tokens[end], 0) + 1
        return n, counts

    def save(self, path: str | Path) -> None:
        """Write the memory to ``path`` as JSON, whole or not at all: a save that fails (a full
        disk, an interrupt) leaves the previous file loadable and raises :class:`SpecdecError`."""
        with self._lock:  # a server saves while generations add
            entries = [list(tokens) for tokens in self._outputs]
        data = {"format": FORMAT, "version": VERSION, "key": self.key, "capacity": self.capacity, "entries": entries}
        try:
            write_atomic(path, json.dumps(data))
        except OSError as exc:
            raise SpecdecError(f"cannot save the memory to {path}: {exc.strerror or exc}") from None

    @classmethod
    def load(cls, path: str | Path, capacity: int | None = None) -> NgramMemory:
        """A memory saved by :meth:`save`; a missing file gives an empty one (it is created on save)."""
        path = Path(path)
        if not path.exists():
            return cls(capacity=capacity or DEFAULT_CAPACITY)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if data.get("format") != FORMAT or data.get("version") != VERSION:
                raise ValueError("not a specdec memory file of this version")
            memory = cls(capacity or int(data["capacity"]), int(data["key"]))
            for tokens in data["entries"]:
                memory.add([int(t) for t in tokens])
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
            raise SpecdecError(f"{path} is not a usable memory file ({exc}); delete it to start afresh") from None
        return memory
