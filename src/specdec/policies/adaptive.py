"""The adaptive draft length: verify the draft prefix with the best expected tokens per second on
the measured cost curve (dynamic speculation lookahead's myopic rule, Mamou et al. 2024; Sequoia's
sizing for trees), a generation's :class:`Calibration` of its drafter's confidence, and a
:class:`Plan` for drafters whose tokens cost forwards; what each buys: docs/explanation/speculation.md."""

from __future__ import annotations

from specdec.costs import CostModel
from specdec.errors import SpecdecError
from specdec.policies.adaptive_parts import Calibration, Plan, Tuning
from specdec.policies.base import DraftPolicy
from specdec.policies.goodput import Offer, TickCost, choose_lengths
from specdec.registry import PolicyRequest, policy
from specdec.tree import chain, path_probabilities
from specdec.types import Draft

DEFAULT_K = 63  # the cost curve is calibrated to 64 rows


class AdaptiveK(DraftPolicy):
    """Verify the draft prefix with the best expected tokens per second: with per-token acceptance
    a_1..a_k (calibrated ``Draft.confidence``, or the running rate), i tokens yield 1 + sum_j
    prod_{l<=j} a_l tokens for ``costs.step(i + 1)`` seconds (or the draft's ``verify_cost``); a
    tree's best-first nodes use path probabilities. Timed forwards refine the curve."""

    def __init__(self, costs: CostModel, k: int = DEFAULT_K, tuning: Tuning | None = None) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise SpecdecError(f"the number of draft tokens must be a whole number >= 1, got {k}")
        self.tuning = tuning or Tuning()
        self.curve = self.costs = costs  # the model's curve; what this generation's forwards cost
        self.k = k
        self.acceptance = self.tuning.prior_acceptance
        self.plan = Plan(self.tuning, k)
        self.calibration = Calibration(self.tuning)
        self._last: int | None = None  # rows of the previous forward (None: after the prefill)
        self._step_cost = 0.0  # seconds a token of this step's draft costs

    def begin(self, target) -> None:
        self.costs = target.forward_costs(self.curve)
        self.calibration, self.plan.declined = Calibration(self.tuning), 0

    def max_k(self, price: float = 0.0) -> int:
        """K, or a priced drafter's planned length (0: none pays)."""
        d = self._step_cost = price
        return self.plan.length(d, self.costs.step) if d > 0 else self.k

    def choose(self, draft: Draft) -> int:
        """Leading draft nodes to verify (0: a plain step pays best): the goodput choice of a
        batch of one (:func:`~specdec.policies.goodput.choose_lengths`)."""
        best_i = choose_lengths([self._offer(draft)], self._step_cost_of(draft))[0]
        self.calibration.chose(draft, best_i)
        return best_i

    def offer(self, draft: Draft) -> Offer | None:
        """Each prefix's expected tokens, for a batch that chooses the lengths together (not for a
        draft that prices its own verification: its step is no rows on a curve)."""
        return None if draft.verify_cost is not None else self._offer(draft)

    def taken(self, draft: Draft, n: int) -> None:
        self.calibration.chose(draft, n)

    def _offer(self, draft: Draft) -> Offer:
        """Per-token acceptance a_1..a_k (calibrated ``Draft.confidence``, or the running rate) as
        path probabilities; a draft model's forwards are spent whatever is verified."""
        confidence = self.calibration.scaled(draft.confidence) if draft.confidence else [self.acceptance] * len(draft)
        parents = draft.parents if draft.parents is not None else chain(len(draft))
        spent = 0.0 if draft.verify_cost is not None else draft.forwards * self._step_cost
        return Offer.of(path_probabilities(parents, confidence), spent)

    def _step_cost_of(self, draft: Draft) -> TickCost:
        """Seconds of this sequence's step by its rows (the last token and the nodes verified)."""
        if draft.verify_cost is not None:
            return lambda rows: draft.verify_cost(rows[0] - 1) * self.costs.forward(1)
        return lambda rows: self.costs.step(rows[0])

    def stop_drafting(self, confidence: list[float]) -> bool:
        """Threshold drafting: stop once the draft is unlikely to survive, or once one more paid
        token (as likely as the last) would lower the expected rate."""
        survival = 1.0
        for a in confidence:
            survival *= a
        if survival < self.tuning.min_survival:
            return True
        d, n = self._step_cost, len(confidence)
        if d <= 0 or not n:
            return False
        expected = 1.0 + sum(path_probabilities(chain(n), confidence))
        now = expected / (n * d + self.costs.step(n + 1))
        return (expected + survival * confidence[-1]) / ((n + 1) * d + self.costs.step(n + 2)) <= now

    def observe(self, drafted: int, accepted: int, seconds: float) -> None:
        # The first one-row forward after the prefill pays a shape change no draft caused.
        if seconds > 0 and not (self._last is None and drafted == 0):
            self.costs.observe(drafted + 1, seconds, after=self._last)
        self._last = drafted + 1 if seconds > 0 else None
        if drafted:
            judged = accepted + (accepted < drafted)  # the accepted ones and the first rejected one
            self.acceptance += self.tuning.rate * (accepted / judged - self.acceptance)
            self.calibration.observe(accepted, judged)
            if self._step_cost > 0:
                self.plan.acceptance += self.tuning.rate * (accepted / judged - self.plan.acceptance)


@policy("adaptive", "verify only the draft prefix that pays on this machine's measured cost curve, "
                    f"at most K tokens (default K: {DEFAULT_K})", order=10, uses_costs=True)
def _build_adaptive(request: PolicyRequest) -> AdaptiveK:
    return AdaptiveK(request.costs(), DEFAULT_K if request.num_draft is None else request.num_draft)
