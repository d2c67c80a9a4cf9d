"""Plain data passed across the seams: what a drafter proposes, what verification decides, and
one record per decoding step (vLLM's vocabulary: accepted, recovered ("correction"), bonus)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch


@dataclass
class Draft:
    """Tokens proposed after the current context.

    ``q`` is the drafter's sampling distribution at each proposed position (after the same
    temperature/top-k/top-p transform as the target). ``None`` means the drafter is deterministic:
    verification then treats q as one-hot on the proposed token, which is exact for prompt lookup.
    """

    tokens: list[int]
    q: torch.Tensor | None = None  # [len(tokens), V] float32, or None for one-hot
    forwards: int = 0  # drafter model forward passes spent on this draft
    # [len(tokens)]: the drafter's estimate that token i is accepted given tokens < i were; a
    # draft-length policy weighs these against the cost of verifying more tokens.
    confidence: list[float] | None = None
    # Drafter-private per-token data it wants back in Drafter.observe (e.g. features it learns from).
    features: list | None = None

    def __len__(self) -> int:
        return len(self.tokens)

    def truncated(self, n: int) -> Draft:
        """The first ``n`` proposed tokens (the forward count is what was already spent)."""
        if n >= len(self.tokens):
            return self
        return Draft(self.tokens[:n], None if self.q is None else self.q[:n], self.forwards,
                     None if self.confidence is None else self.confidence[:n],
                     None if self.features is None else self.features[:n])


@dataclass
class Verdict:
    """The outcome of verifying one draft: ``tokens`` = accepted drafts + one target token."""

    tokens: list[int]
    num_accepted: int
    bonus: bool  # True when every draft token was accepted and the last token is the bonus


StepKind = Literal["plain", "correction", "bonus"]


@dataclass
class StepTrace:
    """One target forward: what was drafted, how much of it survived, and the target's own token."""

    drafted: list[int]
    accepted: int  # drafted tokens kept (a stop may cut the emitted count further)
    emitted: list[int]  # tokens appended to the output in this step, after stops
    kind: StepKind  # what the target's own token was
    draft_s: float
    verify_s: float
    extra: dict = field(default_factory=dict)
