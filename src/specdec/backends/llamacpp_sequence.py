"""One sequence on llama.cpp: batched decode with logits for every new position, draft trees in
one forward, KV-cache rollback with ``llama_memory_seq_rm``.

:class:`LlamaCppSequence` is what every llama.cpp sequence does (chains and trees, parking a
tree's rejected cells, rollback, prompt filling); where its rows are decoded is the subclass's:
:class:`LlamaCppBackend` in a context of its own, ``SequenceBackend``
(:mod:`.llamacpp_batched`) in the ticks of a context shared with other sequences.
"""

from __future__ import annotations

import contextlib
import ctypes
from abc import abstractmethod
from collections.abc import Sequence

import numpy as np
import torch

from specdec import tree as trees
from specdec.backends.base import Backend, check_extend, check_keep, check_truncate
from specdec.backends.llamacpp_kernels import Layout
from specdec.backends.llamacpp_lib import decode, lib
from specdec.backends.llamacpp_weights import LlamaCppWeights
from specdec.errors import SpecdecError

MAX_BRANCHES = 32  # sequence ids per context: a draft tree may have at most this many leaves


class LlamaCppSequence(Backend):
    """One sequence in a llama.cpp context: its ids ``seq0 .. seq0 + branches - 1`` (its own, then a
    draft tree's branches) and, when ``park`` is an id, the id that holds a tree's rejected cells.

    A draft tree is scored in one batch with a sequence id per branch (root-to-leaf path): a node
    shared by several branches carries all their ids, and llama.cpp lets a token attend to the
    cells of its first id, which every ancestor carries too. The cached prefix is shared with each
    branch by ``seq_cp`` (the KV buffer is unified, so nothing is copied), and keeping a path
    hands the accepted branch's cells back to sequence ``seq0``. The rejected nodes' cells stay
    occupied by one more sequence id that nothing attends to (see :meth:`_park`).

    Subclasses decode the rows (:meth:`_run_batch`) and clear the sequence's cells
    (:meth:`_clear_cells`); ``kv`` is held around every change of the cache that another thread
    could be decoding in.
    """

    def __init__(self, weights: LlamaCppWeights, ctx, layout: Layout, *, seq0: int, branches: int,
                 park: int | None, kv=None) -> None:
        self.weights = weights  # keeps the model alive as long as the context
        self.vocab_size = weights.vocab_size
        self.max_length = weights.n_ctx
        self.ctx, self.layout = ctx, layout
        self.seq0, self.branches, self.park = seq0, branches, park
        self._kv = kv if kv is not None else contextlib.nullcontext()
        self.tokens: list[int] = []
        self._floor = 0  # rolling back below this length recomputes the prompt (see PromptRunner.floor)
        self._prefilled = 0  # tokens the prompt filled (by prefill), the rest came one extend at a time
        self._parked = 0  # cells given to the parking id since the last reset (see _park)
        self._last: tuple[int, list[int] | None, list[list[int]]] = (0, None, [])  # start, tree, branches

    @abstractmethod
    def _run_batch(self, tokens: Sequence[int], positions: list[int], seq_ids: list[list[int]],
                   wanted: list[bool]) -> np.ndarray:
        """Decode ``tokens`` at ``positions`` in sequences ``seq_ids``; the logits of the ``wanted`` rows."""

    @abstractmethod
    def _clear_cells(self) -> None:
        """Remove every cell of this sequence's ids from the context."""

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
        if runner is not None:
            hit = cache.lookup(self.layout, tokens) if cache is not None else None
            with self._kv:  # batched: no tick decodes while the prompt runs and lands in the shared context
                runner.fill(self.ctx, self.layout, self.seq0, tokens, hit)
                if cache is not None:
                    cache.save(self.layout, tokens, self.ctx, self.seq0)
            if hit is not None:
                cache.count(hit)
            self.tokens = tokens
            self._floor = runner.floor(len(tokens))
            return 0 if hit is None else hit[0]
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
        out = self._run_batch(chunk, [base + i for i in range(n)], [[self.seq0]] * n, wanted)
        self.tokens.extend(chunk)
        return out

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
        mem = lib().llama_get_memory(self.ctx)
        with self._kv:
            for b in range(1, len(branches)):
                lib().llama_memory_seq_cp(mem, self.seq0, self.seq0 + b, 0, start)  # the prefix, shared
        depth = trees.depths(tree)
        wanted = [not last_only or i == len(tokens) - 1 for i in range(len(tokens))]
        out = self._run_batch(tokens, [start + d - 1 for d in depth], ids, wanted)
        self.tokens.extend(tokens)
        self._last = (start, tree, branches)
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
        mem = lib().llama_get_memory(self.ctx)
        with self._kv:
            removed = length >= self._floor and lib().llama_memory_seq_rm(mem, self.seq0, length, -1)
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
        llama = lib()
        mem = llama.llama_get_memory(self.ctx)
        for b in range(count):
            llama.llama_memory_seq_cp(mem, self.seq0 + b, self.park, start, -1)
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
        """Sequence ``seq0`` becomes the prefix plus the path ``keep`` (offsets into the last tree extend)."""
        llama, s0 = lib(), self.seq0
        mem = llama.llama_get_memory(self.ctx)
        last = keep[-1] if keep else -1
        chosen = next(b for b, path in enumerate(branches) if last < 0 or last in path)
        with self._kv:
            self._park(start, len(branches))
            for b in range(1, len(branches)):
                if b != chosen:
                    llama.llama_memory_seq_rm(mem, s0 + b, -1, -1)
            if chosen != 0:
                llama.llama_memory_seq_rm(mem, s0, start, -1)
                llama.llama_memory_seq_cp(mem, s0 + chosen, s0, start, -1)
                llama.llama_memory_seq_rm(mem, s0 + chosen, -1, -1)
            llama.llama_memory_seq_rm(mem, s0, start + len(keep), -1)  # the branch below the kept path
        self.tokens[start:] = [self.tokens[start + o] for o in keep]

    def _drop_branches(self, start: int, count: int) -> None:
        llama = lib()
        mem = llama.llama_get_memory(self.ctx)
        with self._kv:
            self._park(start, count)
            for b in range(1, count):
                llama.llama_memory_seq_rm(mem, self.seq0 + b, -1, -1)

    def reset(self) -> None:
        self._clear_cells()
        self.tokens = []
        self._last = (0, None, [])
        self._floor = 0
        self._prefilled = self._parked = 0


class LlamaCppBackend(LlamaCppSequence):
    """One sequence (seq id 0) in its own llama.cpp context, with draft trees: ``branches`` ids for
    a tree's branches and one more that parks its rejected cells, in one unified KV cache."""

    supports_tree = True

    def __init__(self, weights: LlamaCppWeights, branches: int = MAX_BRANCHES) -> None:
        layout: Layout = (weights.n_ctx, branches + 1, True)
        super().__init__(weights, weights.context(layout), layout, seq0=0, branches=branches, park=branches)
        self.batch = lib().llama_batch_init(weights.n_batch, 0, branches)

    def _run_batch(self, tokens: Sequence[int], positions: list[int], seq_ids: list[list[int]],
                   wanted: list[bool]) -> np.ndarray:
        batch, n = self.batch, len(tokens)
        batch.n_tokens = n
        for i, tok in enumerate(tokens):
            batch.token[i] = tok
            batch.pos[i] = positions[i]
            batch.n_seq_id[i] = len(seq_ids[i])
            for j, s in enumerate(seq_ids[i]):
                batch.seq_id[i][j] = s
            batch.logits[i] = wanted[i]
        decode(self.ctx, batch)
        n_out = sum(wanted)
        if not n_out:
            return np.empty((0, self.vocab_size), dtype=np.float32)
        out = np.empty((n_out, self.vocab_size), dtype=np.float32)
        ctypes.memmove(out.ctypes.data, lib().llama_get_logits(self.ctx), out.nbytes)
        return out

    def _clear_cells(self) -> None:
        lib().llama_memory_clear(lib().llama_get_memory(self.ctx), True)

    def __del__(self) -> None:
        if getattr(self, "ctx", None):
            lib().llama_batch_free(self.batch)
            lib().llama_free(self.ctx)
            self.ctx = None
