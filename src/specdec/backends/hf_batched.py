"""Several sequences in one transformers forward on a GPU: continuous batching for ``specdec serve
--device cuda``, replayed from one CUDA graph, every answer the same as the request's alone.

:class:`PagedBatch` holds ``slots`` sequences over one KV pool (:mod:`specdec.backends.kv_pool`).
Each sequence is a :class:`PagedSequence`, a backend like any other whose decoding forwards are
submissions; one ticker thread puts every running sequence's submission into one forward of
``slots x rows`` rows (a *tick*) replayed from a captured graph, and hands each sequence its rows'
logits. Every GPU operation of the batch runs on that thread: the ticks, the prompts (eager, one
sequence at a time, in chunks) and the moves of a kept tree path.

Why one shape: a GPU picks its matmul kernels by the number of rows, so a tick of 3 sequences could
round a row differently from a tick of 5. Every tick has the same ``slots x rows`` rows (a
sequence's draft and pad rows in its block of ``rows``, empty slots' blocks writing to the pool's
scratch page), the attention is batch-invariant (:mod:`specdec.backends.paged_attention`: a
sequence's result depends on its own keys and length alone) and prompts run alone, so a request's
tokens never depend on which requests share its ticks. The attention reads only the pages each
sequence holds: a step's cost follows its length.

A tick waits until every running sequence has submitted, but not longer than ``gather_s`` for one
that is busy elsewhere (lockstep: drafting and verification run on the host between ticks). Off a
GPU the same code runs without the graph (the "eager step"), which is how the tests check it.
"""

from __future__ import annotations

import functools
import math
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from specdec import tree as trees
from specdec.backends import paged_attention
from specdec.backends.base import Backend, check_extend, check_keep, check_offer, check_truncate
from specdec.backends.cuda_graphs import Replay, compiled
from specdec.backends.kv_pool import KVPool
from specdec.backends.paged_attention import PAGE, PagedMeta
from specdec.costs import CostModel, Costs
from specdec.errors import SpecdecError
from specdec.policies.goodput import Offer, choose_lengths

ROWS = 16  # rows of each sequence in a tick: a draft of up to 15 tokens and the last token
GATHER_S = 0.003  # how long a tick waits for a running sequence that has not submitted yet
PREFILL_CHUNK = 1024  # prompt rows per eager forward
MAX_LENGTH = 16384  # tokens a sequence may hold by default (or the model's context, if shorter)


@dataclass
class _Submission:
    slot: int
    tokens: list[int]
    positions: np.ndarray  # [ROWS]
    block: np.ndarray  # [ROWS, ROWS]
    start: int
    pages: list[int]
    offer: Offer | None = None  # the tick keeps the first 1 + its chosen length of these tokens
    drafted: int = 0  # draft rows verified in it (the counters)
    out: torch.Tensor | None = None
    error: BaseException | None = None
    done: bool = False


@dataclass
class _Job:
    run: Callable[[], object]
    out: object = None
    error: BaseException | None = None
    done: bool = False


class PagedBatch:
    """Up to ``slots`` sequences of one model stepped together (see the module); a
    :class:`specdec.backends.base.BatchedSequences`. ``pages``: the pool's size (page 0 included),
    ``max_length``: tokens a sequence may hold (prompt, answer and a block of rows)."""

    # Why a server on this batch refuses a request's tree=true (its sequences verify chains only).
    no_trees = ("tree drafts are not verified on the GPU batch: a tree's nodes are laid out so that the "
                "attention's sums group differently from a chain's, which could part an answer from plain "
                "decoding at a near-tie; leave tree out (chains are drafted and verified as usual)")

    def __init__(self, model, slots: int, pages: int, max_length: int, rows: int = ROWS,
                 compile: bool | None = None, graphs: bool | None = None, gather_s: float = GATHER_S,
                 prefill_chunk: int = PREFILL_CHUNK) -> None:
        if slots < 1:
            raise SpecdecError(f"a batch needs at least one slot, got {slots}")
        self.model = model
        self.device = model.device
        self.slots, self.width, self.gather_s = slots, rows, gather_s
        self.prefill_chunk = prefill_chunk  # prompt rows a prefill forward takes at most
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self.max_length = max_length
        self.table_pages = -(-(max_length + rows) // PAGE)
        self.pool = KVPool(model.config, pages, self.device, model.dtype)
        self.kernel = paged_attention.choice(self.device)
        self.window = _window(model.config)
        self.cache = _paged_cache(self.pool)
        self.graphs = self.device.type == "cuda" if graphs is None else graphs
        self._step = compiled(self._forward, self.device, compile)
        self._inputs = _Inputs(slots, rows, self.table_pages, self.device)
        # One object for every tick (its tensors are the inputs' views): a compiled step guards on it.
        self._meta = PagedMeta(self._inputs.table, self._inputs.start, self._inputs.block, self._inputs.positions,
                               "pool", self.kernel)
        self._replay = Replay(self._graph_step, self.device) if self.graphs else None
        self._cond = threading.Condition()
        self._pending: list[_Submission] = []
        self._jobs: list[_Job] = []
        self._active: set[int] = set()
        self._free = list(range(slots))
        self._thread: threading.Thread | None = None
        self._opened = 0.0
        self._tril = np.tril(np.ones((rows, rows), dtype=np.int64))
        self.costs: Callable[[], CostModel | None] | None = None
        self.ticks = 0
        self.rows = 0  # rows decoded (BatchedSequences' counter), real rows only
        self.decode_s = 0.0
        self.sequences = 0  # sequences stepped in the ticks (a sum over ticks)
        self.forwards = 0  # forwards the ticks ran (one each: the one shape)
        self.drafted = 0  # draft rows verified in them
        self.offered = 0  # draft rows offered to the ticks' joint choice, and how many it took
        self.taken = 0
        self.drafting_ticks = 0  # ticks that verified a draft row
        self.trace: list | None = None  # (rows per submission, seconds) per tick, when a list

    # -- sequences --------------------------------------------------------------------------------
    def pages_for(self, tokens: int) -> int:
        """Pages a sequence of ``tokens`` tokens (prompt and answer) reserves: a block of rows more."""
        return -(-(min(tokens, self.max_length) + self.width) // PAGE)

    def check_fits(self, tokens: int) -> None:
        """Refuse a sequence of ``tokens`` tokens that the pool could never hold (a server asks
        before it answers, so that the refusal is a 400 and not a stream that breaks off)."""
        self.pool.fits(self.pages_for(tokens))

    def backend(self) -> PagedSequence:
        """A sequence on a free slot (the model's pool keeps at most ``slots`` of them)."""
        with self._cond:
            if not self._free:
                raise SpecdecError(f"all {self.slots} batched sequences are in use")
            slot = min(self._free)
            self._free.remove(slot)
        return PagedSequence(self, slot)

    def join(self, slot: int) -> None:
        with self._cond:
            self._active.add(slot)

    def leave(self, slot: int) -> None:
        with self._cond:
            self._active.discard(slot)
            self._cond.notify_all()

    def release(self, slot: int) -> None:
        self.leave(slot)
        with self._cond:
            self._free.append(slot)

    # -- the ticker ---------------------------------------------------------------------------------
    def decode(self, sub: _Submission) -> torch.Tensor:
        """``sub``'s rows in the next tick; their logits ``[n, V]`` (float32, on the device)."""
        with self._cond:
            self._start()
            if not self._pending and not self._jobs:
                self._opened = time.monotonic()
            self._pending.append(sub)
            self._cond.notify_all()
            while not sub.done:
                self._cond.wait()
        if sub.error is not None:
            raise sub.error
        return sub.out

    def job(self, run: Callable[[], object]) -> object:
        """``run()`` on the ticker's thread between ticks (a prompt, a move of rows); its result."""
        job = _Job(run)
        with self._cond:
            self._start()
            self._jobs.append(job)
            self._cond.notify_all()
            while not job.done:
                self._cond.wait()
        if job.error is not None:
            raise job.error
        return job.out

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=_ticker, args=(weakref.ref(self),), daemon=True,
                                            name="specdec-gpu-batch")
            self._thread.start()

    def _next(self, timeout: float) -> None:
        with self._cond:
            if self._jobs:
                jobs, self._jobs = self._jobs, []
            elif not self._pending:
                self._cond.wait(timeout)
                return
            else:
                jobs = []
                waiting = {s.slot for s in self._pending}
                wait = self._opened + self.gather_s - time.monotonic()
                if not (self._active <= waiting or wait <= 0):
                    self._cond.wait(wait)
                    return
                chosen, self._pending = self._pending, []
        if jobs:
            self._run_jobs(jobs)
        else:
            self._tick(chosen)

    def _run_jobs(self, jobs: list[_Job]) -> None:
        for job in jobs:
            try:
                with torch.inference_mode():
                    job.out = job.run()
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                job.error = exc
        with self._cond:
            for job in jobs:
                job.done = True
            self._cond.notify_all()

    def _choose(self, chosen: list[_Submission]) -> None:
        """The offered drafts cut to the lengths with the tick's best expected tokens per second
        (:func:`~specdec.policies.goodput.choose_lengths`). Every tick has the one shape, so it
        costs the same whatever rows are in it, up to a block of rows per sequence: every draft
        that is expected to gain anything is verified, up to its block."""
        offered = [sub for sub in chosen if sub.offer is not None]
        if not offered:
            return
        width = self.width

        def cost(rows: Sequence[int]) -> float:
            return 1.0 if all(r <= width for r in rows) else math.inf

        lengths = choose_lengths([sub.offer for sub in offered], cost)
        for sub, n in zip(offered, lengths):
            del sub.tokens[sub.offer.rows + n:]
            sub.drafted = n
            self.offered += sub.offer.most
            self.taken += n

    def _tick(self, chosen: list[_Submission]) -> None:
        t0 = time.perf_counter()
        try:
            self._choose(chosen)
            logits = self._run(chosen)
            for sub in chosen:
                sub.out = logits[sub.slot, :len(sub.tokens)]
        except BaseException as exc:  # noqa: BLE001 - every submission of the tick fails with it
            for sub in chosen:
                sub.error = exc
        seconds = time.perf_counter() - t0
        with self._cond:
            for sub in chosen:
                sub.done = True
            self._opened = time.monotonic()
            self._cond.notify_all()
        self.ticks += 1
        self.forwards += 1
        self.sequences += len(chosen)
        self.rows += sum(len(s.tokens) for s in chosen)
        drafted = sum(s.drafted for s in chosen)
        self.drafted += drafted
        self.drafting_ticks += drafted > 0
        self.decode_s += seconds
        if self.trace is not None:
            self.trace.append(([len(s.tokens) for s in chosen], seconds))

    def _run(self, chosen: list[_Submission]) -> torch.Tensor:
        """One tick: every slot's block of rows (empty ones on the scratch page); ``[slots, rows, V]``."""
        self._inputs.fill(chosen, self.width)
        if self._replay is not None:
            out = self._replay()
        else:
            with torch.inference_mode():
                out = self._graph_step()
        logits = out.clone()  # the next tick overwrites the graph's output
        if self.device.type == "cuda":
            # The tick's time; the sequences read their rows next (on streams of their own, so a
            # sequence that reads late does not queue behind the next tick: _reading_stream).
            torch.cuda.current_stream(self.device).synchronize()
        return logits

    def _graph_step(self) -> torch.Tensor:
        inputs = self._inputs
        self.cache.flat = inputs.flat
        with _attention(self.model):  # outside the compiled step: it reads the setting, never sets it
            return self._step(inputs.ids, inputs.positions, self._meta)

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, meta: PagedMeta) -> torch.Tensor:
        """Float32 logits ``[B, R, V]`` of ``ids`` ``[B, R]`` at ``positions``, keys written at
        ``cache.flat`` and attention through ``meta``."""
        out = self.model(input_ids=ids, position_ids=positions, past_key_values=self.cache,
                         attention_mask=_no_mask(self.model, ids.device), use_cache=True, specdec_paged=meta)
        return out.logits.float()

    # -- on the ticker's thread ---------------------------------------------------------------------
    def prefill(self, pages: list[int], tokens: list[int], start: int, last_only: bool) -> torch.Tensor:
        """Eager forwards of a prompt's ``tokens`` after ``start`` held slots, in chunks (the same
        way whatever else runs: a prompt is alone in its forwards); their logits."""
        def run() -> torch.Tensor:
            out = []
            for i in range(0, len(tokens), self.prefill_chunk):
                part, at = tokens[i:i + self.prefill_chunk], start + i
                out.append(self._prefill_chunk(pages, part, at, last_only))
            return out[-1] if last_only else torch.cat(out)
        return self.job(run)

    def _prefill_chunk(self, pages: list[int], part: list[int], at: int, last_only: bool) -> torch.Tensor:
        n, device = len(part), self.device
        used = -(-(at + n) // PAGE)
        table = torch.tensor([pages[:used]], dtype=torch.long, device=device)
        slots = np.arange(at, at + n)
        flat = np.asarray(pages)[slots // PAGE] * PAGE + slots % PAGE
        self.cache.flat = torch.as_tensor(flat, device=device)
        positions = torch.arange(at, at + n, device=device)[None]
        block = torch.ones(n, n, dtype=torch.bool, device=device).tril()[None]
        meta = PagedMeta(table, torch.tensor([at], device=device), block, positions, "pool", "reference")
        ids = torch.tensor([part], dtype=torch.long, device=device)
        with _attention(self.model):
            out = self.model(input_ids=ids, position_ids=positions, past_key_values=self.cache,
                             attention_mask=_no_mask(self.model, device), use_cache=True, specdec_paged=meta,
                             logits_to_keep=1 if last_only else 0)
        return out.logits[0].float()

    def move(self, pages: list[int], source: list[int], target: list[int]) -> None:
        """Copy slots ``source`` to slots ``target`` of a sequence, in every layer (all read before
        any is written)."""
        def run() -> None:
            table = np.asarray(pages)
            src, dst = (torch.as_tensor(table[np.asarray(s) // PAGE] * PAGE + np.asarray(s) % PAGE, device=self.device)
                        for s in (source, target))
            for keys, values in zip(self.pool.keys, self.pool.values):
                for buffer in (keys, values):
                    flat = buffer.view(-1, *buffer.shape[2:])
                    flat.index_copy_(0, dst, flat.index_select(0, src))
        self.job(run)


def paged_batch(model, slots: int, kv_memory: str | None = None, max_length: int | None = None,
                **options) -> PagedBatch:
    """A :class:`PagedBatch` of ``slots`` sequences of up to ``max_length`` tokens (default: the
    model's context, at most :data:`MAX_LENGTH`), within ``kv_memory``: the pool
    (:func:`specdec.backends.kv_pool.budget_pages`) and what the forwards allocate beside it (a
    tick's, or a prompt's chunk's, whichever is more: they run one at a time), a prompt's chunks
    made small enough that theirs is at most an eighth of the budget or a tick's."""
    from specdec.backends.kv_pool import budget_bytes, budget_pages, forward_scratch, prefill_chunk

    context = getattr(model.config, "max_position_embeddings", None) or MAX_LENGTH
    length = max_length or min(context, MAX_LENGTH)
    rows = options.get("rows", ROWS)
    width = -(-(length + rows) // PAGE) * PAGE  # the key slots a sequence's table reaches
    config, dtype = model.config, model.dtype
    tick = forward_scratch(config, dtype, slots, rows, width)
    chunk = options.pop("prefill_chunk", PREFILL_CHUNK)
    if kv_memory is not None:
        room = max(tick, budget_bytes(kv_memory, model.device) // 8)
        chunk = prefill_chunk(config, dtype, width, room, chunk, rows)
    scratch = max(tick, forward_scratch(config, dtype, 1, chunk, width, logit_rows=1))
    pages = budget_pages(config, dtype, model.device, slots, length + rows, kv_memory, scratch)
    return PagedBatch(model, slots, pages, length, prefill_chunk=chunk, **options)


class _Inputs:
    """A tick's inputs: one pinned host buffer, copied to the device in one transfer, and the views
    of its device copy that the graph reads."""

    def __init__(self, slots: int, rows: int, table_pages: int, device: torch.device) -> None:
        b, r = slots, rows
        self.sizes = {"ids": b * r, "positions": b * r, "start": b, "block": b * r * r, "table": b * table_pages,
                      "flat": b * r}
        total = sum(self.sizes.values())
        pinned = device.type == "cuda"
        self.host = torch.zeros(total, dtype=torch.long, pin_memory=pinned)
        self.array = self.host.numpy()
        self.device_buffer = torch.zeros(total, dtype=torch.long, device=device)
        shapes = {"ids": (b, r), "positions": (b, r), "start": (b,), "block": (b, r, r), "table": (b, table_pages),
                  "flat": (b * r,)}
        self.host_views: dict[str, np.ndarray] = {}
        at = 0
        for name, size in self.sizes.items():
            setattr(self, name, self.device_buffer[at:at + size].view(shapes[name]))
            self.host_views[name] = self.array[at:at + size].reshape(shapes[name])
            at += size
        self.copied = torch.cuda.Event() if pinned else None
        self.slots, self.rows, self.table_pages = slots, rows, table_pages
        self._empty()

    def _empty(self) -> None:
        """Every slot empty: its rows on the scratch page, each seeing itself only."""
        v, r = self.host_views, self.rows
        v["ids"][:] = 0
        v["positions"][:] = np.arange(r)
        v["start"][:] = 0
        v["block"][:] = np.eye(r, dtype=np.int64)
        v["table"][:] = 0
        v["flat"][:] = np.tile(np.arange(r), self.slots)

    def fill(self, chosen: list[_Submission], rows: int) -> None:
        if self.copied is not None:
            self.copied.synchronize()  # the last copy out of the pinned buffer has left it
        self._empty()
        v = self.host_views
        for sub in chosen:
            b, n = sub.slot, len(sub.tokens)
            v["ids"][b, :n] = sub.tokens
            v["ids"][b, n:] = sub.tokens[-1]
            v["positions"][b] = sub.positions
            v["start"][b] = sub.start
            v["block"][b] = sub.block
            table = np.asarray(sub.pages, dtype=np.int64)
            v["table"][b, :len(table)] = table
            slots = np.arange(sub.start, sub.start + rows)
            v["flat"][b * rows:(b + 1) * rows] = table[slots // PAGE] * PAGE + slots % PAGE
        self.device_buffer.copy_(self.host, non_blocking=True)
        if self.copied is not None:
            self.copied.record()


def _ticker(ref: weakref.ref) -> None:
    while True:
        batch = ref()
        if batch is None:
            return
        batch._next(0.5)
        del batch


class PagedSequence(Backend):
    """One sequence of a :class:`PagedBatch`: chains and trees of up to ``rows`` rows a forward
    (longer chains in consecutive blocks, as consecutive forwards), rollback by length, a kept tree
    path moved into place. Its pages are taken by :meth:`reserve` (waiting for free ones: a
    server's admission) and given back when the backend goes back to its pool."""

    # Trees are verified as their best path (the engine cuts them): a tree's nodes sit at slots
    # start + index, not at their positions, so the attention's sums over a node's ancestors group
    # differently from a chain's, and a tree could part from plain decoding at a near-tie. The tree
    # forward below (nodes, then the kept path moved) is kept for when the layout groups as a chain.
    supports_tree = False
    chooses_lengths = True  # its batch picks every sequence's draft length in a tick together

    def __init__(self, batch: PagedBatch, slot: int) -> None:
        self.batch = batch
        self.slot = slot
        self.vocab_size = batch.vocab_size
        self.max_length = batch.max_length
        self.max_tree = batch.width  # nodes of a tree forward, its root included
        self.pages: list[int] = []
        self._prefilling = False
        self.reset()

    @property
    def length(self) -> int:
        return len(self.tokens)

    def reset(self) -> None:
        self.tokens: list[int] = []
        self._last: tuple[int, list[int] | None] = (0, None)
        self.batch.join(self.slot)

    def reserve(self, tokens: int, cancelled: threading.Event | None = None) -> None:
        """Pages for ``tokens`` tokens and a block of rows, waiting in line until the pool has them
        (leaving the line if ``cancelled`` is set)."""
        need = self.batch.pages_for(tokens)
        if need > len(self.pages):
            self._take(need - len(self.pages), cancelled)

    def _take(self, count: int, cancelled: threading.Event | None = None) -> None:
        """``count`` more pages; no tick waits for this sequence while it waits for them."""
        with self.batch._cond:
            active = self.slot in self.batch._active
        if active:
            self.batch.leave(self.slot)
        try:
            self.pages += self.batch.pool.take(count, cancelled=cancelled)
        finally:
            if active:
                self.batch.join(self.slot)

    def _ensure(self, end: int) -> None:
        need = -(-end // PAGE)
        if need > self.batch.table_pages:
            raise SpecdecError(f"the sequence would hold {end} tokens; this server's sequences hold at most "
                               f"{self.max_length}")
        if need > len(self.pages):  # a sequence that grows as it goes (a draft model's) waits as reserve does
            self._take(need - len(self.pages))

    def idle(self) -> None:
        """Back in the pool: no tick waits for it, and its pages go back to the KV pool."""
        self.batch.leave(self.slot)
        self.batch.pool.give(self.pages)
        self.pages = []

    @contextmanager
    def busy(self) -> Iterator[None]:
        self.batch.join(self.slot)
        try:
            yield
        finally:
            self.batch.leave(self.slot)

    def forward_costs(self, costs: CostModel) -> Costs:
        return costs  # every tick has the one shape: a sequence's rows cost what the curve says

    def prefill(self, tokens: Sequence[int]) -> int:
        self._prefilling = True
        try:
            return super().prefill(tokens)
        finally:
            self._prefilling = False

    def extend(self, tokens: Sequence[int], *, last_only: bool = False,
               tree: Sequence[int] | None = None) -> torch.Tensor:
        check_extend(tokens, tree, self.supports_tree)
        if self._last[1] is not None:
            raise ValueError("a tree extend must be followed by truncate, not another extend")
        tokens, start, rows = list(tokens), len(self.tokens), self.batch.width
        if tree is not None and len(tokens) > rows:
            raise ValueError(f"a tree forward holds at most {rows} nodes here, got {len(tokens)}")
        if self._prefilling:
            end = start + len(tokens)
        else:
            end = start + (rows if tree is not None else -(-len(tokens) // rows) * rows)
        self._ensure(end)
        if self._prefilling:
            logits = self.batch.prefill(self.pages, tokens, start, last_only)
        elif tree is not None:
            logits = self._block(tokens, start, tree)
        else:
            parts = [self._block(tokens[i:i + rows], start + i, None) for i in range(0, len(tokens), rows)]
            logits = torch.cat(parts) if len(parts) > 1 else parts[0]
        self.tokens.extend(tokens)
        self._last = (start, None if tree is None else list(tree))
        stream = _reading_stream(self.batch.device)
        if stream is not None:
            logits.record_stream(stream)  # its memory is not reused before this thread's reads end
        return logits[-1:] if last_only else logits

    def extend_offer(self, tokens: Sequence[int], offer: Offer) -> torch.Tensor:
        """The step's last token and a draft chain, of which the tick verifies the first ``i``
        draft tokens, chosen with the other sequences' offers (see :meth:`PagedBatch._choose`);
        the logits of the ``1 + i`` rows taken. A draft longer than a block offers its first rows."""
        check_extend(tokens)
        if self._last[1] is not None:
            raise ValueError("a tree extend must be followed by truncate, not another extend")
        check_offer(tokens, offer)
        width, start = self.batch.width, len(self.tokens)
        tokens = list(tokens)[:width]
        offer = Offer(offer.gains[:width], 1, offer.spent)
        self._ensure(start + width)
        sub = _Submission(self.slot, list(tokens), np.arange(start, start + width), self.batch._tril, start,
                          list(self.pages), offer)
        logits = self.batch.decode(sub)
        self.tokens.extend(sub.tokens)
        self._last = (start, None)
        stream = _reading_stream(self.batch.device)
        if stream is not None:
            logits.record_stream(stream)
        return logits

    def _block(self, tokens: list[int], start: int, tree: list[int] | None) -> torch.Tensor:
        rows, n = self.batch.width, len(tokens)
        if tree is None:
            positions, block = np.arange(start, start + rows), self.batch._tril
        else:
            padded = list(tree) + [-1] * (rows - n)  # pad rows: roots of their own that no node sees
            positions = start - 1 + np.asarray(trees.depths(padded))
            block = trees.ancestor_mask(padded).numpy().astype(np.int64)
        sub = _Submission(self.slot, tokens, positions, block, start, list(self.pages))
        return self.batch.decode(sub)

    def truncate(self, length: int, keep: Sequence[int] | None = None) -> None:
        check_truncate(length, self.length)
        start, tree = self._last
        self._last = (start, None)
        if keep is not None:
            check_keep(tree, start, length, keep)
            keep = list(keep)
            moved = [(start + o, start + i) for i, o in enumerate(keep) if o != i]
            if moved:
                source, target = (list(x) for x in zip(*moved))
                self.batch.move(list(self.pages), source, target)
            self.tokens[start:] = [self.tokens[start + o] for o in keep]
            return
        if tree is not None and length > start:
            check_keep(tree, start, start, list(range(length - start)))
        del self.tokens[length:]  # the slots past it are never read before they are written again

    def __del__(self) -> None:
        batch = getattr(self, "batch", None)
        if batch is not None:
            batch.pool.give(self.pages)
            batch.release(self.slot)
            self.batch = None


_threads = threading.local()


def _reading_stream(device: torch.device):
    """On a GPU, this thread's own stream, made current: what a sequence does with its logits
    (verification's reads) runs there, beside the ticks on the ticker's stream. On the default
    stream a sequence that read its rows after the next tick began would wait for that tick to end,
    and miss the one after it. None elsewhere."""
    if device.type != "cuda":
        return None
    stream = getattr(_threads, "stream", None)
    if stream is None:
        stream = _threads.stream = torch.cuda.Stream(device)
    if torch.cuda.current_stream(device) != stream:
        torch.cuda.set_stream(stream)
    return stream


@contextmanager
def _attention(model) -> Iterator[None]:
    """The model's layers attend through :mod:`paged_attention` while the block runs (read by every
    layer at call time, and at capture)."""
    config = model.config
    before = config._attn_implementation
    config._attn_implementation = paged_attention.registered()
    try:
        yield
    finally:
        config._attn_implementation = before


def _no_mask(model, device: torch.device):
    """A 4-D placeholder mask: transformers then builds none (the paged attention masks by itself)."""
    placeholder = torch.ones(1, 1, 1, 1, dtype=torch.bool, device=device)
    types = set(getattr(model.config, "layer_types", None) or [])
    if "sliding_attention" in types:
        return {"full_attention": placeholder, "sliding_attention": placeholder}
    return placeholder


def _window(config) -> int:
    types = set(getattr(config, "layer_types", None) or [])
    return (getattr(config, "sliding_window", None) or 0) if "sliding_attention" in types else 0


def _paged_cache(pool: KVPool):
    """A transformers ``Cache`` whose layers write their rows at ``cache.flat`` (slots of the pool,
    flattened over pages) and hand attention the whole pool."""
    layer_type, cache_type = _types()
    layers = [layer_type(pool, i) for i in range(len(pool.keys))]
    cache = cache_type(layers=layers)
    for layer in layers:
        layer.owner = cache
    cache.flat = torch.zeros(0, dtype=torch.long)
    return cache


@functools.cache
def _types():
    from transformers.cache_utils import Cache, CacheLayerMixin

    class PoolLayer(CacheLayerMixin):
        is_compileable = True
        is_sliding = False  # windows are the attention's job: every position is kept

        def __init__(self, pool: KVPool, index: int) -> None:
            super().__init__()
            self.is_initialized = True
            self.keys, self.values = pool.keys[index], pool.values[index]
            self.owner = None

        def lazy_initialization(self, key_states, value_states) -> None:
            pass

        def update(self, key_states, value_states, *args, **kwargs):
            flat = self.owner.flat
            # [B, kv_heads, R, d] -> [B * R, kv_heads, d], rows in slot order
            k = key_states.transpose(1, 2).reshape(-1, *key_states.shape[1:2], key_states.shape[-1])
            v = value_states.transpose(1, 2).reshape(-1, *value_states.shape[1:2], value_states.shape[-1])
            self.keys.view(-1, *self.keys.shape[2:]).index_copy_(0, flat, k.to(self.keys.dtype))
            self.values.view(-1, *self.values.shape[2:]).index_copy_(0, flat, v.to(self.values.dtype))
            return self.keys, self.values

        def get_mask_sizes(self, query_length: int, *args) -> tuple[int, int]:
            return self.keys.shape[0] * self.keys.shape[1], 0

        def get_seq_length(self) -> int:
            return 0

        def get_max_length(self) -> int:
            return self.keys.shape[0] * self.keys.shape[1]

    class PoolCache(Cache):
        """The layers of a :class:`KVPool`; ``flat`` says where the next forward writes."""

    return PoolLayer, PoolCache
