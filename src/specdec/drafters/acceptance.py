"""Online calibration of draft confidence: P(a draft token is accepted | its features)."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

Features = tuple
Bucket = Callable[[Features], Hashable]


class AcceptanceTable:
    """Beta-Bernoulli estimates per feature bucket, starting from a prior guess.

    ``update`` learns from one verified draft: tokens before the first rejection were accepted,
    the first rejected one was not, and tokens after it say nothing (they were never judged on
    the context they were drafted for).
    """

    def __init__(self, prior: Callable[[Features], float], bucket: Bucket, strength: float = 8.0) -> None:
        self.prior = prior
        self.bucket = bucket
        self.strength = strength
        self.counts: dict[Hashable, list[float]] = {}  # bucket -> [accepted, judged]

    def estimate(self, feats: Features) -> float:
        accepted, judged = self.counts.get(self.bucket(feats), (0.0, 0.0))
        return (accepted + self.strength * self.prior(feats)) / (judged + self.strength)

    def update(self, features: Sequence[Features], num_accepted: int) -> None:
        for i, feats in enumerate(features[:num_accepted + 1]):
            cell = self.counts.setdefault(self.bucket(feats), [0.0, 0.0])
            cell[0] += i < num_accepted
            cell[1] += 1
