"""Draft-length policies: how many draft tokens to verify in each target forward.

On a CPU the price of verifying k tokens is far from flat (``specdec.costs``), so the adaptive
policy verifies the prefix of a draft that maximises expected tokens per second, and none at all
when no prefix beats a plain step.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from specdec.costs import CostModel
from specdec.errors import SpecdecError
from specdec.types import Draft


class DraftPolicy(ABC):
    """Chooses how much to draft and verify, and learns from what verification kept."""

    @abstractmethod
    def max_k(self) -> int:
        """Most tokens to ask the drafter for in the next step (0: take a plain step)."""

    def choose(self, draft: Draft) -> int:
        """How many of ``draft``'s tokens to verify (default: all of them)."""
        return len(draft)

    def stop_drafting(self, confidence: list[float]) -> bool:
        """Whether a drafter that pays per token should stop after these (default: never)."""
        return False

    def observe(self, drafted: int, accepted: int, seconds: float) -> None:
        """Feedback after each verification of ``drafted`` tokens (``seconds`` for the forward)."""


class FixedK(DraftPolicy):
    """Always ask for the same number of draft tokens (``--num-draft``) and verify all of them."""

    def __init__(self, k: int) -> None:
        if k < 1:
            raise SpecdecError(f"the number of draft tokens must be >= 1, got {k}")
        self.k = k

    def max_k(self) -> int:
        return self.k


class AdaptiveK(DraftPolicy):
    """Verify the draft prefix with the best expected tokens per second.

    With per-token acceptance estimates a_1..a_k (``Draft.confidence``, or the running acceptance
    rate when the drafter gives none), verifying i tokens yields 1 + sum_{j<=i} prod_{l<=j} a_l
    tokens on average for a forward of i + 1 tokens costing ``costs.forward(i + 1)``; i = 0 is a
    plain step. Choosing the best i per step is the myopic rule of dynamic speculation lookahead
    (Mamou et al. 2024), with the CPU's measured cost curve in place of a constant.
    """

    def __init__(self, costs: CostModel, k: int = 12, prior_acceptance: float = 0.5,
                 min_survival: float = 0.2) -> None:
        if k < 1:
            raise SpecdecError(f"the number of draft tokens must be >= 1, got {k}")
        self.costs = costs
        self.k = k
        self.acceptance = prior_acceptance  # running per-token rate, for confidence-less drafts
        self.min_survival = min_survival

    def max_k(self) -> int:
        return self.k

    def choose(self, draft: Draft) -> int:
        confidence = draft.confidence or [self.acceptance] * len(draft)
        best_i, best_rate = 0, 1.0 / self.costs.forward(1)
        expected = survive = 1.0
        for i, a in enumerate(confidence, start=1):
            survive *= a
            expected += survive
            rate = expected / self.costs.forward(i + 1)
            if rate > best_rate:
                best_i, best_rate = i, rate
        return best_i

    def stop_drafting(self, confidence: list[float]) -> bool:
        """Threshold drafting: stop once the whole draft is unlikely to survive verification."""
        survival = 1.0
        for a in confidence:
            survival *= a
        return survival < self.min_survival

    def observe(self, drafted: int, accepted: int, seconds: float) -> None:
        if drafted:
            # Judged tokens: the accepted ones plus the first rejected one, if any.
            judged = accepted + (accepted < drafted)
            self.acceptance += 0.1 * (accepted / judged - self.acceptance)
