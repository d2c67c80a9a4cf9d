"""What the drafters that run a draft model share: a backend on the draft model with the
acceptance table learned for the pair, the draft model's cost curve, and the bridge to a target
with another vocabulary."""

from __future__ import annotations

from collections.abc import Callable

from specdec.backends.base import Backend
from specdec.context import LearnedSlot
from specdec.costs import CostModel
from specdec.drafting.acceptance import AcceptanceTable
from specdec.drafting.drafter import Drafter
from specdec.drafting.suffix_index import ngram_bucket, ngram_prior
from specdec.errors import SpecdecError
from specdec.registry import DraftRequest
from specdec.vocab import VocabBridge


def model_table() -> AcceptanceTable:
    """Acceptance by the decile of the drafter's own probability (and, in trees, by sibling rank)."""
    return AcceptanceTable(prior=lambda f: f[0] / 10 + 0.05, bucket=lambda f: f)


# Kept on the draft model, per target (its drafts' acceptance depends on both); the bridge on the
# target, per draft model (made with both codecs, so it has no default maker).
MODEL_ACCEPTANCE: LearnedSlot[AcceptanceTable] = LearnedSlot("model-acceptance", lambda: model_table())
LOOKUP_ACCEPTANCE: LearnedSlot[AcceptanceTable] = LearnedSlot("model-lookup-acceptance",
                                                              lambda: AcceptanceTable(ngram_prior, ngram_bucket))
VOCAB_BRIDGE: LearnedSlot = LearnedSlot("vocab-bridge", lambda: None)


def draft_backend(request: DraftRequest) -> tuple[Backend, AcceptanceTable, Callable[[Backend], None]]:
    """A backend on the draft model, the acceptance table learned for this pair, and how to give
    the backend back."""
    target, draft = request.target, request.draft
    if draft is None:
        raise SpecdecError("this drafter needs a draft model (--draft-model)")
    table = draft.state(MODEL_ACCEPTANCE.named(f"for-{target.name}"))
    return draft.pool.take(), table, draft.pool.give


def draft_costs(request: DraftRequest) -> Callable[[], CostModel]:
    """The draft model's forward-cost curve (measured on first use, once per machine)."""
    return request.draft.costs


def bridged(request: DraftRequest, inner: Drafter) -> Drafter:
    """``inner`` itself when draft and target share a vocabulary; otherwise wrapped to propose
    target tokens through a vocabulary bridge (:mod:`specdec.drafting.cross`)."""
    target, draft = request.target, request.draft
    if target.codec.same_vocabulary(draft.codec):
        return inner
    from specdec.drafting.cross import CrossVocabDrafter

    try:
        bridge = target.state(VOCAB_BRIDGE.named(draft.name), lambda: VocabBridge(
            target.codec, draft.codec, target.logit_width(), draft.logit_width()))
        return CrossVocabDrafter(inner, bridge, target.eos, draft.eos)
    except BaseException:
        inner.close()
        raise
