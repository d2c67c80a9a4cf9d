"""What the decoding loop asks of a drafter: exactly the hooks :class:`specdec.engine.DecodeRun`
calls, each named for its moment in a generation: :meth:`Drafter.begin`, then per step
:meth:`Drafter.token_cost` and :meth:`Drafter.propose` before the target's forward and
:meth:`Drafter.verified` after it, and :meth:`Drafter.close` at the end.

A drafter may keep state (a KV cache, an index of the text so far); ``begin`` starts a new
sequence and ``propose`` always receives the whole context, so a drafter can resynchronise itself
after any rollback without being told what was accepted. What a drafter wants to remember about
its own draft until the verdict (e.g. the features its acceptance table learns from) it keeps
itself, in :class:`~specdec.drafting.notes.Notes`: a :class:`~specdec.types.Draft` holds only what
the engine, verification, the policy and the trace read.

The interface sits here, below the drafters, because what drafters share (a wrapper across
vocabularies, a draft model's bridge) speaks of drafters too; the drafters themselves import it
from :mod:`specdec.drafters.base`.
"""

from __future__ import annotations

import threading

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
    # False for a drafter that never proposes (plain decoding): a generation with it needs no
    # draft-length policy, and a bench offers it as ``plain``, not as a drafter.
    drafts: bool = True
    sampler: Sampler | None = None

    @property
    def params(self) -> SamplingParams:
        return self.sampler.params if self.sampler is not None else SamplingParams()

    def begin(self, prompt: Sequence[int], sampler: Sampler, target: Backend | None = None) -> None:
        """A generation starts after ``prompt`` on ``target`` (the target's backend, the prompt's
        cache filled). Model drafters draw their tokens with ``sampler``; drafters that share the
        target's weights and cache (self-speculation) keep ``target``, the others ignore it. None
        where there is no target in this vocabulary (a drafter wrapped across vocabularies, tests)."""
        self.sampler = sampler

    def reserve(self, tokens: int, cancelled: threading.Event | None = None) -> None:
        """After :meth:`begin`: the generation will hold up to ``tokens`` tokens. A drafter with a
        model's cache of fixed size (a GPU batch's pages) takes it now, as the target does, waiting
        for memory until ``cancelled`` is set; the others ignore it."""

    @abstractmethod
    def propose(self, tokens: Sequence[int], k: int, stop: StopDrafting | None = None) -> Draft:
        """Up to ``k`` tokens to follow ``tokens`` (the prompt plus everything generated so far).

        Drafters for which each token costs something (a model forward) consult ``stop`` after
        each token; free drafters may ignore it.
        """

    def token_cost(self, tokens: Sequence[int] = ()) -> float:
        """Expected seconds to draft one more token after ``tokens`` (the context of the coming
        draft): a draft model's forward, 0 for drafters whose tokens cost next to nothing (an index
        lookup). Asked by the engine before each draft and handed to the policy
        (:meth:`specdec.policies.base.DraftPolicy.max_k`), which weighs it against what the tokens
        would save and drafts nothing where no draft length pays."""
        return 0.0

    def verified(self, draft: Draft, verdict: Verdict, fed: Sequence[int] = (),
                 logits: torch.Tensor | None = None) -> None:
        """After each verification, what the drafter may learn from: ``draft`` is what the target
        verified (this drafter's last proposal as the engine and the policy cut it; empty after a
        plain step) and ``verdict`` what it kept (``verdict.path``: the kept nodes). ``logits`` row
        i is the target's next-token distribution after ``fed[i]`` (the last context token, then
        the draft's nodes): free information for drafters that learn from it (token recycling).
        Wrappers that have no such rows in the drafter's vocabulary pass none. Ignored by default."""

    def close(self) -> None:
        """The generation is over: give back what was borrowed (e.g. a draft model's KV cache)."""
