"""llama.cpp backend (llama-cpp-python's low-level API): batched decode with logits for every new
position, KV-cache rollback with ``llama_memory_seq_rm``. An optional extra: ``specdec[llamacpp]``.

By default llama.cpp computes slightly different logits for a batch of k tokens than for k
one-token forwards: its fastest kernels change with the batch shape (llamafile's tinyBLAS and the
tiled K-quant matmul from 2 rows on, repacked-weight GEMM from 4 rows, flash attention's split-KV
path for one row and tiled path from 64 rows). Speculative output can then part from plain
decoding at a near-tie. **Exact** kernels (:data:`EXACT`) avoid every batch-shape-dependent path,
so a k-token forward equals k one-token forwards bit for bit, also with other sequences in the
batch: a build without llamafile (``CMAKE_ARGS=-DGGML_LLAMAFILE=OFF``), ``GGML_CPU_TILED_MM=0``,
no weight repacking, and flash attention with K and V caches of *different* types (q8_0 K, f16
V), which keeps every row on the per-row reference kernel that skips masked cells.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from specdec import tree as trees
from specdec.backends.base import Backend, check_extend, check_keep, check_truncate
from specdec.backends.llamacpp_prompt import Layout, PromptCache, PromptRunner, load_repacked
from specdec.errors import SpecdecError
from specdec.registry import LoadedWeights, LoadRequest, backend

MAX_CONTEXT = 8192  # KV memory per context grows with it; the models train on 8192 (SmolLM2) or more
MAX_BRANCHES = 32  # sequence ids per context: a draft tree may have at most this many leaves
TILED_ENV = "GGML_CPU_TILED_MM"  # read once per process, at the first matmul
REBUILD = ("CMAKE_ARGS=-DGGML_LLAMAFILE=OFF pip install --force-reinstall --no-deps --no-cache-dir "
           "llama-cpp-python==0.3.36")

# ggml's type ids and llama.cpp's flash-attention switch (stable parts of the C API).
GGML_F16, GGML_Q8_0 = 1, 8
FLASH_ATTN_AUTO, FLASH_ATTN_ON = -1, 1


@dataclass(frozen=True)
class Kernels:
    """The llama.cpp settings that decide how logits are computed."""

    name: str
    flash_attn: int
    type_k: int
    type_v: int
    repack: bool  # repacked weights (faster GEMM, but a different kernel for 1 and for 4+ rows)

    @property
    def exact(self) -> bool:
        return self.name == "exact"


# K and V of different types keep flash attention off its split-KV and tiled paths (both require
# equal types); q8_0 K with f16 V was the fastest such pair measured here (AVX-512 and AVX2).
EXACT = Kernels("exact", FLASH_ATTN_ON, GGML_Q8_0, GGML_F16, repack=False)
FAST = Kernels("fast", FLASH_ATTN_AUTO, GGML_F16, GGML_F16, repack=True)
DEFAULT_EXACT = True


@lru_cache(maxsize=1)
def _llama():
    """Import llama_cpp once (it is optional) and silence its per-call logging."""
    try:
        import llama_cpp
    except ImportError as exc:
        raise SpecdecError("the llama.cpp backend needs llama-cpp-python: pip install 'specdec[llamacpp]'") from exc

    @llama_cpp.llama_log_callback
    def quiet(level, text, user_data):  # llama.cpp logs every load and decode to stderr otherwise
        return None

    llama_cpp.llama_log_set(quiet, ctypes.c_void_p(0))
    llama_cpp._specdec_quiet = quiet  # keeps the ctypes callback alive; a load that reads the log restores it
    llama_cpp.llama_backend_init()
    return llama_cpp


def has_llamafile() -> bool:
    """Whether the installed llama.cpp was built with llamafile's tinyBLAS kernels (the pip default)."""
    return b"LLAMAFILE = 1" in _llama().llama_print_system_info()


_decoded = {"any": False}  # whether this process has run a forward (the tiled switch is then fixed)


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
        if _decoded["any"]:
            raise SpecdecError("exact llama.cpp kernels must be chosen before the first llama.cpp forward "
                               f"in this process (or set {TILED_ENV}=0 before starting it)")
        os.environ[TILED_ENV] = "0"
    return EXACT


class LlamaCppWeights:
    """A GGUF loaded once; :meth:`backend` makes a context (its own KV cache) per sequence."""

    def __init__(self, path: str, n_ctx: int | None = None, n_batch: int = 512, n_threads: int | None = None,
                 exact: bool | None = None) -> None:
        if not os.path.isfile(path):
            raise SpecdecError(f"model file not found: {path}")
        llama_cpp = _llama()
        self.kernels = choose_kernels(exact)
        params = llama_cpp.llama_model_default_params()
        params.use_extra_bufts = self.kernels.repack
        self.model = llama_cpp.llama_model_load_from_file(path.encode(), params)
        if not self.model:
            raise SpecdecError(f"llama.cpp could not load {path}")
        self.path = path
        self.n_ctx = n_ctx or min(llama_cpp.llama_model_n_ctx_train(self.model), MAX_CONTEXT)
        self.n_batch = n_batch
        self.n_threads = n_threads or os.cpu_count() or 1
        self.vocab_size = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(self.model))
        # How an empty sequence's prompt is filled (exact kernels only; fast kernels would make a
        # cached beginning differ from a computed one): on repacked weights where that changes a
        # tensor, else from the caches of recent prompts where the model has no sliding window.
        self.prompt: PromptRunner | None = None
        self.prompts: PromptCache | None = None
        if self.kernels.exact:
            repacked, changed = load_repacked(path, llama_cpp)
            if changed:
                self.prompt = PromptRunner(self, repacked, llama_cpp)
            else:
                if repacked:
                    llama_cpp.llama_model_free(repacked)
                if llama_cpp.llama_model_n_swa(self.model) == 0:
                    self.prompts = PromptCache(llama_cpp)

    @property
    def exact(self) -> bool:
        return self.kernels.exact

    def backend(self) -> LlamaCppBackend:
        return LlamaCppBackend(self)

    def __del__(self) -> None:
        if getattr(self, "prompt", None) is not None:
            self.prompt.close()
            self.prompt = None
        if getattr(self, "model", None):
            _llama().llama_model_free(self.model)
            self.model = None


def load_llamacpp(path: str, **options) -> LlamaCppWeights:
    """Load a GGUF for the llama.cpp backend (``options``: n_ctx, n_batch, n_threads, exact)."""
    return LlamaCppWeights(path, **options)


@backend("llamacpp", "llama.cpp on the GGUF itself (needs specdec[llamacpp]; several times faster than "
                     "fp32 PyTorch here)", order=10)
def _load(request: LoadRequest) -> LoadedWeights:
    gguf = request.resolved.gguf
    if gguf is None:
        raise SpecdecError(f"the llama.cpp backend needs a GGUF file; {request.resolved.name} is a transformers folder")
    weights = load_llamacpp(str(gguf), exact=request.exact)

    def batched(slots: int):
        from specdec.backends.llamacpp_batched import SharedSequences

        return SharedSequences(weights, slots)
    forget = weights.prompts.clear if weights.prompts is not None else None
    return LoadedWeights(weights.backend, f"gguf-{weights.kernels.name}", exact=weights.exact, batched=batched,
                         forget_prompts=forget)


def context_params(weights: LlamaCppWeights, n_ctx: int, n_seq_max: int, unified: bool):
    """llama.cpp context parameters for ``weights``' kernels and a KV layout."""
    params = _llama().llama_context_default_params()
    params.n_ctx = n_ctx
    params.n_batch = weights.n_batch
    params.n_ubatch = weights.n_batch
    params.n_threads = weights.n_threads
    params.n_threads_batch = weights.n_threads
    # Keep every sliding-window row so that rolling back within the window works (Gemma 3).
    params.swa_full = True
    params.n_seq_max = n_seq_max
    params.kv_unified = unified
    kernels = weights.kernels
    params.flash_attn_type = kernels.flash_attn
    params.type_k, params.type_v = kernels.type_k, kernels.type_v
    return params


class LlamaCppBackend(Backend):
    """One sequence (seq id 0) in its own llama.cpp context.

    A draft tree is scored in one batch with a sequence id per branch (root-to-leaf path): a node
    shared by several branches carries all their ids, and llama.cpp lets a token attend to the
    cells of its first id, which every ancestor carries too. The cached prefix is shared with each
    branch by ``seq_cp`` (the KV buffer is unified, so nothing is copied), and keeping a path
    hands the accepted branch's cells back to sequence 0. The rejected nodes' cells stay occupied
    by one more sequence id that nothing attends to (see :meth:`_park`).
    """

    supports_tree = True

    def __init__(self, weights: LlamaCppWeights, *, shared=None, seq0: int = 0, branches: int = MAX_BRANCHES) -> None:
        self.weights = weights  # keeps the model alive as long as the context
        self.vocab_size = weights.vocab_size
        self.max_length = weights.n_ctx
        # Sequence ids seq0 .. seq0 + branches - 1 are this sequence's (its own, then a tree's branches).
        self.seq0, self.branches = seq0, branches
        self._shared = shared  # a SharedSequences whose ticks run this sequence's forwards, or None
        # The id that holds a tree's rejected cells (standalone contexts only: batched sequences
        # have no trees).
        self.park: int | None = None if shared is not None else seq0 + branches
        if shared is None:
            self.layout: Layout = (weights.n_ctx, branches + 1, True)
            self.ctx = self.new_context(weights, *self.layout)
            self.batch = _llama().llama_batch_init(weights.n_batch, 0, branches)
            self._kv = contextlib.nullcontext()
        else:
            self.layout = shared.layout
            self.ctx, self.batch, self._kv = shared.ctx, None, shared.kv
        self.tokens: list[int] = []
        self._floor = 0  # rolling back below this length recomputes the prompt (see PromptRunner.floor)
        self._prefilled = 0  # tokens the prompt filled (by prefill), the rest came one extend at a time
        self._parked = 0  # cells given to the parking id since the last reset (see _park)
        self._last: tuple[int, list[int] | None, list[list[int]]] = (0, None, [])  # start, tree, branches

    @staticmethod
    def new_context(weights: LlamaCppWeights, n_ctx: int, n_seq_max: int, unified: bool = True):
        """A llama.cpp context on ``weights`` with its kernels and ``n_ctx`` KV cells for up to
        ``n_seq_max`` sequence ids: shared by all of them (``unified``: tree branches share their
        prefix's cells) or split into one stream per id."""
        ctx = _llama().llama_init_from_model(weights.model, context_params(weights, n_ctx, n_seq_max, unified))
        if not ctx:
            raise SpecdecError("llama.cpp could not create a context")
        return ctx

    @property
    def length(self) -> int:
        return len(self.tokens)

    def extend(self, tokens: Sequence[int], *, last_only: bool = False,
               tree: Sequence[int] | None = None) -> torch.Tensor:
        check_extend(tokens, tree, self.supports_tree)
        if self._last[1] is not None:
            raise ValueError("a tree extend must be followed by truncate, not another extend")
        self._check_room(tokens)
        self._make_room(len(tokens))
        if tree is not None:
            return torch.from_numpy(self._decode_tree(list(tokens), list(tree), last_only))
        rows: list[np.ndarray] = []
        step = self.weights.n_batch
        for start in range(0, len(tokens), step):
            chunk = tokens[start:start + step]
            final = start + step >= len(tokens)
            rows.append(self._decode(chunk, want_all=not last_only, want_last=final))
        rows = [r for r in rows if r.size]
        return torch.from_numpy(rows[0] if len(rows) == 1 else np.concatenate(rows, axis=0))

    def _check_room(self, tokens: Sequence[int]) -> None:
        if min(tokens) < 0 or max(tokens) >= self.vocab_size:  # llama.cpp would wrap them silently
            raise SpecdecError(f"token ids must be in 0..{self.vocab_size - 1}")
        if len(self.tokens) + len(tokens) > self.max_length:
            raise SpecdecError(f"the sequence would exceed the llama.cpp context of {self.max_length} tokens")

    def prefill(self, tokens: Sequence[int]) -> int:
        """Fill an empty sequence through the weights' :class:`PromptRunner` (faster kernels; the
        same cache for every generation of this prompt) or from their :class:`PromptCache` and an
        ``extend`` of what it does not hold, else as ``extend``."""
        saved = self._prefill(tokens)
        self._prefilled = len(self.tokens)
        return saved

    def _prefill(self, tokens: Sequence[int]) -> int:
        runner, cache = self.weights.prompt, self.weights.prompts
        if not tokens or (runner is None and cache is None) or self.tokens or self._last[1] is not None:
            return super().prefill(tokens)
        tokens = list(tokens)
        check_extend(tokens)
        self._check_room(tokens)
        _decoded["any"] = True
        if runner is not None:
            with self._kv:  # batched: no tick decodes while the prompt runs and lands in the shared context
                runner.fill(self.ctx, self.layout, self.seq0, tokens)
            self.tokens = tokens
            self._floor = runner.floor(len(tokens))
            return 0
        hit = cache.lookup(self.layout, tokens)
        if hit is not None:
            with self._kv:
                self.tokens = tokens[:cache.load(self.ctx, self.seq0, hit)]
        if len(self.tokens) < len(tokens):
            self.extend(tokens[len(self.tokens):], last_only=True)
        with self._kv:
            cache.save(self.layout, tokens, self.ctx, self.seq0)
        return 0 if hit is None else hit[0]

    def _decode(self, chunk: Sequence[int], want_all: bool, want_last: bool) -> np.ndarray:
        base, n = len(self.tokens), len(chunk)
        wanted = [want_all or (want_last and i == n - 1) for i in range(n)]
        return self._run_batch(chunk, [base + i for i in range(n)], [[self.seq0]] * n, wanted)

    def _decode_tree(self, tokens: list[int], tree: list[int], last_only: bool) -> np.ndarray:
        leaves = trees.leaves(tree)
        if len(leaves) > self.branches or len(tokens) > self.weights.n_batch:
            raise ValueError(f"a tree for this backend has at most {self.branches} leaves and "
                             f"{self.weights.n_batch} nodes")
        start = len(self.tokens)
        branches = [trees.path_to(tree, leaf) for leaf in leaves]
        ids: list[list[int]] = [[] for _ in tokens]
        for b, path in enumerate(branches):
            for node in path:
                ids[node].append(self.seq0 + b)
        mem = _llama().llama_get_memory(self.ctx)
        with self._kv:
            for b in range(1, len(branches)):
                _llama().llama_memory_seq_cp(mem, self.seq0, self.seq0 + b, 0, start)  # the prefix, shared
        depth = trees.depths(tree)
        wanted = [not last_only or i == len(tokens) - 1 for i in range(len(tokens))]
        out = self._run_batch(tokens, [start + d - 1 for d in depth], ids, wanted)
        self._last = (start, tree, branches)
        return out

    def _run_batch(self, tokens: Sequence[int], positions: list[int], seq_ids: list[list[int]],
                   wanted: list[bool]) -> np.ndarray:
        if self._shared is not None:
            _decoded["any"] = True
            out = self._shared.decode(self._shared.submission(self.slot, list(tokens), positions, seq_ids, wanted))
            self.tokens.extend(tokens)
            return out
        batch, n = self.batch, len(tokens)
        batch.n_tokens = n
        for i, tok in enumerate(tokens):
            batch.token[i] = tok
            batch.pos[i] = positions[i]
            batch.n_seq_id[i] = len(seq_ids[i])
            for j, s in enumerate(seq_ids[i]):
                batch.seq_id[i][j] = s
            batch.logits[i] = wanted[i]
        llama_cpp = _llama()
        _decoded["any"] = True
        if llama_cpp.llama_decode(self.ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")
        self.tokens.extend(tokens)
        n_out = sum(wanted)
        if not n_out:
            return np.empty((0, self.vocab_size), dtype=np.float32)
        out = np.empty((n_out, self.vocab_size), dtype=np.float32)
        ctypes.memmove(out.ctypes.data, llama_cpp.llama_get_logits(self.ctx), out.nbytes)
        return out

    def truncate(self, length: int, keep: Sequence[int] | None = None) -> None:
        check_truncate(length, len(self.tokens))
        start, tree, branches = self._last
        self._last = (start, None, [])
        if keep is not None:
            check_keep(tree, start, length, keep)
            self._keep_branch(start, list(keep), branches)
            return
        if tree is not None:
            if length > start:
                check_keep(tree, start, start, list(range(length - start)))
                self._keep_branch(start, list(range(length - start)), branches)
                return
            self._drop_branches(start, len(branches))
        if length == len(self.tokens):
            return
        mem = _llama().llama_get_memory(self.ctx)
        with self._kv:
            removed = length >= self._floor and _llama().llama_memory_seq_rm(mem, self.seq0, length, -1)
        if not removed:
            # Partial removal impossible for this cache type, or below what a prompt's copied
            # sliding-window cache holds: rebuild the prefix instead.
            kept = self.tokens[:length]
            self.reset()
            self.prefill(kept)
            return
        self._prefilled = min(self._prefilled, length)
        del self.tokens[length:]

    def _park(self, start: int, count: int) -> None:
        """Give the cells of the last tree (positions from ``start``, on its ``count`` branches) to
        the parking id, so that dropping a branch does not free them.

        Freed cells between the kept path's cells are holes, and the unified cache puts the next
        tokens in the first holes, before cells of the kept path: flash attention then sums the
        sequence's cells in another order than plain decoding, which rounds differently and at a
        near-tie picks another token (measured: fixed-K trees on SmolLM2 parted from plain decoding
        in 12 of 60 generations). A parked cell belongs to no sequence that attends, so it is
        masked like any other sequence's cell; :meth:`_make_room` recomputes when they crowd.
        Parked cells stay occupied until the next reset, kept or not: the cells in use are at most
        the sequence's tokens plus everything parked.
        """
        if self.park is None:
            return
        lib, mem = _llama(), _llama().llama_get_memory(self.ctx)
        for b in range(count):
            lib.llama_memory_seq_cp(mem, self.seq0 + b, self.park, start, -1)
        self._parked += len(self.tokens) - start

    def _make_room(self, n: int) -> None:
        """Recompute the sequence in an empty cache when parked cells would leave no room for ``n``
        new ones: the prompt as it was filled, the rest by exact kernels, so the same cells."""
        if not self._parked or len(self.tokens) + self._parked + n <= self.layout[0]:
            return
        kept, prompt = list(self.tokens), self._prefilled
        self.reset()
        self.prefill(kept[:prompt])
        if len(kept) > prompt:
            self.extend(kept[prompt:], last_only=True)

    def _keep_branch(self, start: int, keep: list[int], branches: list[list[int]]) -> None:
        """Sequence 0 becomes the prefix plus the path ``keep`` (offsets into the last tree extend)."""
        lib, mem, s0 = _llama(), _llama().llama_get_memory(self.ctx), self.seq0
        last = keep[-1] if keep else -1
        chosen = next(b for b, path in enumerate(branches) if last < 0 or last in path)
        with self._kv:
            self._park(start, len(branches))
            for b in range(1, len(branches)):
                if b != chosen:
                    lib.llama_memory_seq_rm(mem, s0 + b, -1, -1)
            if chosen != 0:
                lib.llama_memory_seq_rm(mem, s0, start, -1)
                lib.llama_memory_seq_cp(mem, s0 + chosen, s0, start, -1)
                lib.llama_memory_seq_rm(mem, s0 + chosen, -1, -1)
            lib.llama_memory_seq_rm(mem, s0, start + len(keep), -1)  # the branch below the kept path
        self.tokens[start:] = [self.tokens[start + o] for o in keep]

    def _drop_branches(self, start: int, count: int) -> None:
        lib, mem = _llama(), _llama().llama_get_memory(self.ctx)
        with self._kv:
            self._park(start, count)
            for b in range(1, count):
                lib.llama_memory_seq_rm(mem, self.seq0 + b, -1, -1)

    def reset(self) -> None:
        lib, mem = _llama(), _llama().llama_get_memory(self.ctx)
        if self._shared is None:
            lib.llama_memory_clear(mem, True)
        else:
            with self._kv:  # only this sequence's ids: the others share the context
                for s in range(self.seq0, self.seq0 + self.branches):
                    lib.llama_memory_seq_rm(mem, s, -1, -1)
        self.tokens = []
        self._last = (0, None, [])
        self._floor = 0
        self._prefilled = self._parked = 0

    def __del__(self) -> None:
        if getattr(self, "_shared", None) is None and getattr(self, "ctx", None):
            _llama().llama_batch_free(self.batch)
            _llama().llama_free(self.ctx)
            self.ctx = None
