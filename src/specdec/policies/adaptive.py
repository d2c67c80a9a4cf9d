"""The adaptive draft length: verify the draft prefix with the best expected tokens per second.

On a CPU the price of verifying k tokens is far from flat (``specdec.costs``), so the adaptive
policy verifies the prefix of a draft that maximises expected tokens per second, and none at all
when no prefix beats a plain step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from specdec.costs import CostModel
from specdec.errors import SpecdecError
from specdec.policies.base import DraftPolicy
from specdec.registry import PolicyRequest, policy
from specdec.tree import chain, path_probabilities
from specdec.types import Draft

# The longest draft verified by default: the cost curve is calibrated to 64 rows, and the policy
# verifies only the prefix that pays (where kernels batch many rows well, a copied stretch pays
# drafted long; elsewhere the policy keeps drafts short).
DEFAULT_K = 63
EXPLORE_EVERY = 16  # steps between single-token tries when drafting is believed not to pay
EXPLORE_GAIN = 1.1  # ... if it would pay at least this much were every token accepted
PRICED_PRIOR = 0.8  # acceptance assumed for a draft model's tokens until its drafts are judged
# A draft must promise at least this much over a plain step: its acceptance estimates and the
# curve are estimates, and a predicted gain of a percent or two is as likely a loss.
MIN_GAIN = 0.03
# A generation's own record of its drafts' acceptance, against what their confidence predicted,
# corrects the confidence of its later drafts (in odds, so that a near-certain copy stays likely
# where unsure guesses fail): a drafter's estimates are learned over every generation (code, prose,
# copies of the prompt), and one generation's text can be far from the average (prose, where
# drafts believed likely mostly fail). It starts from CALIBRATION_PRIOR judged tokens at face
# value; each declined draft adds CALIBRATION_RECOVERY of one, so a generation that stopped
# drafting tries again later (its text may turn to copying).
CALIBRATION_PRIOR = 3.0
CALIBRATION_RECOVERY = 0.05
CALIBRATION_RANGE = (0.1, 4.0)  # the odds factor's bounds
# A generation's drafts start at most START_WINDOW tokens long; a draft accepted whole lets the
# next verify twice its rows (its tokens and the one before them: 4 -> 8 -> 16 -> 32 -> 64 rows,
# the sizes kernels that work on groups of rows run best; up to K, and the window never shrinks
# on a success), a rejection brings it back to what was accepted plus one (at least START_WINDOW).
# Where long copies pay (edits, summaries) the window is at K after a few steps; where a confident
# draft is wrong from its first token (a paraphrase of the prompt), it costs a short draft's rows,
# not K's. Growth follows what was verified, not the window: in prose, short drafts that the curve
# cut to 2-3 tokens succeed now and then, and doubling the window on each would license a 16-token
# guess no 16-token draft had earned, whose miss costs 16 rows where a plain step costs one.
START_WINDOW = 3
# ... except where the curve, not the draft's odds, stopped a draft short of the window: a CPU's
# curve can dip at a few rows (here 6 rows cost 2.9 one-row forwards, 8 cost 3.9, 16 cost 7.5, 32
# cost 14.1: a token is cheapest verified 32 at a time, but within a window of 11, 6 rows win), so a
# copy verified 5 tokens at a time would never earn the window where its long drafts pay. A draft
# the curve cut while its odds of surviving to the window's end were at least GROW_SURVIVAL earns
# the window's doubling when it is kept whole. In prose the odds, not the curve, cut drafts short.
GROW_SURVIVAL = 0.5


class AdaptiveK(DraftPolicy):
    """Verify the draft prefix with the best expected tokens per second.

    With per-token acceptance estimates a_1..a_k (``Draft.confidence``, or the running acceptance
    rate when the drafter gives none), verifying i tokens yields 1 + sum_{j<=i} prod_{l<=j} a_l
    tokens on average for a step costing ``costs.step(i + 1)`` (its forward of i + 1 tokens and
    the shape switch it imposes on the next forward); i = 0 is a plain step. A draft that prices
    its own verification (``Draft.verify_cost``: part of the work already ran while drafting, as
    in self-speculation) is weighed on that price instead. A tree's nodes come best first, so the
    same rule with path probabilities in place of the running products sizes a tree by what pays
    (Sequoia's hardware-aware sizing, with this machine's measured curve).
    Choosing the best i per step is the myopic rule of dynamic speculation lookahead (Mamou et al.
    2024), with the CPU's measured cost curve in place of a constant. Every timed forward refines
    that curve (:meth:`specdec.costs.CostModel.observe`), so it follows the context length and the
    machine's load during a session.
    """

    def __init__(self, costs: CostModel, k: int = DEFAULT_K, prior_acceptance: float = 0.5,
                 min_survival: float = 0.2) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise SpecdecError(f"the number of draft tokens must be a whole number >= 1, got {k}")
        self.curve = costs  # the model's measured curve
        self.costs = costs  # what this generation's forwards cost (the curve, or a batch's margin)
        self.k = k
        self.acceptance = prior_acceptance  # running per-token rate, for confidence-less drafts
        self.min_survival = min_survival
        self._last: int | None = None  # rows of this generation's previous forward (None: the prefill)
        self.drafter = None  # the generation's drafter: what its tokens cost
        # Per-token acceptance of drafts that cost something (a draft model's): what planning them
        # assumes. Optimistic at first (a draft model of the target's family mostly agrees with
        # it), then learned from those drafts alone.
        self.priced_acceptance = PRICED_PRIOR
        self._step_cost = 0.0  # seconds a token of this step's draft costs (the drafter's price)
        self._declined = 0  # steps drafting was believed not to pay
        self._calibration = _fresh_calibration()  # this generation's judged tokens: accepted, predicted, count
        self._verified: list[float] = []  # the confidence of the tokens the last choice verified
        self.window = min(k, START_WINDOW)  # the longest draft this generation verifies now
        self._short_by_curve = False  # the last choice stopped short of a window it could fill

    def begin(self, target, drafter=None) -> None:
        self.costs = target.forward_costs(self.curve)
        self.drafter = drafter
        self._declined = 0
        self._calibration = _fresh_calibration()
        self._verified = []
        self.window = min(self.k, START_WINDOW)
        self._short_by_curve = False

    def calibration(self) -> float:
        """The odds factor of this generation's drafts: the odds of their observed acceptance over
        the odds their confidence predicted (with :data:`CALIBRATION_PRIOR` tokens at face value),
        within :data:`CALIBRATION_RANGE`."""
        accepted, predicted, judged = self._calibration
        observed, believed = accepted / judged, predicted / judged
        low, high = CALIBRATION_RANGE
        return min(high, max(low, _odds(observed) / _odds(believed)))

    def _token_cost(self) -> float:
        """Seconds to draft one token in this step, as the drafter priced it (0: free)."""
        return self._step_cost

    def max_k(self, tokens: Sequence[int] = ()) -> int:
        """At most K; for a drafter whose tokens cost a forward each here, the draft length that
        pays best at the running acceptance rate, and none where no length pays even if every
        token were accepted (then the draft model is never run: not even its prompt)."""
        d = self._step_cost = self.drafter.token_cost(tokens) if self.drafter is not None else 0.0
        if d <= 0:
            return self.window
        best, _ = self._plan(d, self.priced_acceptance)
        best = min(best, self.window)
        if best == 0 and self._plan(d, 1.0)[1] >= EXPLORE_GAIN:
            # Drafting would pay well at a higher acceptance than believed: try one token now and
            # then, or the estimate would never be corrected. (A first try fills the draft model's
            # prompt, seconds on a CPU: not for a gain within noise.)
            self._declined += 1
            if self._declined % EXPLORE_EVERY == 0:
                return 1
        return best

    def _plan(self, d: float, acceptance: float) -> tuple[int, float]:
        """The draft length with the best expected tokens per second when each token costs ``d``
        seconds to draft and survives with probability ``acceptance``, and its rate over a plain
        step's."""
        plain = 1.0 / self.costs.step(1)
        best_i, best_rate = 0, plain * (1 + MIN_GAIN)
        expected, survive = 1.0, 1.0
        for i in range(1, self.k + 1):
            survive *= acceptance
            expected += survive
            rate = expected / (i * d + self.costs.step(i + 1))
            if rate > best_rate:
                best_i, best_rate = i, rate
        return best_i, (best_rate if best_i else plain) / plain

    def choose(self, draft: Draft, context: int = 0) -> int:
        """The number of leading draft nodes to verify (a tree's nodes come best first): none
        unless some prefix promises :data:`MIN_GAIN` over a plain step. A drafter's confidence is
        scaled by this generation's :meth:`calibration`."""
        if draft.confidence:
            factor = self.calibration()
            confidence = [_scale(c, factor) for c in draft.confidence]
        else:
            confidence = [self.acceptance] * len(draft)
        parents = draft.parents if draft.parents is not None else chain(len(draft))
        cost = self._cost(draft)
        best_i, best_rate = 0, (1 + MIN_GAIN) / cost(0)
        expected = 1.0
        survival = path_probabilities(parents, confidence)
        for i, survive in enumerate(survival[:self.window], start=1):
            expected += survive
            rate = expected / cost(i)
            if rate > best_rate:
                best_i, best_rate = i, rate
        # What the verified tokens were believed to be worth (a chain's; a tree's path is judged node by node)
        self._verified = list(draft.confidence[:best_i]) if draft.confidence and draft.parents is None else []
        reach = min(self.window, len(draft))
        self._short_by_curve = (0 < best_i < reach and draft.parents is None
                                and survival[reach - 1] >= GROW_SURVIVAL)
        if best_i == 0 and len(draft):
            accepted, predicted, judged = self._calibration
            believed = predicted / judged
            self._calibration = [accepted + CALIBRATION_RECOVERY * believed, predicted + CALIBRATION_RECOVERY * believed,
                                 judged + CALIBRATION_RECOVERY]
        return best_i

    def _cost(self, draft: Draft) -> Callable[[int], float]:
        """Seconds of a step verifying the draft's first i nodes against plain decoding: the
        draft's own price (in plain steps) when it gives one, the cost curve's otherwise; a
        draft model's forwards are spent whatever is verified, and count in every choice."""
        if draft.verify_cost is not None:
            return lambda i: draft.verify_cost(i) * self.costs.forward(1)
        spent = draft.forwards * self._token_cost()
        return lambda i: spent + self.costs.step(i + 1)

    def stop_drafting(self, confidence: list[float]) -> bool:
        """Threshold drafting: stop once the whole draft is unlikely to survive verification, or,
        for a drafter that pays per token, once one more token (assumed as likely as the last)
        would lower the step's expected tokens per second."""
        survival = 1.0
        for a in confidence:
            survival *= a
        if survival < self.min_survival:
            return True
        d = self._token_cost()
        if d <= 0 or not confidence:
            return False
        n = len(confidence)
        expected = 1.0 + sum(path_probabilities(chain(n), confidence))
        now = expected / (n * d + self.costs.step(n + 1))
        more = (expected + survival * confidence[-1]) / ((n + 1) * d + self.costs.step(n + 2))
        return more <= now

    def observe(self, drafted: int, accepted: int, seconds: float, context: int = 0) -> None:
        # A generation's first one-row forward follows the prefill, a shape change that no draft
        # caused: it would teach the unit a switch it does not pay in steady decoding.
        first_after_prefill = self._last is None and drafted == 0
        if seconds > 0 and not first_after_prefill:
            self.costs.observe(drafted + 1, seconds, after=self._last)
        self._last = drafted + 1 if seconds > 0 else None
        if drafted:
            # Judged tokens: the accepted ones plus the first rejected one, if any.
            judged = accepted + (accepted < drafted)
            self.acceptance += 0.1 * (accepted / judged - self.acceptance)
            if accepted == drafted:
                earned = self.window if self._short_by_curve else drafted  # see GROW_SURVIVAL
                self.window = min(self.k, max(self.window, 2 * (earned + 1) - 1))
            else:
                self.window = min(self.k, max(START_WINDOW, accepted + 1))
            self._short_by_curve = False
            if self._verified:
                self._calibration[0] += accepted
                self._calibration[1] += sum(self._verified[:judged])
                self._calibration[2] += judged
                self._verified = []
            if self._step_cost > 0:
                self.priced_acceptance += 0.1 * (accepted / judged - self.priced_acceptance)


def _fresh_calibration() -> list[float]:
    typical = 0.7  # a draft token's usual confidence: the prior's odds factor is 1 whatever it is
    return [CALIBRATION_PRIOR * typical, CALIBRATION_PRIOR * typical, CALIBRATION_PRIOR]


def _odds(p: float) -> float:
    p = min(max(p, 1e-3), 1 - 1e-3)
    return p / (1 - p)


def _scale(p: float, factor: float) -> float:
    """``p`` with its odds multiplied by ``factor``."""
    if factor == 1.0:
        return p
    odds = _odds(p) * factor
    return odds / (1 + odds)


@policy("adaptive", "verify only the draft prefix that pays on this machine's measured cost curve, "
                    f"at most K tokens (default K: {DEFAULT_K})", order=10)
def _build_adaptive(request: PolicyRequest) -> AdaptiveK:
    return AdaptiveK(request.costs(), DEFAULT_K if request.num_draft is None else request.num_draft)
