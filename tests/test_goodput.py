"""The batch's draft lengths chosen together (specdec.policies.goodput): hand-computed ticks,
"nobody drafts" among them; one sequence chooses as the single-stream policy always chose; the
engine verifies the draft cut to what the batch took and still gives plain decoding's tokens."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from conftest import ScriptDrafter, plain_tokens
from specdec.backends.llamacpp_batched import forwards
from specdec.backends.toy import ToyBackend, ToyLM
from specdec.costs import BatchCosts, CostModel
from specdec.drafters.ngram import NgramDrafter
from specdec.engine import DecodeConfig, decode
from specdec.policies.adaptive import AdaptiveK
from specdec.policies.goodput import (MAX_PAUSE, DelayBudget, Offer, OfferPause, choose_lengths, drafts_can_pay,
                                      goodput)
from specdec.tree import chain, path_probabilities
from specdec.types import Draft


def per_draft(base: float, forward: float, row: float):
    """A tick of ``base`` seconds, plus ``forward`` for each sequence that drafts (its rows make a
    forward of their own, as on llama.cpp) and ``row`` for each draft row."""
    return lambda rows: base + sum(forward + row * (n - 1) for n in rows if n > 1)


def best_by_enumeration(offers, cost):
    best, chosen = -math.inf, None
    for lengths in itertools.product(*(range(o.most + 1) for o in offers)):
        rate = goodput(offers, lengths, cost)
        if rate > best:
            best, chosen = rate, list(lengths)
    return chosen, best


def test_nobody_drafts_when_no_draft_pays_for_the_forward_it_adds():
    # Plain: 2 tokens in 1 s. One 0.3-likely token: 2.3 tokens in 1.6 s (1.44/s); both: 2.6 in 2.2 s.
    offers = [Offer.of([0.3]), Offer.of([0.3])]
    assert choose_lengths(offers, per_draft(1.0, 0.5, 0.1)) == [0, 0]
    assert goodput(offers, [0, 0], per_draft(1.0, 0.5, 0.1)) == 2.0


def test_a_long_confident_draft_beside_many_without_is_verified_whole():
    # 8 sequences, one with 7 tokens at 0.99 each. Plain: 8 tokens in 1 s. Its i tokens add
    # 0.99 + ... + 0.99**i tokens for 0.2 + 0.05 i seconds: i = 7 gives 14.7255 / 1.55 = 9.50 a
    # second, i = 6 13.8519 / 1.5 = 9.23; every shorter one less.
    offers = [Offer()] * 3 + [Offer.of([0.99 ** i for i in range(1, 8)])] + [Offer()] * 4
    cost = per_draft(1.0, 0.2, 0.05)
    assert choose_lengths(offers, cost) == [0, 0, 0, 7, 0, 0, 0, 0]
    assert goodput(offers, [0, 0, 0, 7, 0, 0, 0, 0], cost) == pytest.approx(14.7255 / 1.55, rel=1e-4)


def test_a_draft_that_pays_its_sequence_alone_waits_when_its_forward_holds_up_the_batch():
    confident = Offer.of([0.9, 0.81, 0.729])  # 2.439 expected accepted tokens of 3
    # Alone: a step of 1 s, each draft row 0.4 s more: 3 rows give 3.439 tokens in 2.2 s (1.56/s).
    alone = lambda rows: 1.0 + 0.4 * (rows[0] - 1)  # noqa: E731
    assert choose_lengths([confident], alone) == [3]
    # Beside 15 plain sequences in a 4 s tick whose forward of its rows (1 s + 0.4 a row) all wait
    # for: 16 tokens in 4 s (4/s) against at best 18.439 in 6.2 s (2.97/s).
    tick = lambda rows: 4.0 + sum(1.0 + 0.4 * (n - 1) for n in rows if n > 1)  # noqa: E731
    assert choose_lengths([confident] + [Offer()] * 15, tick) == [0] * 16


def test_sequences_that_draft_alike_share_a_forward_that_none_pays_alone():
    # Four sequences, one 0.9-likely token each; a tick costs 1 s + 0.1 a row + 1 s for each
    # distinct row count past the first (llama.cpp slices unequal rows into forwards of their own).
    # Plain: 4 / 1.4 = 2.86/s; one drafting: 4.9 / 2.5 = 1.96/s; all four: 7.6 / 1.8 = 4.22/s.
    offers = [Offer.of([0.9])] * 4
    cost = lambda rows: 1.0 + 0.1 * sum(rows) + (len(set(rows)) - 1)  # noqa: E731
    assert choose_lengths(offers, cost) == [1, 1, 1, 1]
    assert goodput(offers, [1, 1, 1, 1], cost) == pytest.approx(7.6 / 1.8)


def _split_equal(forward):
    """A tick as llama.cpp computes streams of unequal rows (:func:`forwards`), each forward
    ``forward(rows)`` seconds."""
    return lambda rows: sum(forward(n) for n, _ in forwards(range(len(rows)), rows, 4096))


def test_a_batch_too_large_for_any_draft_to_pay_is_told_so_before_anyone_drafts():
    # The 1.5B model's forwards on a 2-core AVX2 CPU (ms by rows, bench-results/qwen-kernels-stock),
    # linear between and past them: from 8 rows on each row costs about 17.6 ms, so 8 sequences
    # stepping make 8 tokens in 141 ms and at best, every token kept, 16 in 270 (1.05x): no draft
    # beats the margin. 4 sequences: 4 in 84 ms against 8 sure tokens in 141 (1.19x).
    points = {1: 44.0, 4: 84.1, 8: 141.3, 16: 269.5, 64: 1128.8}

    def forward(n):
        if n >= 64:
            return points[64] + 17.6 * (n - 64)
        lo = max(k for k in points if k <= n)
        hi = min(k for k in points if k >= n)
        return points[lo] if lo == hi else points[lo] + (points[hi] - points[lo]) * (n - lo) / (hi - lo)

    cpu = _split_equal(forward)
    assert drafts_can_pay(1, cpu) and drafts_can_pay(4, cpu, 1.15)
    assert not drafts_can_pay(8, cpu, 1.15) and not drafts_can_pay(16, cpu, 1.15)
    # Without a margin the sure tokens of 8 sequences pay (1.05x), and so might real ones.
    assert drafts_can_pay(8, cpu)
    # A GPU's forward costs about the same up to its shape: drafts can pay at any size.
    assert drafts_can_pay(16, _split_equal(lambda n: 10.0 + 0.01 * n), 1.15)
    # More rows than the tick holds are ruled out, and so is every draft where one row more is.
    assert not drafts_can_pay(16, lambda rows: math.inf if sum(rows) > 16 else 1.0)


def test_drafts_that_only_break_even_in_a_batch_are_left_out_with_a_margin():
    # 8 sequences; one offers 2 tokens at 0.9, 0.81 (1.71 expected); plain: 8 tokens in 1 s.
    # Drafting both: 9.71 tokens in 1 + 0.3 + 2 x 0.05 = 1.4 s, 6.94 a second; one: 8.9 in 1.35 s;
    # so not at all. With a forward of 0.1 s: 9.71 / 1.2 = 8.09 a second, 1.011 times plain (one
    # token: 8.9 / 1.15 = 7.74): taken without a margin, left out with one of 1.1; with a forward
    # of 0.01 s and rows of 0.01 s, 9.71 / 1.03 = 9.43 a second, 1.18 times plain: taken.
    offers = [Offer.of([0.9, 0.81])] + [Offer()] * 7
    assert choose_lengths(offers, per_draft(1.0, 0.3, 0.05)) == [0] * 8
    assert choose_lengths(offers, per_draft(1.0, 0.1, 0.05)) == [2] + [0] * 7
    assert choose_lengths(offers, per_draft(1.0, 0.1, 0.05), margin=1.1) == [0] * 8
    assert choose_lengths(offers, per_draft(1.0, 0.01, 0.01), margin=1.1) == [2] + [0] * 7
    with pytest.raises(ValueError, match="margin"):
        choose_lengths(offers, per_draft(1.0, 0.1, 0.05), margin=0.5)


def test_a_cost_that_rules_rows_out_is_never_chosen_and_fixed_rows_count_in_the_tick():
    offers = [Offer.of([0.99] * 6), Offer((0.0,), rows=30)]  # a prompt chunk of 30 rows beside a draft
    cost = lambda rows: math.inf if sum(rows) > 34 else 1.0 + 0.01 * sum(rows)  # noqa: E731
    assert choose_lengths(offers, cost) == [3, 0]  # 4 + 30 rows fill the batch


def test_a_prompt_chunk_in_the_tick_does_not_make_a_poor_draft_look_good():
    # Each sequence's rows are a forward of 0.5 s + 0.1 s a row. A step alone: 1 token in 0.6 s
    # (1.67/s); with its 0.1-likely token 1.1 in 0.7 s (1.57/s): not worth it. Beside a prompt
    # chunk of 100 rows (10.5 s, no token) the tick's own rate would be 1 / 11.1 against
    # 1.1 / 11.2, so the draft would win; the chunk is paid whatever is chosen, so it is not.
    cost = lambda rows: sum(0.5 + 0.1 * r for r in rows if r > 0)  # noqa: E731
    poor, prompt = Offer.of([0.1]), Offer((0.0,), rows=100)
    assert choose_lengths([poor], cost) == [0]
    assert choose_lengths([prompt, poor], cost) == [0, 0]
    # A draft that pays for itself still goes in beside the chunk: 1.9 tokens in 0.7 s (2.71/s).
    good = Offer.of([0.9])
    assert choose_lengths([prompt, good], cost) == [0, 1]


def test_a_learned_curve_that_dips_beside_a_prompt_chunk_never_prices_a_tick_at_no_time():
    # A learned tick cost need not be monotone: here a prompt chunk's tick with one draft row
    # more seems cheaper than without it (0.5 s against 1.0 s), by more than the step's own
    # 0.1 s. The draft's rows are then priced at nothing on top of the step (never below the
    # step's own time, never at a negative time), so the choice is made, not an error raised.
    def cost(rows):
        prompt, step = rows
        if not prompt:
            return 0.1 + 0.01 * (step - 1)
        return 1.0 if step == 1 else 0.5

    offers = [Offer((0.0,), rows=32), Offer.of([0.9, 0.9])]
    assert choose_lengths(offers, cost) == [0, 2]
    assert choose_lengths(offers, cost, margin=1.15, stretch=1.5) == [0, 2]


def test_no_draft_stretches_a_shared_tick_past_the_limit():
    # The 8 sequences above, one offering 7 tokens at 0.99: the best, all 7, makes the 1 s tick
    # 1.55 s. Stretched at most 1.5 times, 6 (1.5 s, 13.85 tokens: 9.23/s against 8/s); at most
    # 1.2 times, none (one token already makes it 1.25 s).
    offers = [Offer()] * 3 + [Offer.of([0.99 ** i for i in range(1, 8)])] + [Offer()] * 4
    cost = per_draft(1.0, 0.2, 0.05)
    assert choose_lengths(offers, cost, stretch=1.5) == [0, 0, 0, 6, 0, 0, 0, 0]
    assert choose_lengths(offers, cost, stretch=1.2) == [0] * 8
    with pytest.raises(ValueError, match="stretch"):
        choose_lengths(offers, cost, stretch=0.9)


@pytest.mark.parametrize("seed", range(40))
def test_the_choice_is_the_best_of_every_combination_on_small_batches(seed):
    rng = random.Random(seed)
    offers = [Offer.of(path_probabilities(chain(n), [rng.random() for _ in range(n)]))
              for n in (rng.randint(0, 4) for _ in range(rng.randint(1, 4)))]
    base, forward, row = rng.uniform(0.5, 3), rng.uniform(0, 1.5), rng.uniform(0.01, 0.5)
    cost = per_draft(base, forward, row)
    chosen = choose_lengths(offers, cost)
    assert goodput(offers, chosen, cost) == pytest.approx(best_by_enumeration(offers, cost)[1])


def old_choose(costs: CostModel, confidence: list[float], spent: float = 0.0) -> int:
    """AdaptiveK.choose before the batch chose (the single-stream rule this must keep)."""
    cost = lambda i: spent + costs.step(i + 1)  # noqa: E731
    best_i, best_rate, expected = 0, 1 / cost(0), 1.0
    for i, survive in enumerate(path_probabilities(chain(len(confidence)), confidence), start=1):
        expected += survive
        if expected / cost(i) > best_rate:
            best_i, best_rate = i, expected / cost(i)
    return best_i


@pytest.mark.parametrize("seed", range(60))
def test_one_sequence_chooses_as_the_single_stream_policy_chose(seed):
    rng = random.Random(seed)
    curve = CostModel({n: n ** rng.uniform(0.2, 1.0) * rng.uniform(0.8, 1.2) for n in range(1, 17)},
                      switch=rng.uniform(0, 0.4))
    confidence = [rng.choice([rng.random(), 0.99, 0.5]) for _ in range(rng.randint(1, 16))]
    spent = rng.choice([0.0, rng.uniform(0, 2)])
    offer = Offer.of(path_probabilities(chain(len(confidence)), confidence), spent)
    assert choose_lengths([offer], lambda rows: curve.step(rows[0])) == [old_choose(curve, confidence, spent)]


def test_offers_that_shared_ticks_keep_declining_pause_for_longer_each_time():
    pause = OfferPause()

    def steps_without(n: int) -> int:
        """Answers n declined offers in shared ticks; the steps then taken without offering."""
        for _ in range(n):
            assert pause.wants_offer()
            pause.answered(0, shared=True)
        skipped = 0
        while not pause.wants_offer():
            skipped += 1
        return skipped

    assert steps_without(1) == 0  # one decline is no streak
    assert steps_without(1) == 1  # the second in a row: a step without
    assert [steps_without(1) for _ in range(6)] == [2, 4, 8, 16, MAX_PAUSE, MAX_PAUSE]
    pause.answered(3, shared=True)  # an offer taken ends the streak
    assert steps_without(1) == 0 and steps_without(1) == 1
    pause.answered(0, shared=False)  # declined alone: the single-stream decision, no streak
    assert steps_without(1) == 0


def test_a_sequence_is_delayed_by_others_drafts_at_most_its_share_of_its_ticks_plus_the_grant():
    # Three sequences; 0 starts with the grant (0.1 * 10 ticks = 1 tick of delay), 1 and 2 had
    # banked less or more. A tick may stretch by what the poorest of them has left; those that
    # drafted nothing pay the stretch, the one that drafted does not; everyone banks 0.1 a tick.
    budget = DelayBudget(share=0.1, grant=10)
    for seq in (0, 1, 2):
        budget.start(seq)
    budget.left[1], budget.left[2] = 0.5, 3.0
    assert budget.stretch([0, 1, 2]) == pytest.approx(1.5)
    assert budget.stretch([0, 2]) == pytest.approx(2.0)
    assert budget.stretch([9]) == 1.0  # a sequence never started may not be delayed at all
    budget.settle([0, 1, 2], [4, 0, 0], 1.5)
    assert budget.left == pytest.approx({0: 1.1, 1: 0.1, 2: 2.6})
    budget.settle([0, 2], [0, 0], 1.0)  # a tick without drafts: banked, nothing paid
    assert budget.left == pytest.approx({0: 1.2, 1: 0.1, 2: 2.7})
    budget.drop(1)
    assert 1 not in budget.left


@pytest.mark.parametrize("seed", range(5))
def test_no_answer_waits_for_others_drafts_longer_than_its_budget_over_a_run(seed):
    # Sequences come and go over 400 ticks; one of them always offers a long sure draft that a
    # tick takes in a forward more (a third of the tick, and a twentieth a row), the rest step.
    # Each tick takes the choice under the budget's stretch; every sequence's total delay from
    # others' drafts stays within share x its ticks + the grant, and some drafts went in.
    rng = random.Random(seed)
    budget = DelayBudget(share=0.05, grant=8)
    cost = per_draft(1.0, 0.3, 0.05)
    running: dict[int, list[float]] = {}  # seq -> [ticks, delay]
    done, next_seq, drafted_ticks = [], 0, 0
    for _ in range(400):
        while len(running) < 4:
            budget.start(next_seq)
            running[next_seq] = [0, 0.0]
            next_seq += 1
        seqs = sorted(running)
        drafter = seqs[rng.randrange(len(seqs))]
        offers = [Offer.of([0.95] * 10) if s == drafter else Offer.of([]) for s in seqs]
        stretch = budget.stretch(seqs)
        lengths = choose_lengths(offers, cost, 1.15, stretch)
        took = cost([1 + n for n in lengths]) / cost([1] * len(seqs))
        assert took <= stretch + 1e-9
        budget.settle(seqs, lengths, took)
        drafted_ticks += any(lengths)
        for s, n in zip(seqs, lengths):
            running[s][0] += 1
            running[s][1] += took - 1 if n == 0 else 0.0
            if rng.random() < 1 / 60:  # a generation ends
                done.append(running.pop(s))
                budget.drop(s)
    done.extend(running.values())
    assert drafted_ticks > 10
    for ticks, delay in done:
        assert delay <= 0.05 * (ticks + 8) + 1e-9


def test_a_budget_of_no_share_keeps_drafts_out_of_shared_ticks_and_an_infinite_one_sets_no_bound():
    none, unbounded = DelayBudget(share=0.0), DelayBudget(share=math.inf)
    for budget in (none, unbounded):
        budget.start(0)
        budget.start(1)
    assert none.stretch([0, 1]) == 1.0
    assert unbounded.stretch([0, 1]) == math.inf
    unbounded.settle([0, 1], [5, 0], 9.0)
    assert unbounded.stretch([0, 1]) == math.inf
    with pytest.raises(ValueError, match="delay share is at least 0"):
        DelayBudget(share=-0.1)
    with pytest.raises(ValueError, match="delay grant"):
        DelayBudget(grant=math.inf)


def test_bad_offers_are_refused_clearly():
    with pytest.raises(ValueError, match="gains"):
        Offer(())
    with pytest.raises(ValueError, match="finite"):
        Offer((1.0, math.nan))
    with pytest.raises(ValueError, match="rows"):
        Offer((1.0,), rows=-1)
    with pytest.raises(ValueError, match="lengths"):
        goodput([Offer()], [0, 0], lambda rows: 1.0)
    with pytest.raises(ValueError, match="cost some time"):
        choose_lengths([Offer.of([0.5])], lambda rows: 0.0)


def test_llama_cpp_slices_a_tick_by_runs_of_consecutive_sequences_and_equal_rows():
    assert forwards(range(16), [1] * 16, 512) == [(16, 16)]
    assert forwards(range(16), [1] * 5 + [3] + [1] * 10, 512) == [(16, 16), (2, 1)]
    # two drafting sequences apart: a forward each; side by side and alike: one
    assert forwards(range(16), [1, 1, 1, 2, 1, 1, 1, 1, 1, 2] + [1] * 6, 512) == [(16, 16), (1, 1), (1, 1)]
    assert forwards(range(16), [1, 1, 1, 2, 2] + [1] * 11, 512) == [(16, 16), (2, 2)]
    assert forwards([0, 1, 2, 4, 5], [1] * 5, 512) == [(3, 3), (2, 2)]  # a gap in the ids
    assert forwards([0, 1], [5, 2], 512) == [(4, 2), (3, 1)]
    assert forwards(range(4), [8] * 4, 8) == [(8, 4)] * 4  # at most n_ubatch rows a forward


def test_batch_costs_learn_what_each_forward_of_a_tick_took():
    curve = CostModel({1: 1.0, 2: 1.5, 16: 4.0, 64: 12.0})
    batch = BatchCosts(curve)
    assert batch.forward(16, 16) == 4.0 and batch.tick([(16, 16), (2, 1)]) == 5.5  # the curve, at first
    for _ in range(30):
        batch.observe([(16, 16)], 3.0)  # sixteen sequences of one row cost less than the curve says
    assert batch.forward(16, 16) == pytest.approx(3.0, rel=0.02)
    assert curve.forward(16) == 4.0  # the model's own curve is left as it was
    # Sizes no tick ran follow the ones that did (the calibration is off for all alike) ...
    assert batch.forward(15, 15) < curve.forward(15) and batch.forward(2, 1) < curve.forward(2)
    # ... and a tick of a known forward and a new one teaches the new one what it took beyond.
    for _ in range(30):
        batch.observe([(16, 16), (14, 1)], 3.0 + 6.0)  # a 14-row chain: 6 s where the curve said 3.5
    assert batch.forward(16, 16) == pytest.approx(3.0, rel=0.1)
    assert batch.forward(14, 1) == pytest.approx(6.0, rel=0.1)
    before = batch.tick([(16, 16), (1, 1)])
    batch.observe([(16, 16), (300, 1)], 1000.0)  # a prompt's forward: another regime, not learned from
    assert batch.tick([(16, 16), (1, 1)]) == before and batch.observations == 60


def test_a_forward_past_the_learned_sizes_is_priced_with_caution_in_proportion_to_its_rows():
    # Caution prices a tick one standard deviation above its estimate. A 128-row forward is at
    # least as uncertain as the 64-row one, twice over: a tick of many sequences' long drafts must
    # not look cheaper, beside cautious one-row steps, than its mean says.
    curve = CostModel({n: 0.1 * n for n in range(1, 129)})
    batch = BatchCosts(curve)
    sd64 = batch.tick([(64, 8)], caution=1.0) - batch.tick([(64, 8)])
    sd128 = batch.tick([(128, 8)], caution=1.0) - batch.tick([(128, 8)])
    assert sd64 > 0 and sd128 == pytest.approx(2 * sd64)
    # Relative to its mean, as cautious as the steps of the 8 sequences alone.
    steps = batch.tick([(8, 8)], caution=1.0) / batch.tick([(8, 8)])
    assert batch.tick([(128, 8)], caution=1.0) / batch.tick([(128, 8)]) >= 0.8 * steps


class BatchChooses(ToyBackend):
    """A toy sequence whose batch chooses its draft lengths: every step's offer goes into a tick
    beside the other sequences' ``offers`` (fixed), on a cost where drafts compete for rows."""

    chooses_lengths = True

    def __init__(self, lm: ToyLM, others: list[Offer], cost) -> None:
        super().__init__(lm)
        self.others, self.cost, self.taken = others, cost, []

    def extend_offer(self, tokens, offer):
        n = choose_lengths([offer, *self.others], self.cost)[0]
        self.taken.append((offer.most, n))
        return self.extend(tokens[:1 + n])


@pytest.mark.parametrize("busy", [0, 3, 15])
@pytest.mark.parametrize("kind", ["ngram", "oracle", "anti-oracle"])
def test_answers_are_plain_decodings_whatever_the_batch_takes_of_each_draft(busy, kind):
    lm = ToyLM(8, 2, seed=3, scale=2.0)
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]
    cfg = DecodeConfig(max_new_tokens=40)
    plain = plain_tokens(lm, prompt, cfg)
    others = [Offer.of([0.6, 0.36])] * busy
    target = BatchChooses(lm, others, per_draft(1.0 + 0.2 * busy, 0.4, 0.05))
    drafter = NgramDrafter() if kind == "ngram" else ScriptDrafter(prompt + plain, lm.vocab_size,
                                                                  right=kind == "oracle")
    out = decode(target, prompt, cfg, drafter, AdaptiveK(CostModel({1: 1.0, 16: 1.6})))
    assert out.token_ids == plain
    assert target.taken, "no draft was offered to the batch"
    drafted = sum(step.drafted != [] for step in out.trace)
    assert drafted == sum(n > 0 for _, n in target.taken)  # what was taken was verified
    assert out.stats.drafted == sum(n for _, n in target.taken)
    if kind == "oracle" and busy == 0:
        assert any(n > 0 for _, n in target.taken)


def test_the_policy_offers_what_it_would_have_chosen_alone():
    policy = AdaptiveK(CostModel({1: 1.0, 2: 1.3, 4: 1.9, 8: 3.0}))
    draft = Draft([5, 6, 7, 8], confidence=[0.9, 0.8, 0.5, 0.2])
    offer = policy.offer(draft)
    assert offer.most == 4 and offer.gains[0] == 1.0
    assert offer.gains[2] == pytest.approx(1 + 0.9 + 0.72)
    assert choose_lengths([offer], lambda rows: policy.costs.step(rows[0]))[0] == policy.choose(draft)
    assert policy.offer(Draft([5], confidence=[0.9], verify_cost=lambda n: 1.0 + n)) is None
