"""The llama.cpp library handle: llama-cpp-python imported once (it is an optional extra,
``specdec[llamacpp]``), its logging silenced, every forward run through :func:`decode`.

The other llama.cpp modules reach the C API only through :func:`lib`.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
import time
from collections.abc import Iterator
from functools import lru_cache

from specdec.errors import SpecdecError

_state = {"decoded": False, "quiet": None}  # whether a forward ran; the silencing callback (kept alive)
# One forward at a time in the process: each llama_decode already runs on every core (its own
# thread team), so two at once (a target's batch and a draft model's, or two requests' models)
# would only share the cores worse.
_DECODE = threading.Lock()


@lru_cache(maxsize=1)
def lib():
    """The ``llama_cpp`` module: imported once, logging silenced, the backend initialised."""
    try:
        import llama_cpp
    except ImportError as exc:
        raise SpecdecError("the llama.cpp backend needs llama-cpp-python: pip install 'specdec[llamacpp]'") from exc

    @llama_cpp.llama_log_callback
    def quiet(level, text, user_data):  # llama.cpp logs every load and decode to stderr otherwise
        return None

    llama_cpp.llama_log_set(quiet, ctypes.c_void_p(0))
    _state["quiet"] = quiet  # a ctypes callback must outlive its registration
    llama_cpp.llama_backend_init()
    return llama_cpp


@contextlib.contextmanager
def log_captured() -> Iterator[list[bytes]]:
    """llama.cpp's log lines while the block runs (silenced again after it)."""
    llama_cpp = lib()
    lines: list[bytes] = []

    @llama_cpp.llama_log_callback
    def capture(level, text, user_data):
        lines.append(text or b"")

    llama_cpp.llama_log_set(capture, ctypes.c_void_p(0))
    try:
        yield lines
    finally:
        llama_cpp.llama_log_set(_state["quiet"], ctypes.c_void_p(0))


def decode(ctx, batch) -> float:
    """``llama_decode``, failing loudly; every forward of specdec's goes through here. The seconds
    it computed (not counting a wait for another forward to end)."""
    _state["decoded"] = True
    with _DECODE:
        t0 = time.perf_counter()
        failed = lib().llama_decode(ctx, batch) != 0
        seconds = time.perf_counter() - t0
    if failed:
        raise RuntimeError("llama_decode failed")
    return seconds


def has_decoded() -> bool:
    """Whether this process has run a llama.cpp forward (ggml's process-wide switches are then fixed)."""
    return _state["decoded"]


def has_llamafile() -> bool:
    """Whether the installed llama.cpp was built with llamafile's tinyBLAS kernels (the pip default)."""
    return b"LLAMAFILE = 1" in lib().llama_print_system_info()
