"""Which llama.cpp kernels compute the logits, and the context parameters that choose them.

By default llama.cpp computes slightly different logits for a batch of k tokens than for k
one-token forwards: its fastest kernels change with the batch shape (llamafile's tinyBLAS from 2
rows, the tiled K-quant matmul from 8, repacked-weight GEMM from 4, flash attention's split-KV path
for one row and tiled path from 64 rows). Speculative output can then part from plain decoding at
a near-tie. **Exact** kernels (:data:`EXACT`) avoid every batch-shape-dependent path, so a k-token
forward equals k one-token forwards bit for bit, also with other sequences in the batch: a build
without llamafile (``CMAKE_ARGS=-DGGML_LLAMAFILE=OFF``), ``GGML_CPU_TILED_MM=0``, and flash
attention with K and V caches of *different* types (q8_0 K, f16 V), which keeps every row on the
per-row reference kernel that skips masked cells.

The matrix multiplications themselves: ``make setup`` builds llama.cpp with specdec's kernel patch
(``patches/llama.cpp``), whose multi-row kernels give every row the one-row kernel's bits at the
speed of llama.cpp's fast kernels or faster (the repacked Q4_K GEMV run on up to 8 rows at once,
the weights unpacked once for all of them, in place of ggml's GEMM; Q6_K, Q8_0 and Q5_0 weights
unpacked once for several rows). The patched library tests
itself (:func:`exact_rows`): each weight type of the model, 1..64 rows, every row against the one-row
result, on this CPU. Where every type passes, a micro-batch may hold any number of rows. Where the
stock library is installed (``pip install specdec[llamacpp]``), or a type fails, repacked weights
are decoded at most :data:`REPACKED_ROWS` rows a micro-batch, which keeps every row on the one-row
GEMV (ggml takes its 4-row GEMM from 4 rows).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass

import gguf

from specdec.backends.llamacpp_lib import has_decoded, has_llamafile, has_selftest, kernel_selftest, lib
from specdec.errors import SpecdecError

TILED_ENV = "GGML_CPU_TILED_MM"  # read once per process, at the first matmul
MULTIROW_ENV = "SPECDEC_MULTIROW"  # "0": exact kernels keep the stock library's row cap (exact_rows)
REBUILD = ("CMAKE_ARGS=-DGGML_LLAMAFILE=OFF pip install --force-reinstall --no-deps --no-cache-dir "
           "llama-cpp-python==0.3.36")

# ggml's type ids and llama.cpp's flash-attention switch (stable parts of the C API).
GGML_F16, GGML_Q8_0 = 1, 8
FLASH_ATTN_AUTO, FLASH_ATTN_ON = -1, 1

Layout = tuple[int, int, bool]  # n_ctx, n_seq_max, unified: the state of one context loads into another alike
# The most rows a micro-batch of repacked weights may hold with every row on the one-row GEMV
# (ggml-cpu's repack.cpp: "If there are more than three rows in src1, use gemm").
REPACKED_ROWS = 3
# The row counts the library's self-test checks (1..SELFTEST_ROWS): a verification step's window.
SELFTEST_ROWS = 64


@dataclass(frozen=True)
class Kernels:
    """The llama.cpp settings that decide how logits are computed."""

    name: str
    flash_attn: int
    type_k: int
    type_v: int

    @property
    def exact(self) -> bool:
        return self.name == "exact"


# K and V of different types keep flash attention off its split-KV and tiled paths (both require
# equal types); q8_0 K with f16 V was the fastest such pair (measured on AVX-512 and AVX2).
EXACT = Kernels("exact", FLASH_ATTN_ON, GGML_Q8_0, GGML_F16)
FAST = Kernels("fast", FLASH_ATTN_AUTO, GGML_F16, GGML_F16)
DEFAULT_EXACT = True


def choose_kernels(exact: bool | None) -> Kernels:
    """The kernels for a load: ``exact`` True/False, or None for the default (exact when the build
    allows it, with one line on stderr when it does not).

    Exact kernels also switch llama.cpp's tiled K-quant matmul off for the whole process: ggml reads
    that switch once, at the first matmul, so exact mode must be chosen before any forward runs.
    """
    want = DEFAULT_EXACT if exact is None else exact
    if not want:
        return FAST
    if has_llamafile():
        message = ("this llama.cpp build has llamafile kernels, which round a batch of tokens differently "
                   f"from one token at a time; for exact (batch-invariant) decoding rebuild it: {REBUILD}")
        if exact:
            raise SpecdecError(message)
        print(f"specdec: note: {message} (using its fast kernels)", file=sys.stderr)
        return FAST
    if os.environ.get(TILED_ENV) != "0":
        if has_decoded():
            raise SpecdecError("exact llama.cpp kernels must be chosen before the first llama.cpp forward "
                               f"in this process (or set {TILED_ENV}=0 before starting it)")
        os.environ[TILED_ENV] = "0"
    return EXACT


def stream_ubatch(rows: int) -> int:
    """The ``n_ubatch`` that caps a micro-batch at ``rows`` rows in a context of one KV stream per
    sequence. There llama.cpp slices a batch with ``split_equal``, which admits one sequence more
    than ``n_ubatch`` before it stops (``cur_seq_set.size() > n_ubatch``), each with at least one
    row: with ``n_ubatch`` 3, four sequences stepping one row each made a micro-batch of 4 rows, on
    the repacked GEMM, and served answers parted from the same requests served alone."""
    return max(1, rows - 1)


def context_params(kernels: Kernels, layout: Layout, n_batch: int, n_threads: int, n_ubatch: int | None = None):
    """llama.cpp context parameters for ``kernels`` and a KV ``layout``: ``n_ctx`` cells for up to
    ``n_seq_max`` sequence ids, shared by all of them (``unified``: tree branches share their
    prefix's cells) or split into one stream per id; llama.cpp computes a batch in micro-batches of
    at most ``n_ubatch`` rows (default ``n_batch``)."""
    n_ctx, n_seq_max, unified = layout
    n_ubatch = n_ubatch or n_batch
    if not unified and n_seq_max > 1 and n_ubatch < n_batch:
        n_ubatch = stream_ubatch(n_ubatch)
    params = lib().llama_context_default_params()
    params.n_ctx = n_ctx
    params.n_batch = n_batch
    params.n_ubatch = n_ubatch
    params.n_threads = n_threads
    params.n_threads_batch = n_threads
    # Keep every sliding-window row so that rolling back within the window works (Gemma 3).
    params.swa_full = True
    params.n_seq_max = n_seq_max
    params.kv_unified = unified
    params.flash_attn_type = kernels.flash_attn
    params.type_k, params.type_v = kernels.type_k, kernels.type_v
    return params


@dataclass(frozen=True)
class RowLimit:
    """How many rows a micro-batch of exact kernels may hold for a model on this library and CPU."""

    rows: int | None  # None: any number
    note: str | None = None  # why there is a limit, for one line on stderr (None: nothing to say)


def exact_rows(type_names: Iterable[str], repacked: bool, n_threads: int, multirow: bool | None = None) -> RowLimit:
    """The micro-batch limit of exact kernels for weights of ``type_names`` (ggml's names, as
    llama.cpp's load log spells them: ``q4_K``, ``q6_K``, ``f32``), ``repacked`` or not, computed
    on ``n_threads`` threads.

    With specdec's patched library, its self-test decides: no limit where every type passes for
    1..64 rows; else fewer rows than the smallest count that failed. Without it (the stock library),
    or with ``multirow`` False (the capped path, for comparison and its tests; also set by
    ``SPECDEC_MULTIROW=0`` in the environment), repacked weights take at most :data:`REPACKED_ROWS`
    rows and the rest any number, as before the patch.
    """
    if multirow is None and os.environ.get(MULTIROW_ENV) == "0":
        multirow = False
    if multirow is False or not has_selftest():
        if not repacked:
            return RowLimit(None)
        note = None if multirow is False else (
            "this llama.cpp has no batch-invariant multi-row kernels (make setup builds them): exact decoding "
            f"takes at most {REPACKED_ROWS} rows a micro-batch")
        return RowLimit(REPACKED_ROWS, note)
    rows: int | None = None
    failed = []
    for name in sorted(set(type_names)):
        try:
            ggml_type = gguf.GGMLQuantizationType[name.upper()]
        except KeyError:
            ggml_type = None
        result = None if ggml_type is None else kernel_selftest(int(ggml_type), SELFTEST_ROWS, n_threads)
        if result is None:
            # a type the self-test cannot build (one that needs an importance matrix): as before the patch
            failed.append(f"{name} (not testable)")
            rows = min(rows or REPACKED_ROWS, REPACKED_ROWS) if repacked else rows
        elif result.differing:
            failed.append(f"{name} ({result.differing} outputs differ, from {result.first_rows} rows)")
            rows = min(rows or result.first_rows, result.first_rows - 1)
    if not failed:
        return RowLimit(None)
    limit = f"at most {rows} row{'s' if rows != 1 else ''} a micro-batch" if rows else "no limit"
    return RowLimit(rows, "exact kernels: this llama.cpp's multi-row matmul is not batch-invariant on this CPU for "
                          f"{', '.join(failed)}: decoding takes {limit}")
