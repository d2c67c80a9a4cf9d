"""Plain data passed across the seams: what a drafter proposes, what verification decides, and
one record per decoding step (vLLM's vocabulary: accepted, recovered ("correction"), bonus)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

import torch


@dataclass
class Draft:
    """Tokens proposed after the current context, with what the engine and its readers need about
    them: verification (:mod:`specdec.verify`), the draft-length policy and the step trace. What a
    drafter wants back about its own draft it keeps itself (:mod:`specdec.drafting.notes`).

    ``q`` is the drafter's sampling distribution at each proposed position (after the same
    temperature/top-k/top-p transform as the target); it is only needed for rejection sampling.
    ``None`` means the drafter is deterministic (or drew with the target's own noise): verification
    then accepts a token exactly when it equals the target's own choice, which for a one-hot q is
    rejection sampling's rule and residual.
    """

    tokens: list[int]  # the engine feeds them to the target; everyone reads them
    q: torch.Tensor | None = None  # [len(tokens), V] float32, or None: verification's (rejection sampling)
    forwards: int = 0  # drafter model forward passes spent on this draft: the policy's price, the trace
    # [len(tokens)]: the drafter's estimate that token i is accepted given tokens < i were; the
    # policy weighs these against the cost of verifying more tokens (the engine's best path too).
    confidence: list[float] | None = None
    probs: list[float] | None = None  # [len(tokens)]: q(token) as the drafter drew it (for the trace)
    proposed: int | None = None  # how many tokens the drafter proposed before any cut (for the trace)
    # A tree (specdec.tree): parents[i] is node i's parent, -1 for a child of the context; None is a
    # chain. Nodes come parents first and best first, so every prefix is a tree. For a tree,
    # confidence[i] is P(node i is accepted | its parent is), and q[i] the distribution node i was
    # drawn from (its siblings drawn i.i.d. from the same one, as in SpecInfer). The engine, the
    # target's forward, verification, the policy and the trace read it.
    parents: list[int] | None = None
    extra: dict | None = None  # drafter-specific details for the trace (e.g. which source drafted)
    # The cost of a step verifying the first n nodes, in plain one-token steps, when the target's
    # forward-cost curve does not price it (part of the work already ran while drafting, e.g. a
    # self draft's layer passes); None: the curve's. Such a step's time is no point on that curve.
    # The policy prices with it; the engine keeps such a step off the curve.
    verify_cost: Callable[[int], float] | None = None

    def __post_init__(self) -> None:
        if self.proposed is None:
            self.proposed = len(self.tokens)

    def __len__(self) -> int:
        return len(self.tokens)

    @cached_property
    def is_tree(self) -> bool:
        """Whether some node has a sibling (a chain given as parents is still a chain)."""
        from specdec.tree import is_chain

        return not is_chain(self.parents)

    def truncated(self, n: int) -> Draft:
        """The first ``n`` proposed nodes (the forward count is what was already spent)."""
        if n >= len(self.tokens):
            return self
        return self.subset(list(range(n)))

    def subset(self, keep: list[int]) -> Draft:
        """The draft made of nodes ``keep`` (each kept after its parent). A verify cost prices
        prefixes, so it stays only when ``keep`` is one."""
        from specdec.tree import chain, is_chain, subset

        pick = (lambda xs: None if xs is None else [xs[i] for i in keep])
        q = None if self.q is None else self.q[keep] if keep else self.q[:0]
        parents = subset(self.parents if self.parents is not None else chain(len(self.tokens)), keep)
        parents = None if is_chain(parents) else parents
        verify_cost = self.verify_cost if keep == list(range(len(keep))) else None
        return Draft([self.tokens[i] for i in keep], q, self.forwards, pick(self.confidence), pick(self.probs),
                     self.proposed, parents, self.extra, verify_cost)


@dataclass
class Verdict:
    """The outcome of verifying one draft: ``tokens`` = accepted drafts + one target token."""

    tokens: list[int]
    num_accepted: int
    bonus: bool  # True when every draft token was accepted and the last token is the bonus
    # For the trace, when asked for: p(x) of each draft token under its parent's row, and min(1, p/q).
    target_probs: list[float] | None = None
    accept_probs: list[float] | None = None
    path: list[int] | None = None  # the accepted draft nodes in order (a chain: 0 .. num_accepted - 1)

    def __post_init__(self) -> None:
        if self.path is None:
            self.path = list(range(self.num_accepted))


StepKind = Literal["plain", "correction", "bonus"]


@dataclass
class StepTrace:
    """One target forward: what was drafted, how much of it survived, and the target's own token.

    ``emitted`` is what the step added to the output after stops: its first ``accepted`` tokens
    are accepted draft tokens and the rest (at most one) is the target's own token of ``kind``.
    Drafted tokens past ``accepted`` that were not emitted were rejected (or cut by a stop).
    """

    position: int  # new tokens generated before this step
    drafted: list[int]  # the draft tokens the target verified
    accepted: int  # emitted tokens that were accepted drafts
    emitted: list[int]
    kind: StepKind  # what the target's own token was
    draft_s: float
    verify_s: float
    proposed: int = 0  # tokens the drafter proposed before the policy's cut
    draft_forwards: int = 0
    confidence: list[float] | None = None  # the drafter's acceptance estimate per drafted token
    draft_probs: list[float] | None = None  # q(x) per drafted token (None: deterministic drafter)
    target_probs: list[float] | None = None  # p(x) per drafted token, under its parent's row (trace=True)
    accept_probs: list[float] | None = None  # min(1, p/q) per drafted token (trace=True)
    parents: list[int] | None = None  # the draft's tree (None: a chain)
    path: list[int] | None = None  # the accepted nodes of a tree, in order (None: a chain's prefix)
    extra: dict = field(default_factory=dict)  # drafter-specific details (e.g. which source drafted)
    # 0 for the end of sequence a finished grammar leaves as the only token, emitted without one
    target_forwards: int = 1

    @property
    def target_token(self) -> int | None:
        """The target's own token, if the step emitted it (a stop can end a step before it)."""
        return self.emitted[-1] if len(self.emitted) > self.accepted else None

    @property
    def accepted_nodes(self) -> list[int]:
        """Indices into ``drafted`` of the emitted accepted tokens."""
        return (self.path if self.path is not None else list(range(len(self.drafted))))[:self.accepted]

    @property
    def rejected(self) -> list[int]:
        """Drafted tokens that did not make it into the output (turned down, never judged, or cut)."""
        kept = set(self.accepted_nodes)
        return [t for i, t in enumerate(self.drafted) if i not in kept]

    def to_dict(self) -> dict:
        """JSON form (the trace file's ``steps``)."""
        out = {k: v for k, v in self.__dict__.items() if v is not None and k != "extra"}
        # Times stay exact: a trace's stats are recomputed by summing them.
        for key in ("confidence", "draft_probs", "target_probs", "accept_probs"):
            if key in out:
                out[key] = [round(x, 5) for x in out[key]]
        if self.extra:
            out["extra"] = self.extra
        return out
