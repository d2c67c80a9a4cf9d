"""Prompts through llama.cpp's faster kernels, decoding through its exact ones.

Exact kernels (:data:`specdec.backends.llamacpp_kernels.EXACT`) make a decoding step's logits
independent of how many rows the step has; on repacked weights they decode at most three rows a
micro-batch (every row on the one-row GEMV), which would make a long prompt's prefill several times
slower than the repacked GEMM. A prompt needs no such invariance: plain and speculative decoding,
alone or batched, all fill the cache from an empty sequence with the same prompt, so any
deterministic computation of it keeps their tokens equal. :class:`PromptRunner` runs that first
prefill in a context of full-size micro-batches on the same weights, with the same KV types and
layout, and copies the sequence's cache into the decoding context (``llama_state_seq_get_data`` /
``set_data``). It exists only where llama.cpp repacks a tensor of the model on this CPU
(:func:`specdec.backends.llamacpp_weights.load_model`): SmolLM2's Q4_1 weights have no repacked
form, so its prompts are computed as its decoding steps are.

:class:`PromptCache` keeps the caches of recent prompts, so that a prompt that begins like one of
them (a system prompt, the same file or document, an earlier turn) computes only the rest. Its
cells must be those a cold fill leaves: under one-row kernels any beginning will do; in the
runner's micro-batches the repacked GEMM computes rows in groups of :data:`GEMM_ROWS` and the rows
left over at a micro-batch's end on the GEMV, so a beginning is reused only to a multiple of that
group, after which the rest falls into groups, and a tail, exactly as a cold fill's.
"""

from __future__ import annotations

import ctypes
import threading

from specdec.backends.llamacpp_kernels import Kernels, Layout, context_params
from specdec.backends.llamacpp_lib import decode, lib, new_context
from specdec.errors import SpecdecError

# Rows the repacked GEMM takes at a time (ggml-cpu's repack.cpp; the rest of a micro-batch runs on
# the GEMV): a cached beginning that ends on a multiple of it leaves every later row on the kernel
# a cold fill gives it.
GEMM_ROWS = 4


def seq_state(ctx, seq: int) -> tuple[object, int]:
    """A copy of sequence ``seq``'s cache in ``ctx``: (the bytes, their count)."""
    llama = lib()
    size = llama.llama_state_seq_get_size(ctx, seq)
    state = (ctypes.c_uint8 * size)()
    return state, llama.llama_state_seq_get_data(ctx, state, size, seq)


def load_seq_state(ctx, seq: int, state, size: int) -> None:
    """Put a :func:`seq_state` copy into (empty) sequence ``seq`` of ``ctx``, a context of the same layout."""
    if lib().llama_state_seq_set_data(ctx, state, size, seq) != size:
        raise SpecdecError("llama.cpp could not load a prompt's cache into the decoding context")


class PromptRunner:
    """Fills a sequence's cache with a prompt computed in full-size micro-batches (see the module)."""

    def __init__(self, model, kernels: Kernels, n_batch: int, n_threads: int, n_ubatch: int | None = None) -> None:
        """``model``: the weights (their owner frees them); contexts on them get ``kernels``' KV
        types (the decoding context's), batches of ``n_batch`` rows computed in micro-batches of
        ``n_ubatch`` (default: all of them at once) and ``n_threads``."""
        self.model, self.kernels, self.n_batch, self.n_threads = model, kernels, n_batch, n_threads
        self.n_ubatch = n_ubatch
        self.n_swa = lib().llama_model_n_swa(model)
        self._contexts: dict[Layout, tuple[object, object]] = {}
        self._lock = threading.Lock()  # one prompt at a time: a context and its batch are not shared

    def _context(self, layout: Layout):
        if layout not in self._contexts:
            llama = lib()
            params = context_params(self.kernels, layout, self.n_batch, self.n_threads, self.n_ubatch)
            ctx = new_context(self.model, params)
            if not ctx:
                raise SpecdecError("llama.cpp could not create a prompt context")
            self._contexts[layout] = (ctx, llama.llama_batch_init(self.n_batch, 0, 1))
        return self._contexts[layout]

    def fill(self, target_ctx, layout: Layout, seq: int, tokens: list[int],
             begun: tuple[int, object, int] | None = None) -> None:
        """Compute ``tokens`` and put their cache into sequence ``seq`` of ``target_ctx`` (a context
        with ``layout``, where ``seq`` is empty): from position 0, or after ``begun``, a
        :meth:`PromptCache.lookup` hit (its length, state and size) whose length is a multiple of
        :data:`GEMM_ROWS`."""
        llama = lib()
        with self._lock:
            ctx, batch = self._context(layout)
            mem = llama.llama_get_memory(ctx)
            llama.llama_memory_clear(mem, True)
            first = 0
            if begun is not None:
                first, state, size = begun  # another length would move rows between GEMM and GEMV
                load_seq_state(ctx, 0, state, size)
                llama.llama_memory_seq_rm(mem, 0, first, -1)
            step = self.n_batch
            for start in range(first, len(tokens), step):
                chunk = tokens[start:start + step]
                batch.n_tokens = len(chunk)
                for i, tok in enumerate(chunk):
                    batch.token[i] = tok
                    batch.pos[i] = start + i
                    batch.n_seq_id[i] = 1
                    batch.seq_id[i][0] = 0
                    batch.logits[i] = False  # a prefill needs no logits: not even the output matmul
                decode(ctx, batch)
            load_seq_state(target_ctx, seq, *seq_state(ctx, 0))

    def floor(self, length: int) -> int:
        """The shortest length a sequence filled with ``length`` prompt tokens can be cut back to
        exactly: a sliding-window layer's copy holds only the window's cells, so a deeper rollback
        must recompute the prompt."""
        return length if self.n_swa and length > self.n_swa else 0

    def close(self) -> None:
        llama = lib()
        for ctx, batch in self._contexts.values():
            llama.llama_batch_free(batch)
            llama.llama_free(ctx)
        self._contexts.clear()


class PromptCache:
    """The caches of recent prompts, so that a prompt that begins like one of them (a chat
    template's system prompt, the same document, an earlier turn) computes only the rest.

    Only for exact kernels: a beginning's cells are then the same whichever forward made them (one-row
    kernels), or whichever prompt's fill made them, cut at a multiple of ``align`` rows (a
    :class:`PromptRunner`'s micro-batches, see the module), so a prompt filled from the cache gets
    the logits it gets cold. Not for sliding-window models: a sequence's copy leaves out the cells
    outside its window, which a shorter prompt still needs.
    """

    def __init__(self, entries: int = 32, min_tokens: int = 16, align: int = 1, max_bytes: int = 1 << 30) -> None:
        """At most ``entries`` prompts and ``max_bytes`` of their caches (the oldest go first): 32
        prompts of a server's clients, about 45k prompt tokens of Qwen2.5-Coder-1.5B in 1 GiB."""
        self.entries, self.min_tokens, self.align, self.max_bytes = entries, min_tokens, align, max_bytes
        self._saved: list[tuple[Layout, tuple[int, ...], object, int]] = []  # most recent last
        self._lock = threading.Lock()
        self.hits = 0  # prompts filled from the cache, and the tokens that saved
        self.tokens_saved = 0

    def lookup(self, layout: Layout, tokens: list[int]) -> tuple[int, object, int] | None:
        """The longest beginning of ``tokens`` held for ``layout`` (at least ``min_tokens``):
        (its length, the saved state, the state's size), or None. Give it to :meth:`load`."""
        best = None
        with self._lock:
            for saved_layout, saved, state, size in self._saved:
                if saved_layout != layout:
                    continue
                n = _common(saved, tokens) // self.align * self.align
                if n >= self.min_tokens and (best is None or n > best[0]):
                    best = (n, state, size)
        return best

    def save(self, layout: Layout, tokens: list[int], ctx, seq: int) -> None:
        """Keep the cache of sequence ``seq`` of ``ctx``, which holds exactly ``tokens``."""
        if len(tokens) < self.min_tokens:
            return
        key = tuple(tokens)
        with self._lock:
            if any(saved_layout == layout and saved == key for saved_layout, saved, _, _ in self._saved):
                return
        state, written = seq_state(ctx, seq)
        with self._lock:
            self._saved.append((layout, key, state, written))
            del self._saved[:-self.entries]
            while len(self._saved) > 1 and sum(entry[3] for entry in self._saved) > self.max_bytes:
                del self._saved[0]

    def clear(self) -> None:
        """Forget every saved prompt."""
        with self._lock:
            self._saved.clear()

    def load(self, ctx, seq: int, hit: tuple[int, object, int]) -> int:
        """Fill empty sequence ``seq`` of ``ctx`` with the beginning :meth:`lookup` found; its length."""
        common, state, size = hit
        load_seq_state(ctx, seq, state, size)
        llama = lib()
        llama.llama_memory_seq_rm(llama.llama_get_memory(ctx), seq, common, -1)  # the saved prompt's rest
        self.count(hit)
        return common

    def count(self, hit: tuple[int, object, int]) -> None:
        """Count a hit used elsewhere (a :class:`PromptRunner` loads it into its own context)."""
        self.hits += 1
        self.tokens_saved += hit[0]


def _common(a: tuple[int, ...], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
