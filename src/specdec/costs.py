"""The cost curve: how long one target forward takes for n new tokens, measured on this machine
and refined while decoding.

On a CPU, verifying k draft tokens (a forward of k+1 tokens) can cost much more than decoding one
token, so whether a draft pays depends on this curve; the adaptive policy and ``specdec bench
--cost-curve`` both read it from here.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from specdec.cache import JsonCache
from specdec.errors import SpecdecError


class Timed(Protocol):
    """What measuring forwards needs of a model: a cache to fill, extend and roll back (every
    :class:`specdec.backends.base.Backend` has it)."""

    @property
    def length(self) -> int: ...

    def extend(self, tokens: Sequence[int]) -> object: ...

    def truncate(self, length: int) -> None: ...

    def reset(self) -> None: ...

    def prefill(self, tokens: Sequence[int]) -> int: ...


def measure_forward_costs(backend: Timed, context: Sequence[int], sizes: Sequence[int],
                          repeats: int = 3, long_from: int | None = None) -> dict[int, float]:
    """Fastest seconds of one ``extend`` of n tokens after ``context``, for each n in ``sizes``.

    Sizes are interleaved within each repeat so machine noise hits all of them alike, and the
    fastest repeat counts (noise only ever adds time: another process on the cores can double a
    median); the cache is rolled back to ``context`` after every forward. Sizes from ``long_from``
    on are timed in the first two repeats only (each costs many short forwards). A one-token
    forward is timed right after another one (untimed), as in plain decoding: after another size it
    would also pay the shape switch (:func:`measure_switch`). Every size, the unit included, is
    timed in the same rounds, so a slow spell of the machine moves them all alike instead of the
    ratios between them.
    """
    base, pool = _at(backend, context)
    samples: dict[int, list[float]] = {n: [] for n in sizes}
    backend.extend(pool[:1])  # warm-up: first calls allocate
    backend.truncate(base)
    for repeat in range(repeats):
        for n in sizes:
            if long_from is not None and n >= long_from and repeat >= 2:
                continue
            tokens = _tokens(pool, n)
            if n == 1:
                _wait(backend.extend(tokens))
                backend.truncate(base)
            t0 = time.perf_counter()
            _wait(backend.extend(tokens))
            samples[n].append(time.perf_counter() - t0)
            backend.truncate(base)
    return {n: min(v) for n, v in samples.items()}


def measure_switch(backend: Timed, context: Sequence[int], repeats: int = 5, other: int = 4) -> tuple[float, float]:
    """(steady, switch): the fastest seconds of a one-token ``extend`` right after another
    one-token forward, and how much longer it takes, in the median, right after a forward of
    ``other`` tokens (medians on both sides: the difference of two minima reads one lucky steady
    sample as a switch).

    llama.cpp re-plans its compute graph when the batch shape changes (for a small model a sizeable
    fraction of its one-token forward), so every draft step also slows the plain step that follows
    it; a policy that ignores this drafts where it cannot pay.
    """
    base, pool = _at(backend, context)
    steady: list[float] = []
    after: list[float] = []
    for i in range(2 * repeats):
        before = 1 if i % 2 == 0 else other
        _wait(backend.extend(_tokens(pool, before)))
        backend.truncate(base)
        t0 = time.perf_counter()
        _wait(backend.extend(pool[:1]))
        (steady if before == 1 else after).append(time.perf_counter() - t0)
        backend.truncate(base)
    return min(steady), max(0.0, statistics.median(after) - statistics.median(steady))


def _wait(result: object) -> None:
    """Wait until a forward's logits exist: a GPU returns before it has computed them, and reading
    one value back waits for everything queued before it."""
    device = getattr(result, "device", None)
    if device is not None and device.type != "cpu":
        float(result.reshape(-1)[0])


def _at(backend: Timed, context: Sequence[int]) -> tuple[int, list[int]]:
    """Put ``backend``'s cache at ``context``; its length, and the tokens timed forwards feed."""
    backend.reset()
    backend.prefill(context)
    return backend.length, list(context) or [0]


def _tokens(pool: list[int], n: int) -> list[int]:
    return (pool * (n // len(pool) + 1))[:n]


class Ema:
    """A running average; one observation moves it by at most ``clip`` times (a scheduler hiccup
    or a server's queue must not swing a decision)."""

    def __init__(self, value: float, weight: float = 0.1, clip: float = 3.0) -> None:
        self.value = value
        self.weight = weight
        self.clip = clip

    def add(self, x: float) -> None:
        x = min(max(x, self.value / self.clip), self.value * self.clip) if self.value > 0 else x
        self.value += self.weight * (x - self.value)


class Costs(Protocol):
    """What a policy reads of forward costs: :class:`CostModel` (the model's measured curve) or a
    view of it, such as the marginal cost of one sequence's rows in a batch that
    :meth:`specdec.backends.base.Backend.forward_costs` gives."""

    @property
    def unit(self) -> float:
        """Seconds of a steady one-token forward."""

    @property
    def switch(self) -> float:
        """Extra seconds of a one-token forward right after a forward of another size."""

    def forward(self, n: int) -> float:
        """Estimated seconds for a forward of ``n`` new tokens."""

    def step(self, n: int) -> float:
        """Estimated seconds a step verifying ``n`` tokens costs against plain decoding."""

    def ratio(self, n: int) -> float:
        """Cost of a forward of ``n`` tokens relative to one token."""

    def observe(self, n: int, seconds: float, after: int | None = None) -> None:
        """Learn from one timed forward of ``n`` new tokens (a view may leave it to the curve)."""


class CostModel:
    """Seconds per target forward as a function of the number of new tokens n (n = k + 1).

    Calibrated at every n from 1 to 16 (and at 24, 32, 48 and 64) and kept as measured: on a CPU the
    curve need not be monotone (a kernel for groups of rows can make n + 1 rows cheaper than n), and
    a policy that knows the true cost of each count can verify one more token when that makes the
    forward cheaper.

    The model is a unit (the cost of one row) times a ratio per n. Both are refined online from
    the forwards the engine times (:meth:`observe`): the unit follows the 1-row forwards (it grows
    with the context, and with machine load), each ratio follows the forwards of its own size
    relative to the current unit, and a one-row forward right after a bigger one teaches the
    shape-switch cost instead (:meth:`step`). Updates are exponential moving averages clipped per
    step, so a single slow forward (a scheduler hiccup) cannot swing a decision.
    """

    UNIT_WEIGHT = 0.2
    RATIO_WEIGHT = 0.1
    SWITCH_WEIGHT = 0.1
    CLIP = 1.5  # one observation moves an estimate by at most this factor (before averaging)
    # Bounds that no machine's honest measurement exceeds: a forward of n tokens costs at most
    # ROWS_BOUND x n one-token forwards, and a shape switch at most MAX_SWITCH of one. A calibration
    # taken while another process held the cores can read far above them, and a policy that
    # believed it would never draft again, so never learn otherwise.
    ROWS_BOUND = 1.25
    MAX_SWITCH = 0.5

    def __init__(self, seconds: dict[int, float], switch: float = 0.0) -> None:
        if not seconds:
            raise ValueError("a cost model needs at least one measurement")
        if any(not (s > 0) for s in seconds.values()):
            raise ValueError("forward costs must be positive")
        self.measured = dict(sorted(seconds.items()))  # the calibration, as measured
        first = next(iter(self.measured))
        self._unit = Ema(self.measured[first] / first, self.UNIT_WEIGHT, self.CLIP)
        self._ratios = {n: Ema(self._bounded(n, s / self.unit), self.RATIO_WEIGHT, self.CLIP)
                        for n, s in self.measured.items()}
        # Extra time of a one-token forward right after a forward of another size (the backend
        # re-plans for the new shape), as a fraction of the unit so that it follows the unit: the
        # price a draft step adds to the plain step after it.
        self._switch = Ema(self._switch_fraction(switch), self.SWITCH_WEIGHT, math.inf)  # bounded in observe
        self.observations = 0
        self._batch: BatchCosts | None = None

    @property
    def batch(self) -> BatchCosts:
        """The forwards of a batch of this model's sequences, learned from its ticks (kept with
        the curve: whoever steps the model's sequences together reads and teaches the same)."""
        if self._batch is None:
            self._batch = BatchCosts(self)
        return self._batch

    def _bounded(self, n: int, ratio: float) -> float:
        return min(max(ratio, min(n, 1.0)), self.ROWS_BOUND * n)

    def _switch_fraction(self, seconds: float) -> float:
        return min(max(seconds / self.unit, 0.0), self.MAX_SWITCH)

    @property
    def unit(self) -> float:
        """Seconds of a steady one-token forward."""
        return self._unit.value

    @property
    def switch(self) -> float:
        """Extra seconds of a one-token forward right after a forward of another size."""
        return self._switch.value * self.unit

    @property
    def seconds(self) -> dict[int, float]:
        """The current estimate at every calibrated size."""
        return {n: self.forward(n) for n in self.measured}

    def forward(self, n: int) -> float:
        """Estimated seconds for a forward of ``n`` new tokens."""
        return self.unit * self.ratio(n)

    def step(self, n: int) -> float:
        """Estimated seconds a step verifying ``n`` tokens costs against plain decoding: its forward
        and, for n > 1, the shape switch it imposes on the one-token forward after it."""
        return self.forward(n) + (self.switch if n > 1 else 0.0)

    def ratio(self, n: int) -> float:
        """Cost of a forward of ``n`` tokens relative to one token."""
        if n in self._ratios:
            return self._ratios[n].value
        ratios = {size: ema.value for size, ema in self._ratios.items()}
        sizes = sorted(ratios)
        first, last = sizes[0], sizes[-1]
        if n < first or len(sizes) == 1:
            return ratios[first] * n / first
        if n > last:
            # The curve's mean slope, not its last segment's: adjacent sizes can dip (odd vs even).
            slope = max(0.0, (ratios[last] - ratios[first]) / (last - first))
            return ratios[last] + slope * (n - last)
        b = next(s for s in sizes if s > n)
        a = max(s for s in sizes if s < n)
        return ratios[a] + (ratios[b] - ratios[a]) * (n - a) / (b - a)

    def observe(self, n: int, seconds: float, after: int | None = None) -> None:
        """Learn from one timed forward of ``n`` new tokens (``after``: the size of the forward
        before it in the same generation, when known)."""
        if not (seconds > 0) or n < 1:
            return
        self.observations += 1
        if n == 1 and after is not None and after > 1:
            # An extra that may be 0: bounded absolutely instead of by relative clipping.
            self._switch.add(self._switch_fraction(seconds - self.unit))
        elif n == 1:
            self._unit.add(seconds)
        else:
            ema = self._ratios.get(n)
            if ema is None:  # a size never calibrated starts from the curve's interpolation
                ema = self._ratios[n] = Ema(self.ratio(n), self.RATIO_WEIGHT, self.CLIP)
            ema.add(self._bounded(n, seconds / self.unit))


class BatchCosts:
    """Seconds of one forward of a batch of sequences (continuous batching) by its rows and
    whether they are one sequence's or several's, as the batch's ticks meet it: learned from the
    ticks themselves and kept with the model's curve.

    A tick may run as several forwards (llama.cpp slices unequal rows into forwards of their own:
    the sequences' first rows together, then a drafting sequence's other rows alone), and its time
    is their sum: each tick is one linear equation in the costs of forwards of 1 .. ``ROWS`` rows
    of one sequence and of several, which a Kalman filter solves as the ticks come. It starts from
    the model's curve for both, trusted to half its value, neighbouring sizes of a kind together,
    all sizes together (a calibration taken while something else ran is off for every size alike),
    and all sizes of one kind together (measured here: 16 rows of one sequence took up to 1.5 times
    what one row of 16 sequences took, and chains of 40-50 rows beside 3 sequences 2-3 times what
    the calibration said). So a tick that ran one well-known forward and a few new ones teaches
    the new ones what it took beyond the known one, rather than spreading its surprise over all of
    them, and sizes no tick ran yet follow the ones that did, the nearest of their kind first. Past ``ROWS`` rows
    (prompts), the curve times what the learned sizes say of it overall; such ticks teach nothing.
    """

    ROWS = 64
    PRIOR = 0.5  # the curve's uncertainty, as a share of each value: each size alone, all, each kind
    DRIFT = 0.03  # how far, as a share, a forward's cost may move from one tick to the next (the same)
    NOISE = 0.1  # a tick's time is measured to this share (another process on the cores)
    NEAR = 3.0  # rows over which the costs of sizes of one kind go together

    def __init__(self, curve: CostModel) -> None:
        self.curve = curve
        one = np.array([curve.forward(n) for n in range(1, self.ROWS + 1)])
        prior = np.concatenate([one, one])  # one sequence's forwards, then several's
        kinds = [np.concatenate([one, 0 * one]), np.concatenate([0 * one, one])]
        # Neighbouring sizes of a kind cost alike (a forward of 47 rows about what one of 49 took):
        # a smooth part over the rows, beside a little of each size alone.
        rows = np.arange(self.ROWS)
        near = np.exp(-((rows[:, None] - rows[None, :]) / self.NEAR) ** 2 / 2)
        smooth = np.zeros((2 * self.ROWS, 2 * self.ROWS))
        smooth[:self.ROWS, :self.ROWS] = smooth[self.ROWS:, self.ROWS:] = near
        shape = (np.outer(prior, prior) * (smooth + 0.1 * np.eye(2 * self.ROWS)) + np.outer(prior, prior)
                 + sum(np.outer(k, k) for k in kinds))
        self._prior = prior
        self._theta = prior.copy()
        self._cov = self.PRIOR ** 2 * shape
        self._drift = self.DRIFT ** 2 * shape
        self.observations = 0

    def _index(self, rows: int, sequences: int) -> int:
        return rows - 1 + (self.ROWS if sequences > 1 else 0)

    def forward(self, rows: int, sequences: int = 1) -> float:
        """Estimated seconds of one forward of ``rows`` rows from ``sequences`` sequences."""
        if 1 <= rows <= self.ROWS:
            return float(self._theta[self._index(rows, sequences)])
        return self.curve.forward(rows) * float(self._theta.sum() / self._prior.sum())

    def tick(self, forwards: Sequence[tuple[int, int]], caution: float = 0.0) -> float:
        """Estimated seconds of a tick run as these forwards, (rows, sequences) each; with
        ``caution``, that many standard deviations of the estimate more (a tick of forwards no
        tick ran yet is priced above what the curve says of them, one of well-known ones at it)."""
        mean = sum(self.forward(rows, sequences) for rows, sequences in forwards)
        if not caution:
            return mean
        # A forward past ROWS rows is as uncertain as the ROWS-row one, in proportion to its rows
        # (without it such a forward was priced at its mean beside cautious small ones, so a tick
        # of many sequences' long drafts looked cheaper than their steps alone).
        weights: dict[int, float] = {}
        for rows, sequences in forwards:
            if rows >= 1:
                i = self._index(min(rows, self.ROWS), sequences)
                weights[i] = weights.get(i, 0.0) + max(1.0, rows / self.ROWS)
        variance = sum(wi * wj * self._cov[i, j] for i, wi in weights.items() for j, wj in weights.items())
        return mean + caution * math.sqrt(max(variance, 0.0))

    def observe(self, forwards: Sequence[tuple[int, int]], seconds: float) -> None:
        """Learn from one timed tick run as ``forwards``."""
        if not forwards or not seconds > 0 or any(not 1 <= rows <= self.ROWS for rows, _ in forwards):
            return
        x = np.zeros(2 * self.ROWS)
        for rows, sequences in forwards:
            x[self._index(rows, sequences)] += 1
        self.observations += 1
        cov_x = self._cov @ x
        gain = cov_x / (x @ cov_x + (self.NOISE * seconds) ** 2)
        self._theta += gain * (seconds - x @ self._theta)
        self._cov -= np.outer(gain, cov_x)
        self._cov += self._drift
        # No forward is free, and none costs more than the curve's bound allows (a tick slowed by
        # something else must not rule drafting out for good).
        np.clip(self._theta, 0.2 * self._prior, 5.0 * self._prior, out=self._theta)


# Every count to 16 (a CPU's curve is not monotone there), then a few long drafts' counts: where a
# backend's kernels batch many rows well (llama.cpp's fast kernels: 64 rows for 23 one-row
# forwards on a 1.5B model here), a copied stretch pays drafted long.
CALIBRATION_SIZES = tuple(range(1, 17)) + (24, 32, 48, 64)
LONG_FROM = 17


REPEATS = 5  # rounds of the calibration (the fastest of each size counts)
REPEATS_ENV = "SPECDEC_CALIBRATION_REPEATS"


def calibration_repeats() -> int:
    """Rounds of a calibration: ``SPECDEC_CALIBRATION_REPEATS`` or :data:`REPEATS`. Fewer rounds
    start a model sooner with a rougher curve, which the forwards then refine (the test suite runs
    one: what it checks does not depend on the curve's precision)."""
    raw = os.environ.get(REPEATS_ENV)
    if raw is None:
        return REPEATS
    try:
        repeats = int(raw)
    except ValueError:
        repeats = 0
    if repeats < 1:
        raise SpecdecError(f"{REPEATS_ENV} must be a whole number >= 1, got {raw!r}")
    return repeats


def calibrated(key: str, backend: Timed, context: Sequence[int], repeats: int | None = None) -> CostModel:
    """The cost model for ``key`` (model, backend, dtype, threads, CPU), measured once per machine
    in ``repeats`` rounds (default :func:`calibration_repeats`).

    Measurements are cached as JSON under the specdec cache (``costs/``); a missing or corrupt
    file is measured again. Delete it to re-measure, e.g. after moving to a busier machine. A curve
    of fewer rounds than the default is kept apart, so it never stands in for a full one.
    """
    repeats = calibration_repeats() if repeats is None else repeats
    if repeats != REPEATS:
        key = f"{key}-r{repeats}"
    cache = JsonCache("costs", key)
    found = cache.load(_parse_seconds)
    if found is None:
        seconds = measure_forward_costs(backend, context, CALIBRATION_SIZES, repeats, long_from=LONG_FROM)
        _, switch = measure_switch(backend, context, repeats)
        cache.store({**{str(n): s for n, s in seconds.items()}, SWITCH_KEY: switch / seconds[1]})
    else:
        seconds, fraction = found
        switch = fraction * seconds[1]
    return CostModel(seconds, switch)


SWITCH_KEY = "switch_fraction"  # of a one-token forward (files with an absolute "switch" are re-measured)


def _parse_seconds(raw) -> tuple[dict[int, float], float]:
    raw = dict(raw)
    switch = float(raw.pop(SWITCH_KEY))  # KeyError for an older file: measured again
    seconds = {int(n): float(s) for n, s in raw.items()}
    if set(seconds) != set(CALIBRATION_SIZES) or any(not (0 < s < 1e3) for s in seconds.values()):
        raise ValueError("not a cost curve of this version")
    if not 0 <= switch < 1e3:
        raise ValueError("not a shape-switch fraction")
    return seconds, switch
