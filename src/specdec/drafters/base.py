"""The drafter interface (:class:`Drafter`, declared in :mod:`specdec.drafting.drafter` and
imported from here by the drafters) and the ``none`` drafter: plain decoding."""

from __future__ import annotations

from collections.abc import Sequence

from specdec.drafting.drafter import Drafter, StopDrafting
from specdec.registry import DraftRequest, drafter
from specdec.types import Draft

__all__ = ["Drafter", "NoDrafter", "StopDrafting"]


class NoDrafter(Drafter):
    """Plain autoregressive decoding: never proposes anything."""

    name = "none"
    drafts = False

    def propose(self, tokens: Sequence[int], k: int, stop: StopDrafting | None = None) -> Draft:
        return Draft([])


@drafter("none", "plain decoding, one target forward per token (the baseline)", order=0, drafts=False)
def _build_none(request: DraftRequest) -> Drafter:
    return NoDrafter()
