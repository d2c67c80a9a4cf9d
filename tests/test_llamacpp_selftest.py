"""specdec's llama.cpp kernel patch (patches/llama.cpp) and how exact mode uses it.

The patched library's multi-row matmul gives every row the one-row kernel's bits; its self-test
(``ggml_cpu_exact_selftest_bufts``) checks that on the running CPU for a weight type, 1..64 rows,
through ggml's CPU backend as a model runs it, in every buffer type that takes the type. These tests
run the self-test for every weight type of the shipped models, show that it fails where a kernel is
not batch-invariant (llama.cpp's tiled matmul, switched on in a subprocess) and where a placement
could not be run (faults injected: no CPU here fails so), and check how its verdict sets exact
mode's micro-batch limit, down to one row for a buffer type it did not run (forced: AMX where the
library has none, an Arm buffer type where it has AMX). Which loops ran (AVX2 or AVX-512) depends on the CPU, and on the build: an AVX2-only
build on an AVX-512 machine runs the AVX2 loops; each run names its instruction set.
"""

from __future__ import annotations

import ctypes
import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("llama_cpp")

from specdec.backends import llamacpp_kernels as kernels  # noqa: E402
from specdec.backends import llamacpp_lib  # noqa: E402
from specdec.backends.llamacpp_kernels import REPACKED_ROWS, SELFTEST_ROWS, RowLimit, exact_rows  # noqa: E402
from specdec.cpu import usable_cpus  # noqa: E402
from specdec.backends.llamacpp_lib import SelfTest, has_selftest, kernel_selftest, lib  # noqa: E402

patched = pytest.mark.skipif(not has_selftest(), reason="this llama.cpp is the stock library "
                                                        "(make setup builds it with specdec's kernel patch)")

# ggml type ids of the shipped models' weights: SmolLM2 (Q4_1, Q8_0), Gemma-3 (Q4_K, Q6_K, Q8_0),
# Qwen2.5-Coder 1.5B (Q4_K, Q6_K) and 0.5B (Q5_0, Q8_0, Q4_K, Q6_K); F32 norms; Q4_0 is repacked too.
SHIPPED = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q8_0": 8, "Q4_K": 12, "Q6_K": 14}


REPACKED = ("CPU_REPACK", "CPU")  # a verdict on weights this CPU repacks, and on plain ones
PLAIN = ("CPU",)


def instruction_set() -> str:
    info = lib().llama_print_system_info().decode()
    return "AVX-512" if "AVX512 = 1" in info else "AVX2" if "AVX2 = 1" in info else "other"


def extra_buffer_types() -> list[str]:
    """The extra buffer types of the library's CPU backend (llama.cpp may place weights in each),
    asked of ggml itself as llama.cpp asks (``ggml_backend_dev_get_extra_bufts``)."""
    folder = pathlib.Path(llamacpp_lib._cpu_library()._name).parent
    ggml = ctypes.CDLL(str(folder / "libggml.so"))
    base = ctypes.CDLL(str(folder / "libggml-base.so"))
    ggml.ggml_backend_dev_by_type.restype = ctypes.c_void_p
    ggml.ggml_backend_dev_by_type.argtypes = [ctypes.c_int]
    base.ggml_backend_dev_backend_reg.restype = ctypes.c_void_p
    base.ggml_backend_dev_backend_reg.argtypes = [ctypes.c_void_p]
    base.ggml_backend_reg_get_proc_address.restype = ctypes.c_void_p
    base.ggml_backend_reg_get_proc_address.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    base.ggml_backend_buft_name.restype = ctypes.c_char_p
    base.ggml_backend_buft_name.argtypes = [ctypes.c_void_p]
    dev = ggml.ggml_backend_dev_by_type(0)  # GGML_BACKEND_DEVICE_TYPE_CPU
    address = base.ggml_backend_reg_get_proc_address(base.ggml_backend_dev_backend_reg(dev),
                                                     b"ggml_backend_dev_get_extra_bufts")
    if not address:
        return []
    bufts = ctypes.CFUNCTYPE(ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)(address)(dev)
    names = []
    while bufts and bufts[len(names)]:
        names.append(base.ggml_backend_buft_name(bufts[len(names)]).decode())
    return names


def has_amx() -> bool:
    """Whether this library's CPU backend has AMX's buffer type (a CPU with AMX, which make setup's
    build then compiles its kernels for)."""
    return "AMX" in extra_buffer_types()


# Where the library places Q4_K weights: AMX first where it has it, then the repack buffer, then a
# plain one; what a fault-free self-test of Q4_K runs.
Q4K_PLACEMENTS = (("AMX",) if has_amx() else ()) + REPACKED
# A buffer type the self-test never runs here, for the tests that force one into a load.
UNRUN = "KLEIDIAI" if has_amx() else "AMX"


@patched
@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_every_row_of_a_multirow_product_has_the_one_row_bits(name):
    result = kernel_selftest(SHIPPED[name], SELFTEST_ROWS, usable_cpus())
    assert result is not None, f"the self-test could not run {name}"
    assert result.complete, f"{name}: no kernel ran in {result.untested or 'any buffer type'}"
    assert result.differing == 0, (f"{name} on {instruction_set()}: {result.differing} outputs differ "
                                   f"from {result.first_rows} rows")
    assert "CPU" in result.tested  # the plain buffer, which takes every type
    if name in ("Q4_0", "Q4_K"):  # repacked wherever the CPU has AVX2 (every x86 machine here)
        assert "CPU_REPACK" in result.tested, f"{name} was not repacked on {instruction_set()}"


@patched
def test_the_self_test_runs_every_extra_buffer_type_of_the_library():
    """Each extra buffer type llama.cpp may place weights in runs for some shipped type: CPU_REPACK
    here; on a Sapphire Rapids CPU also AMX, whose one-row (VNNI) and multi-row (tile) kernels are
    different code (the first version tested buffer types named REPACK only)."""
    extras = extra_buffer_types()
    assert extras, "the CPU backend names no extra buffer type (this CPU repacks Q4_K: CPU_REPACK)"
    ran = set()
    for number in SHIPPED.values():
        ran.update(kernel_selftest(number, 8, 2).tested)
    assert set(extras) <= ran, f"never run: {set(extras) - ran}"


@patched
@pytest.mark.parametrize("faults", [1, 2], ids=["one-row-product-fails", "no-placement"])
def test_a_placement_that_did_not_run_fails_the_self_test(faults, monkeypatch):
    """A one-row product that fails (an empty result, once read out of bounds) and weights that
    could not be placed anywhere (once a pass: nothing differed because nothing ran) are failures,
    naming the buffer types, and exact decoding takes one row."""
    clean = kernel_selftest(12, 8, 2)  # the same test without faults
    assert clean.complete and clean.tested == Q4K_PLACEMENTS
    first = ctypes.c_int()
    tested, untested = ctypes.create_string_buffer(256), ctypes.create_string_buffer(256)
    code = llamacpp_lib._selftest_function()(12, 8, 2, faults, ctypes.byref(first), tested, untested, 256)
    assert code == -2 and tested.value == b"" and untested.value == ",".join(Q4K_PLACEMENTS).encode()
    result = kernel_selftest(12, 8, 2, faults)
    assert not result.complete and result.tested == () and result.untested == Q4K_PLACEMENTS
    limit = exact_rows(["q4_K"], repacked=True, n_threads=2, buffers=["CPU_Mapped", "CPU_REPACK"])
    assert limit.rows is None  # the real verdict; with the faulty one, one row:
    monkeypatch.setattr(kernels, "kernel_selftest",
                        lambda t, rows, threads: kernel_selftest(t, rows, threads, faults))
    limit = exact_rows(["q4_K"], repacked=True, n_threads=2, buffers=["CPU_Mapped", "CPU_REPACK"])
    assert limit.rows == 1 and ", ".join(Q4K_PLACEMENTS) in limit.note


def test_a_self_test_that_ran_no_placement_limits_exact_decoding_to_one_row(monkeypatch):
    verdicts = {12: SelfTest(0, 0, (), REPACKED), 0: SelfTest(0, 0, PLAIN)}
    monkeypatch.setattr(kernels, "has_selftest", lambda: True)
    monkeypatch.setattr(kernels, "kernel_selftest", lambda t, rows, threads: verdicts[t])
    limit = exact_rows(["f32", "q4_K"], repacked=True, n_threads=2, buffers=["CPU_Mapped", "CPU_REPACK"])
    assert limit.rows == 1 and "CPU_REPACK, CPU" in limit.note and "q4_K" in limit.note
    verdicts[12] = SelfTest(0, 0, (), ())  # nothing takes the type, so nothing ran
    limit = exact_rows(["f32", "q4_K"], repacked=True, n_threads=2)
    assert limit.rows == 1 and "ran no kernel for q4_K" in limit.note


def test_a_buffer_type_the_self_test_did_not_run_limits_exact_decoding_to_one_row(monkeypatch):
    """AMX (Intel Sapphire Rapids and later) takes Q4_0/Q4_1/Q8_0/Q4_K/Q6_K weights before the
    repack buffer does, with its own one-row and multi-row kernels; no CPU here has it, so what the
    library reports is forced: a buffer type the self-test did not run is refused by name."""
    verdicts = {12: SelfTest(0, 0, REPACKED, ("AMX",)), 14: SelfTest(0, 0, PLAIN), 0: SelfTest(0, 0, PLAIN)}
    monkeypatch.setattr(kernels, "has_selftest", lambda: True)
    monkeypatch.setattr(kernels, "kernel_selftest", lambda t, rows, threads: verdicts[t])
    types, buffers = ["f32", "q4_K", "q6_K"], ["CPU_Mapped", "CPU_REPACK", "AMX"]
    limit = exact_rows(types, repacked=True, n_threads=2, buffers=buffers)
    assert limit.rows == 1 and "buffer type AMX" in limit.note and "\n" not in limit.note
    # The self-test ran every buffer type that takes these types, but the load put weights in AMX:
    # a buffer type it never ran for any of the model's types (an older library's self-test).
    verdicts[12] = SelfTest(0, 0, REPACKED)
    limit = exact_rows(types, repacked=True, n_threads=2, buffers=buffers)
    assert limit.rows == 1 and "buffer type AMX" in limit.note and "CPU_REPACK" not in limit.note
    assert exact_rows(types, repacked=True, n_threads=2, buffers=buffers[:2]) == RowLimit(None)
    # SPECDEC_MULTIROW=0 caps rows on top of the self-test, never instead of it
    monkeypatch.setenv("SPECDEC_MULTIROW", "0")
    assert exact_rows(types, repacked=True, n_threads=2, buffers=buffers).rows == 1
    assert exact_rows(types, repacked=True, n_threads=2, buffers=buffers[:2]) == RowLimit(REPACKED_ROWS)
    # The stock library has no self-test: its 3-row cap keeps repacked weights on the one-row GEMV,
    # which says nothing of AMX's tiles (used from 2 rows).
    monkeypatch.setattr(kernels, "has_selftest", lambda: False)
    limit = exact_rows(types, repacked=True, n_threads=2, buffers=buffers)
    assert limit.rows == 1 and "buffer type AMX" in limit.note and "make setup" in limit.note


@pytest.mark.real
def test_weights_in_a_buffer_type_the_self_test_did_not_run_decode_one_row_at_a_time(monkeypatch, capsys):
    """The load's own log says where llama.cpp placed the weights; one there that the self-test
    did not run (forced: UNRUN) caps the model at one row a micro-batch, with one line on stderr."""
    from specdec.backends import llamacpp_weights
    from specdec.models import resolve

    real_load = llamacpp_weights.load_model

    def load_model(path):
        model, buffers, types = real_load(path)
        return model, buffers + (UNRUN,), types

    monkeypatch.setattr(llamacpp_weights, "load_model", load_model)
    monkeypatch.setattr(llamacpp_weights, "_NOTED", set())
    weights = llamacpp_weights.load_llamacpp(str(resolve("smollm2-135m", need_hf=False).gguf), n_ctx=512)
    assert weights.n_ubatch == 1 and weights.prompt is not None
    lines = capsys.readouterr().err.splitlines()
    assert len([line for line in lines if UNRUN in line]) == 1, lines


@patched
def test_the_self_test_fails_a_kernel_that_is_not_batch_invariant():
    """Negative control: with llama.cpp's tiled K-quant matmul on (ggml reads the switch once per
    process, so in a process of its own), Q6_K products of 8 or more rows round differently."""
    code = ("from specdec.backends.llamacpp_lib import kernel_selftest\n"
            "r = kernel_selftest(14, 16, 2)\n"
            "print(r.differing, r.first_rows)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "GGML_CPU_TILED_MM": "1"})
    assert out.returncode == 0, out.stderr
    differing, first = map(int, out.stdout.split())
    assert differing > 0 and first >= 2


def test_without_the_patch_repacked_weights_keep_the_three_row_cap(monkeypatch):
    monkeypatch.setattr(kernels, "has_selftest", lambda: False)
    capped = exact_rows(["f32", "q4_K", "q6_K"], repacked=True, n_threads=2)
    assert capped.rows == REPACKED_ROWS and "make setup" in capped.note
    assert exact_rows(["f32", "q4_1"], repacked=False, n_threads=2) == RowLimit(None)


def test_a_type_that_fails_its_self_test_limits_the_rows_below_where_it_failed(monkeypatch):
    verdicts = {12: SelfTest(1200, 4, REPACKED), 14: SelfTest(0, 0, PLAIN), 0: SelfTest(0, 0, PLAIN)}
    monkeypatch.setattr(kernels, "has_selftest", lambda: True)
    monkeypatch.setattr(kernels, "kernel_selftest", lambda t, rows, threads: verdicts[t])
    limit = exact_rows(["f32", "q4_K", "q6_K"], repacked=True, n_threads=2)
    assert limit.rows == 3 and "q4_K (1200 outputs differ, from 4 rows)" in limit.note
    verdicts[14] = SelfTest(10, 2, PLAIN)  # a one-row kernel's multi-row form wrong from 2 rows: one row at a time
    assert exact_rows(["f32", "q4_K", "q6_K"], repacked=True, n_threads=2).rows == 1
    assert exact_rows(["f32", "q4_K", "q6_K"], repacked=True, n_threads=2, multirow=False).rows == 1
    verdicts[12] = verdicts[14] = SelfTest(0, 0, REPACKED)
    assert exact_rows(["f32", "q4_K", "q6_K"], repacked=True, n_threads=2) == RowLimit(None)
    assert exact_rows(["f32", "q4_K"], repacked=True, n_threads=2, multirow=False).rows == REPACKED_ROWS
    assert exact_rows(["f32", "q4_K"], repacked=False, n_threads=2, multirow=False) == RowLimit(None)


@patched
@pytest.mark.real
def test_exact_weights_take_full_micro_batches_where_the_self_test_passes():
    from specdec.backends.llamacpp import load_llamacpp
    from specdec.models import resolve

    gguf = str(resolve("gemma3-270m", need_hf=False).gguf)
    weights = load_llamacpp(gguf, n_ctx=512)
    assert "q4_K" in weights.types
    assert weights.n_ubatch == weights.n_batch and weights.prompt is None  # no cap, no prompt runner
    capped = load_llamacpp(gguf, n_ctx=512, multirow=False)  # the stock library's path, kept
    if has_amx():
        # AMX takes the Q4_K weights before the repack buffer: nothing repacked, nothing to cap
        assert "AMX" in weights.buffers and not weights.repacked
        assert capped.n_ubatch == capped.n_batch and capped.prompt is None
    else:
        assert weights.repacked and "CPU_REPACK" in weights.buffers
        assert capped.n_ubatch == REPACKED_ROWS and capped.prompt is not None


@patched
def test_the_library_names_its_kernel_generation_in_the_cost_curve_key(shared_model):
    """A cost curve measured on one generation of the patch prices rows wrongly on the next (the
    multi-row Q4_K GEMV makes 2-8 rows far cheaper; on a CPU with AMX, the multi-row VNNI kernels
    2-4 rows), so the cached curve's key names it, and whether the weights are in AMX buffers."""
    from specdec.backends.llamacpp_lib import kernel_generation

    # make setup builds the patch this checkout carries, whose newest generation (8 rows a pass in
    # the AVX2 loops) every x86 build reports, with the AMX kernels or without
    newest = 4
    assert kernel_generation() == newest, "the installed llama.cpp predates this checkout's patches: run make setup"
    from specdec.backends.llamacpp_lib import _cpu_library

    assert _cpu_library().ggml_cpu_exact_rows_per_pass() == 8
    model = shared_model("smollm2-135m")
    assert f"-rows-gen{newest}" in model.loaded.cost_key
    assert ("-amx" in model.loaded.cost_key) == has_amx()  # SmolLM2's Q4_1/Q8_0: AMX takes them


@pytest.mark.skipif(not has_amx(), reason="no AMX buffer type here (a CPU without AMX)")
def test_a_forward_on_amx_tiles_after_pytorchs_own_amx_kernels_on_the_same_thread():
    """PyTorch's oneDNN releases the AMX tiles after a bfloat16 matmul; ggml configured them once
    per thread, so its next tiled matmul on that thread raised SIGILL (a drafter on transformers in
    bfloat16 beside a llama.cpp target). The patched ggml loads the configuration for every tiled
    matmul. In a subprocess: a crash must fail this test, not end the run."""
    code = ("import torch, specdec\n"
            "model = specdec.load('smollm2-135m', backend='llamacpp')\n"
            "prompt = 'Tell me about the sea, the sky and the mountains'\n"
            "first = model.generate(prompt, max_new_tokens=4, drafter='none').token_ids\n"
            "a = torch.randn(256, 256, dtype=torch.bfloat16)\n"
            "(a @ a).sum().item()\n"
            "assert model.generate(prompt, max_new_tokens=4, drafter='none').token_ids == first\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, f"exit {out.returncode}: {out.stderr[-2000:]}"
