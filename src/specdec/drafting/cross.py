"""Any drafter for a target with another vocabulary, through a :class:`~specdec.vocab.VocabBridge`.

Two ways across, both lossless because the target still verifies every token:

- **through text** (greedy, and seeded sampling with ``verify="coupled"``): the drafter continues
  the draft-tokenized text so far; its draft is decoded to text and re-tokenized with the target's
  tokenizer at the seam (Universal Assisted Generation). The target tokens are deterministic
  proposals, accepted exactly when they equal the target's own choice;
- **the intersection** (``verify="rejection"``): a model drafter samples only tokens whose text
  exists in both vocabularies (its q renormalised there), each maps to one target token, and q
  becomes a distribution over the target's vocabulary for rejection sampling.
"""

from __future__ import annotations

import math
import threading

from collections.abc import Sequence

from specdec.backends.base import Backend
from specdec.drafting.drafter import Drafter, StopDrafting
from specdec.sampling import Sampler
from specdec.types import Draft, Verdict
from specdec.vocab import VocabBridge, has_broken_character

ENDS_A_WORD = (" ", "\n", "\t", ".", ",", ";", ":", "!", "?", ")", "]", "}", '"', "'")


class CrossVocabDrafter(Drafter):
    """Wraps ``inner`` (which drafts in the draft model's vocabulary) to propose target tokens."""

    def __init__(self, inner: Drafter, bridge: VocabBridge, target_eos: frozenset[int],
                 draft_eos: frozenset[int]) -> None:
        self.inner = inner
        self.bridge = bridge
        self.name = inner.name
        self.target_eos = sorted(target_eos)
        self.draft_eos = draft_eos
        self._last: tuple[Draft, list[int], list[int]] | None = None  # inner draft, its text ends, ours
        self._density = 1.0  # draft tokens per target token on this generation's prompt, at least 1

    @property
    def intersection(self) -> bool:
        return self.sampler is not None and not self.sampler.greedy and not self.sampler.coupled

    def begin(self, prompt: Sequence[int], sampler: Sampler, target: Backend | None = None) -> None:
        super().begin(prompt, sampler, target)
        if hasattr(self.inner, "allowed"):
            self.inner.allowed = self.bridge.draft_mask if self.intersection else None
        # The inner drafter works in the draft model's vocabulary: the target is none of its.
        context = self.bridge.draft_context(prompt)
        self._density = max(1.0, len(context) / max(1, len(prompt)))
        self.inner.begin(context, sampler)

    def reserve(self, tokens: int, cancelled: threading.Event | None = None) -> None:
        # ``tokens`` counts target tokens; the inner drafter's vocabulary may spell the same text in
        # more (or fewer) tokens. No count is a hard bound short of one token per byte, which would
        # hold a draft model's whole context for every request, so the prompt's own density scales
        # it, never below ``tokens``: the prompt's draft tokens are covered exactly, and the answer
        # is assumed as dense as the prompt. Too few is not fatal: a draft backend's cache takes
        # more as it grows (waiting as reserve does), and a draft model clamps to its own context.
        self.inner.reserve(math.ceil(tokens * self._density), cancelled)

    def propose(self, tokens: Sequence[int], k: int, stop: StopDrafting | None = None) -> Draft:
        context = self.bridge.draft_context(tokens)
        inner = self.inner.propose(context, k, stop)
        self._last = None
        if not inner.tokens:
            return Draft([], forwards=inner.forwards)
        if self.intersection:
            return self._through_intersection(inner)
        return self._through_text(tokens, context, inner, k)

    def _through_intersection(self, inner: Draft) -> Draft:
        targets = self.bridge.target_of[inner.tokens].tolist()
        n = targets.index(-1) if -1 in targets else len(targets)  # cannot happen with a masked drafter
        q = self.bridge.to_target(inner.q[:n]) if inner.q is not None else None
        self._last = (inner, list(range(1, n + 1)), list(range(1, n + 1)))
        return Draft(targets[:n], q, inner.forwards, _cut(inner.confidence, n), _cut(inner.probs, n),
                     extra={"draft_tokens": inner.tokens[:n]})

    def _through_text(self, tokens: Sequence[int], context: list[int], inner: Draft, k: int) -> Draft:
        drafted = list(inner.tokens)
        eos = next((i for i, t in enumerate(drafted) if t in self.draft_eos), None)
        if eos is not None:
            drafted = drafted[:eos]
        ends = self.bridge.text_ends(self.bridge.draft, context, drafted) if drafted else []
        base = self.bridge.text(self.bridge.draft, context[-4:])
        text = self.bridge.text(self.bridge.draft, context[-4:] + drafted)[len(base):]
        text = text[:has_broken_character(text)]  # a character the draft has not finished
        new = self.bridge.continuation(tokens, text) if text else []
        if new is None:
            return Draft([], forwards=inner.forwards)
        if eos is not None and len(text) == (ends[-1] if ends else 0):
            new = new + self.target_eos[:1]
        elif new and not text.endswith(ENDS_A_WORD):
            new = new[:-1]  # its text may still grow with the next draft token: not fixed yet
        new = new[:k]
        if not new:
            return Draft([], forwards=inner.forwards)
        target_ends = self.bridge.text_ends(self.bridge.target, list(tokens), new)
        confidence = self._confidence(inner, ends, target_ends)
        self._last = (inner, ends, target_ends)
        return Draft(new, None, inner.forwards, confidence, extra={"draft_tokens": inner.tokens})

    @staticmethod
    def _confidence(inner: Draft, draft_ends: list[int], target_ends: list[int]) -> list[float] | None:
        """A target token survives when every draft token its text touches does: the chance of
        reaching its end over the chance of reaching the previous one's."""
        if not inner.confidence:
            return None

        def survival(end: int) -> float:
            p = 1.0
            for j, c in enumerate(inner.confidence[:len(draft_ends)]):
                if (draft_ends[j - 1] if j else 0) < end:
                    p *= c
            return p

        reach = [1.0] + [survival(e) for e in target_ends]
        return [min(1.0, b / a) if a > 0 else 0.0 for a, b in zip(reach, reach[1:])]

    def token_cost(self, tokens: Sequence[int] = ()) -> float:
        return self.inner.token_cost(self.bridge.draft_context(tokens) if tokens else ())

    def verified(self, draft: Draft, verdict: Verdict, fed: Sequence[int] = (), logits=None) -> None:
        """The inner drafter learns which of its tokens the target's kept text covered (the
        target's rows are in the other vocabulary: it gets none)."""
        if self._last is None:
            return
        inner, draft_ends, target_ends = self._last
        kept = target_ends[verdict.num_accepted - 1] if verdict.num_accepted else 0
        accepted = sum(end <= kept for end in draft_ends)
        self.inner.verified(inner, Verdict([], accepted, bonus=False))

    def close(self) -> None:
        self.inner.close()


def _cut(xs, n):
    return None if xs is None else xs[:n]
