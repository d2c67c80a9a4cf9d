"""Forwards replayed from captured CUDA graphs: a step's kernels launched by one call, not hundreds.

A small model's forward on a GPU is hundreds of kernel launches of a few microseconds of work each;
eager PyTorch pays the launches from Python and the GPU waits for them (a 135M model decodes at
the same speed as a 7B one). A captured graph replays them all from one launch. It replays the
same shapes at the same addresses, so everything a step varies (tokens, positions, cache slots,
the tree mask) lives in static input buffers that the host fills before each replay, and the
output is a static buffer read after it.

This is ``torch.cuda.CUDAGraph`` by hand rather than ``torch.compile(mode="reduce-overhead")``: the
engine already runs one shape per sequence (exact decoding pads every forward to it), so one
graph per shape and per sequence is all it needs, with its inputs in one packed buffer and one
copy per step; ``reduce-overhead``'s cudagraph trees copy every non-static input per call, guard
on Python state, and re-record when a shape they have not seen arrives. Its kernels may still come
from ``torch.compile`` (default mode, no graphs of its own): fusing the small element-wise kernels
of a layer makes the replayed graph shorter (:func:`compiled`).
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import threading
from collections.abc import Callable

import torch

from specdec.errors import SpecdecError

Step = Callable[[], torch.Tensor]
WARMUP = 2  # eager runs before a capture: the compiler, cuBLAS's workspace and allocations settle


class Replay:
    """``step`` (reads static inputs, returns a static output) made callable as one replay.

    On CUDA the step is captured into a graph on first use; elsewhere it simply runs (the same
    buffers and arithmetic, so a CPU exercises everything but the capture). ``captures`` counts
    the graphs made, for tests and reports."""

    captures = 0

    def __init__(self, step: Step, device: torch.device) -> None:
        self.step = step
        self.device = device
        self._graph: torch.cuda.CUDAGraph | None = None
        self._out: torch.Tensor | None = None

    def __call__(self) -> torch.Tensor:
        if self.device.type != "cuda":
            with torch.inference_mode():
                return self.step()
        if self._graph is None:
            self._graph, self._out = capture(self.step)
            Replay.captures += 1
        self._graph.replay()
        return self._out


_capture_lock = threading.Lock()


@contextlib.contextmanager
def _no_gc():
    """Garbage first, then none while capturing: an unreachable old graph that the cycle collector
    frees mid-capture resets it on the capturing stream, which invalidates the capture."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
_compile_lock = threading.Lock()


def capture(step: Step) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """Warm ``step`` up on a side stream (as capture requires), then capture one run of it. One
    capture at a time; other threads' work does not spoil it (a server's other sequences)."""
    with _capture_lock, torch.inference_mode(), _no_gc():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            out = step()
    return graph, out


# One kernel choice per process: once a compiled step has run, a later compile failure may not
# leave another step on eager kernels (two sequences would round differently), and once one failed
# every later step stays eager.
_compile_state = {"fallback": False, "compiled_ran": False}


def compiled(function: Callable, device: torch.device, enabled: bool | None = None) -> Callable:
    """``function`` through ``torch.compile`` (default mode: fused kernels, no graphs of its own) on
    CUDA (``enabled``: None) unless ``SPECDEC_COMPILE=0``; if compiling fails (no Triton, no
    compiler) before any compiled step ran in this process, eager functions from then on, with one
    line on stderr saying why; after one ran, an error (a process runs one kind of kernels).
    Elsewhere (or ``enabled`` False), ``function`` itself."""
    if enabled is None:
        enabled = device.type == "cuda" and os.environ.get("SPECDEC_COMPILE", "1") != "0"
    if not enabled:
        return function
    # Static shapes: one compile per model and forward size, whatever else was compiled before;
    # the cache's capacity alone is left symbolic (static_cache marks it), so a grown cache only
    # recaptures.
    fast = torch.compile(function, dynamic=False)
    state = _compile_state

    def run(*args, **kwargs):
        if state["fallback"]:
            return function(*args, **kwargs)
        try:
            with _compile_lock:  # two sequences compiling the same model at once compile it twice
                out = fast(*args, **kwargs)
        except Exception as error:  # noqa: BLE001 - any compiler failure leaves eager kernels, said once
            if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
                raise
            if state["compiled_ran"]:
                raise SpecdecError(f"torch.compile failed ({type(error).__name__}: {str(error)[:200]}) after "
                                   f"compiled kernels ran in this process; SPECDEC_COMPILE=0 runs eager kernels "
                                   f"throughout") from error
            state["fallback"] = True
            print(f"specdec: warning: torch.compile failed ({type(error).__name__}: {str(error)[:200]}); "
                  f"graphs replay eager kernels (SPECDEC_COMPILE=0 skips compiling)", file=sys.stderr, flush=True)
            return function(*args, **kwargs)
        state["compiled_ran"] = True
        return out

    run.state = state  # type: ignore[attr-defined]  # {"fallback": True} once compiling failed
    return run
