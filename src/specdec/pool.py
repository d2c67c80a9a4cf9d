"""Idle per-sequence backends kept for reuse (a llama.cpp context takes a noticeable time to create)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from specdec.backends.base import Backend


class BackendPool:
    """Hands out backends over shared weights, one sequence each; thread-safe."""

    def __init__(self, make: Callable[[], Backend], max_idle: int = 8,
                 order: Callable[[Backend], int] | None = None) -> None:
        self.make = make
        self.max_idle = max_idle
        # Which idle backend goes first (lowest key); None: the one given back last.
        self.order = order
        self._idle: list[Backend] = []
        self._lock = threading.Lock()

    def take(self) -> Backend:
        with self._lock:
            if self._idle:
                if self.order is None:
                    return self._idle.pop()
                first = min(self._idle, key=self.order)
                self._idle.remove(first)
                return first
        return self.make()

    def give(self, backend: Backend) -> None:
        backend.idle()
        with self._lock:
            if len(self._idle) < self.max_idle:
                self._idle.append(backend)

    @contextmanager
    def lease(self) -> Iterator[Backend]:
        backend = self.take()
        try:
            yield backend
        finally:
            self.give(backend)
