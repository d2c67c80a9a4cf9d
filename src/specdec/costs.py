"""The cost curve: how long one target forward takes for n new tokens, measured on this machine.

On a CPU, verifying k draft tokens (a forward of k+1 tokens) can cost much more than decoding one
token, so whether a draft pays depends on this curve; the adaptive policy and ``specdec bench
--cost-curve`` both read it from here.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

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


@dataclass
class CostModel:
    """Seconds per target forward as a function of the number of new tokens n (n = k + 1).

    Built from measurements at a few sizes; sizes in between are interpolated linearly and sizes
    past the largest are extrapolated from the last two points. Only ratios matter to the policy,
    and those barely move with the context length, so the curve is not updated while decoding.
    A forward of more tokens never costs less than one of fewer, so a measured dip (noise on a
    shared VM, e.g. 3 tokens slower than 4) is smoothed away by isotonic regression; otherwise
    the policy would chase it.
    """

    seconds: dict[int, float]
    _sizes: list[int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.seconds:
            raise ValueError("a cost model needs at least one measurement")
        self._sizes = sorted(self.seconds)
        self.seconds = dict(zip(self._sizes, _isotonic([self.seconds[n] for n in self._sizes])))

    def forward(self, n: int) -> float:
        """Estimated seconds for a forward of ``n`` new tokens."""
        if n in self.seconds:
            return self.seconds[n]
        sizes = self._sizes
        if n <= sizes[0]:
            return self.seconds[sizes[0]]
        if n >= sizes[-1]:
            if len(sizes) == 1:
                return self.seconds[sizes[-1]] * n / sizes[-1]
            a, b = sizes[-2], sizes[-1]
        else:
            b = next(s for s in sizes if s > n)
            a = max(s for s in sizes if s < n)
        slope = (self.seconds[b] - self.seconds[a]) / (b - a)
        return max(self.seconds[a] + slope * (n - a), 1e-9)

    def ratio(self, n: int) -> float:
        """Cost of a forward of ``n`` tokens relative to one token."""
        return self.forward(n) / self.forward(1)


def _isotonic(values: list[float]) -> list[float]:
    """The non-decreasing sequence closest to ``values`` in least squares (pool adjacent violators)."""
    blocks: list[tuple[float, int]] = []  # (mean, count) of pooled runs
    for v in values:
        blocks.append((v, 1))
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m2, n2), (m1, n1) = blocks.pop(), blocks.pop()
            blocks.append(((m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2))
    return [m for m, n in blocks for _ in range(n)]


CALIBRATION_SIZES = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16)


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
    if not seconds or any(not (0 < s < 1e3) for s in seconds.values()):
        raise ValueError("not a cost curve")
    return seconds
