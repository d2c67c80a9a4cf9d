"""Which llama.cpp kernels compute the logits, and the context parameters that choose them.

By default llama.cpp computes slightly different logits for a batch of k tokens than for k
one-token forwards: its fastest kernels change with the batch shape (llamafile's tinyBLAS from 2
rows, the tiled K-quant matmul from 8, repacked-weight GEMM from 4, flash attention's split-KV path
for one row and tiled path from 64 rows). Speculative output can then part from plain decoding at
a near-tie. **Exact** kernels (:data:`EXACT`) avoid every batch-shape-dependent path, so a k-token
forward equals k one-token forwards bit for bit, also with other sequences in the batch: a build
without llamafile (``CMAKE_ARGS=-DGGML_LLAMAFILE=OFF``), ``GGML_CPU_TILED_MM=0``, flash attention
with K and V caches of *different* types (q8_0 K, f16 V), which keeps every row on the per-row
reference kernel that skips masked cells, and repacked weights decoded at most
:data:`REPACKED_ROWS` rows per llama.cpp micro-batch.

Repacked weights (e.g. Q4_K as ``q4_K_8x8``) have two kernels: a GEMV that computes each row on
its own, taken for micro-batches of up to 3 rows, and a GEMM over groups of 4 rows that rounds
differently. Capping a decoding context's micro-batch at 3 rows keeps every row on the GEMV, so a
k-token forward is ceil(k / 3) micro-batches of the one-row kernel. That beats giving up repacking:
on Qwen2.5-Coder-1.5B (Q4_K_M, 2 cores) one row costs 35 ms on the repacked GEMV and 43 ms on the
plain per-row dot product, 2 and 3 rows 60 and 79 ms against 84 and 103 ms.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from specdec.backends.llamacpp_lib import has_decoded, has_llamafile, lib
from specdec.errors import SpecdecError

TILED_ENV = "GGML_CPU_TILED_MM"  # read once per process, at the first matmul
REBUILD = ("CMAKE_ARGS=-DGGML_LLAMAFILE=OFF pip install --force-reinstall --no-deps --no-cache-dir "
           "llama-cpp-python==0.3.36")

# ggml's type ids and llama.cpp's flash-attention switch (stable parts of the C API).
GGML_F16, GGML_Q8_0 = 1, 8
FLASH_ATTN_AUTO, FLASH_ATTN_ON = -1, 1

Layout = tuple[int, int, bool]  # n_ctx, n_seq_max, unified: the state of one context loads into another alike
# The most rows a micro-batch of repacked weights may hold with every row on the one-row GEMV
# (ggml-cpu's repack.cpp: "If there are more than three rows in src1, use gemm").
REPACKED_ROWS = 3


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
# equal types); q8_0 K with f16 V was the fastest such pair measured here (AVX-512 and AVX2).
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
