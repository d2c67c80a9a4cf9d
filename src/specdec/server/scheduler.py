"""Concurrency of the server: at most ``slots`` generations in progress (each holds a backend, so
its own KV cache, or its own sequence of a batched context; the rest wait in line). Unbatched,
target forwards run one at a time, step by step, in arrival order, so concurrent generations
interleave fairly on this CPU. Batched (``serial=False``: the model's backends step together,
:mod:`specdec.backends.llamacpp_batched`), every generation's step runs at once in its own worker
thread and the backend puts their forwards in one batch. A step is never interrupted; a client
that goes away frees its slot and backend after the step in flight.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio

from specdec.engine import DecodeRun
from specdec.server.metrics import ServerMetrics
from specdec.types import StepTrace


class Scheduler:
    """Slots for generations, and one target forward at a time in arrival order."""

    def __init__(self, slots: int, metrics: ServerMetrics, serial: bool = True) -> None:
        self.slots = asyncio.Semaphore(slots)
        self.compute = asyncio.Lock() if serial else None
        self.metrics = metrics
        # Worker threads for steps: one per slot when they run at once (anyio's default is 40).
        self.limiter = anyio.CapacityLimiter(max(slots, 1) + 1)

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold one of the slots (waiting in line for it) while the block runs."""
        t0 = time.perf_counter()
        self.metrics.waiting.inc()
        try:
            await self.slots.acquire()
        finally:
            self.metrics.waiting.dec()
        self.metrics.queue.observe(time.perf_counter() - t0)
        self.metrics.running.inc()
        try:
            yield
        finally:
            self.metrics.running.dec()
            self.slots.release()

    async def run(self, call: Callable[..., Any], *args: Any) -> Any:
        """``call(*args)`` in a worker thread (alone on the CPU unless batched); a cancelled caller
        waits for it to end."""
        with anyio.CancelScope(shield=True):
            if self.compute is None:
                return await anyio.to_thread.run_sync(call, *args, limiter=self.limiter)
            async with self.compute:
                return await anyio.to_thread.run_sync(call, *args)

    async def steps(self, run: DecodeRun) -> AsyncIterator[StepTrace]:
        """The steps of ``run``, each computed in its turn (serial), or one after another in a
        worker thread of the generation's own (batched: see :meth:`_running`)."""
        try:
            if self.compute is not None:
                steps = iter(run)
                while (step := await self.run(next, steps, None)) is not None:
                    yield step
            else:
                async for step in self._running(run):
                    yield step
        finally:
            run.close()  # hands the backend back now, also when the client went away

    async def _running(self, run: DecodeRun) -> AsyncIterator[StepTrace]:
        """Batched: the generation steps in one worker thread from start to end and hands each step
        over as it comes. A thread hop per step would put every step's next forward behind the
        event loop's turn (with many streams, late for the batch it could have joined). A consumer
        that stops (the client left) stops the thread after the step in flight and waits for it."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        stop = threading.Event()
        done = object()

        def work() -> None:
            try:
                for step in run:
                    loop.call_soon_threadsafe(queue.put_nowait, step)
                    if stop.is_set():
                        break
            except BaseException as exc:  # noqa: BLE001 - raised in the consumer
                loop.call_soon_threadsafe(queue.put_nowait, _Failed(exc))
            finally:
                loop.call_soon_threadsafe(queue.put_nowait, done)

        worker = asyncio.ensure_future(anyio.to_thread.run_sync(work, limiter=self.limiter))
        try:
            while (item := await queue.get()) is not done:
                if isinstance(item, _Failed):
                    raise item.error
                yield item
        finally:
            stop.set()
            with anyio.CancelScope(shield=True):
                await worker  # no step in flight once it returns: the run may be closed


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error
