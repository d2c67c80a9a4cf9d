"""A GGUF loaded by llama.cpp once, with its kernels, for every context made on it.

Exact weights also say how many rows a micro-batch may hold (:func:`.llamacpp_kernels.exact_rows`:
any number where the library's multi-row kernels pass their self-test for this model's weight
types) and how an empty sequence's prompt is filled (:mod:`.llamacpp_prompt`): where decoding is
capped to a few rows a micro-batch, in a context of full-size micro-batches (the repacked GEMM);
else from the caches of recent prompts.
"""

from __future__ import annotations

import os
import re
import sys

from specdec.backends.llamacpp_kernels import Layout, choose_kernels, context_params, exact_rows
from specdec.backends.llamacpp_lib import REPACK_BUFFER, lib, load_model_file, log_captured, new_context
from specdec.backends.llamacpp_prompt import GEMM_ROWS, PromptCache, PromptRunner
from specdec.cpu import usable_cpus
from specdec.errors import SpecdecError

MAX_CONTEXT = 8192  # KV memory per context grows with it; the models train on 8192 (SmolLM2) or more


class LlamaCppWeights:
    """A GGUF loaded once; a context (its own KV cache) per sequence is made with :meth:`context`."""

    def __init__(self, path: str, n_ctx: int | None = None, n_batch: int = 512, n_threads: int | None = None,
                 exact: bool | None = None, multirow: bool | None = None) -> None:
        """``multirow`` False (``SPECDEC_MULTIROW=0``) caps exact decoding on repacked weights at the
        stock library's 3 rows a micro-batch, on top of the self-test's verdict; the kernels stay the
        patched library's (2 and 3 rows run its multi-row kernels)."""
        if not os.path.isfile(path):
            raise SpecdecError(f"model file not found: {path}")
        llama_cpp = lib()
        self.kernels = choose_kernels(exact)
        self.model, self.buffers, self.types = load_model(path)
        self.repacked = REPACK_BUFFER in self.buffers
        if not self.model:
            raise SpecdecError(f"llama.cpp could not load {path}")
        self.path = path
        self.n_ctx = n_ctx or min(llama_cpp.llama_model_n_ctx_train(self.model), MAX_CONTEXT)
        self.n_batch = n_batch
        self.n_threads = n_threads or usable_cpus()
        self.vocab_size = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(self.model))
        # Rows per micro-batch of a decoding context: with exact kernels, as many as the library's
        # kernels keep batch-invariant for this model's weight types (see llamacpp_kernels).
        self.n_ubatch = n_batch
        if self.kernels.exact:
            limit = exact_rows(self.types, self.repacked, self.n_threads, multirow, self.buffers)
            if limit.note:
                _note_once(limit.note)
            if limit.rows is not None:
                self.n_ubatch = min(limit.rows, n_batch)
        # How an empty sequence's prompt is filled (exact kernels only; fast kernels would make a
        # cached beginning differ from a computed one): where decoding is capped at a few rows a
        # micro-batch, in a context of full micro-batches (the repacked GEMM; the same cache for
        # every generation of the prompt); and where the model has no sliding window, starting
        # from the caches of recent prompts (cut to the GEMM's row groups after a runner).
        self.prompt: PromptRunner | None = None
        self.prompts: PromptCache | None = None
        if self.kernels.exact:
            if self.n_ubatch < n_batch:
                self.prompt = PromptRunner(self.model, self.kernels, self.n_batch, self.n_threads)
            if llama_cpp.llama_model_n_swa(self.model) == 0:
                self.prompts = PromptCache(align=GEMM_ROWS if self.prompt is not None else 1)

    @property
    def exact(self) -> bool:
        return self.kernels.exact

    def context(self, layout: Layout):
        """A llama.cpp context on these weights with their kernels and a KV ``layout``."""
        params = context_params(self.kernels, layout, self.n_batch, self.n_threads, self.n_ubatch)
        ctx = new_context(self.model, params)
        if not ctx:
            raise SpecdecError("llama.cpp could not create a context")
        return ctx

    def __del__(self) -> None:
        if getattr(self, "prompt", None) is not None:
            self.prompt.close()
            self.prompt = None
        if getattr(self, "model", None):
            lib().llama_model_free(self.model)
            self.model = None


def load_llamacpp(path: str, **options) -> LlamaCppWeights:
    """Load a GGUF for the llama.cpp backend (``options``: n_ctx, n_batch, n_threads, exact)."""
    return LlamaCppWeights(path, **options)


def load_model(path: str) -> tuple[object, tuple[str, ...], tuple[str, ...]]:
    """The model, its weights repacked where llama.cpp has a repacked form (both kernel settings
    use them), the buffer types llama.cpp placed its weights in (ggml's names: ``CPU_Mapped``,
    ``CPU_REPACK``, ``AMX``), and its tensors' types (ggml's names).

    Only llama.cpp can say the second: where it places a tensor depends on the tensor's type, its
    shape *and* this CPU's features (``ggml_repack_get_optimal_repack_type`` in ggml-cpu's
    repack.cpp, the AMX buffer's ``supports_op``), so the GGUF's tensor types alone cannot tell. Its
    public C API reports no model's buffer types (``llama_get_memory_breakdown`` is in the non-public
    llama-ext.h, returns C++ types and needs a context); the load itself does, one log line per
    buffer it allocated (``load_tensors:   CPU_REPACK model buffer size =    12.66 MiB``), a buffer
    type named only when some tensor went into it. So those lines are read.
    """
    llama_cpp = lib()
    with log_captured() as lines:
        params = llama_cpp.llama_model_default_params()
        params.use_extra_bufts = True
        model = load_model_file(path, params)
    text = b"".join(lines).decode(errors="replace")
    return model, tuple(dict.fromkeys(_BUFFERS.findall(text))), tuple(_TENSOR_TYPES.findall(text))


# llama.cpp's load log counts the tensors of each type: "llama_model_loader: - type q4_K:  169 tensors"
_TENSOR_TYPES = re.compile(r"- type\s+(\w+):\s+\d+ tensors")
# and names each buffer of weights: "load_tensors:   CPU_REPACK model buffer size =    12.66 MiB"
_BUFFERS = re.compile(r"(\S+) model buffer size")
_NOTED: set[str] = set()


def _note_once(note: str) -> None:
    if note not in _NOTED:
        _NOTED.add(note)
        print(f"specdec: note: {note}", file=sys.stderr)
