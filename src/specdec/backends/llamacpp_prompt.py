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
            size = lib.llama_state_seq_get_size(ctx, 0)
            state = (ctypes.c_uint8 * size)()
            written = lib.llama_state_seq_get_data(ctx, state, size, 0)
            if lib.llama_state_seq_set_data(target_ctx, state, written, seq) != written:
                raise SpecdecError("llama.cpp could not load a prompt's cache into the decoding context")

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
