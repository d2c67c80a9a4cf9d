"""The perfect drafter: the target's own greedy continuation, known in advance, at confidence 1.

Every token it drafts is kept, so a run with it measures the ceiling the cost curve leaves any
drafter on a workload (``scripts/ceilings.py oracle`` times it beside real drafters;
``scripts/ceilings.py replay`` replays it on recorded answers). Not registered: it needs the
answer before the generation."""

from __future__ import annotations

from collections.abc import Sequence

from specdec.drafters.base import Drafter
from specdec.drafting.acceptance import kept_prefix
from specdec.types import Draft


class OracleDrafter(Drafter):
    """Drafts the known plain continuation (``reference``: prompt + plain output), confidence 1."""

    name = "oracle"

    def __init__(self, reference: Sequence[int]) -> None:
        self.reference = list(reference)

    def propose(self, tokens, k, stop=None) -> Draft:
        if list(tokens) != self.reference[:len(tokens)]:
            raise RuntimeError("the context left plain decoding's: the oracle has nothing to draft from")
        nxt = self.reference[len(tokens):len(tokens) + k]
        return Draft(nxt, confidence=[1.0] * len(nxt))


class HindsightCut(Drafter):
    """Another drafter's own candidates, each cut in hindsight at the prefix the target keeps.

    It drafts what ``inner`` would (its chain up to ``k`` tokens, no stop) but only the tokens that
    plain decoding's continuation (``reference``) confirms, at confidence 1: a perfect length
    choice on that drafter's candidates. Its gap to the drafter under a real policy is what any
    policy could still win on them; its gap to :class:`OracleDrafter` is what better candidates
    could. The inner drafter learns nothing from these steps (its estimates are not used)."""

    name = "cut"

    def __init__(self, inner: Drafter, reference: Sequence[int]) -> None:
        self.inner = inner
        self.reference = list(reference)

    def begin(self, prompt, sampler, target=None) -> None:
        self.inner.begin(prompt, sampler, target)

    def reserve(self, tokens, cancelled=None) -> None:
        self.inner.reserve(tokens, cancelled)

    def propose(self, tokens, k, stop=None) -> Draft:
        candidate = self.inner.propose(tokens, k).tokens
        kept = kept_prefix(candidate, self.reference[len(tokens):len(tokens) + len(candidate)])
        return Draft(candidate[:kept], confidence=[1.0] * kept)

    def close(self) -> None:
        self.inner.close()
