"""Online calibration of draft confidence: P(a draft token is accepted | its features)."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

from specdec import tree as trees
from specdec.types import Draft, Verdict

Features = tuple
Bucket = Callable[[Features], Hashable]


class AcceptanceTable:
    """Beta-Bernoulli estimates per feature bucket, starting from a prior guess.

    Only judged tokens teach it: in a chain, the tokens before the first rejection were accepted
    and the first rejected one was not, while tokens after it say nothing (they were never judged
    on the context they were drafted for). In a tree, every child tried along the accepted path was
    judged: the one on the path accepted, its siblings rejected.
    """

    def __init__(self, prior: Callable[[Features], float], bucket: Bucket, strength: float = 8.0) -> None:
        self.prior = prior
        self.bucket = bucket
        self.strength = strength
        self.counts: dict[Hashable, list[float]] = {}  # bucket -> [accepted, judged]

    def estimate(self, feats: Features) -> float:
        accepted, judged = self.counts.get(self.bucket(feats), (0.0, 0.0))
        return (accepted + self.strength * self.prior(feats)) / (judged + self.strength)

    def record(self, feats: Features, accepted: bool) -> None:
        cell = self.counts.setdefault(self.bucket(feats), [0.0, 0.0])
        cell[0] += accepted
        cell[1] += 1

    def update(self, features: Sequence[Features], num_accepted: int) -> None:
        """Learn from a chain whose first ``num_accepted`` tokens were kept."""
        for i, feats in enumerate(features[:num_accepted + 1]):
            self.record(feats, i < num_accepted)

    def learn(self, draft: Draft, verdict: Verdict) -> None:
        """Learn from one verified draft, chain or tree."""
        if not draft.is_tree:
            self.update(draft.features, verdict.num_accepted)
            return
        for node, accepted in trees.judged(draft.parents, verdict.path):
            self.record(draft.features[node], accepted)
