"""Self-speculation combined with the free sources: the n-gram index and the recycled table.

Each step first weighs the free sources' own draft (:class:`~specdec.drafters.recycle.RecycleDrafter`:
n-gram index + recycled next tokens; a tree with ``--tree``): taken whole when its best prefix
costs less per expected token on the target's cost curve than steps drafted through the layers
have cost per token (measured wall time). Otherwise the draft goes through the layers
(:class:`~specdec.drafters.self_spec.SelfDrafter`), and at each position where the free sources
agree with the small head or are likelier, their chain ends the draft if it pays. Free tokens were
not run ahead through the layers; verification runs them in one batched pass, which costs far less
per token than one pass each.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec import tree as trees
from specdec.backends.base import Backend
from specdec.drafting.acceptance import AcceptanceTable
from specdec.drafters.base import Drafter, StopDrafting
from specdec.drafting.grow import best_chain
from specdec.drafting.draft_tokens import DraftTokens
from specdec.drafters.recycle import RecycleDrafter, build_recycle
from specdec.drafting.self_head import DraftHead
from specdec.drafters.self_spec import HEAD_ROWS_OPTION, SELF, SelfDrafter, shared_state
from specdec.drafting.self_timing import Measured
from specdec.registry import DraftRequest, drafter
from specdec.types import Draft, Verdict


class CombinedDrafter(SelfDrafter):
    """A :class:`SelfDrafter` that lets ``free`` (the token-recycling drafter) draft where it pays
    more than the target's layers (see the module's docstring)."""

    name = "combined"

    def __init__(self, head: DraftHead, table: AcceptanceTable, measured: Measured, free: RecycleDrafter) -> None:
        super().__init__(head, table, measured)
        self.free = free

    def begin(self, prompt: Sequence[int], sampler, target: Backend | None = None) -> None:
        super().begin(prompt, sampler, target)
        self.free.begin(prompt, sampler, target)

    def reserve(self, tokens: int, cancelled=None) -> None:
        super().reserve(tokens, cancelled)
        self.free.reserve(tokens, cancelled)  # the same vocabulary: the same count

    def close(self) -> None:
        self.free.close()

    def _instead(self, tokens: Sequence[int], k: int, stop: StopDrafting | None, want_q: bool) -> Draft | None:
        """The free sources' draft (a tree with ``--tree``) as the whole draft, when its best
        prefix costs less per expected token (one batched forward: a row each) than drafting
        token by token through the layers does on average; None otherwise. The draft-length
        policy may still cut it.

        Decided before any layer pass: a free chain is verified in one forward with the last
        token, which a pass run ahead for it would split in two. (This also brings the n-gram
        index up to date for the per-position look-ups of :meth:`_hand_over`.)"""
        draft = self.free.propose(tokens, k, stop)
        if not draft.tokens:
            return None
        parents = draft.parents if draft.parents is not None else trees.chain(len(draft))
        expected, best = 1.0, float("inf")
        for n, reach in enumerate(trees.path_probabilities(parents, draft.confidence), start=1):
            expected += reach
            best = min(best, self.m.forward(n + 1) / expected)
        if best >= self.m.self_token.value:
            return None
        self.clock.not_through_layers()
        if want_q:
            draft.q = one_hot(draft.tokens, self.target.vocab_size)
        return draft

    def _hand_over(self, out: DraftTokens, tokens: Sequence[int], k: int, stop: StopDrafting | None,
                   want_q: bool, token: int, estimate: float) -> bool:
        """The free sources take over where they are likelier, or agree with the head, and their
        chain pays for its verified rows (then it goes on without a layer pass per token)."""
        free = self.free.expand(out.tokens, tokens[-1])
        return bool(free and (free[0][0] == token or free[0][1] > estimate)
                    and self._free_tail(out, tokens, k, stop, want_q))

    def _free_tail(self, out: DraftTokens, tokens: Sequence[int], k: int, stop: StopDrafting | None,
                   want_q: bool) -> bool:
        """End the draft with the free sources' chain (no layer passes until verification) if it
        pays: its expected accepted tokens would each have cost a layer pass, its tokens cost a
        batched row each and ending the step here costs one more full head. False: not taken."""
        tail, features = best_chain(lambda path: self.free.expand(out.tokens + path, tokens[-1]), k - len(out.tokens))
        expected = sum(trees.path_probabilities(trees.chain(len(tail)), tail.confidence))
        # The tail's rows and the full head: about a forward of its length.
        if expected * (self.m.body.value + self.m.small.value) <= self.m.forward(len(tail)):
            return False
        for tok, estimate, feats in zip(tail.tokens, tail.confidence, features):
            out.append(tok, 1.0, estimate, feats, one_hot(tok, self.target.vocab_size) if want_q else None)
            if stop is not None and stop(out.confidence):
                break
        return True

    def verified(self, draft: Draft, verdict: Verdict, fed: Sequence[int] = (),
                 logits: torch.Tensor | None = None) -> None:
        """The target's rows are recycled whoever drafted; the verdict goes to whoever did."""
        if logits is not None:
            self.free.recycle(fed, logits)
        if not self.clock.through_layers:  # the free sources' own draft (maybe a tree)
            self.clock.emitted = len(verdict.tokens)
            self.free.verified(draft, verdict)
            return
        super().verified(draft, verdict)

    def _record(self, source: str, feats: tuple, accepted: bool) -> None:
        if source == SELF:
            super()._record(source, feats, accepted)
        else:
            self.free.record(source, feats, accepted)


def one_hot(tokens, vocab_size: int) -> torch.Tensor:
    """Rejection sampling's q for deterministic draft tokens (free sources' tokens)."""
    return torch.nn.functional.one_hot(torch.tensor(tokens), vocab_size).float()


@drafter("combined", "per step, the n-gram index and recycled table (free, verified in one batched pass; "
                     "with --tree a tree) where they pay more than drafting through the target's own "
                     "layers (self), which takes over where they are weak (transformers backend)", order=36,
         options=[HEAD_ROWS_OPTION])
def _build_combined(request: DraftRequest) -> Drafter:
    return CombinedDrafter(*shared_state(request.target, request.options["head_rows"]),
                           free=build_recycle(request.target, request.tree))
