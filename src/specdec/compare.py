"""Is speculation faster than plain decoding here? Paired timings in, a ratio, its spread and a
verdict out (pure arithmetic: ``specdec generate --compare`` and ``specdec bench`` use it).

Timings on a shared 2-core machine wander by several percent from run to run, and a first run pays
for warming kernels and caches; one plain run against one speculative run can show 1.28x for two
runs that did the same work. So a speed-up is reported as the median of per-pair ratios (each
pair ran back to back, in alternating order) with its spread, and it counts as a speed-up only if
it survives three checks:

1. every pair agrees on the side of 1.0 (the spread does not include 1.0);
2. it is at least :data:`MIN_EFFECT` away from 1.0 (with 3 pairs, pure noise puts all of them on
   one side a quarter of the time);
3. it is not more than the counters allow: a speculative target forward costs at least a plain
   one-token forward, so speculation can be at most (tokens per forward, speculative) / (tokens per
   forward, plain) faster. A run that accepted 2 drafts in 160 tokens cannot be 1.28x faster, however
   the clock read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# Below this a speed-up is not told apart from run-to-run noise (identical runs here differ by a
# few percent); 3% is the smallest effect the README's measurements resolve.
MIN_EFFECT = 0.03


def median(values: Sequence[float]) -> float:
    """The median (the mean of the middle two for an even count)."""
    if not values:
        raise ValueError("median of no values")
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile by linear interpolation between order statistics (numpy's default)."""
    if not values:
        raise ValueError("quantile of no values")
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def within_noise(speedup: float, low: float, high: float, min_effect: float = MIN_EFFECT) -> bool:
    """Whether a speed-up with spread [low, high] is indistinguishable from 1.0x: the spread
    includes 1.0, or the speed-up is less than ``min_effect`` away from it."""
    return low <= 1.0 <= high or abs(speedup - 1.0) < min_effect


def forward_ceiling(plain_tokens: int, plain_forwards: int, spec_tokens: int, spec_forwards: int) -> float | None:
    """The most speculation can gain given its counters: its tokens per target forward over plain's
    (every speculative forward costs at least one plain forward; drafting costs more, not less).
    None when a count is missing."""
    if plain_forwards <= 0 or spec_forwards <= 0 or plain_tokens <= 0:
        return None
    return (spec_tokens / spec_forwards) / (plain_tokens / plain_forwards)


@dataclass(frozen=True)
class Comparison:
    """The speed-up of speculative over plain decoding from paired runs."""

    speedup: float  # median of the per-pair ratios plain_s / speculative_s
    low: float  # the spread: the smallest and largest per-pair ratio
    high: float
    pairs: int
    ceiling: float | None  # the most the counters allow (see :func:`forward_ceiling`)
    verdict: str  # "faster", "slower", "noise", or "beyond-counters" (a speed-up the counters cannot explain)

    @property
    def within_noise(self) -> bool:
        """True unless the runs show a real difference (faster or slower)."""
        return self.verdict in ("noise", "beyond-counters")

    def describe(self) -> str:
        """``1.02x (0.97-1.06 over 3 pairs), within run-to-run noise`` and the like."""
        over = f"over {self.pairs} pair{'s' if self.pairs != 1 else ''}"
        text = f"{self.speedup:.2f}x ({self.low:.2f}-{self.high:.2f} {over})" if self.pairs > 1 else \
            f"{self.speedup:.2f}x ({over})"
        if self.verdict == "noise":
            return text + ", within run-to-run noise"
        if self.verdict == "beyond-counters":
            return text + f", more than the {self.ceiling:.2f}x its target forwards allow: run-to-run noise"
        return text

    def to_dict(self) -> dict:
        """The fields ``--json`` reports beside the outputs."""
        return {"speedup": round(self.speedup, 3), "speedup_spread": [round(self.low, 3), round(self.high, 3)],
                "within_noise": self.within_noise, "verdict": self.verdict, "repeats": self.pairs,
                "speedup_ceiling": None if self.ceiling is None else round(self.ceiling, 3)}


def compare(plain_s: Sequence[float], spec_s: Sequence[float], ceiling: float | None = None,
            min_effect: float = MIN_EFFECT) -> Comparison:
    """Compare paired wall times: ``plain_s[i]`` and ``spec_s[i]`` ran back to back.

    ``ceiling`` (from :func:`forward_ceiling`) caps what counts as a real speed-up.
    """
    if len(plain_s) != len(spec_s) or not plain_s:
        raise ValueError(f"need the same number (>= 1) of plain and speculative timings, got {len(plain_s)} "
                         f"and {len(spec_s)}")
    if min(*plain_s, *spec_s) <= 0:
        raise ValueError("timings must be positive")
    ratios = [p / s for p, s in zip(plain_s, spec_s)]
    speedup, low, high = median(ratios), min(ratios), max(ratios)
    if within_noise(speedup, low, high, min_effect):
        verdict = "noise"
    elif speedup > 1.0 and ceiling is not None and speedup > ceiling * (1.0 + min_effect):
        verdict = "beyond-counters"
    else:
        verdict = "faster" if speedup > 1.0 else "slower"
    return Comparison(speedup, low, high, len(ratios), ceiling, verdict)


def spread(ratios: Sequence[float], speedup: float) -> dict:
    """A benchmark's per-question speed-ups summarized: ``speedup_spread`` (their 25th and 75th
    percentiles) and ``within_noise`` (that range includes 1.0, or ``speedup``, the reported
    overall ratio, is within :data:`MIN_EFFECT` of it).

    Per-question ratios vary with the questions as well as with noise, so the middle half of them
    is the range a reader can rely on; a spread that includes 1.0 means the method gains on some
    questions what it loses on others."""
    if not ratios:
        return {"speedup_spread": None, "within_noise": None}
    low, high = quantile(ratios, 0.25), quantile(ratios, 0.75)
    return {"speedup_spread": [round(low, 3), round(high, 3)],
            "within_noise": within_noise(speedup, low, high)}
