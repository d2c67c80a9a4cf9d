"""What this CPU can do, read once from /proc/cpuinfo: detected, never assumed.

Some machines that run specdec have AVX-512 with native bf16, others AVX2 only; caches of
measurements (cost curves, kernel choices) are keyed by :func:`machine_tag` so that one machine's
numbers are never used on another.
"""

from __future__ import annotations

import os
import platform
from functools import lru_cache
from pathlib import Path


@lru_cache(maxsize=1)
def _cpuinfo() -> tuple[str, frozenset[str]]:
    model, flags = platform.processor() or platform.machine(), frozenset()
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return model, flags
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and model == (platform.processor() or platform.machine()):
            model = value.strip()
        elif key == "flags" and not flags:
            flags = frozenset(value.split())
    return model, flags


def cpu_model() -> str:
    """The CPU's model name (``AMD EPYC``, ``Intel(R) Xeon(R) ...``)."""
    return _cpuinfo()[0]


def cpu_flags() -> frozenset[str]:
    """The instruction-set flags of the first CPU (``avx2``, ``avx512f``, ``avx512_bf16``, ...)."""
    return _cpuinfo()[1]


def has_native_bf16() -> bool:
    """Whether bf16 matmuls run natively (AVX512-BF16 or AMX) rather than emulated."""
    flags = cpu_flags()
    return "avx512_bf16" in flags or "amx_bf16" in flags


def simd_level() -> str:
    """The widest vector extension present: ``avx512``, ``avx2``, ``avx`` or ``none``."""
    flags = cpu_flags()
    if "avx512f" in flags:
        return "avx512"
    return next((f for f in ("avx2", "avx") if f in flags), "none")


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity mask (``taskset``, a container's cpuset, a test
    worker pinned to its own cores), not every CPU the machine has. A forward split over more threads
    than that leaves them spinning in turn on the same cores, several times slower."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # no affinity on this platform (macOS, Windows)
        return os.cpu_count() or 1


# torch's threads before a llama.cpp process kept torch to one (specdec.backends.llamacpp_lib):
# the threads its computations run on, which the machine's tag names.
_threads_before_one: list[int] = []


def keep_torch_to_one_thread() -> None:
    """torch on one thread from here on; the machine's tag still names the threads it had. A
    process that runs llama.cpp calls it: torch and llama.cpp share one OpenMP runtime, and what
    torch computes beside llama.cpp are single rows of logits, which a second thread does not speed
    up; a transformers model loaded later sets its own thread count (``--threads``)."""
    import torch

    if torch.get_num_threads() != 1:
        _threads_before_one.append(torch.get_num_threads())
        torch.set_num_threads(1)


def machine_tag() -> str:
    """What measured speeds depend on besides the model: CPU model, vector level and torch's threads
    (as they were before a llama.cpp process kept torch to one: its forwards' threads)."""
    import torch

    threads = _threads_before_one[0] if _threads_before_one and torch.get_num_threads() == 1 else \
        torch.get_num_threads()
    return f"{cpu_model()}-{simd_level()}-{threads}t"
