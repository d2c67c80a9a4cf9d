"""What the decoding loop asks of a drafter: propose up to k tokens after the current context.

A drafter may keep state (a KV cache, an index of the text so far); ``begin`` starts a new
sequence and ``propose`` always receives the whole context, so a drafter can resynchronise itself
after any rollback without being told what was accepted.

The interface sits here, below the drafters, because what drafters share (a wrapper across
vocabularies, a draft model's bridge) speaks of drafters too; the drafters themselves import it
from :mod:`specdec.drafters.base`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

import torch

from specdec.backends.base import Backend
from specdec.sampling import Sampler, SamplingParams
from specdec.types import Draft, Verdict

# Called with the confidences of the tokens drafted so far; True ends the draft there.
StopDrafting = Callable[[list[float]], bool]


class Drafter(ABC):
    """Proposes draft tokens; see :class:`specdec.types.Draft` for the contract on ``q``."""

    name: str = "drafter"
    sampler: Sampler | None = None

    @property
    def params(self) -> SamplingParams:
        return self.sampler.params if self.sampler is not None else SamplingParams()

    def attach(self, target: Backend) -> None:
        """The target's backend for the coming generation (called before :meth:`begin`). Drafters
        that share the target's weights and cache (self-speculation) keep it; others ignore it."""

    def begin(self, prompt: Sequence[int], sampler: Sampler) -> None:
        """Start a new sequence; model drafters draw their tokens with ``sampler``."""
        self.sampler = sampler

    @abstractmethod
    def propose(self, tokens: Sequence[int], k: int, stop: StopDrafting | None = None) -> Draft:
        """Up to ``k`` tokens to follow ``tokens`` (the prompt plus everything generated so far).

        Drafters for which each token costs something (a model forward) consult ``stop`` after
        each token; free drafters may ignore it.
        """

    def token_cost(self, tokens: Sequence[int] = ()) -> float:
        """Expected seconds to draft one more token after ``tokens`` (the context of the coming
        draft): a draft model's forward, 0 for drafters whose tokens cost next to nothing (an index
        lookup). The adaptive policy weighs it against what the tokens would save, and drafts
        nothing where no draft length pays."""
        return 0.0

    def observe(self, draft: Draft, verdict: Verdict) -> None:
        """Feedback after verification: ``verdict.path`` holds the draft nodes that were kept."""

    def see(self, fed: Sequence[int], logits: torch.Tensor) -> None:
        """The target's logits from the forward just done: row i is its next-token distribution
        after ``fed[i]`` (the last context token, then the draft's nodes). Free information for
        drafters that learn from it (token recycling); ignored by default."""

    def close(self) -> None:
        """The generation is over: give back what was borrowed (e.g. a draft model's KV cache)."""
