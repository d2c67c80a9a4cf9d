"""What a drafter noted about each node of the draft it proposed last (e.g. the features its
acceptance table learns from), read back once the engine's cut of that draft is verified.

Such notes are the drafter's own business, so they stay with the drafter rather than travel in
the :class:`~specdec.types.Draft` through the engine. The engine only ever cuts a draft
(:meth:`Draft.truncated`, :meth:`Draft.subset`: nodes kept in order, each after its parent), so
the verified draft's nodes are found among the proposed ones by token and parent.
"""

from __future__ import annotations

from specdec.tree import chain
from specdec.types import Draft


class Notes:
    """The last draft a drafter proposed and its per-node notes."""

    def __init__(self) -> None:
        self._draft: Draft | None = None
        self._notes: list = []

    def keep(self, draft: Draft, notes: list) -> Draft:
        """Remember ``notes`` (one per node of ``draft``, the draft about to be proposed); ``draft``."""
        self._draft, self._notes = draft, list(notes)
        return draft

    def get(self, verified: Draft) -> list | None:
        """The notes of each node of ``verified`` (the last kept draft as the engine cut it); []
        for an empty draft, None where ``verified`` is no cut of the kept draft."""
        if not len(verified):
            return []
        if self._draft is None:
            return None
        nodes = nodes_in(self._draft, verified)
        return None if nodes is None else [self._notes[i] for i in nodes]

    def take(self, verified: Draft) -> list | None:
        """:meth:`get`, then forget the kept draft (its verdict is in: notes are read once)."""
        found = self.get(verified)
        self._draft, self._notes = None, []
        return found

    def clear(self) -> None:
        self._draft, self._notes = None, []


def nodes_in(made: Draft, cut: Draft) -> list[int] | None:
    """The index in ``made`` of each node of ``cut``, an in-order subset of it closed under
    ancestors; None if it is none. Each node is matched to the first later node of ``made`` with its
    token under its parent's match: where ``made`` has equal siblings, the engine's cuts keep the
    first of them whenever they keep one (prefixes, whole subtrees, first children)."""
    made_parents = made.parents if made.parents is not None else chain(len(made))
    cut_parents = cut.parents if cut.parents is not None else chain(len(cut))
    found: list[int] = []
    j = 0
    for token, parent in zip(cut.tokens, cut_parents):
        under = found[parent] if parent >= 0 else -1
        while j < len(made.tokens) and (made.tokens[j] != token or made_parents[j] != under):
            j += 1
        if j == len(made.tokens):
            return None
        found.append(j)
        j += 1
    return found
