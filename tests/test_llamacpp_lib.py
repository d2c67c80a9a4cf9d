"""The llama.cpp library handle: one OpenMP team in the process, the llama thread's.

llama.cpp and PyTorch's CPU wheel share one libgomp (torch ships ``libgomp.so.1``, whose soname
satisfies llama.cpp's dependency), which keeps a team of threads for every thread that ever ran a
parallel region; once the process holds more OpenMP threads than cores every barrier of a forward
sleeps and wakes. These tests count the threads a process holds after the things that used to start
a second team: forwards from several threads, a model load (AMX buffers repack in a parallel region
on the loading thread), torch ops over a vocabulary-sized row on the main thread and on a request
thread. The llama thread carries its name into the OS, and its OpenMP workers inherit it, so every
thread a team added is told apart by name.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

pytest.importorskip("llama_cpp")

from specdec.backends import llamacpp_lib  # noqa: E402


def test_every_llama_cpp_computation_runs_on_one_thread(monkeypatch):
    """Forwards from any thread (requests, the batch's ticker, the main thread's warm-up), model
    loads and new contexts all run on the one llama thread."""
    ran_on = []

    class Library:
        def llama_decode(self, ctx, batch):
            ran_on.append(threading.get_ident())
            return 0

        def llama_model_load_from_file(self, path, params):
            ran_on.append(threading.get_ident())
            return object()

        def llama_init_from_model(self, model, params):
            ran_on.append(threading.get_ident())
            return object()

    monkeypatch.setattr(llamacpp_lib, "lib", lambda: Library())
    callers = [threading.Thread(target=llamacpp_lib.decode, args=(None, None)) for _ in range(3)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join()
    llamacpp_lib.decode(None, None)
    llamacpp_lib.load_model_file("model.gguf", None)
    llamacpp_lib.new_context(None, None)
    # a computation already on that thread that asks for another runs it there, without waiting on itself
    assert llamacpp_lib.on_llama_thread(llamacpp_lib.on_llama_thread, threading.get_ident) == ran_on[0]
    assert len(ran_on) == 6 and len(set(ran_on)) == 1
    assert ran_on[0] not in {threading.get_ident(), *(caller.ident for caller in callers)}


# A fresh process on two threads whatever the test worker was pinned to: llama.cpp's forwards and
# torch each asked for two, so that a team of either would have a worker to show. It loads SmolLM2,
# runs forwards, then what sampling does between forwards (a division and an argmax over a row of
# 200,000 floats, more than torch's grain of 32,768 elements) on the main thread and on a request
# thread that is still alive when the threads are counted; with CONTROL set, torch gets its two
# threads back after the load, as a process that sets them itself would.
_PROCESS = r"""
import ctypes, json, os, threading, torch
torch.set_num_threads(2)
from specdec.backends.llamacpp import LlamaCppBackend, load_llamacpp
from specdec.models import resolve

def names():
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            out[tid] = open(f"/proc/self/task/{tid}/comm").read().strip()
        except OSError:
            pass
    return out

before = names()
weights = load_llamacpp(str(resolve("smollm2-135m", need_hf=False).gguf), n_ctx=256, n_threads=2)
backend = LlamaCppBackend(weights)
backend.prefill([1, 2, 3, 4, 5, 6, 7, 8])
backend.extend([9])
if os.environ.get("CONTROL"):
    torch.set_num_threads(2)

def sample_step():
    row = torch.randn(200_000)
    return int((row.softmax(-1) / torch.rand(200_000).clamp_min(1e-9)).argmax())

sample_step()
counted, done = threading.Event(), threading.Event()
def request():
    ctypes.CDLL(None).prctl(15, b"request", 0, 0, 0)  # its name, inherited by a team's workers
    sample_step()
    counted.set()
    done.wait()
thread = threading.Thread(target=request)
thread.start()
counted.wait()
backend.extend([10])
after = names()
done.set()
thread.join()
print(json.dumps({"new": [name for tid, name in after.items() if tid not in before],
                  "torch_threads": torch.get_num_threads()}))
"""


def _new_threads(control: bool) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    if control:
        env["CONTROL"] = "1"
    out = subprocess.run([sys.executable, "-c", _PROCESS], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, f"exit {out.returncode}: {out.stderr[-2000:]}"
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_process_holds_one_openmp_team_the_llama_threads():
    """After a load, forwards and a sampling step's torch ops on two threads, the only threads
    the process gained are the llama thread, its one OpenMP worker (two threads a forward) and the
    request thread itself."""
    seen = _new_threads(control=False)
    assert seen["torch_threads"] == 1
    assert sorted(seen["new"]) == ["request", *[llamacpp_lib._LLAMA_THREAD_NAME] * 2], seen["new"]


def test_the_thread_count_catches_a_torch_team_beside_llama_cpps():
    """The negative control: torch given its two threads back after the load starts a team on the
    main thread and one on the request thread, each with a worker the count above would have caught."""
    seen = _new_threads(control=True)
    assert sorted(seen["new"]).count("request") == 2, seen["new"]  # the request thread and its worker
    assert len(seen["new"]) == 5, seen["new"]  # ... and a worker of the main thread's team
