"""specdec's llama.cpp kernel patch (patches/llama.cpp) and how exact mode uses it.

The patched library's multi-row matmul gives every row the one-row kernel's bits; its self-test
(``ggml_cpu_exact_selftest``) checks that on the running CPU for a weight type, 1..64 rows, through
ggml's CPU backend as a model runs it. These tests run the self-test for every weight type of the
shipped models, show that it fails where a kernel is not batch-invariant (llama.cpp's tiled matmul,
switched on in a subprocess), and check how its verdict sets exact mode's micro-batch limit. Which
loops ran (AVX2 or AVX-512) depends on the CPU, and on the build: an AVX2-only build on an AVX-512
machine runs the AVX2 loops; each run names its instruction set.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("llama_cpp")

from specdec.backends import llamacpp_kernels as kernels  # noqa: E402
from specdec.backends.llamacpp_kernels import REPACKED_ROWS, SELFTEST_ROWS, RowLimit, exact_rows  # noqa: E402
from specdec.backends.llamacpp_lib import SelfTest, has_selftest, kernel_selftest, lib  # noqa: E402

patched = pytest.mark.skipif(not has_selftest(), reason="this llama.cpp is the stock library "
                                                        "(make setup builds it with specdec's kernel patch)")

# ggml type ids of the shipped models' weights: SmolLM2 (Q4_1, Q8_0), Gemma-3 (Q4_K, Q6_K, Q8_0),
# Qwen2.5-Coder 1.5B (Q4_K, Q6_K) and 0.5B (Q5_0, Q8_0, Q4_K, Q6_K); F32 norms; Q4_0 is repacked too.
SHIPPED = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q8_0": 8, "Q4_K": 12, "Q6_K": 14}


def instruction_set() -> str:
    info = lib().llama_print_system_info().decode()
    return "AVX-512" if "AVX512 = 1" in info else "AVX2" if "AVX2 = 1" in info else "other"


@patched
@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_every_row_of_a_multirow_product_has_the_one_row_bits(name):
    result = kernel_selftest(SHIPPED[name], SELFTEST_ROWS, os.cpu_count() or 1)
    assert result is not None, f"the self-test could not run {name}"
    assert result.differing == 0, (f"{name} on {instruction_set()}: {result.differing} outputs differ "
                                   f"from {result.first_rows} rows")
    if name in ("Q4_0", "Q4_K"):  # repacked wherever the CPU has AVX2 (every x86 machine here)
        assert result.repacked, f"{name} was not repacked on {instruction_set()}"


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
    verdicts = {12: SelfTest(1200, 4, True), 14: SelfTest(0, 0, False), 0: SelfTest(0, 0, False)}
    monkeypatch.setattr(kernels, "has_selftest", lambda: True)
    monkeypatch.setattr(kernels, "kernel_selftest", lambda t, rows, threads: verdicts[t])
    limit = exact_rows(["f32", "q4_K", "q6_K"], repacked=True, n_threads=2)
    assert limit.rows == 3 and "q4_K (1200 outputs differ, from 4 rows)" in limit.note
    verdicts[14] = SelfTest(10, 2, False)  # a one-row kernel's multi-row form wrong from 2 rows: one row at a time
    assert exact_rows(["f32", "q4_K", "q6_K"], repacked=True, n_threads=2).rows == 1
    verdicts[12] = verdicts[14] = SelfTest(0, 0, True)
    assert exact_rows(["f32", "q4_K", "q6_K"], repacked=True, n_threads=2) == RowLimit(None)
    assert exact_rows(["f32", "q4_K"], repacked=True, n_threads=2, multirow=False).rows == REPACKED_ROWS


@patched
@pytest.mark.real
def test_exact_weights_take_full_micro_batches_where_the_self_test_passes():
    from specdec.backends.llamacpp import load_llamacpp
    from specdec.models import resolve

    gguf = str(resolve("gemma3-270m", need_hf=False).gguf)
    weights = load_llamacpp(gguf, n_ctx=512)
    assert weights.repacked and "q4_K" in weights.types
    assert weights.n_ubatch == weights.n_batch and weights.prompt is None  # no cap, no prompt runner
    capped = load_llamacpp(gguf, n_ctx=512, multirow=False)  # the stock library's path, kept
    assert capped.n_ubatch == REPACKED_ROWS and capped.prompt is not None


@patched
def test_the_library_names_its_kernel_generation_in_the_cost_curve_key():
    """A cost curve measured on one generation of the patch prices rows wrongly on the next (the
    multi-row Q4_K GEMV makes 2-8 rows far cheaper), so the cached curve's key names it."""
    from specdec.backends.llamacpp_lib import kernel_generation

    # make setup builds the patch this checkout carries: its generation is the newest
    assert kernel_generation() == 2, "the installed llama.cpp predates the multi-row Q4_K GEMV: run make setup"
    import specdec

    model = specdec.load("smollm2-135m", backend="llamacpp")
    assert "-rows-gen2" in model.loaded.cost_key
