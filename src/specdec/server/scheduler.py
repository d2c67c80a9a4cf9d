"""Concurrency of the server: at most ``slots`` generations in progress (each holds a backend, so
its own KV cache, or its own sequence of a batched context; the rest wait in line). Unbatched,
target forwards run one at a time, step by step, in arrival order, so concurrent generations
interleave fairly on this CPU. Batched (``serial=False``: the model's backends step together,
:mod:`specdec.backends.llamacpp_batched`), every generation runs its steps back to back in a worker
thread of its own and the backend puts their forwards in one batch; the steps reach the request
through a queue, so a generation's next step does not wait for the event loop to stream the last
one (with many streams the loop's turn came after the next batch had left without it). A step is
never interrupted; a client that goes away frees its slot and backend after the step in flight.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
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

    async def steps(self, run: DecodeRun) -> AsyncIterator[Progress]:
        """The steps of ``run``, each computed in its turn (batched: as soon as the last one is),
        with the output as it stood after each."""
        if self.compute is not None:
            steps = iter(run)
            try:
                while (step := await self.run(next, steps, None)) is not None:
                    yield Progress(step, run.result.token_ids[:step.position + len(step.emitted)], run.done)
            finally:
                run.close()  # hands the backend back now, also when the client went away
            return
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        stop = threading.Event()

        def produce() -> None:
            put = loop.call_soon_threadsafe
            try:
                for step in run:
                    put(queue.put_nowait, Progress(step, run.result.token_ids[:step.position + len(step.emitted)],
                                                   run.done))
                    if stop.is_set():
                        break
            except BaseException as exc:  # the request's, not the worker's: raised where it waits
                put(queue.put_nowait, _Failed(exc))
            finally:
                run.close()
                put(queue.put_nowait, None)

        worker = asyncio.ensure_future(anyio.to_thread.run_sync(produce, limiter=self.limiter))
        try:
            while (item := await queue.get()) is not None:
                if isinstance(item, _Failed):
                    raise item.error
                yield item
        finally:
            stop.set()  # the worker ends after the step in flight
            run.cancel()  # or, waiting for KV pages, leaves their line
            with anyio.CancelScope(shield=True):
                await worker
            run.close()


@dataclass(frozen=True)
class Progress:
    """One step of a generation, with its new tokens up to and including the step's and whether
    it was the last (a batched generation may be further along by the time it is read)."""

    step: StepTrace
    token_ids: list[int]
    done: bool


@dataclass(frozen=True)
class _Failed:
    error: BaseException
