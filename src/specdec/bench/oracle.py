"""The perfect drafter: the target's own greedy continuation, known in advance, at confidence 1.

Every token it drafts is kept, so a run with it measures the ceiling the cost curve leaves any
drafter on a workload (``scripts/oracle_ceiling.py`` times it beside real drafters;
``scripts/replay_transcripts.py`` replays it on recorded answers). Not registered: it needs the
answer before the generation."""

from __future__ import annotations

from collections.abc import Sequence

from specdec.drafters.base import Drafter
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
