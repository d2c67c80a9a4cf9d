"""The cost curve: how long one target forward takes for n new tokens, measured on this machine
and refined while decoding.

On a CPU, verifying k draft tokens (a forward of k+1 tokens) can cost much more than decoding one
token, so whether a draft pays depends on this curve; the adaptive policy and ``specdec bench
--cost-curve`` both read it from here.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

from specdec.backends.base import Backend
from specdec.cache import JsonCache

def measure_forward_costs(backend: Backend, context: Sequence[int], sizes: Sequence[int],
                          repeats: int = 3) -> dict[int, float]:
    """Median seconds of one ``extend`` of n tokens after ``context``, for each n in ``sizes``.

    Sizes are interleaved within each repeat so machine noise hits all of them alike; the cache is
    rolled back to ``context`` after every forward.
    """
    backend.reset()
    backend.prefill(context)
    base = backend.length
    pool = list(context) or [0]
    samples: dict[int, list[float]] = {n: [] for n in sizes}
    backend.extend(pool[:1])  # warm-up: first calls allocate
    backend.truncate(base)
    for _ in range(repeats):
        for n in sizes:
            tokens = (pool * (n // len(pool) + 1))[:n]
            t0 = time.perf_counter()
            backend.extend(tokens)
            samples[n].append(time.perf_counter() - t0)
            backend.truncate(base)
    return {n: statistics.median(v) for n, v in samples.items()}


class CostModel:
    """Seconds per target forward as a function of the number of new tokens n (n = k + 1).

    Calibrated at every n from 1 to 16 and kept as measured: on a CPU the curve is not monotone
    (llama.cpp on AVX2: 3 rows cost 3.1x one row, 4 rows 2.6x), and a policy that knows the true
    cost of each count can verify one more token when that makes the forward cheaper.

    The model is a unit (the cost of one row) times a ratio per n. Both are refined online from
    the forwards the engine times (:meth:`observe`): the unit follows the 1-row forwards (it grows
    with the context, and with machine load), each ratio follows the forwards of its own size
    relative to the current unit. Updates are exponential moving averages clipped per step, so a
    single slow forward (a scheduler hiccup) cannot swing a decision.
    """

    UNIT_WEIGHT = 0.2
    RATIO_WEIGHT = 0.1
    CLIP = 1.5  # one observation moves an estimate by at most this factor (before averaging)

    def __init__(self, seconds: dict[int, float]) -> None:
        if not seconds:
            raise ValueError("a cost model needs at least one measurement")
        if any(not (s > 0) for s in seconds.values()):
            raise ValueError("forward costs must be positive")
        self.measured = dict(sorted(seconds.items()))  # the calibration, as measured
        first = next(iter(self.measured))
        self.unit = self.measured[first] / first
        self._ratios = {n: s / self.unit for n, s in self.measured.items()}
        self.observations = 0

    @property
    def seconds(self) -> dict[int, float]:
        """The current estimate at every calibrated size."""
        return {n: self.forward(n) for n in self.measured}

    def forward(self, n: int) -> float:
        """Estimated seconds for a forward of ``n`` new tokens."""
        return self.unit * self.ratio(n)

    def ratio(self, n: int) -> float:
        """Cost of a forward of ``n`` tokens relative to one token."""
        if n in self._ratios:
            return self._ratios[n]
        sizes = sorted(self._ratios)
        first, last = sizes[0], sizes[-1]
        if n < first or len(sizes) == 1:
            return self._ratios[first] * n / first
        if n > last:
            # The curve's mean slope, not its last segment's: adjacent sizes can dip (odd vs even).
            slope = max(0.0, (self._ratios[last] - self._ratios[first]) / (last - first))
            return self._ratios[last] + slope * (n - last)
        b = next(s for s in sizes if s > n)
        a = max(s for s in sizes if s < n)
        return self._ratios[a] + (self._ratios[b] - self._ratios[a]) * (n - a) / (b - a)

    def observe(self, n: int, seconds: float) -> None:
        """Learn from one timed forward of ``n`` new tokens."""
        if not (seconds > 0) or n < 1:
            return
        self.observations += 1
        if n == 1:
            target = min(max(seconds, self.unit / self.CLIP), self.unit * self.CLIP)
            self.unit += self.UNIT_WEIGHT * (target - self.unit)
            return
        current = self.ratio(n)
        target = min(max(seconds / self.unit, current / self.CLIP), current * self.CLIP)
        self._ratios[n] = current + self.RATIO_WEIGHT * (target - current)


CALIBRATION_SIZES = tuple(range(1, 17))


def calibrated(key: str, backend: Backend, context: Sequence[int], repeats: int = 5) -> CostModel:
    """The cost model for ``key`` (model, backend, dtype, threads, CPU), measured once per machine.

    Measurements are cached as JSON under the specdec cache (``costs/``); a missing or corrupt
    file is measured again. Delete it to re-measure, e.g. after moving to a busier machine.
    """
    cache = JsonCache("costs", key)
    seconds = cache.load(_parse_seconds)
    if seconds is None:
        seconds = measure_forward_costs(backend, context, CALIBRATION_SIZES, repeats)
        cache.store({str(n): s for n, s in seconds.items()})
    return CostModel(seconds)


def _parse_seconds(raw) -> dict[int, float]:
    seconds = {int(n): float(s) for n, s in raw.items()}
    if set(seconds) != set(CALIBRATION_SIZES) or any(not (0 < s < 1e3) for s in seconds.values()):
        raise ValueError("not a cost curve of this version")
    return seconds
