"""N-gram drafting from an index of the whole context (prompt lookup, grown up).

Each draft token is copied from the context's earlier occurrences of its longest matching suffix
(and from earlier outputs, with a memory), as :class:`~specdec.drafting.suffix_index.SuffixIndex`
finds them. Each token also gets an estimated acceptance probability from what predicts it best:
how long the match is and how unanimous the earlier continuations were, calibrated online by
:class:`AcceptanceTable`. No model is involved, so the draft is deterministic (one-hot q).

With ``tree=True`` the draft branches where earlier continuations disagree: each node's children
are the distinct continuations of its longest matching suffix, and the tree grows best-first by
estimated path probability (SuffixDecoding's speculation tree), so any prefix of its nodes is the
best tree of that size and the policy can keep the size that pays.
"""

from __future__ import annotations

from collections.abc import Sequence

from specdec.context import LearnedSlot
from specdec.drafting.acceptance import AcceptanceTable, Hindsight
from specdec.drafters.base import Drafter, StopDrafting
from specdec.drafting.grow import best_first_tree
from specdec.drafting.notes import Notes
from specdec.drafting.suffix_index import NgramFeatures, NgramMemory, SuffixIndex, ngram_bucket, ngram_prior
from specdec.registry import DraftRequest, drafter
from specdec.types import Draft, Verdict

WIDTH = 3  # most children a tree node gets (the most frequent continuations)


class NgramDrafter(Drafter):
    """Draft from the longest suffix (``min_ngram``..``max_ngram`` tokens) seen earlier in the context."""

    name = "ngram"

    def __init__(self, max_ngram: int = 4, min_ngram: int = 1, table: AcceptanceTable | None = None,
                 tree: bool = False, memory: NgramMemory | None = None) -> None:
        self.tree = tree
        self.table = table or AcceptanceTable(ngram_prior, ngram_bucket)
        # earlier generations' continuations (``memory``) are used where they beat this context's
        self.index = SuffixIndex(max_ngram, min_ngram, memory, estimate=self.table.estimate)
        # Declined chains are judged on the tokens that followed them (the table learns what it
        # would never have verified); the last chain proposed, until the policy's verdict on it.
        self.hindsight = Hindsight(self.table)
        self._proposal: tuple[int, list[int], list[NgramFeatures]] | None = None
        self.notes = Notes()  # each drafted token's features, until its verdict teaches the table

    def begin(self, prompt, sampler, target=None) -> None:
        super().begin(prompt, sampler, target)
        self.index.begin(prompt)
        self.hindsight.clear()
        self._proposal = None
        self.notes.clear()

    def close(self) -> None:
        self.hindsight.judge(self.index.seq, final=True)
        self.hindsight.clear()
        self.index.remember()

    def sync(self, tokens: Sequence[int]) -> None:
        """Index the tokens added since the last call and judge the declined chains they decide."""
        if self.index.sync(tokens):
            self.hindsight.clear()  # they were drafted after a context that is gone
        self.hindsight.judge(self.index.seq)

    def propose(self, tokens: Sequence[int], k: int, stop: StopDrafting | None = None) -> Draft:
        self.sync(tokens)
        self._proposal = None
        if self.tree:
            return self._propose_tree(k)
        draft: list[int] = []
        features: list[NgramFeatures] = []
        confidence: list[float] = []
        # The occurrences with the context's longest match are followed token by token (a suffix
        # tree's deepest node); where they all end, the most frequent continuation goes on.
        group, start, remembered = self.index.longest_matches()
        # Token by token, so that drafting stops where the policy says the chain no longer pays
        # (most steps on a CPU); a walk of the index is a few dictionary lookups a token.
        while len(draft) < k:
            followed = self.index.follow(group, start, remembered, draft) if group else None
            if followed is not None:
                token, feats, group = followed
            else:
                group = []
                found = self.index.continuations(draft)
                if not found:
                    break
                token, feats = found[0]
            draft.append(token)
            features.append(feats)
            confidence.append(self.table.estimate(feats))
            if stop is not None and stop(confidence):
                break
        self._proposal = (len(self.index.seq), draft, features)
        return self.notes.keep(Draft(draft, confidence=confidence), features)

    def _propose_tree(self, k: int) -> Draft:
        """Grow a tree best-first by path probability over the distinct continuations of each node."""
        return self.notes.keep(*best_first_tree(self.expand, k, WIDTH))

    def expand(self, path: list[int]) -> list[tuple[int, float, NgramFeatures]]:
        """Candidates to follow context + ``path``: every level's continuations, best estimate first."""
        found = [(token, self.table.estimate(feats), feats)
                 for token, feats in self.index.continuations(path, every_level=True)]
        return sorted(found, key=lambda c: c[1], reverse=True)

    def verified(self, draft: Draft, verdict: Verdict, fed=(), logits=None) -> None:
        """The verified tokens teach the table; a chain the policy declined waits for hindsight."""
        features = self.notes.take(draft)
        if features:
            self.table.learn(draft, features, verdict)
        elif not len(draft) and self._proposal is not None:
            self.hindsight.declined(*self._proposal)
        self._proposal = None


@drafter("ngram", "prompt lookup from an index of every n-gram of the prompt and output (no model); "
                  "with --tree it branches where earlier continuations disagree", order=10)
def _build_ngram(request: DraftRequest) -> NgramDrafter:
    return NgramDrafter(table=request.target.state(NGRAM_ACCEPTANCE), tree=request.tree, memory=request.target.memory)


# The target model's n-gram acceptance table: what it learns carries over to later generations.
NGRAM_ACCEPTANCE: LearnedSlot[AcceptanceTable] = LearnedSlot(
    "ngram-acceptance", lambda: AcceptanceTable(ngram_prior, ngram_bucket))
