"""Several sequences in one llama.cpp forward: continuous batching for ``specdec serve``.

A forward of 8 one-token rows costs a fraction of 8 forwards of one, so generations that step
together make more tokens per second than generations that take turns. :class:`SharedSequences`
is one llama.cpp context with a KV stream per sequence; every sequence's ``extend`` is a
submission, and one ticker thread puts the submissions of all running sequences into one
``llama_decode`` (a *tick*). Each generation's engine loop is unchanged and still the reference it
is tested against: it only waits at its forward for the others' rows. A sequence joins at its
first forward after a reset and leaves when its backend goes back to the pool; a tick waits for
every running sequence, but not longer than ``gather_s`` for one that is busy elsewhere.

With exact kernels (:data:`specdec.backends.llamacpp_kernels.EXACT`) a row's logits do not depend on the
other rows in its batch, and a stream per sequence keeps each sequence's cells in position order
(in a unified cache a sequence's new cells can land in holes another left before its older cells,
and flash attention would sum them in another order), so batching cannot change any request's
text: tested with concurrent generations against each generation alone.

The batch chooses its draft lengths together: a sequence hands its whole draft and its policy's
:class:`~specdec.policies.goodput.Offer` (:meth:`SequenceBackend.extend_offer`), and the tick picks
every sequence's length at once for the most expected tokens per second of the tick
(:func:`~specdec.policies.goodput.choose_lengths`), "nobody drafts" included, on what such a tick
costs here (:meth:`SharedSequences.tick_cost`: llama.cpp's split of the tick into forwards, each
priced by the model's :class:`~specdec.costs.BatchCosts`, which the ticks teach), stretching the
tick by no more than every sequence in it may still be delayed by others' drafts
(:class:`~specdec.policies.goodput.DelayBudget`: a share of its own ticks). A tick waits for
every running sequence that is computing its next step, for up to a share of a tick's time (a
sequence left behind would cost a tick of its own). A draft model's forwards (a burst of its own
ticks) still price their rows at their margin (:meth:`SequenceBackend.forward_costs`,
:class:`MarginalCosts`) to plan how much to draft.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch

from specdec.backends.base import check_extend, check_offer
from specdec.backends.llamacpp_kernels import Layout
from specdec.backends.llamacpp_lib import decode, lib
from specdec.backends.llamacpp_sequence import LlamaCppSequence
from specdec.backends.llamacpp_weights import LlamaCppWeights
from specdec.costs import CostModel, Costs
from specdec.errors import SpecdecError
from specdec.policies.goodput import DelayBudget, Offer, OfferPause, TickCost, choose_lengths, drafts_can_pay

MAX_SEQ_IDS = 64  # sequences per context (llama.cpp allows 256; each has its own KV stream here)
CELLS_PER_SLOT = 4096  # KV cells per sequence (prompt + answer + a draft)
GATHER_S = 0.02  # how long a tick waits at least for a running sequence that has not submitted yet
GATHER_SHARE = 0.25  # ... and at most this share of the last tick's time (see _gather_until)
# A tick is priced this many standard deviations of its estimate above it: a draft verified in a
# forward of a size no tick ran yet must pay even if that size costs more than the curve says
# (measured here: a 15-row chain beside 3 sequences took 0.3-0.7 s where the calibration said 0.27).
CAUTION = 1.0
# ... and where several sequences share it, drafts must beat nobody drafting by this much: with no
# requests waiting, one sequence finishing early frees nothing, while its rows lengthened every
# other sequence's ticks (in the trace at 16 clients, ticks that drafted about broke even, and the
# run took 18% longer than plain decoding's).
MARGIN = 1.15
# ... and no tick's drafts make it longer than this many times the tick without them
# (``specdec serve --max-tick-stretch``; by default no cap: the delay budget bounds what each
# answer pays over its whole life instead, ``--max-delay-share``, see DelayBudget).
STRETCH = math.inf
# How often (in ticks) whether drafts can pay at a crowd size is asked again of the learned costs.
RECHECK_TICKS = 64


@dataclass
class _Submission:
    seq: int
    tokens: list[int]
    positions: list[int]
    seq_ids: list[list[int]]
    wanted: list[bool]
    offer: Offer | None = None  # the batch keeps offer.rows + the chosen length of these rows
    drafted: int = 0  # draft rows in it (for the counters)
    crowd: int = 0  # submissions in its tick
    out: np.ndarray | None = None
    error: BaseException | None = None
    done: bool = False

    def cut(self, rows: int) -> None:
        """Keep the first ``rows`` rows (the batch's choice)."""
        del self.tokens[rows:], self.positions[rows:], self.seq_ids[rows:], self.wanted[rows:]


def forwards(seqs: Sequence[int], rows: Sequence[int], n_ubatch: int) -> list[tuple[int, int]]:
    """The forwards llama.cpp computes a tick in, as (rows, sequences) each: sequence ``seqs[i]``
    (ascending) puts in ``rows[i]`` rows. With a KV stream per sequence a batch is sliced by
    ``split_equal``: each slice takes the same number of rows from a run of consecutive sequence
    ids (the first one with rows left, then each next id while it has rows left; a missing id ends
    the run), at most ``n_ubatch`` rows. So unequal lengths and gaps between ids cost forwards:
    16 sequences of one row are one forward; one of them with 3 rows adds a forward of 2 rows."""
    left = list(rows)
    n, first, out = len(left), 0, []
    while True:
        while first < n and left[first] <= 0:  # what lies before the first row left is used up
            first += 1
        if first == n:
            return out
        end = first + 1
        # llama.cpp admits one sequence more than n_ubatch before it stops (see stream_ubatch)
        while end < n and left[end] > 0 and seqs[end] == seqs[end - 1] + 1 and end - first <= n_ubatch:
            end += 1
        size = end - first
        each = max(1, min(min(left[first:end]), n_ubatch // size))
        for i in range(first, end):
            left[i] -= each
        out.append((each * size, size))


@dataclass
class _TickLog:
    """What the last ticks held, for the marginal cost of a sequence's rows."""

    rows: dict[int, int] = field(default_factory=dict)  # sequence -> rows in the last tick it was in
    last_total: int | None = None


class SharedSequences:
    """One llama.cpp context shared by up to ``slots`` sequences, stepped together."""

    def __init__(self, weights: LlamaCppWeights, slots: int, gather_s: float = GATHER_S) -> None:
        if not 1 <= slots <= MAX_SEQ_IDS:
            raise SpecdecError(f"batched llama.cpp serves 1..{MAX_SEQ_IDS} sequences at once, got {slots}")
        self.weights = weights
        self.slots = slots
        self.gather_s = gather_s
        self.max_stretch = STRETCH  # a shared tick's drafts make it at most this many times as long
        # ... and at most what every sequence in it may still be delayed by others' drafts
        self.budget = DelayBudget()
        self.n_ctx = min(weights.n_ctx, CELLS_PER_SLOT) * slots
        self.max_length = min(weights.n_ctx, CELLS_PER_SLOT)
        # One KV stream per sequence: a stream's cells stay in position order through rollbacks, as
        # in a context of its own, so flash attention sums them in the same order (a unified cache
        # lets one sequence's new cells land in another's freed holes, before its older cells).
        self.layout: Layout = (self.n_ctx, slots, False)
        self.ctx = weights.context(self.layout)
        self.batch = lib().llama_batch_init(weights.n_batch, 0, 1)
        self.kv = threading.RLock()  # the KV cache: one tick's decode or one sequence's rollback at a time
        self._cond = threading.Condition()
        self._pending: list[_Submission] = []
        self._active: set[int] = set()
        self._free = list(range(slots))
        self._ticking = False
        self._thread: threading.Thread | None = None
        self._opened = 0.0  # when the tick being gathered opened (the last tick's end, or a first submission)
        self._last_s = 0.0  # how long the last tick took
        self._log = _TickLog()
        self.costs: Callable[[], CostModel] | None = None  # the curve every tick teaches (set by the model)
        self.ticks = 0  # counters: ticks run, rows decoded, seconds in llama_decode
        self.rows = 0
        self.decode_s = 0.0
        self.sequences = 0  # submissions in the ticks (their sum over ticks)
        self.drafted = 0  # draft rows verified in them
        self.offered = 0  # draft rows offered to the ticks' choice, and how many of them it took
        self.taken = 0
        self.drafting_ticks = 0  # ticks that verified a draft row
        # Steps taken without an offer, paused after shared ticks declined (OfferPause), by slot:
        # each slot's request thread counts its own, without the lock every tick's submissions
        # and wake-ups queue for (the count came between a paused step and its submission).
        self._paused = [0] * slots
        self.forwards = 0  # the forwards llama.cpp split the ticks into
        self.placeholders = 0  # rows put in gaps between the ticks' sequence ids (see _holes)
        self.trace: list | None = None  # (rows per submission, seconds) per tick, when a list
        # Every tick as a JSON line in this file, where SPECDEC_TICK_TRACE names one (to find out
        # what a batch did: scripts/loadtest.py --tick-traces sums such files up).
        self._trace_file = _trace_file()
        self._expected: dict | None = None  # the last choice's expected tokens and seconds (traced)
        # crowd size -> (ticks // RECHECK_TICKS, the tick_cost it was asked of, answer)
        self._can_draft: dict[int, tuple[int, Callable, bool]] = {}

    # -- sequences --------------------------------------------------------------------------------
    def backend(self) -> SequenceBackend:
        """A backend on a free sequence slot (the pool keeps at most ``slots`` of them)."""
        with self._cond:
            if not self._free:
                raise SpecdecError(f"all {self.slots} batched sequences are in use")
            slot = min(self._free)  # lowest first: see _run on consecutive sequence ids
            self._free.remove(slot)
        return SequenceBackend(self, slot)

    def join(self, slot: int) -> None:
        with self._cond:
            self._active.add(slot)

    def start(self, slot: int) -> None:
        """A new generation on ``slot`` (its delay allowance starts over) joins the ticks."""
        with self._cond:
            self.budget.start(slot)
            self._active.add(slot)

    def leave(self, slot: int) -> None:
        with self._cond:
            self._active.discard(slot)
            self._log.rows.pop(slot, None)
            self._cond.notify_all()  # a tick may have been waiting for it

    def release(self, slot: int) -> None:
        self.leave(slot)
        with self._cond:
            self.budget.drop(slot)
            self._free.append(slot)

    def count_paused(self, slot: int) -> None:
        """The sequence on ``slot`` steps without an offer, paused (called by that slot's request
        thread only, so no lock)."""
        self._paused[slot] += 1

    @property
    def paused(self) -> int:
        """Steps taken without an offer: paused after shared ticks declined them, or where no draft
        could pay in a batch of their size."""
        return sum(self._paused)

    def drafts_can_pay(self) -> bool:
        """Whether a draft could pay in a tick of the sequences running now, were every one of its
        tokens kept (:func:`~specdec.policies.goodput.drafts_can_pay` on this batch's costs, with
        the margin shared ticks ask): where not, a sequence steps without drafting, as plain
        decoding does. Alone, or before the costs are measured, the offer's own choice decides.
        Asked once per crowd size every :data:`RECHECK_TICKS` ticks (the costs keep learning), and
        again whenever the batch's pricing is another (tests price ticks their own way)."""
        crowd, epoch, source = len(self._active), self.ticks // RECHECK_TICKS, self.tick_cost
        if crowd < 2:
            return True
        known = self._can_draft.get(crowd)
        if known is not None and known[:2] == (epoch, source):
            return known[2]
        try:
            cost = source(range(crowd))  # consecutive ids: a tick without gaps, the cheapest
        except SpecdecError:
            return True
        answer = drafts_can_pay(crowd, cost, MARGIN)
        self._can_draft[crowd] = (epoch, source, answer)
        return answer

    def others(self, slot: int) -> int:
        """Rows the other running sequences put in the last tick (each at least one)."""
        with self._cond:
            return sum(max(1, self._log.rows.get(s, 1)) for s in self._active if s != slot)

    # -- ticks --------------------------------------------------------------------------------------
    @staticmethod
    def submission(seq: int, tokens: list[int], positions: list[int], seq_ids: list[list[int]],
                   wanted: list[bool], offer: Offer | None = None, drafted: int = 0) -> _Submission:
        return _Submission(seq, list(tokens), list(positions), [list(i) for i in seq_ids], list(wanted), offer,
                           drafted)

    def tick_cost(self, seqs: Sequence[int]) -> TickCost:
        """What a tick of these sequences (ascending ids) costs by the rows each puts in: alone, a
        step on the model's curve (the single-stream policy's price, shape switch included);
        together, llama.cpp's forwards of the tick (:func:`forwards`) on the model's
        :class:`~specdec.costs.BatchCosts`. More rows than a batch holds: ruled out."""
        curve = self.costs() if self.costs is not None else None
        if curve is None:
            raise SpecdecError("the batch's cost is unknown until the model's cost curve is measured")
        room, n_ubatch = self.weights.n_batch, self.weights.n_ubatch
        if len(seqs) == 1:
            return lambda rows: curve.step(rows[0]) if rows[0] <= room else math.inf
        batch = curve.batch
        # One choice asks for a few hundred layouts, most of them split alike (any one sequence's
        # extra rows make the same forward), and the tick waits for the choice: each asked once.
        costs: dict[tuple[int, ...], float] = {}
        prices: dict[tuple[tuple[int, int], ...], float] = {}

        def price(split: list[tuple[int, int]]) -> float:
            key = tuple(split)
            if key not in prices:
                prices[key] = batch.tick(split, CAUTION)
            return prices[key]

        def cost(rows: Sequence[int]) -> float:
            key = tuple(rows)
            if key not in costs:
                if sum(rows) > room:
                    costs[key] = math.inf
                else:
                    present = [(s, r) for s, r in zip(seqs, rows) if r > 0]  # a sequence of no rows is a gap
                    costs[key] = _layout([s for s, _ in present], [r for _, r in present], room, n_ubatch, price)[0]
            return costs[key]

        return cost

    def _holes(self, seqs: Sequence[int], rows: Sequence[int]) -> list[int]:
        """The sequence ids between the tick's that get a placeholder row (see :func:`_layout`):
        where the batch's costs say it is cheaper; without a measured curve, where it saves
        forwards at a fifth of a forward per row."""
        curve = self.costs() if self.costs is not None else None
        if curve is not None:
            price = lambda split: curve.batch.tick(split, CAUTION)  # noqa: E731
        else:
            price = lambda split: len(split) + 0.2 * sum(n for n, _ in split)  # noqa: E731
        return _layout(seqs, rows, self.weights.n_batch, self.weights.n_ubatch, price)[1]

    def decode(self, sub: _Submission) -> np.ndarray:
        """Run ``sub`` in the next tick with the other sequences' submissions; its logits rows."""
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=_ticker, args=(weakref.ref(self),), daemon=True,
                                                name="specdec-batch")
                self._thread.start()
            if not self._pending and not self._ticking:
                self._opened = time.monotonic()  # the next tick opens with the first submission
            self._pending.append(sub)
            self._cond.notify_all()
            while not sub.done:
                self._cond.wait()
        if sub.error is not None:
            raise sub.error
        return sub.out

    def _next_tick(self, timeout: float) -> None:
        """Run a tick once it is due, or wait up to ``timeout`` for one to become due (called by
        the ticker thread: every decode runs on that one thread, so llama.cpp's OpenMP team is
        one team, not one per request thread spinning on the 2 cores)."""
        with self._cond:
            if not self._pending:
                self._cond.wait(timeout)
                return
            wait = self._gather_until() - time.monotonic()
            if wait <= 0:
                self._tick()
            else:
                self._cond.wait(wait)

    def _fail_pending(self, exc: BaseException) -> None:
        """End every submission waiting for a tick with ``exc`` (the ticker met an error outside
        a decode, which fails only that tick's own submissions)."""
        with self._cond:
            self._fail(self._pending, exc)
            self._pending.clear()

    def _fail(self, subs: Sequence[_Submission], exc: BaseException) -> None:
        """End ``subs`` with ``exc``, each raised in its own request (called with the condition held)."""
        for sub in subs:
            sub.error, sub.done = exc, True
        self._cond.notify_all()

    def _gather_until(self) -> float:
        """When the tick being gathered runs (called with the condition held). Lockstep: a tick
        waits until every running sequence has submitted (on 2 cores a decode that overlaps
        another sequence's Python work runs at half speed), but not forever for one that is busy
        elsewhere: at least ``gather_s`` after the tick opened, and longer where the ones missing
        are many beside the ones waiting (each left behind pays a tick of its own, and the batch a
        forward more, where waiting costs each one present the wait), up to a share of the last
        tick's time."""
        present = {s.seq for s in self._pending}
        missing = len(self._active - present)
        if not missing:
            return self._opened
        share = min(GATHER_SHARE, missing / max(1, len(present)))
        return self._opened + max(self.gather_s, share * self._last_s)

    def _tick(self) -> None:
        """Decode the pending submissions that fit one batch, their draft lengths chosen together
        (called with the condition held; the decode itself runs without it, so sequences can queue
        for the next tick meanwhile)."""
        room, chosen = self.weights.n_batch, []
        for sub in sorted(self._pending, key=lambda sub: sub.seq):
            need = sub.offer.rows if sub.offer is not None else len(sub.tokens)
            if need <= room:
                chosen.append(sub)
                room -= need
                self._pending.remove(sub)
        for sub in chosen:
            sub.crowd = len(chosen)
        offered = [sub.offer.most if sub.offer is not None else None for sub in chosen]
        # What each offered, as the expected tokens of its first draft nodes (traced)
        gains = ([[round(g, 3) for g in sub.offer.gains[:17]] if sub.offer is not None else None for sub in chosen]
                 if self._trace_file is not None else [])
        try:
            stretch = self._choose(chosen)
        except Exception as exc:  # a failed choice costs the tick its drafts, never its requests
            stretch = 1.0
            warnings.warn(f"specdec: the batch's draft lengths failed ({exc!r}); this tick verifies no drafts",
                          RuntimeWarning, stacklevel=1)
            for sub in chosen:
                if sub.offer is not None:
                    sub.cut(sub.offer.rows)
                    sub.drafted = 0
        try:
            holes = self._holes([s.seq for s in chosen], [len(s.tokens) for s in chosen])
        except BaseException as exc:  # out of the pending list already: failed here, not lost
            self._fail(chosen, exc)
            raise
        running, opened = set(self._active), self._opened
        self._ticking = True
        self._cond.release()
        t0 = time.monotonic()
        try:
            seconds, holes = self._run(chosen, holes)
        except BaseException as exc:  # every submission of the tick fails with it
            for sub in chosen:
                sub.error = exc
            seconds, holes = 0.0, []
        finally:
            self._cond.acquire()
            self._ticking = False
            self._opened = time.monotonic()
            self._last_s = self._opened - t0
            for sub in chosen:
                sub.done = True
            self._cond.notify_all()
        self._learn(chosen, holes, seconds)
        if seconds > 0:  # a tick that ran: each banks its share of it, and pays for others' drafts
            self.budget.settle([s.seq for s in chosen], [s.drafted for s in chosen], stretch)
        if self._trace_file is not None:
            self._record(chosen, holes, offered, gains, running, t0, t0 - opened, seconds)

    def _choose(self, chosen: list[_Submission]) -> float:
        """Cut the offered drafts to the lengths with the tick's best expected tokens per second;
        how many times the tick without drafts the tick is expected to take."""
        if not any(sub.offer is not None and sub.offer.most for sub in chosen):
            return 1.0
        expected = 1.0
        offers = [sub.offer if sub.offer is not None else _fixed(sub) for sub in chosen]
        try:
            cost = self.tick_cost([sub.seq for sub in chosen])
        except SpecdecError:  # no curve yet: plain steps (nothing measured says a draft pays)
            lengths = [0] * len(offers)
        else:
            several = len(offers) > 1
            stretch = (min(self.max_stretch, self.budget.stretch(sub.seq for sub in chosen)) if several
                       else math.inf)
            lengths = choose_lengths(offers, cost, MARGIN if several else 1.0, stretch)
            if any(lengths) or self._trace_file is not None:
                seconds = cost([o.rows + n for o, n in zip(offers, lengths)])
                plain_s = cost([o.rows for o in offers])
                expected = seconds / plain_s if any(lengths) else 1.0
                if self._trace_file is not None:  # what the choice expected, beside what the tick takes
                    self._expected = {"tokens": round(sum(o.gains[n] for o, n in zip(offers, lengths)), 2),
                                      "seconds": round(seconds, 4), "plain_seconds": round(plain_s, 4),
                                      "stretch_allowed": round(stretch, 3) if math.isfinite(stretch) else None}
        for sub, offer, n in zip(chosen, offers, lengths):
            if sub.offer is not None:
                sub.cut(offer.rows + n)
                sub.drafted = n
                self.offered += offer.most
                self.taken += n
        return expected

    def _learn(self, chosen: list[_Submission], holes: list[int], seconds: float) -> None:
        """Counters, and what the tick teaches the model's costs (called with the condition held)."""
        rows = [len(s.tokens) for s in chosen]
        total = sum(rows)
        split = forwards(*_filled([s.seq for s in chosen], rows, holes), self.weights.n_ubatch)
        for sub in chosen:
            self._log.rows[sub.seq] = len(sub.tokens)
        curve = self.costs() if self.costs is not None else None
        if seconds > 0 and curve is not None:
            if len(chosen) == 1:  # one sequence's forward: a point of the model's own curve
                curve.observe(total, seconds, after=self._log.last_total)
            else:
                curve.batch.observe(split, seconds)
        self._log.last_total = total
        self.ticks += 1
        self.rows += total
        self.decode_s += seconds
        self.sequences += len(chosen)
        drafted = sum(s.drafted for s in chosen)
        self.drafted += drafted
        self.drafting_ticks += drafted > 0
        self.forwards += len(split)
        self.placeholders += len(holes)
        if self.trace is not None:
            self.trace.append(([len(s.tokens) for s in chosen], seconds))

    def _record(self, chosen: list[_Submission], holes: list[int], offered: list[int | None],
                gains: list[list[float] | None], running: set[int], t0: float, gathered: float, seconds: float) -> None:
        """One tick as a line of the trace file: when, how long it gathered and decoded, the
        sequences running and those in it (rows each, the draft rows each offered and the expected
        tokens of their first 16 prefixes), the forwards llama.cpp split it into."""
        seqs, rows = [s.seq for s in chosen], [len(s.tokens) for s in chosen]
        line = {"context": id(self), "t": round(t0, 4), "gathered_s": round(gathered, 4), "seconds": round(seconds, 4),
                "running": sorted(running), "seqs": seqs, "rows": rows, "offered": offered,
                "drafted": [s.drafted for s in chosen], "holes": holes,
                "forwards": forwards(*_filled(seqs, rows, holes), self.weights.n_ubatch), "expected": self._expected,
                "gains": gains}
        self._expected = None
        self._trace_file.write(json.dumps(line) + "\n")
        self._trace_file.flush()

    def _run(self, chosen: list[_Submission], holes: Sequence[int] = ()) -> tuple[float, list[int]]:
        """Decode ``chosen`` (in sequence id order: with a KV stream per sequence llama.cpp splits
        a batch wherever its sequence ids are not consecutive, one more forward each time) with a
        placeholder row in each of ``holes`` (see :meth:`_holes`); the seconds, and the holes
        filled (one whose stream is full stays a gap)."""
        batch, llama = self.batch, lib()
        with self.kv:
            mem = llama.llama_get_memory(self.ctx)
            # A placeholder continues its stream (llama.cpp wants each sequence's positions to
            # follow its cells) and is removed after the tick, which leaves the stream's cells
            # as they were: the next cell written there lands where it would have.
            placed = {}
            for h in holes:
                pos = llama.llama_memory_seq_pos_max(mem, h) + 1
                if pos < self.max_length:
                    placed[h] = pos
            rows = [(sub.seq, sub) for sub in chosen] + [(h, None) for h in placed]
            n = 0
            for seq, sub in sorted(rows, key=lambda r: r[0]):
                if sub is None:  # a placeholder: no logits, nothing kept
                    batch.token[n], batch.pos[n], batch.n_seq_id[n], batch.logits[n] = 0, placed[seq], 1, False
                    batch.seq_id[n][0] = seq
                    n += 1
                    continue
                for i, tok in enumerate(sub.tokens):
                    batch.token[n] = tok
                    batch.pos[n] = sub.positions[i]
                    batch.n_seq_id[n] = len(sub.seq_ids[i])
                    for j, s in enumerate(sub.seq_ids[i]):
                        batch.seq_id[n][j] = s
                    batch.logits[n] = sub.wanted[i]
                    n += 1
            batch.n_tokens = n
            try:
                seconds = decode(self.ctx, batch)
            finally:
                for h, pos in placed.items():
                    llama.llama_memory_seq_rm(mem, h, pos, -1)
            base = ctypes.cast(llama.llama_get_logits(self.ctx), ctypes.c_void_p).value
            vocab, row = self.weights.vocab_size, 0
            for sub in chosen:
                k = sum(sub.wanted)
                sub.out = np.empty((k, vocab), dtype=np.float32)
                if k:
                    ctypes.memmove(sub.out.ctypes.data, base + row * vocab * 4, sub.out.nbytes)
                row += k
        return seconds, sorted(placed)

    def __del__(self) -> None:
        if getattr(self, "ctx", None):
            lib().llama_batch_free(self.batch)
            lib().llama_free(self.ctx)
            self.ctx = None


def _layout(seqs: Sequence[int], rows: Sequence[int], room: int, n_ubatch: int,
            price: Callable[[list[tuple[int, int]]], float]) -> tuple[float, list[int]]:
    """The price of a tick of these sequences (ascending ids) and rows, and the ids that get a
    placeholder row. llama.cpp computes a run of consecutive ids in one forward and starts
    another forward at every missing id, so where sequences left the batch (or one is busy
    elsewhere) a row in each gap, written to that id's stream and removed after the tick, can
    cost less than the forwards the gaps cost (a row adds a little to a forward; a forward of few
    rows costs about a whole one-row forward): the gaps are filled where ``price`` (seconds of a
    tick run as given forwards) says so, and where the batch has room for them."""
    split = price(forwards(seqs, rows, n_ubatch))
    gaps = _gaps(seqs)
    if not gaps or sum(rows) + len(gaps) > room:
        return split, []
    filled = price(forwards(*_filled(seqs, rows, gaps), n_ubatch))
    return (filled, gaps) if filled < split else (split, [])


def _gaps(seqs: Sequence[int]) -> list[int]:
    """The ids missing between the lowest and the highest of ``seqs`` (ascending)."""
    present = set(seqs)
    return [s for s in range(seqs[0], seqs[-1]) if s not in present] if seqs else []


def _filled(seqs: Sequence[int], rows: Sequence[int], holes: Sequence[int]) -> tuple[list[int], list[int]]:
    """``seqs`` and their ``rows`` with one row for each of ``holes``, in id order."""
    both = sorted([*zip(seqs, rows), *((h, 1) for h in holes)])
    return [s for s, _ in both], [r for _, r in both]


TICK_TRACE_ENV = "SPECDEC_TICK_TRACE"


def _trace_file():
    """The file every tick is written to, if ``SPECDEC_TICK_TRACE`` names one (appended to)."""
    path = os.environ.get(TICK_TRACE_ENV)
    return open(path, "a", encoding="utf-8") if path else None


def _fixed(sub: _Submission) -> Offer:
    """A submission without an offer, as one: its rows whatever is chosen, worth a step's token;
    a prompt's chunk (the logits of its last row at most) none."""
    return Offer((1.0 if all(sub.wanted) else 0.0,), len(sub.tokens))


def _ticker(ref: weakref.ref) -> None:
    """The decode thread of a :class:`SharedSequences` (ends when it is gone)."""
    while True:
        shared = ref()
        if shared is None:
            return
        try:
            shared._next_tick(0.5)
        except BaseException as exc:  # the requests waiting fail with it; none waits forever
            shared._fail_pending(exc)
        del shared


class SequenceBackend(LlamaCppSequence):
    """One sequence of a :class:`SharedSequences` context: a backend like any other, whose
    forwards are batched with the other running sequences' forwards. Chains only: a draft tree's
    branches would need sequence ids that share the prefix's cells, which separate streams do not
    (the engine verifies a tree drafter's best path instead)."""

    supports_tree = False

    def __init__(self, shared: SharedSequences, slot: int) -> None:
        self.shared = shared
        self.slot = slot
        super().__init__(shared.weights, shared.ctx, shared.layout, seq0=slot, branches=1, park=None,
                         kv=shared.kv)
        self.max_length = shared.max_length
        # Offers paused while shared ticks keep declining them (in the traces at 8-16 clients, the
        # n-gram generations' drafting between ticks left 10-12% of the wall time outside the
        # decodes, against 3-5% for plain decoding, with the same ticks).
        self._pause = OfferPause()

    chooses_lengths = True

    def wants_offer(self) -> bool:
        """No offer while paused (:class:`~specdec.policies.goodput.OfferPause`), nor where the
        batch's size rules every draft out (:meth:`SharedSequences.drafts_can_pay`)."""
        if self._pause.wants_offer() and self.shared.drafts_can_pay():
            return True
        self.shared.count_paused(self.slot)
        return False

    def _run_batch(self, tokens: Sequence[int], positions: list[int], seq_ids: list[list[int]],
                   wanted: list[bool]) -> np.ndarray:
        """A submission to the next tick (this sequence's rows with the other sequences')."""
        drafted = len(tokens) - 1 if len(tokens) > 1 and all(wanted) else 0  # a draft cut alone, verified
        return self.shared.decode(self.shared.submission(self.slot, tokens, positions, seq_ids, wanted,
                                                         drafted=drafted))

    def extend_offer(self, tokens: Sequence[int], offer: Offer) -> torch.Tensor:
        """The step's last token and its whole draft chain into the next tick, which keeps the
        first ``1 + i`` rows, i chosen with the other sequences' offers; their logits."""
        check_extend(tokens)
        if self._last[1] is not None:
            raise ValueError("a tree extend must be followed by truncate, not another extend")
        check_offer(tokens, offer)
        tokens = list(tokens)
        if len(tokens) > self.weights.n_batch:  # more than a tick holds: the offer's first rows
            tokens, offer = tokens[:self.weights.n_batch], Offer(offer.gains[:self.weights.n_batch], 1, offer.spent)
        self._check_room(tokens)
        self._make_room(len(tokens))
        base, n = len(self.tokens), len(tokens)
        sub = self.shared.submission(self.slot, tokens, [base + i for i in range(n)], [[self.seq0]] * n,
                                     [True] * n, offer=offer)
        out = self.shared.decode(sub)
        self.tokens.extend(tokens[:out.shape[0]])
        if offer.most:
            self._pause.answered(out.shape[0] - 1, sub.crowd > 1)
        return torch.from_numpy(out)

    def _clear_cells(self) -> None:
        llama = lib()
        mem = llama.llama_get_memory(self.ctx)
        with self._kv:  # only this sequence's ids: the others share the context
            for s in range(self.seq0, self.seq0 + self.branches):
                llama.llama_memory_seq_rm(mem, s, -1, -1)

    def reset(self) -> None:
        super().reset()  # removes this sequence's cells under the context's KV lock
        self._pause = OfferPause()
        self.shared.start(self.slot)

    def idle(self) -> None:
        """Back in the pool, or between bursts: no tick waits for this sequence until it steps again."""
        self.shared.leave(self.slot)

    @contextmanager
    def busy(self) -> Iterator[None]:
        """Ticks wait for this sequence while the block runs (a draft model's burst of forwards)."""
        self.shared.join(self.slot)
        try:
            yield
        finally:
            self.shared.leave(self.slot)

    def forward_costs(self, costs: CostModel) -> Costs:
        return MarginalCosts(costs, lambda: self.shared.others(self.slot))

    def __del__(self) -> None:
        if getattr(self, "shared", None) is not None:
            with self.shared.kv:
                llama = lib()
                mem = llama.llama_get_memory(self.shared.ctx)
                llama.llama_memory_seq_rm(mem, self.seq0, -1, -1)
            self.shared.release(self.slot)
            self.shared = None


class MarginalCosts:
    """A sequence's view of the batch's cost: what its n rows add to the tick (a
    :class:`~specdec.costs.Costs` over the model's curve, which it reads and never changes).

    The others bring ``others()`` rows, mostly one each. llama.cpp gives every sequence its own
    KV stream here and computes a batch of streams in *equal* slices (one row of each sequence per
    slice), so a sequence's first row rides in the shared slice (the curve's increment from b to
    b + 1 rows) and its other n - 1 rows make a forward of their own (the curve at n - 1).
    """

    def __init__(self, curve: CostModel, others: Callable[[], int]) -> None:
        self.curve = curve
        self._others = others

    @property
    def unit(self) -> float:
        return self.curve.unit

    @property
    def switch(self) -> float:
        return self.curve.switch

    def forward(self, n: int) -> float:
        b = self._others()
        if b == 0:
            return self.curve.forward(n)
        shared = self.curve.forward(b + 1) - self.curve.forward(b)
        return shared + (self.curve.forward(n - 1) if n > 1 else 0.0)

    def step(self, n: int) -> float:
        # Alone, a draft step also pays the shape switch of the one-row forward after it; in a
        # batch the shape changes every tick anyway.
        return self.forward(n) + (self.curve.switch if n > 1 and self._others() == 0 else 0.0)

    def ratio(self, n: int) -> float:
        return self.forward(n) / self.curve.unit

    def observe(self, n: int, seconds: float, after: int | None = None) -> None:
        """Ticks teach the shared curve (a sequence's own wait includes the others' rows)."""
