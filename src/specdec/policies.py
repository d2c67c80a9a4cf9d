"""Draft-length policies: how many tokens to ask the drafter for before each target forward."""

from __future__ import annotations

from abc import ABC, abstractmethod

from specdec.errors import SpecdecError


class DraftPolicy(ABC):
    """Chooses k for the next step and learns from what verification kept."""

    @abstractmethod
    def next_k(self) -> int:
        """Upper bound on the next draft's length (0: take a plain step)."""

    def observe(self, drafted: int, accepted: int) -> None:
        """Feedback after each verification."""


class FixedK(DraftPolicy):
    """Always ask for the same number of draft tokens (``--num-draft``)."""

    def __init__(self, k: int) -> None:
        if k < 1:
            raise SpecdecError(f"the number of draft tokens must be >= 1, got {k}")
        self.k = k

    def next_k(self) -> int:
        return self.k
