"""The policy interface: how much to draft and verify, and what to learn from each verification."""

from __future__ import annotations

from abc import ABC, abstractmethod

from specdec.backends.base import Backend
from specdec.policies.goodput import Offer
from specdec.types import Draft


class DraftPolicy(ABC):
    """Chooses how much to draft and verify, and learns from what verification kept."""

    def begin(self, target: Backend) -> None:
        """A generation starts on ``target`` (policies that price forwards ask it what they cost)."""

    @abstractmethod
    def max_k(self, price: float = 0.0) -> int:
        """Most tokens to ask the drafter for in the next step (0: take a plain step). ``price`` is
        what the drafter says one more token costs it here, in seconds
        (:meth:`specdec.drafting.drafter.Drafter.token_cost`, asked by the engine): 0 for free
        tokens."""

    def choose(self, draft: Draft) -> int:
        """How many of ``draft``'s tokens to verify (default: all of them)."""
        return len(draft)

    def offer(self, draft: Draft) -> Offer | None:
        """What verifying each prefix of ``draft`` is worth (:class:`~specdec.policies.goodput.Offer`),
        for a target whose batch chooses every sequence's draft length together
        (:attr:`specdec.backends.base.Backend.chooses_lengths`); None (the default): this policy's
        :meth:`choose` decides alone, and the batch verifies what it kept."""
        return None

    def taken(self, draft: Draft, n: int) -> None:
        """The batch verifies the first ``n`` nodes of ``draft``, which :meth:`offer` valued (in
        place of :meth:`choose`)."""

    def stop_drafting(self, confidence: list[float]) -> bool:
        """Whether a drafter that pays per token should stop after these (default: never)."""
        return False

    def observe(self, drafted: int, accepted: int, seconds: float) -> None:
        """Feedback after each verification of ``drafted`` tokens (``seconds`` for the forward of
        ``drafted + 1`` tokens; the target's cost model knows how the context's length weighs)."""
