"""Self-speculation: the target drafts for itself through a small LM head over its own layers.

A forward of a model with a large vocabulary, such as Gemma-3-270M, is two halves of similar cost:
its layers and its 262k-row LM head. Plain decoding pays both for every token. This drafter runs the target's own layers
on the token it is about to propose from (:meth:`specdec.context.LayerAccess.body`, into the
target's own KV cache) and reads the hidden state through a head of the target's most frequent
tokens only (:mod:`specdec.drafting.self_head`; 16k rows cost a sixteenth of the full head). Those
layer passes are exactly the ones plain decoding would make for the accepted tokens, so
verification of the whole draft is just the full head over the pending hidden states in one
batched matmul: the saving is the full head for every accepted token but one. Output is
unchanged: the target still judges every token over its whole vocabulary.

Where the target's next token lies in the small head, the draft's greedy choice over it *is* the
target's (same hidden state, same rows), so acceptance is the head's coverage of the text.

Each extra draft token costs one more pass through the layers that is wasted if it is rejected,
so the draft ends where its estimated survival no longer pays for that risk on the measured
costs (:mod:`specdec.drafting.self_timing`, :meth:`SelfDrafter._worth`).

Backends that cannot run the layers without the head (llama.cpp computes the full output head for
every row it returns and exposes no hidden states) are not :class:`~specdec.context.LayerAccess`
and cannot self-speculate; the drafter says so.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch

from specdec.backends.base import Backend
from specdec.context import DraftContext, LayerAccess, LearnedSlot
from specdec.drafting.acceptance import AcceptanceTable
from specdec.drafters.base import Drafter, StopDrafting
from specdec.drafting.draft_tokens import DraftTokens, decile
from specdec.drafting.notes import Notes
from specdec.drafting.self_head import HEAD_ROWS, DraftHead, head_for
from specdec.drafting.self_timing import Measured, StepClock, head_seconds
from specdec.errors import SpecdecError
from specdec.options import Option, at_least
from specdec.registry import DraftRequest, drafter
from specdec.types import Draft, Verdict

SELF = "self"  # the source of self-drafted tokens (in the drafter's notes)
GREEDY = -1  # the feature of every greedy self-draft token

# The self drafter's own option (the combined drafter declares the same one).
HEAD_ROWS_OPTION = Option(
    "head_rows", int, HEAD_ROWS,
    "rows of the small LM head the self and combined drafters draft through: the target's likeliest tokens "
    "(more rows: more coverage, a slower head)",
    at_least(256), metavar="N")


def self_table() -> AcceptanceTable:
    """Acceptance of self-drafted tokens by the decile of the small head's probability for its
    token. Greedy: the head's argmax *is* the target's whenever the target's token lies in the
    head, whatever its probability, so every decile starts at 0.9 (the head's coverage) and learns
    where coverage is worse (a flat small-head distribution often means the target's token lies
    outside it). Sampling: from the decile itself, as for a draft model."""
    return AcceptanceTable(prior=lambda f: 0.9 if f[0] == GREEDY else f[0] / 10 + 0.05, bucket=lambda f: f)


class SelfDrafter(Drafter):
    """Drafts with the target's own layers and a small LM head (see the module's docstring).

    Subclasses may let other sources draft (:class:`specdec.drafters.combined.CombinedDrafter`)
    through two hooks: :meth:`_instead` (a whole draft before any layer pass) and
    :meth:`_hand_over` (the rest of the draft at a position), and route the feedback on their
    tokens through :meth:`_record`.
    """

    name = SELF

    def __init__(self, head: DraftHead, table: AcceptanceTable, measured: Measured) -> None:
        self.head = head
        self.table = table
        self.m = measured
        self.target: Backend | None = None
        self._seen = 0
        self.clock = StepClock(measured.self_token)
        self.notes = Notes()  # each drafted token's (source, features), until its verdict

    def begin(self, prompt: Sequence[int], sampler, target: Backend | None = None) -> None:
        """Drafting runs the target's own layers: ``target`` must give layer access."""
        if target is not None and not isinstance(target, LayerAccess):
            raise SpecdecError(no_body_message(type(target).__name__))
        super().begin(prompt, sampler, target)
        self.target = target
        self.notes.clear()
        self.head.add(prompt)
        self._seen = len(prompt)

    def propose(self, tokens: Sequence[int], k: int, stop: StopDrafting | None = None) -> Draft:
        if self.target is None:
            raise SpecdecError("the self drafter drafts with the target's own layers: begin with the target")
        self.clock.next_step()
        self.head.add(tokens[self._seen:])  # what the context holds is likely to come again
        self._seen = len(tokens)
        want_q = not self.sampler.greedy and not self.sampler.coupled
        instead = self._instead(tokens, k, stop, want_q)
        if instead is not None:
            return instead
        out = DraftTokens(want_q)
        hidden = self._body(tokens[-1])
        forwards, survival = 1, 1.0
        for i in range(k):
            t0 = time.perf_counter()
            tok, prob, q = self._draw(hidden, len(tokens) + i, want_q)
            self.m.small.add(time.perf_counter() - t0)
            feats = (GREEDY, decile(prob)) if self.sampler.greedy else (decile(prob),)
            estimate = self.table.estimate(feats)
            if self._hand_over(out, tokens, k, stop, want_q, tok, estimate):
                break
            if not self._worth(survival * estimate):
                break
            survival *= estimate
            out.append(tok, prob, estimate, (SELF, feats), q)
            if i + 1 == k or (stop is not None and stop(out.confidence)):
                break
            hidden = self._body(tok)
            forwards += 1
        return self.notes.keep(out.draft(forwards, verify_cost=self._verify_cost()), out.features)

    def _instead(self, tokens: Sequence[int], k: int, stop: StopDrafting | None, want_q: bool) -> Draft | None:
        """Another source's whole draft for this step, decided before any layer pass; None: draft
        through the layers."""
        return None

    def _hand_over(self, out: DraftTokens, tokens: Sequence[int], k: int, stop: StopDrafting | None,
                   want_q: bool, token: int, estimate: float) -> bool:
        """Whether another source ended the draft ``out`` here (its tokens appended), instead of
        ``token`` (the small head's choice, accepted with probability ``estimate``)."""
        return False

    def _verify_cost(self) -> Callable[[int], float]:
        """The draft's verification cost in plain steps, for the draft-length policy. The draft's
        layer passes already ran, into the target's cache; verifying any prefix of it is the full
        LM head over the pending rows in one batched matmul, about one row's cost whatever its
        length. So the price is the same for every prefix (the policy then verifies the whole
        draft, which the drafter already sized by its own measured costs), and the engine keeps
        that forward off the target's cost curve."""
        share = max(self.m.head / self.m.forward(1), 1e-9)  # positive: the policy divides by it
        return lambda n: share

    def _body(self, token: int) -> torch.Tensor:
        t0 = time.perf_counter()
        hidden = self.target.body([token])[-1]
        self.m.body.add(time.perf_counter() - t0)
        return hidden

    def _draw(self, hidden: torch.Tensor, position: int, want_q: bool) -> tuple[int, float, torch.Tensor | None]:
        """The drafted token, its probability under the draft, and the full distribution when
        rejection sampling needs it."""
        ids, logits = self.head.logits(hidden)
        if self.sampler.greedy:
            best = int(logits.argmax())
            return int(ids[best]), float(torch.softmax(logits, -1)[best]), None
        # Sampling: the small head's logits in a full-vocabulary row (-inf elsewhere), through the
        # same temperature / top-k / top-p as the target; coupled mode draws with its noise.
        full = torch.full((self.target.vocab_size,), float("-inf"))
        full[ids] = logits
        q = self.sampler.probs(full)
        tok = self.sampler.draft_token(q, position)
        return tok, float(q[tok]), q if want_q else None

    def _worth(self, survival: float) -> bool:
        """Whether a draft token reached with probability ``survival`` pays for its layer pass.

        Per emitted token a step costs (emitted x layer pass + overhead) / emitted, with overhead
        = full head + rejected drafts' layer passes + small heads. One more draft token adds
        ``survival`` expected tokens and ``small head + (1 - survival) x layer pass`` expected
        overhead; it pays when that lowers the ratio overhead / emitted.
        """
        added = self.m.small.value + (1.0 - survival) * self.m.body.value
        return survival * self.m.overhead.value > self.m.per_step.value * added

    def verified(self, draft: Draft, verdict: Verdict, fed: Sequence[int] = (),
                 logits: torch.Tensor | None = None) -> None:
        """Each judged token teaches the table of the source that proposed it; the step's
        tokens and wasted layer passes go into the measured costs."""
        self.clock.emitted = len(verdict.tokens)
        features = self.notes.take(draft) or []
        for i in range(min(len(draft), verdict.num_accepted + 1)):
            source, feats = features[i]
            self._record(source, feats, i < verdict.num_accepted)
        wasted = sum(1 for i in range(verdict.num_accepted, len(draft)) if features[i][0] == SELF)
        self.m.per_step.add(len(verdict.tokens))
        self.m.overhead.add(self.m.head + wasted * self.m.body.value + len(draft) * self.m.small.value)

    def _record(self, source: str, feats: tuple, accepted: bool) -> None:
        """One judged token of ``source`` (here always the small head) for its acceptance table."""
        self.table.record(feats, accepted)


def no_body_message(backend: str) -> str:
    return (f"the self drafter needs a backend that can run the target's layers without its LM head "
            f"(transformers); {backend} cannot: llama.cpp computes the full output head for every "
            f"row it returns and exposes no hidden states, so neither can the head be cut nor layers "
            f"skipped there (use --backend transformers, or --drafter ngram / recycle)")


# Kept on the target per head size: a head of other rows covers other tokens, so neither its
# measurements nor its acceptance carry over.
SELF_HEAD: LearnedSlot[tuple[DraftHead, Measured]] = LearnedSlot("self-draft-head", lambda: None)
SELF_ACCEPTANCE: LearnedSlot[AcceptanceTable] = LearnedSlot("self-acceptance", self_table)


def shared_state(target: DraftContext, rows: int = HEAD_ROWS) -> tuple[DraftHead, AcceptanceTable, Measured]:
    """The draft head of ``rows`` rows, its acceptance table and measurements on ``target``, kept
    across generations (built on first use: ranking the head and timing the full one)."""
    if not target.layer_access:
        raise SpecdecError(no_body_message(f"the {target.backend_name} backend"))
    if target.device.startswith("cuda"):
        # Its layer passes run eagerly and unpadded, outside the one padded shape of every GPU forward.
        raise SpecdecError("the self drafter is not available on a GPU: its layer passes would run outside "
                           "the one padded shape every GPU forward has, so its drafts could part from plain "
                           "decoding (use --drafter ngram, or a draft model: --drafter model)")

    def build() -> tuple[DraftHead, Measured]:
        costs = target.costs()
        with target.pool.lease() as backend:
            return head_for(target, backend, rows), Measured.start(head_seconds(backend), costs)
    head, measured = target.state(SELF_HEAD.named(str(rows)), build)
    return head, target.state(SELF_ACCEPTANCE.named(str(rows))), measured


@drafter("self", "the target drafts for itself: its own layers (sharing its KV cache) read through a "
                 f"{HEAD_ROWS // 1024}k-row head (--head-rows) of its most frequent tokens; verifying costs only "
                 "the full LM head (transformers backend)", order=35, options=[HEAD_ROWS_OPTION])
def _build_self(request: DraftRequest) -> Drafter:
    return SelfDrafter(*shared_state(request.target, request.options["head_rows"]))
