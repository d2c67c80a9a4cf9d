"""A draft being built token by token: the tokens, what verification (q rows) and the
draft-length policy (acceptance estimates, draft probabilities) need about each, and the features
the drafter keeps in its notes; shared by the drafters that draw from a distribution (model, self,
combined)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from specdec.drafting.acceptance import AcceptanceTable
from specdec.types import Draft


@dataclass
class DraftTokens:
    """A draft being built: tokens with what verification and the policy need about each."""

    want_q: bool
    tokens: list[int] = field(default_factory=list)
    qs: list[torch.Tensor] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)
    confidence: list[float] = field(default_factory=list)
    features: list[tuple] = field(default_factory=list)  # the drafter's own: kept in its notes, not the Draft

    def add(self, token: int, q: torch.Tensor, feats: tuple, table: AcceptanceTable) -> float:
        """Add ``token`` drawn from ``q``; its estimate comes from ``table``."""
        estimate = table.estimate(feats)
        self.append(token, float(q[token]), estimate, feats, q)
        return estimate

    def append(self, token: int, prob: float, estimate: float, feats: tuple, q: torch.Tensor | None) -> None:
        """Add ``token`` with its probability under the draft and its acceptance estimate (``q`` is
        kept only when rejection sampling needs it)."""
        self.tokens.append(token)
        if self.want_q:
            self.qs.append(q)
        self.probs.append(prob)
        self.confidence.append(estimate)
        self.features.append(feats)

    def draft(self, forwards: int, parents: list[int] | None = None, extra: dict | None = None,
              verify_cost: Callable[[int], float] | None = None) -> Draft:
        q = torch.stack(self.qs) if self.qs else None
        return Draft(self.tokens, q, forwards, self.confidence, self.probs, parents=parents, extra=extra,
                     verify_cost=verify_cost)


def decile(prob) -> int:
    return min(int(float(prob) * 10), 9)
