"""Draft-length policies and the cost model they read."""

from __future__ import annotations

import time

import pytest

from specdec.costs import CostModel, measure_forward_costs, measure_switch
from specdec.backends.toy import ToyLM
from specdec.drafting.acceptance import AcceptanceTable
from specdec.errors import SpecdecError
from specdec.policies.adaptive import AdaptiveK
from specdec.policies.adaptive_parts import Tuning
from specdec.policies.fixed import FixedK
from specdec.types import Draft

STEEP = CostModel({1: 1.0, 2: 1.8, 4: 2.6, 8: 4.0})  # llama.cpp-like: every token costs
FLAT = CostModel({1: 1.0, 2: 1.05, 8: 1.2})  # GPU-like: verification is nearly free


def draft(conf):
    return Draft(list(range(len(conf))), confidence=conf)


def test_cost_model_interpolates_and_extrapolates():
    assert STEEP.forward(3) == pytest.approx(2.2)
    assert STEEP.forward(12) == pytest.approx(4.0 + 3.0 / 7 * 4)
    assert STEEP.ratio(8) == 4.0
    assert CostModel({1: 2.0}).forward(3) == pytest.approx(6.0)


def test_unsure_drafts_are_not_verified_when_verification_is_expensive():
    assert AdaptiveK(STEEP).choose(draft([0.5, 0.5, 0.5])) == 0


def test_sure_drafts_are_verified_whole():
    assert AdaptiveK(STEEP).choose(draft([0.99] * 7)) == 7
    assert AdaptiveK(FLAT).choose(draft([0.9] * 7)) == 7


# This machine's exact llama.cpp curve (1.5B Q4_K_M, 2-core EPYC), in one-row forwards: 6 rows are
# a dip (0.48 a row) that 16 and 32 rows beat (0.47, 0.44).
DIP = CostModel({1: 1.0, 2: 1.43, 3: 1.84, 4: 2.29, 5: 2.71, 6: 2.87, 7: 3.46, 8: 3.87, 9: 4.96, 10: 5.1,
                 11: 5.38, 12: 6.09, 13: 6.54, 14: 6.81, 15: 7.12, 16: 7.47, 24: 11.55, 32: 14.1, 48: 24.5,
                 64: 30.1})


def test_a_sure_copy_is_verified_at_the_size_that_verifies_a_token_cheapest():
    """From its first draft, past the curve's dip at 6 rows: no window holds a copy short while it
    earns its length (replays showed the window bought nothing; CHANGELOG.md)."""
    policy = AdaptiveK(DIP, k=63)
    policy.begin(_Target())
    assert policy.max_k() == 63
    assert policy.choose(draft([0.995] * 63)) == 31


def test_a_fading_draft_is_verified_only_as_far_as_it_is_likely():
    policy = AdaptiveK(DIP, k=63)
    policy.begin(_Target())
    fading = draft([0.9, 0.8, 0.5, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3])
    assert 0 < policy.choose(fading) < 5


def test_the_best_prefix_stops_before_a_weak_token():
    assert AdaptiveK(STEEP).choose(draft([0.99, 0.99, 0.99, 0.05, 0.99])) == 3


def test_drafts_without_confidence_use_the_running_acceptance():
    policy = AdaptiveK(STEEP, tuning=Tuning(prior_acceptance=0.9))
    assert policy.choose(Draft([1, 2, 3])) == 3
    for _ in range(60):
        policy.observe(3, 0, 0.0)  # everything rejected
    assert policy.acceptance < 0.05
    assert policy.choose(Draft([1, 2, 3])) == 0


class _Target:
    def forward_costs(self, curve):
        return curve


def trust(policy: AdaptiveK) -> float:
    """The generation's odds factor on its drafter's confidence (1: at face value)."""
    p = policy.calibration.scaled([0.5])[0]
    return p / (1 - p)


def test_a_generation_whose_drafts_fail_trusts_its_drafters_confidence_less():
    """Per generation, in odds: drafts judged at 0.75 confidence that mostly fail make the next
    0.75-confidence draft not worth verifying, while a near-certain copy still is; a new
    generation starts at face value, and declined drafts slowly return trust."""
    policy = AdaptiveK(CostModel({1: 1.0, 2: 1.3, 3: 1.6, 8: 3.0}))
    policy.begin(_Target())
    unsure, sure = draft([0.75]), draft([0.995, 0.995])
    assert policy.choose(unsure) == 1 and trust(policy) == 1.0
    failures = 0
    while policy.choose(draft([0.75])) == 1:
        policy.observe(1, 0, 0.0)  # rejected
        failures += 1
        assert failures < 8, "kept verifying unsure drafts that all failed"
    assert failures >= 1 and trust(policy) < 0.5
    assert policy.choose(sure) == 2
    before = trust(policy)
    for _ in range(40):
        policy.choose(unsure)  # declined: trust returns a little each time
    assert before < trust(policy) < 1.0
    policy.begin(_Target())
    assert trust(policy) == 1.0 and policy.choose(unsure) == 1
    off = AdaptiveK(CostModel({1: 1.0, 2: 1.3, 3: 1.6, 8: 3.0}), tuning=Tuning(calibration_prior=0))
    for _ in range(5):
        off.choose(unsure)
        off.observe(1, 0, 0.0)
    assert trust(off) == 1.0  # calibration off: face value whatever happens


def test_k_must_be_positive():
    with pytest.raises(SpecdecError):
        FixedK(0)
    with pytest.raises(SpecdecError):
        AdaptiveK(FLAT, k=0)


def test_acceptance_table_censors_tokens_after_the_first_rejection():
    table = AcceptanceTable(prior=lambda f: 0.5, bucket=lambda f: f, strength=2.0)
    table.update([("a",), ("b",), ("c",)], num_accepted=1)
    assert table.counts == {("a",): [1.0, 1.0], ("b",): [0.0, 1.0]}  # "c" was never judged
    assert table.estimate(("a",)) == pytest.approx(2 / 3)
    assert table.estimate(("c",)) == 0.5


def test_measure_forward_costs_restores_the_cache():
    backend = ToyLM(8, 2).backend()
    costs = measure_forward_costs(backend, [1, 2, 3, 4], sizes=[1, 2, 5], repeats=2)
    assert set(costs) == {1, 2, 5} and all(v > 0 for v in costs.values())
    assert backend.tokens == [1, 2, 3, 4]  # the context only: every measured forward was undone


def test_the_unit_is_timed_as_plain_decoding_runs_it():
    """A one-token forward right after another one: timed after a bigger forward it would carry
    the shape switch, and every ratio of the curve would come out too low."""
    costs = measure_forward_costs(switching(ToyLM(8, 2).backend()), [1, 2, 3, 4], sizes=[4, 1], repeats=2)
    assert costs[1] < SWITCH_S / 2


def test_cost_model_keeps_the_cost_of_each_row_count_as_measured():
    costs = CostModel({1: 1.0, 2: 1.8, 3: 3.1, 4: 2.6, 8: 4.0})  # llama.cpp on AVX2: odd counts cost more
    assert [costs.ratio(n) for n in (1, 2, 3, 4, 8)] == [1.0, 1.8, 3.1, 2.6, 4.0]
    assert costs.ratio(6) == pytest.approx(3.3)  # interpolated between measured neighbours
    assert costs.ratio(10) == pytest.approx(4.0 + 3.0 / 7 * 2)  # the curve's mean slope past the end


def test_the_policy_verifies_one_more_token_when_that_forward_is_cheaper():
    costs = CostModel({1: 1.0, 2: 1.8, 3: 3.1, 4: 2.6, 5: 4.5})
    policy = AdaptiveK(costs)
    # Two sure tokens and a weak third: 3 rows (2 drafts) cost more than 4 rows (3 drafts).
    assert policy.choose(draft([0.99, 0.99, 0.3])) == 3
    assert policy.choose(draft([0.99, 0.99])) == 1  # no third token: 3 rows (2.97 tokens / 3.1) lose to 2 rows


def test_online_observations_track_the_unit_and_each_ratio():
    costs = CostModel({1: 1.0, 2: 1.8, 4: 2.6})
    for _ in range(40):
        costs.observe(1, 2.0)  # the context grew: one row now costs twice as much
        costs.observe(2, 2.0 * 1.2)  # and two rows cost only 1.2x one
    assert costs.unit == pytest.approx(2.0, rel=0.02)
    assert costs.ratio(2) == pytest.approx(1.2, rel=0.05)
    assert costs.ratio(4) == 2.6  # never observed: as calibrated


def test_one_slow_forward_moves_the_estimate_only_a_little():
    costs = CostModel({1: 1.0, 2: 1.8})
    costs.observe(2, 100.0)  # a scheduler hiccup
    assert costs.ratio(2) < 1.8 * 1.06
    costs.observe(1, 100.0)
    assert costs.unit < 1.11


def test_the_adaptive_policy_feeds_its_forward_times_to_the_cost_model():
    costs = CostModel({1: 1.0, 2: 1.8})
    policy = AdaptiveK(costs)
    policy.observe(1, 1, 1.0 * 1.2)
    assert costs.observations == 1 and costs.ratio(2) < 1.8


def test_a_draft_step_is_charged_the_shape_switch_it_imposes_on_the_next_forward():
    # 0.6 expected extra tokens for 1.5x the forward pays (1.6 / 1.5 > 1) until the plain forward
    # after it costs 0.2 more (llama.cpp re-planning its graph): 1.6 / 1.7 < 1.
    assert AdaptiveK(CostModel({1: 1.0, 2: 1.5})).choose(draft([0.6])) == 1
    costs = CostModel({1: 1.0, 2: 1.5}, switch=0.2)
    assert costs.step(1) == 1.0 and costs.step(2) == pytest.approx(1.7)
    assert AdaptiveK(costs).choose(draft([0.6])) == 0
    assert AdaptiveK(costs).choose(draft([0.95])) == 1


def test_the_switch_is_learned_from_one_row_forwards_right_after_bigger_ones():
    costs = CostModel({1: 1.0, 2: 1.8})
    policy = AdaptiveK(costs)
    for _ in range(60):
        policy.observe(0, 0, 1.0)  # steady plain steps
        policy.observe(1, 1, 1.8)  # a draft step
        policy.observe(0, 0, 1.3)  # the plain step after it pays 0.3 for the switch
    assert costs.unit == pytest.approx(1.0)
    assert costs.switch == pytest.approx(0.3, rel=0.02)
    assert costs.ratio(2) == pytest.approx(1.8)
    # A new generation's first forward follows its prefill: it teaches neither the unit nor the
    # switch (no draft caused that shape change); the steady forwards after it teach the unit.
    fresh = AdaptiveK(costs)
    fresh.observe(0, 0, 2.0)
    assert costs.switch == pytest.approx(0.3, rel=0.02) and costs.unit == pytest.approx(1.0)
    fresh.observe(0, 0, 2.0)
    assert costs.unit > 1.0 and costs.switch / costs.unit == pytest.approx(0.3, rel=0.02)  # it follows the unit


def test_a_calibration_taken_under_load_is_bounded_so_the_policy_can_still_draft():
    """Measured while another process held the cores: 7 rows at 9.9x one row and a shape switch of
    three forwards. Neither can be true of the machine; believed, no draft would ever pay again
    (and the policy would never learn otherwise). Bounded: n rows cost at most 1.25 n forwards,
    a switch at most half of one, and a near-certain chain is verified."""
    seconds = {1: 0.0155, 2: 0.0304, 3: 0.0338, 7: 0.1538}
    costs = CostModel(seconds, switch=0.048)
    assert costs.ratio(7) == pytest.approx(7 * CostModel.ROWS_BOUND)
    assert costs.switch == pytest.approx(CostModel.MAX_SWITCH * costs.unit)
    assert AdaptiveK(costs).choose(draft([0.99] * 6)) > 0
    costs.observe(7, 0.5)  # online observations are bounded the same way
    assert costs.ratio(7) <= 7 * CostModel.ROWS_BOUND


def test_the_switch_follows_the_unit():
    costs = CostModel({1: 1.0, 2: 1.8}, switch=0.3)
    for _ in range(40):
        costs.observe(1, 0.5)  # the machine got twice as fast (or the calibration was taken under load)
    assert costs.unit == pytest.approx(0.5, rel=0.02)
    assert costs.switch == pytest.approx(0.15, rel=0.02)


SWITCH_S = 0.004  # what the backend below charges for a shape switch


def switching(backend):
    """``backend`` made to pay SWITCH_S for a one-token forward right after a wider one, as
    llama.cpp pays for re-planning its graph."""
    extend = backend.extend
    last = [1]

    def timed(tokens, **kwargs):
        if len(tokens) == 1 and last[0] > 1:
            time.sleep(SWITCH_S)
        last[0] = len(tokens)
        return extend(tokens, **kwargs)

    backend.extend = timed
    return backend


def test_measure_switch_finds_the_switch_and_restores_the_cache():
    backend = switching(ToyLM(8, 2).backend())
    steady, switch = measure_switch(backend, [1, 2, 3, 4], repeats=3)
    assert 0 < steady < SWITCH_S / 2
    assert SWITCH_S * 0.75 < switch < SWITCH_S * 5  # sleep() never returns early; a busy machine adds
    assert backend.tokens == [1, 2, 3, 4]
    # negative control: the same backend without the charge shows (almost) none
    _, none = measure_switch(ToyLM(8, 2).backend(), [1, 2, 3, 4], repeats=3)
    assert none < SWITCH_S * 0.75


# Qwen2.5-Coder-1.5B on llama.cpp, 2-core AVX2: every verified row costs about half a forward.
CPU = CostModel({1: 1.0, 2: 1.54, 3: 2.01, 4: 2.49, 5: 3.03, 8: 4.5})


def test_a_draft_model_is_not_run_where_no_draft_length_pays():
    """Its 0.5B sibling drafts a token for 0.47 of the target's forward: with the verified row's
    ~0.5 on top, a drafted token costs about a plain step. Even if every token were accepted,
    drafting would gain 3%: the draft model is never asked for anything (not even its prompt)."""
    policy = AdaptiveK(CPU)
    policy.plan.acceptance = 0.98
    policy.begin(ToyLM(8, 2).backend())
    assert [policy.max_k(0.47) for _ in range(48)] == [0] * 48


def test_a_cheap_draft_model_drafts_the_length_that_pays_best():
    policy = AdaptiveK(CPU)
    policy.plan.acceptance = 0.9
    policy.begin(ToyLM(8, 2).backend())
    planned = policy.max_k(0.05)
    assert 2 <= planned < policy.k
    free = AdaptiveK(CPU, tuning=Tuning(prior_acceptance=0.9))
    free.begin(ToyLM(8, 2).backend())
    assert free.max_k(0.0) == free.k  # free tokens: draft up to K, verify what pays
    # Acceptance fell: shorter drafts; then none, with a one-token try now and then.
    for _ in range(40):
        policy.observe(planned, 0, 0.0)
    assert policy.plan.acceptance < 0.2
    tries = [policy.max_k(0.05) for _ in range(32)]  # at 100% acceptance it would pay: tried now and then
    assert set(tries) == {0, 1} and tries.count(1) == 2


def test_drafting_stops_when_one_more_token_would_lower_the_rate():
    def policy_at(cost: float) -> AdaptiveK:
        policy = AdaptiveK(CPU, tuning=Tuning(prior_acceptance=0.95))
        policy.begin(ToyLM(8, 2).backend())
        policy.max_k(cost)  # the step starts at the drafter's price for its tokens
        return policy

    assert not policy_at(0.05).stop_drafting([0.95, 0.95])
    assert policy_at(0.6).stop_drafting([0.95, 0.95])
    assert not policy_at(0.0).stop_drafting([0.95, 0.95])  # only the survival threshold ends a free draft


def test_a_draft_models_forwards_count_in_the_choice_of_prefix():
    """Spent draft forwards are part of the step's time: with them a longer prefix can pay where
    it would not on the target's cost alone."""
    policy = AdaptiveK(CPU)
    policy.begin(ToyLM(8, 2).backend())
    policy.max_k(0.47)
    sure = Draft([1, 2, 3], forwards=3, confidence=[0.9, 0.9, 0.9])
    alone = AdaptiveK(CPU)
    assert policy.choose(sure) >= alone.choose(Draft([1, 2, 3], confidence=[0.9, 0.9, 0.9]))
