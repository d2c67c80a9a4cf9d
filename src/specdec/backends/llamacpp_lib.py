"""The llama.cpp library handle: llama-cpp-python imported once (it is an optional extra,
``specdec[llamacpp]``), its logging silenced, every forward run through :func:`decode`.

The other llama.cpp modules reach the C API only through :func:`lib`.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import pathlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import TypeVar

from specdec import cpu
from specdec.errors import SpecdecError

T = TypeVar("T")

_state = {"decoded": False, "quiet": None}  # whether a forward ran; the silencing callback (kept alive)
# The process holds one OpenMP team, the llama thread's. llama.cpp's CPU backend runs a forward as
# one OpenMP parallel region with a barrier after each of its ~1,100 graph nodes, and libgomp keeps
# a team of threads for every thread that ever started a parallel region. Once the process holds
# more OpenMP threads than cores, libgomp cuts its spinning at barriers to almost nothing and every
# barrier sleeps and wakes: a one-row forward of Qwen2.5-Coder-1.5B on 2 cores went from about 36 ms
# to 50-57 ms. Three things start teams outside the forward's thread, each closed here:
# - forwards from several threads (the server's batch after its warm-up on the main thread): every
#   forward of the process runs on one thread, the llama thread (each llama_decode already runs on
#   every core, so two at once would only share the cores worse);
# - loading weights into an AMX buffer (Intel Xeon with AMX): ggml repacks them into tiles inside an
#   OpenMP parallel region on the loading thread; loads and contexts are made on the llama thread;
# - PyTorch: the CPU wheel ships its own libgomp.so.1, whose soname satisfies llama.cpp's too, so
#   both libraries share one OpenMP runtime, and any torch op over more than 32,768 elements (one
#   softmax or division over a 152k vocabulary: every sampled token) starts a team on the calling
#   thread. A process that runs llama.cpp keeps torch to one thread (:func:`lib`), measured: a
#   one-row forward 34.8 ms, then 52.1 ms after one such op on the main thread; 32.6 ms with torch
#   on one thread.
_LLAMA_THREAD_NAME = "specdec-llama"


def _name_llama_thread() -> None:
    """Give the llama thread its name in the OS too (Linux), which its OpenMP workers inherit."""
    try:
        ctypes.CDLL(None).prctl(15, _LLAMA_THREAD_NAME.encode(), 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):  # not Linux
        pass


_LLAMA_THREAD = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=_LLAMA_THREAD_NAME,
                                                      initializer=_name_llama_thread)
_on_llama_thread = threading.local()


def on_llama_thread(function: Callable[..., T], *args) -> T:
    """``function(*args)`` on the one thread that runs every llama.cpp computation of the process."""
    if getattr(_on_llama_thread, "yes", False):
        return function(*args)
    return _LLAMA_THREAD.submit(_mark_and_call, function, *args).result()


def _mark_and_call(function: Callable[..., T], *args) -> T:
    _on_llama_thread.yes = True
    return function(*args)


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
    cpu.keep_torch_to_one_thread()  # before any torch op starts a team beside llama.cpp's (see above)
    on_llama_thread(llama_cpp.llama_backend_init)
    return llama_cpp


def load_model_file(path: str, params):
    """``llama_model_load_from_file`` on the llama thread (an AMX buffer's repacking runs an OpenMP
    region on the loading thread)."""
    return on_llama_thread(lib().llama_model_load_from_file, path.encode(), params)


def new_context(model, params):
    """``llama_init_from_model`` on the llama thread (its graph reservation may compute)."""
    return on_llama_thread(lib().llama_init_from_model, model, params)


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
    """``llama_decode``, failing loudly, on the process's llama.cpp thread (:func:`on_llama_thread`);
    every forward of specdec's goes through here. The seconds it computed (not counting a wait for
    another forward to end)."""
    _state["decoded"] = True
    failed, seconds = on_llama_thread(_timed_decode, ctx, batch)
    if failed:
        raise RuntimeError("llama_decode failed")
    return seconds


def _timed_decode(ctx, batch) -> tuple[bool, float]:
    t0 = time.perf_counter()
    failed = lib().llama_decode(ctx, batch) != 0
    return failed, time.perf_counter() - t0


def has_decoded() -> bool:
    """Whether this process has run a llama.cpp forward (ggml's process-wide switches are then fixed)."""
    return _state["decoded"]


def has_llamafile() -> bool:
    """Whether the installed llama.cpp was built with llamafile's tinyBLAS kernels (the pip default)."""
    return b"LLAMAFILE = 1" in lib().llama_print_system_info()


# The buffer types whose weights every CPU matmul reads as they are (ggml's names: a plain buffer,
# and the file mapped in place); every other buffer type of the CPU backend is an "extra" one, with
# kernels of its own (CPU_REPACK, AMX, KleidiAI, ...).
PLAIN_BUFFERS = frozenset({"CPU", "CPU_Mapped"})
REPACK_BUFFER = "CPU_REPACK"
AMX_BUFFER = "AMX"  # where llama.cpp puts weights it has AMX tile kernels for
_NAMES_SIZE = 256  # bytes for each list of buffer-type names the self-test writes


@dataclass(frozen=True)
class SelfTest:
    """What ggml's CPU backend said of one weight type's matrix multiplication, run as a model runs it
    (``ggml_cpu_exact_selftest_bufts``, part of specdec's kernel patch): in every buffer type that
    takes the type, each row of every 2..rows-row product against the one-row product of the same
    activations, bit for bit."""

    differing: int  # outputs that differ (0: batch-invariant)
    first_rows: int  # the smallest row count that differed (0: none)
    tested: tuple[str, ...] = ()  # the buffer types whose kernels ran (ggml's names)
    untested: tuple[str, ...] = ()  # buffer types that take the type but whose kernels could not run

    @property
    def repacked(self) -> bool:
        """Whether the kernels of an extra buffer type ran (this CPU repacks the type)."""
        return any(name not in PLAIN_BUFFERS for name in self.tested)

    @property
    def complete(self) -> bool:
        """Whether every buffer type that takes the type ran (and one did): only then is
        ``differing`` a verdict on all the kernels a model of this type may run."""
        return bool(self.tested) and not self.untested


@lru_cache(maxsize=1)
def _cpu_library() -> ctypes.CDLL | None:
    """The ggml CPU library beside the loaded libllama, or None (a platform whose library is named
    otherwise)."""
    llama_cpp = lib()
    folder = getattr(getattr(llama_cpp, "llama_cpp", None), "_base_path", None)
    folder = pathlib.Path(folder) if folder else pathlib.Path(llama_cpp.__file__).parent / "lib"
    for name in ("libggml-cpu.so", "libggml-cpu.dylib", "ggml-cpu.dll"):
        if (folder / name).exists():
            try:
                return ctypes.CDLL(str(folder / name))
            except OSError:
                return None
    return None


@lru_cache(maxsize=1)
def _selftest_function():
    """``ggml_cpu_exact_selftest_bufts`` from the ggml CPU library, or None (a stock build, or one of
    an earlier patch, whose ``ggml_cpu_exact_selftest`` tested only the repacked and plain buffers
    and passed where nothing ran)."""
    library = _cpu_library()
    function = getattr(library, "ggml_cpu_exact_selftest_bufts", None) if library is not None else None
    if function is None:
        return None
    function.restype = ctypes.c_int64
    function.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int),
                         ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
    return function


def kernel_generation() -> int:
    """Which of specdec's kernel patches the installed llama.cpp carries, as far as it changes what a
    forward costs: 0 none (the stock library), 1 the exact multi-row kernels and their self-test,
    2 also the multi-row Q4_K GEMV that replaces ggml's GEMM (cheaper 2-8-row forwards), 3 also AMX
    buffers' multi-row VNNI kernels (a build for a CPU with AMX: 2-4-row forwards without the tiles),
    4 also 8 rows a pass in the AVX2 loops, which took 4 (5-8-row forwards cheaper on a CPU without
    AVX-512; a build with the AMX kernels reports 4 too, its AMX buffers named apart in the key).
    Measurements cached per library (the cost curve) name it. (The self-test's coverage of every
    buffer type changed no kernel, so no generation.)"""
    library = _cpu_library()
    if library is None or not any(getattr(library, name, None) is not None
                                  for name in ("ggml_cpu_exact_selftest_bufts", "ggml_cpu_exact_selftest")):
        return 0
    if getattr(library, "ggml_cpu_exact_rows_per_pass", None) is not None:
        return 4
    if getattr(library, "ggml_amx_vnni_rows", None) is not None:
        return 3
    return 2 if getattr(library, "ggml_gemv_q4_K_8x8_q8_K_rows", None) is not None else 1


def has_selftest() -> bool:
    """Whether the installed llama.cpp carries specdec's exact multi-row kernels and their self-test
    of every buffer type."""
    return _selftest_function() is not None


@lru_cache(maxsize=None)
def kernel_selftest(ggml_type: int, rows: int, n_threads: int, faults: int = 0) -> SelfTest | None:
    """Run the library's batch-invariance self-test for ``ggml_type`` (a ggml type id) at 1..``rows``
    rows on ``n_threads`` threads; None where the library has no self-test or cannot test the type.
    A result that is not :attr:`~SelfTest.complete` is a failure (a buffer type that takes the type
    could not be run, or none ran). ``faults`` (tests only) makes the library fail as a CPU here
    cannot: 1 every one-row product, 2 every placement of the weights.
    Like any matmul it fixes ggml's process-wide switches (the tiled matmul) if no forward has yet."""
    function = _selftest_function()
    if function is None:
        return None
    _state["decoded"] = True
    first = ctypes.c_int()
    tested, untested = ctypes.create_string_buffer(_NAMES_SIZE), ctypes.create_string_buffer(_NAMES_SIZE)
    differing = on_llama_thread(function, ggml_type, rows, n_threads, faults, ctypes.byref(first), tested,
                                untested, _NAMES_SIZE)
    if differing == -1:
        return None
    return SelfTest(max(0, int(differing)), first.value, _names(tested.value), _names(untested.value))


def _names(value: bytes) -> tuple[str, ...]:
    return tuple(name for name in value.decode(errors="replace").split(",") if name)
