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

    def learn(self, draft: Draft, features: Sequence[Features], verdict: Verdict) -> None:
        """Learn from one verified draft, chain or tree, whose nodes had ``features``."""
        if not draft.is_tree:
            self.update(features, verdict.num_accepted)
            return
        for node, accepted in trees.judged(draft.parents, verdict.path):
            self.record(features[node], accepted)


class Hindsight:
    """Judges the chains a policy declined against the tokens that followed them.

    A table taught by verified drafts alone never learns about the drafts it is too unsure to
    have verified: a bucket whose prior is low stays low, even on text where its drafts would all
    have been kept (the first tokens of a copy into an edited function), so the policy never
    tries them. A deterministic draft needs no forward to be judged: the plain steps after it
    produce the target's own tokens, and a draft token is kept by verification exactly when it
    equals the token the target produces there (with sampling too: a one-hot draft token is
    accepted with probability p(token), the probability that plain decoding samples it). So each
    declined chain is judged, token by token up to its first miss, once the context has reached
    past it.
    """

    def __init__(self, table: AcceptanceTable) -> None:
        self.table = table
        self._pending: list[tuple[int, list[int], list[Features]]] = []  # (position, tokens, features)

    def declined(self, position: int, tokens: Sequence[int], features: Sequence[Features]) -> None:
        """A chain drafted after ``position`` context tokens that was not verified."""
        if tokens:
            self._pending.append((position, list(tokens), list(features)))

    def judge(self, context: Sequence[int], final: bool = False) -> None:
        """Teach the table every pending chain ``context`` decides (all of them when ``final``:
        a chain the generation ended inside is judged on the tokens it reached)."""
        waiting = []
        for position, tokens, features in self._pending:
            followed = context[position:position + len(tokens)]
            kept = kept_prefix(tokens, followed)
            missed = kept < len(followed)
            if not (missed or final or len(followed) == len(tokens)):
                waiting.append((position, tokens, features))
                continue
            self.table.update(features[:kept + missed], kept)
        self._pending = waiting

    def clear(self) -> None:
        self._pending = []


def kept_prefix(tokens: Sequence[int], followed: Sequence[int]) -> int:
    """How many of a deterministic draft's ``tokens`` verification keeps, given the tokens the
    target produced after the same context (``followed``, as far as it has reached)."""
    kept = 0
    while kept < min(len(tokens), len(followed)) and tokens[kept] == followed[kept]:
        kept += 1
    return kept
