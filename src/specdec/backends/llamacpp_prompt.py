"""Prompts through llama.cpp's faster kernels, decoding through its exact ones.

Exact kernels (:data:`specdec.backends.llamacpp.EXACT`) make a decoding step's logits independent
of how many rows the step has; they cost little per generated token but about 6% of a long prompt's
prefill on Gemma-3 (its Q4_K weights lose the repacked GEMM). A prompt needs no such invariance:
plain and speculative decoding, alone or batched, all fill the cache from an empty sequence with the
same prompt, so any deterministic computation of it keeps their tokens equal. :class:`PromptRunner`
runs that first prefill on a second copy of the model with repacked weights, in a context with the
same KV types and layout, and copies the sequence's cache into the exact context
(``llama_state_seq_get_data`` / ``set_data``). It exists only where repacking changes a tensor
(:func:`repacks`): SmolLM2's Q4_1 weights have no repacked form, so its prompts stay exact.
"""

from __future__ import annotations

import ctypes
import threading
from typing import TYPE_CHECKING

from specdec.errors import SpecdecError

if TYPE_CHECKING:
    from specdec.backends.llamacpp import LlamaCppWeights

Layout = tuple[int, int, bool]  # n_ctx, n_seq_max, unified: the state of one context loads into another alike


def seq_state(lib, ctx, seq: int) -> tuple[object, int]:
    """A copy of sequence ``seq``'s cache in ``ctx``: (the bytes, their count)."""
    size = lib.llama_state_seq_get_size(ctx, seq)
    state = (ctypes.c_uint8 * size)()
    return state, lib.llama_state_seq_get_data(ctx, state, size, seq)


def load_seq_state(lib, ctx, seq: int, state, size: int) -> None:
    """Put a :func:`seq_state` copy into (empty) sequence ``seq`` of ``ctx``, a context of the same layout."""
    if lib.llama_state_seq_set_data(ctx, state, size, seq) != size:
        raise SpecdecError("llama.cpp could not load a prompt's cache into the decoding context")


def load_repacked(path: str, lib) -> tuple[object, bool]:
    """The model with repacked weights, and whether llama.cpp repacked any tensor of it (its load
    log names a CPU_REPACK buffer only then)."""
    lines: list[bytes] = []

    @lib.llama_log_callback
    def capture(level, text, user_data):
        lines.append(text or b"")

    lib.llama_log_set(capture, ctypes.c_void_p(0))
    try:
        params = lib.llama_model_default_params()
        params.use_extra_bufts = True
        model = lib.llama_model_load_from_file(path.encode(), params)
    finally:
        lib.llama_log_set(lib._specdec_quiet, ctypes.c_void_p(0))
    return model, any(b"CPU_REPACK model buffer" in line for line in lines)


class PromptRunner:
    """Fills a sequence's cache with a prompt computed on repacked weights (see the module)."""

    def __init__(self, weights: LlamaCppWeights, model, lib) -> None:
        self.weights, self.model, self.lib = weights, model, lib
        self.n_swa = lib.llama_model_n_swa(model)
        self._contexts: dict[Layout, tuple[object, object]] = {}
        self._lock = threading.Lock()  # one prompt at a time: a context and its batch are not shared

    def _context(self, layout: Layout):
        if layout not in self._contexts:
            from specdec.backends.llamacpp import context_params

            ctx = self.lib.llama_init_from_model(self.model, context_params(self.weights, *layout))
            if not ctx:
                raise SpecdecError("llama.cpp could not create a prompt context")
            self._contexts[layout] = (ctx, self.lib.llama_batch_init(self.weights.n_batch, 0, 1))
        return self._contexts[layout]

    def fill(self, target_ctx, layout: Layout, seq: int, tokens: list[int]) -> None:
        """Compute ``tokens`` from position 0 and put their cache into sequence ``seq`` of
        ``target_ctx`` (a context with ``layout``, where ``seq`` is empty)."""
        lib = self.lib
        with self._lock:
            ctx, batch = self._context(layout)
            lib.llama_memory_clear(lib.llama_get_memory(ctx), True)
            step = self.weights.n_batch
            for start in range(0, len(tokens), step):
                chunk = tokens[start:start + step]
                batch.n_tokens = len(chunk)
                for i, tok in enumerate(chunk):
                    batch.token[i] = tok
                    batch.pos[i] = start + i
                    batch.n_seq_id[i] = 1
                    batch.seq_id[i][0] = 0
                    batch.logits[i] = False  # a prefill needs no logits: not even the output matmul
                if lib.llama_decode(ctx, batch) != 0:
                    raise RuntimeError("llama_decode failed")
            load_seq_state(lib, target_ctx, seq, *seq_state(lib, ctx, 0))

    def floor(self, length: int) -> int:
        """The shortest length a sequence filled with ``length`` prompt tokens can be cut back to
        exactly: a sliding-window layer's copy holds only the window's cells, so a deeper rollback
        must recompute the prompt."""
        return length if self.n_swa and length > self.n_swa else 0

    def close(self) -> None:
        for ctx, batch in self._contexts.values():
            self.lib.llama_batch_free(batch)
            self.lib.llama_free(ctx)
        self._contexts.clear()
        if self.model:
            self.lib.llama_model_free(self.model)
            self.model = None


class PromptCache:
    """The caches of recent prompts, so that a prompt that begins like one of them (a chat
    template's system prompt, an earlier turn) computes only the rest.

    Only for exact kernels without a :class:`PromptRunner`: their k-token forward equals k one-token
    forwards bit for bit, so the cells of a beginning are the same whichever forward made them, and
    a prompt filled from the cache gets the logits it gets cold. Not for sliding-window models: a
    sequence's copy leaves out the cells outside its window, which a shorter prompt still needs.
    """

    def __init__(self, lib, entries: int = 8, min_tokens: int = 16) -> None:
        self.lib = lib
        self.entries, self.min_tokens = entries, min_tokens
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
                n = _common(saved, tokens)
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
        state, written = seq_state(self.lib, ctx, seq)
        with self._lock:
            self._saved.append((layout, key, state, written))
            del self._saved[:-self.entries]

    def clear(self) -> None:
        """Forget every saved prompt."""
        with self._lock:
            self._saved.clear()

    def load(self, ctx, seq: int, hit: tuple[int, object, int]) -> int:
        """Fill empty sequence ``seq`` of ``ctx`` with the beginning :meth:`lookup` found; its length."""
        common, state, size = hit
        load_seq_state(self.lib, ctx, seq, state, size)
        self.lib.llama_memory_seq_rm(self.lib.llama_get_memory(ctx), seq, common, -1)  # the saved prompt's rest
        self.hits += 1
        self.tokens_saved += common
        return common


def _common(a: tuple[int, ...], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
