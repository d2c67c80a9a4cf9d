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
itself (:func:`exact_rows`): each weight type of the model, 1..64 rows, in every buffer type that
takes it, every row against the one-row result, on this CPU. Where every type passes, a micro-batch
may hold any number of rows; where one fails, fewer rows than where it failed; where the weights
may be in a buffer type the self-test did not run, one row. Where the stock library is installed
(``pip install specdec[llamacpp]``), repacked weights are decoded at most :data:`REPACKED_ROWS` rows
a micro-batch, which keeps every row on the one-row GEMV (ggml takes its 4-row GEMM from 4 rows).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass

import gguf

from specdec.backends.llamacpp_lib import (PLAIN_BUFFERS, REPACK_BUFFER, has_decoded, has_llamafile,
                                           has_selftest, kernel_selftest, lib)
from specdec.errors import SpecdecError

TILED_ENV = "GGML_CPU_TILED_MM"  # read once per process, at the first matmul
MULTIROW_ENV = "SPECDEC_MULTIROW"  # "0": the stock library's row cap on top of the self-test (exact_rows)
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


def exact_rows(type_names: Iterable[str], repacked: bool, n_threads: int, multirow: bool | None = None,
               buffers: Iterable[str] = ()) -> RowLimit:
    """The micro-batch limit of exact kernels for weights of ``type_names`` (ggml's names, as
    llama.cpp's load log spells them: ``q4_K``, ``q6_K``, ``f32``), ``repacked`` or not, held in
    ``buffers`` (the buffer types llama.cpp's load log names: ``CPU_Mapped``, ``CPU_REPACK``, ``AMX``),
    computed on ``n_threads`` threads.

    With specdec's patched library, its self-test decides: no limit where every type passes for
    1..64 rows in every buffer type that takes it; fewer rows than the smallest count that failed;
    one row (the one-row kernels themselves) where a buffer type that holds or takes the weights was
    not run by the self-test (refused, with a note naming it). Without the patch (the stock library),
    repacked weights take at most :data:`REPACKED_ROWS` rows (its one-row GEMV) and plain ones any
    number, but weights in any other extra buffer type (AMX: VNNI for one row, tiles for two) one row.
    ``multirow`` False (``SPECDEC_MULTIROW=0`` in the environment) caps repacked weights at
    :data:`REPACKED_ROWS` rows on top of the self-test's verdict: the stock library's limits, for
    comparison and the prompt runner's tests. It does not switch the patch's kernels off: a 2- or
    3-row micro-batch still runs its multi-row kernels, which is why the self-test still runs.
    """
    if multirow is None and os.environ.get(MULTIROW_ENV) == "0":
        multirow = False
    extra = sorted(set(buffers) - PLAIN_BUFFERS)
    if not has_selftest():
        unknown = [name for name in extra if name != REPACK_BUFFER]
        if unknown:
            return _refused(unknown, "and this llama.cpp has no self-test of their kernels "
                                     "(make setup builds it)")
        if not repacked:
            return RowLimit(None)
        note = None if multirow is False else (
            "this llama.cpp has no batch-invariant multi-row kernels with a self-test of every buffer type "
            f"(make setup builds them): exact decoding takes at most {REPACKED_ROWS} rows a micro-batch")
        return RowLimit(REPACKED_ROWS, note)
    rows: int | None = REPACKED_ROWS if multirow is False and repacked else None
    failed: list[str] = []
    tested: set[str] = set()
    refused: dict[str, None] = {}  # buffer types, in order
    unrun: list[str] = []  # types of which no kernel ran
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
            continue
        tested.update(result.tested)
        if not result.complete:
            refused.update(dict.fromkeys(result.untested))
            if not result.tested:
                unrun.append(name)
        elif result.differing:
            failed.append(f"{name} ({result.differing} outputs differ, from {result.first_rows} rows)")
            rows = min(rows or result.first_rows, max(1, result.first_rows - 1))
    # Weights llama.cpp put in a buffer type whose kernels the self-test ran for none of their types.
    refused.update(dict.fromkeys(name for name in extra if name not in tested))
    if refused or unrun:
        return _refused(list(refused), "whose kernels this llama.cpp's self-test did not run", unrun)
    if not failed:
        return RowLimit(rows)
    limit = f"at most {rows} row{'s' if rows != 1 else ''} a micro-batch" if rows else "no limit"
    return RowLimit(rows, "exact kernels: this llama.cpp's multi-row matmul is not batch-invariant on this CPU for "
                          f"{', '.join(failed)}: decoding takes {limit}")


def _refused(buffers: list[str], why: str, unrun: list[str] | None = None) -> RowLimit:
    """One row a micro-batch (every row on the one-row kernel itself) where llama.cpp may place the
    weights in ``buffers``, whose kernels were not tested (``why``), or for types ``unrun``, of which
    no kernel ran."""
    reasons = []
    if buffers:
        kind = "buffer type" if len(buffers) == 1 else "buffer types"
        reasons.append(f"llama.cpp may place this model's weights in {kind} {', '.join(buffers)} (multi-row "
                       f"kernels of their own, which may round differently from the one-row ones), {why}")
    if unrun:
        reasons.append(f"this llama.cpp's self-test ran no kernel for {', '.join(unrun)}")
    return RowLimit(1, f"exact kernels: {'; '.join(reasons)}: decoding takes 1 row a micro-batch")
