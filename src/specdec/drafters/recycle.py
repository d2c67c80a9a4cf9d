"""Token recycling: drafts from the target's own earlier predictions, at no model cost.

Every target forward already computed the next-token distribution after each token it was fed,
including draft tokens it then rejected. Token Recycling (Luo et al., ACL 2025) keeps, for every
token, the target's top-``width`` next tokens from the latest such row (an adjacency table that
persists across generations of the same model) and drafts by walking it: after token t, try
next[t][0], next[t][1], ... It needs no index match, so it drafts where the n-gram index has
nothing to offer (open-ended text). Here it is one source among two: each draft position's
candidates are the n-gram index's continuations and the recycled next tokens, each scored by its
own calibrated acceptance estimate, and the best go into the chain, or into a tree grown best-first
(``--tree``). The draft is deterministic, so verification stays exact in every mode.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from specdec import tree as trees
from specdec.context import DraftContext, LearnedSlot
from specdec.drafting.acceptance import AcceptanceTable
from specdec.drafters.base import Drafter, StopDrafting
from specdec.drafting.grow import best_chain, best_first_tree
from specdec.drafting.notes import Notes
from specdec.drafters.ngram import NGRAM_ACCEPTANCE
from specdec.drafting.suffix_index import NgramMemory, SuffixIndex, ngram_bucket, ngram_prior
from specdec.registry import DraftRequest, drafter
from specdec.topk import topk_indices
from specdec.types import Draft, Verdict

WIDTH = 4  # recycled candidates kept per token (and children per tree node)
NGRAM, RECYCLED = "ngram", "recycled"


class RecycleDrafter(Drafter):
    """Draft from the n-gram index and from the target's recycled top next tokens, whichever is likelier."""

    name = "recycle"

    def __init__(self, table: dict[int, list[int]] | None = None, ngram_table: AcceptanceTable | None = None,
                 memory: NgramMemory | None = None, acceptance: AcceptanceTable | None = None,
                 width: int = WIDTH, tree: bool = False) -> None:
        self.next = table if table is not None else {}  # token -> the target's top next tokens after it
        # The index's candidates are estimated as the n-gram drafter's are (on the target, its very table).
        self.ngram_table = ngram_table or AcceptanceTable(ngram_prior, ngram_bucket)
        self.index = SuffixIndex(memory=memory, estimate=self.ngram_table.estimate)
        self.acceptance = acceptance or AcceptanceTable(recycled_prior, recycled_bucket)
        self.width = width
        self.tree = tree
        self.notes = Notes()  # each drafted node's (source, features), until its verdict

    def begin(self, prompt, sampler, target=None) -> None:
        super().begin(prompt, sampler, target)
        self.index.begin(prompt)
        self.notes.clear()

    def close(self) -> None:
        self.index.remember()

    def recycle(self, fed: Sequence[int], logits: torch.Tensor) -> None:
        """Keep the target's top next tokens after each token it was fed (``logits`` row i: after
        ``fed[i]``)."""
        top = topk_indices(logits, self.width).tolist()
        for token, row in zip(fed, top):
            self.next[token] = row

    def propose(self, tokens: Sequence[int], k: int, stop: StopDrafting | None = None) -> Draft:
        self.index.sync(tokens)

        def expand(path: list[int]) -> list[tuple[int, float, tuple]]:
            return self.expand(path, tokens[-1])

        return self.notes.keep(*(best_first_tree(expand, k, self.width) if self.tree else best_chain(expand, k)))

    def expand(self, path: list[int], last_context_token: int) -> list[tuple[int, float, tuple]]:
        """Candidates after context + ``path`` from both sources, best estimate first (one per token)."""
        best: dict[int, tuple[float, tuple]] = {}
        for token, feats in self.index.continuations(path, every_level=self.tree):
            best[token] = (self.ngram_table.estimate(feats), (NGRAM, feats))
        last = path[-1] if path else last_context_token
        depth = len(path)
        for rank, token in enumerate(self.next.get(last, ())):
            feats = (rank, depth)
            est = self.acceptance.estimate(feats)
            if token not in best or est > best[token][0]:
                best[token] = (est, (RECYCLED, feats))
        found = [(token, est, feats) for token, (est, feats) in best.items()]
        return sorted(found, key=lambda c: c[1], reverse=True)

    def verified(self, draft: Draft, verdict: Verdict, fed: Sequence[int] = (),
                 logits: torch.Tensor | None = None) -> None:
        """The target's rows are recycled; each judged node teaches the table of the source that
        proposed it."""
        if logits is not None:
            self.recycle(fed, logits)
        features = self.notes.take(draft)
        if not features:
            return
        if draft.is_tree:
            judged = trees.judged(draft.parents, verdict.path)
        else:
            judged = [(i, i < verdict.num_accepted) for i in range(min(len(draft), verdict.num_accepted + 1))]
        for node, accepted in judged:
            self.record(*features[node], accepted)

    def record(self, source: str, feats: tuple, accepted: bool) -> None:
        """One judged candidate of ``source`` (n-gram or recycled), for its acceptance table."""
        (self.ngram_table if source == NGRAM else self.acceptance).record(feats, accepted)


def recycled_bucket(feats: tuple[int, int]) -> tuple[int, int]:
    rank, depth = feats
    return min(rank, 3), min(depth, 3)


def recycled_prior(feats: tuple[int, int]) -> float:
    """Prior P(accept) of the rank-r recycled token: about what a model's top-r next token scores on
    chat text (the top token ~0.45, then quickly less), refined online per (rank, depth) bucket."""
    rank, _ = feats
    return 0.45 * math.exp(-1.1 * rank)


@drafter("recycle", "token recycling: the target's own top next tokens from earlier forwards (no model), "
                    "combined with the n-gram index; with --tree it branches on both", order=15)
def _build_recycle(request: DraftRequest) -> RecycleDrafter:
    return build_recycle(request.target, request.tree)


# The recycled table and both acceptance tables belong to the target model: they carry over from
# one generation to the next (TR's adjacency matrix is never reset either).
RECYCLED_NEXT: LearnedSlot[dict] = LearnedSlot("recycle-next", dict)
RECYCLED_ACCEPTANCE: LearnedSlot[AcceptanceTable] = LearnedSlot(
    "recycle-acceptance", lambda: AcceptanceTable(recycled_prior, recycled_bucket))


def build_recycle(target: DraftContext, tree: bool = False) -> RecycleDrafter:
    """A recycling drafter on ``target``'s learned tables."""
    return RecycleDrafter(table=target.text_state(RECYCLED_NEXT), ngram_table=target.state(NGRAM_ACCEPTANCE),
                          memory=target.memory, acceptance=target.state(RECYCLED_ACCEPTANCE), tree=tree)
