"""The one seam between the decoding algorithm and a model: extend a KV cache, read logits, roll back.

Everything the algorithm asks of a model goes through :class:`Backend`; a new model runtime is one
new file implementing these four members, registered with :func:`specdec.registry.backend`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import torch


class Backend(ABC):
    """A model plus one sequence's KV cache.

    ``extend`` appends tokens after the cached ones and returns float32 logits for the new positions;
    ``truncate`` drops cached positions so that the next ``extend`` continues from a shorter prefix.
    Implementations are single-sequence and not thread-safe: make one per concurrent generation.
    """

    vocab_size: int
    max_length: int | None = None  # the model's context in tokens (None: unbounded)

    @property
    @abstractmethod
    def length(self) -> int:
        """Number of tokens currently in the cache."""

    @abstractmethod
    def extend(self, tokens: Sequence[int], *, last_only: bool = False) -> torch.Tensor:
        """Append ``tokens`` and return logits ``[len(tokens), V]`` (``[1, V]`` with ``last_only``).

        Row i is the next-token distribution after ``tokens[i]``. ``last_only`` lets a drafter or a
        prefill skip the LM head on positions nobody reads (for a 262k vocabulary that head is most
        of the forward's cost).
        """

    @abstractmethod
    def truncate(self, length: int) -> None:
        """Roll back: keep only the first ``length`` cached tokens (``length <= self.length``)."""

    def reset(self) -> None:
        """Forget the whole sequence."""
        self.truncate(0)

    def prefill(self, tokens: Sequence[int]) -> None:
        """Fill the cache with ``tokens`` without needing their logits."""
        if tokens:
            self.extend(tokens, last_only=True)


def check_extend(tokens: Sequence[int]) -> None:
    """Shared argument check for ``Backend.extend`` implementations."""
    if not tokens:
        raise ValueError("extend needs at least one token")


def check_truncate(length: int, current: int) -> None:
    """Shared argument check for ``Backend.truncate`` implementations."""
    if not 0 <= length <= current:
        raise ValueError(f"cannot truncate a cache of {current} tokens to {length}")
