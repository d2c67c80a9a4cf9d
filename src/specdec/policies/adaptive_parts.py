"""The adaptive policy's parts (:mod:`specdec.policies.adaptive`): its numbers (:class:`Tuning`), a
generation's :class:`Calibration` of its drafter's confidence, and the :class:`Plan` of a drafter
whose tokens cost forwards. Each kept because replays of recorded answers measured what it buys
(docs/explanation/speculation.md)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from specdec.types import Draft


@dataclass(frozen=True)
class Tuning:
    """The policy's numbers, in one place."""

    min_survival: float = 0.2  # threshold drafting: stop where the whole draft is this unlikely to survive
    prior_acceptance: float = 0.5  # per-token rate of drafts without confidence, until observed
    rate: float = 0.1  # weight of one verification in the running acceptance rates
    calibration_prior: float = 3.0  # judged tokens at face value before a generation's own (0: off)
    calibration_recovery: float = 0.05  # of a token at face value, added by each declined draft
    calibration_range: tuple[float, float] = (0.1, 4.0)  # the odds factor's bounds
    priced_prior: float = 0.8  # per-token acceptance assumed for a draft model's tokens at first
    explore_every: int = 16  # steps between one-token tries where a priced drafter is believed not to pay
    explore_gain: float = 1.1  # ... if it would pay this much were every token accepted


class Calibration:
    """A generation's drafts' acceptance against what their confidence predicted, as an odds factor
    on its later drafts' confidence (a drafter learns over every generation; this text may differ).
    A declined draft adds a little at face value: a generation that stopped drafting tries again."""

    TYPICAL = 0.7  # a draft token's usual confidence: the prior's factor is 1 whatever it is

    def __init__(self, tuning: Tuning) -> None:
        self.tuning = tuning
        prior = tuning.calibration_prior
        self.accepted, self.predicted, self.judged = prior * self.TYPICAL, prior * self.TYPICAL, prior
        self.verified: list[float] = []  # the confidence of the tokens the last choice verified

    def scaled(self, confidence: list[float]) -> list[float]:
        if not self.tuning.calibration_prior:
            return confidence
        low, high = self.tuning.calibration_range
        factor = min(high, max(low, _odds(self.accepted / self.judged) / _odds(self.predicted / self.judged)))
        return confidence if factor == 1.0 else [_scale(c, factor) for c in confidence]

    def chose(self, draft: Draft, chosen: int) -> None:
        if not self.tuning.calibration_prior:
            return
        self.verified = list(draft.confidence[:chosen]) if draft.confidence and draft.parents is None else []
        if chosen == 0 and len(draft):
            recovery, believed = self.tuning.calibration_recovery, self.predicted / self.judged
            self.accepted, self.predicted = self.accepted + recovery * believed, self.predicted + recovery * believed
            self.judged += recovery

    def observe(self, accepted: int, judged: int) -> None:
        if self.verified:
            self.accepted, self.predicted = self.accepted + accepted, self.predicted + sum(self.verified[:judged])
            self.judged += judged
            self.verified = []


class Plan:
    """For a drafter whose tokens cost forwards: the length with the best expected rate at the
    acceptance its drafts have shown (0: its prompt never runs), and a one-token try now and then
    where a higher acceptance would pay well (or the belief would never be corrected)."""

    def __init__(self, tuning: Tuning, k: int) -> None:
        self.tuning, self.k = tuning, k
        self.acceptance = tuning.priced_prior  # learned from priced drafts alone, across generations
        self.declined = 0

    def best(self, d: float, acceptance: float, step: Callable[[int], float]) -> tuple[int, float]:
        """The length and its rate over a plain step, a token costing ``d`` seconds to draft."""
        plain = 1.0 / step(1)
        best_i, best_rate, expected, survive = 0, plain, 1.0, 1.0
        for i in range(1, self.k + 1):
            survive *= acceptance
            expected += survive
            if expected / (i * d + step(i + 1)) > best_rate:
                best_i, best_rate = i, expected / (i * d + step(i + 1))
        return best_i, best_rate / plain

    def length(self, d: float, step: Callable[[int], float]) -> int:
        best = self.best(d, self.acceptance, step)[0]
        if best == 0 and self.best(d, 1.0, step)[1] >= self.tuning.explore_gain:
            self.declined += 1
            return 1 if self.declined % self.tuning.explore_every == 0 else 0
        return best


def _odds(p: float) -> float:
    p = min(max(p, 1e-3), 1 - 1e-3)
    return p / (1 - p)


def _scale(p: float, factor: float) -> float:  # p with its odds multiplied by factor
    return _odds(p) * factor / (1 + _odds(p) * factor)
