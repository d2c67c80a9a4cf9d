"""Continuous batching on llama.cpp: generations stepped in one forward give the tokens each gives
alone (exact kernels), join and leave between steps, and the server answers every concurrent
request as it answers it alone."""

from __future__ import annotations

import asyncio
import math
import threading
import time

import pytest

pytest.importorskip("llama_cpp")

import httpx  # noqa: E402

import specdec  # noqa: E402
from conftest import serving, spec_bench_prompts  # noqa: E402
from specdec.backends.llamacpp import has_llamafile  # noqa: E402
from specdec.backends.llamacpp_batched import MarginalCosts, _gaps  # noqa: E402
from specdec.backends.llamacpp_lib import lib  # noqa: E402
from specdec.costs import CostModel  # noqa: E402
from specdec.errors import SpecdecError  # noqa: E402
from specdec.server.app import ServeConfig, Server  # noqa: E402
from loadtest import run_load  # noqa: E402
from specdec.bench.questions import load_questions  # noqa: E402

pytestmark = [pytest.mark.real,
              pytest.mark.skipif(has_llamafile(), reason="this llama.cpp build has llamafile kernels (not exact)")]

MODEL = "smollm2-135m"
PROMPTS = list(spec_bench_prompts(("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem",
                                     "humanities")).values())[:8]
PROMPTS += [f"Write two sentences about the number {i}." for i in range(8 - len(PROMPTS))]  # without the data
# Each generation differs: drafter, tree, policy, sampling, length (short ones leave the batch early).
KINDS = [dict(drafter="none"), dict(drafter="ngram"), dict(drafter="recycle"), dict(drafter="ngram", tree=True),
         dict(drafter="ngram", policy="fixed", num_draft=3), dict(drafter="recycle", temperature=0.8, seed=5),
         dict(drafter="none", max_new_tokens=7), dict(drafter="ngram", max_new_tokens=19)]


@pytest.fixture(scope="module")
def alone():
    return specdec.load(MODEL, backend="llamacpp")


@pytest.fixture(scope="module")
def alone_answers(alone):
    """Each prompt's answer of 24 tokens generated alone, greedy and plain: what the servers' tests
    expect of every request (computed once for all of them)."""
    return {p: alone.generate(p, chat=True, max_new_tokens=24, drafter="none").text for p in PROMPTS}


@pytest.fixture(scope="module")
def batched():
    model = specdec.load(MODEL, backend="llamacpp")
    model.loaded.enable_batching(8)
    return model


def _generate(model, i: int) -> list[int]:
    kwargs = {"max_new_tokens": 40, **KINDS[i]}
    return model.generate(PROMPTS[i], chat=True, **kwargs).token_ids


def _concurrently(work, n: int) -> None:
    """``work(i)`` for i in 0..n-1, each on a thread of its own, all started before any is joined."""
    threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)


def test_concurrent_generations_give_the_tokens_each_gives_alone(alone, batched, monkeypatch):
    # Whether a draft pays in a shared tick depends on this CPU's measured cost curve (and the
    # stretch limit, tested on given costs in test_goodput.py); the drafts must be verified here
    # on every CPU, so the ticks are priced on a known cost where a draft row costs little.
    monkeypatch.setattr(batched.loaded.batched, "tick_cost", lambda seqs: lambda rows: 1.0 + 0.01 * sum(rows))
    expected = [_generate(alone, i) for i in range(8)]
    got: list = [None] * 8
    ticks = batched.loaded.batched.ticks

    def work(i: int) -> None:
        time.sleep(0.05 * (i % 3))  # staggered: some join while others are decoding
        got[i] = _generate(batched, i)

    _concurrently(work, 8)
    assert got == expected
    # They really shared forwards: far fewer ticks than the generations' steps.
    steps = sum(len(tokens) for tokens in expected)
    shared = batched.loaded.batched
    assert shared.ticks - ticks < 0.9 * steps
    # The batch chose the adaptive generations' draft lengths together and verified some of
    # what they offered, not all of it (the answers above are the drafts verified).
    assert 0 < shared.taken < shared.offered
    # A second wave reuses the sequences the first one left.
    again: list = [None] * 4
    _concurrently(lambda i: again.__setitem__(i, _generate(batched, i)), 4)
    assert again == expected[:4]


def test_a_sequence_whose_offers_shared_ticks_decline_pauses_them_and_answers_as_alone(alone, batched, monkeypatch):
    # A draft row costs a shared tick a second forward that never pays (10 s on 1 s), while alone a
    # draft costs little: shared ticks decline every offer, so after two in a row a generation
    # steps 1, 2, 4, ... steps without drafting (no Python work the tick would wait for), and
    # offers again when it is alone. The answers are still each one's alone.
    import specdec.backends.llamacpp_batched as module

    shared = batched.loaded.batched
    monkeypatch.setattr(shared, "tick_cost",
                        lambda seqs: lambda rows: 1.0 + 10.0 * (len(seqs) > 1 and max(rows) > 1) + 0.01 * sum(rows))
    # Long sure drafts would pay on these costs (three chains of 64 kept tokens share the 10 s), so
    # the sequences offer; their real drafts are short, and the ticks decline them.
    prompts = [PROMPTS[i] for i in (1, 4, 6)]

    def ngram(model, prompt: str) -> list[int]:
        return model.generate(prompt, chat=True, max_new_tokens=40, drafter="ngram").token_ids

    expected = [ngram(alone, p) for p in prompts]
    got: list = [None] * 3
    paused, offered = shared.paused, shared.offered
    seen: list[bool] = []
    wants = module.SequenceBackend.wants_offer
    monkeypatch.setattr(module.SequenceBackend, "wants_offer", lambda self: seen.append(wants(self)) or seen[-1])
    _concurrently(lambda i: got.__setitem__(i, ngram(batched, prompts[i])), 3)
    assert got == expected
    assert shared.paused - paused == seen.count(False) > 0
    assert shared.offered > offered  # offers were made, and declined, before the pauses


def test_sequences_of_a_batch_where_no_draft_can_pay_step_without_drafting_and_answer_as_alone(
        alone, batched, monkeypatch):
    # In a shared tick each draft row costs what the whole tick of one row each costs (1 s): not
    # even a draft whose every token is kept pays there, so no sequence drafts while others run;
    # alone, drafts cost little. (A step decided alone may still meet others who joined since in
    # its tick: what is checked is each step's decision, by the batch it saw.) The answers are
    # each one's alone.
    import specdec.backends.llamacpp_batched as module

    shared = batched.loaded.batched
    monkeypatch.setattr(shared, "tick_cost",
                        lambda seqs: lambda rows: 1.0 + (1.0 if len(seqs) > 1 else 0.01) * (sum(rows) - len(rows)))
    prompts = [PROMPTS[i] for i in (1, 4, 6)]

    def ngram(model, prompt: str) -> list[int]:
        return model.generate(prompt, chat=True, max_new_tokens=40, drafter="ngram").token_ids

    expected = [ngram(alone, p) for p in prompts]
    decisions: list[tuple[int, bool]] = []  # (sequences running, whether the step drafted)
    can_pay = module.SharedSequences.drafts_can_pay

    def spy(self):
        answer = can_pay(self)
        decisions.append((len(self._active), answer))
        return answer

    monkeypatch.setattr(module.SharedSequences, "drafts_can_pay", spy)
    paused = shared.paused
    got: list = [None] * 3
    _concurrently(lambda i: got.__setitem__(i, ngram(batched, prompts[i])), 3)
    assert got == expected
    crowded = [answer for running, answer in decisions if running > 1]
    assert crowded and not any(crowded)
    assert shared.paused - paused >= len(crowded)  # steps taken without drafting, counted


def test_a_draft_length_choice_that_fails_costs_its_tick_the_drafts_not_the_requests(alone, batched, monkeypatch):
    # The batch's choice raising (a bug, a cost curve gone wrong) must not stop the ticker with
    # requests waiting on it forever: each tick it fails verifies no drafts, and the answers are
    # still each one's alone.
    import specdec.backends.llamacpp_batched as module

    def broken(*args, **kwargs):
        raise ValueError("a broken choice")

    shared = batched.loaded.batched
    monkeypatch.setattr(shared, "tick_cost", lambda seqs: lambda rows: 1.0 + 0.01 * sum(rows))
    monkeypatch.setattr(module, "choose_lengths", broken)
    expected = [_generate(alone, i) for i in range(3)]
    got: list = [None] * 3
    taken = shared.taken
    with pytest.warns(RuntimeWarning, match="a broken choice"):
        _concurrently(lambda i: got.__setitem__(i, _generate(batched, i)), 3)
    assert got == expected
    assert shared.taken == taken


def test_the_delay_budget_and_the_tick_stretch_limit_decide_whether_a_draft_that_slows_the_others_goes_in(
        batched, monkeypatch):
    # Three sequences step; one offers 8 tokens it is sure of. Any draft costs the tick a second
    # forward (1 s on top of 1 s), so it raises the tick's expected tokens per second (3 in 1.03 s
    # against about 10.7 in 2.11 s) while doubling the others' wait (a stretch of 2.05). It goes in
    # when every sequence in the tick may still be delayed that long (--max-delay-share) and the
    # tick may stretch that far (--max-tick-stretch); the others pay for it, the drafter does not.
    from specdec.backends.llamacpp_batched import _Submission
    from specdec.policies.goodput import DelayBudget, Offer

    shared = batched.loaded.batched
    monkeypatch.setattr(shared, "tick_cost",
                        lambda seqs: lambda rows: 1.0 + (max(rows) > 1) + 0.01 * sum(rows))
    seqs = (5, 6, 7)  # slots no generation of this test's fixture uses

    expected: list[float] = []

    def tick(stretch: float, budget: DelayBudget) -> list[int]:
        monkeypatch.setattr(shared, "max_stretch", stretch)
        monkeypatch.setattr(shared, "budget", budget)
        subs = [_Submission(seq, [7] * (9 if seq == 5 else 1), list(range(9 if seq == 5 else 1)),
                            [[seq]] * (9 if seq == 5 else 1), [True] * (9 if seq == 5 else 1),
                            offer=Offer.of([0.99] * 8) if seq == 5 else Offer.of([]))
                for seq in seqs]
        expected.append(shared._choose(subs))
        return [sub.drafted for sub in subs]

    def budget(left: float) -> DelayBudget:
        out = DelayBudget()
        out.left.update({seq: left for seq in seqs})
        return out

    assert tick(math.inf, budget(1.0)) == [0, 0, 0]  # 1 tick of delay left: a stretch of 2.05 is too much
    assert expected[-1] == 1.0
    rich = budget(1.2)
    assert tick(math.inf, rich) == [8, 0, 0]
    assert expected[-1] == pytest.approx(2.11 / 1.03)
    shared.budget.settle(list(seqs), [8, 0, 0], expected[-1])
    assert rich.left == pytest.approx({5: 1.23, 6: 1.23 - 1.08 / 1.03, 7: 1.23 - 1.08 / 1.03})
    assert tick(math.inf, budget(1.2)) == [8, 0, 0]
    assert tick(1.5, budget(math.inf)) == [0, 0, 0]
    assert tick(3.0, DelayBudget(math.inf)) == [8, 0, 0]
    assert tick(math.inf, DelayBudget(0.0)) == [0, 0, 0]


def test_the_server_passes_its_tick_stretch_limit_and_delay_share_to_the_batch():
    model = specdec.load(MODEL, backend="llamacpp")
    Server(model, config=ServeConfig(slots=2, max_tick_stretch=2.0, max_delay_share=0.1))
    assert model.loaded.batched.max_stretch == 2.0
    assert model.loaded.batched.budget.share == 0.1
    spell = lambda name: "--" + name.replace("_", "-")  # noqa: E731
    with pytest.raises(SpecdecError, match="max-tick-stretch must be >= 1"):
        ServeConfig(max_tick_stretch=0.5).validate(spell)
    with pytest.raises(SpecdecError, match="max-delay-share must be >= 0"):
        ServeConfig(max_delay_share=-1).validate(spell)


def test_an_error_outside_a_decode_fails_its_request_and_the_ticker_goes_on(batched, monkeypatch):
    # What the ticker meets outside a decode ends the submissions of that tick with the error,
    # raised in their own request (not a request waiting forever), and the next request is
    # served as before.
    shared = batched.loaded.batched
    real, failed = shared._holes, []

    def once(seqs, rows):
        if not failed:
            failed.append(seqs)
            raise RuntimeError("outside a decode")
        return real(seqs, rows)

    monkeypatch.setattr(shared, "_holes", once)
    outcome: list = []

    def work(i: int) -> None:
        try:
            batched.generate(PROMPTS[0], chat=True, max_new_tokens=4)
        except RuntimeError as exc:
            outcome.append(str(exc))

    _concurrently(work, 1)
    assert outcome == ["outside a decode"]
    assert len(batched.generate(PROMPTS[0], chat=True, max_new_tokens=4).token_ids) == 4


def test_a_gap_left_between_running_sequences_is_filled_and_answers_stay_the_same(alone, batched, monkeypatch):
    # Sequence 1 is held idle (as a generation that left) while generations run on 0 and 2:
    # llama.cpp would compute them in a forward each (their ids are not consecutive), so each
    # tick puts a placeholder row in 1's stream and removes it after; the answers are still each
    # one's alone, and 1's cells are as they were.
    expected = [alone.generate(PROMPTS[i], chat=True, max_new_tokens=30, drafter="ngram").token_ids
                for i in range(2)]
    pool, shared = batched.loaded.pool, batched.loaded.batched
    # Every gap filled (whether it pays is the cost's call, tested below on a known curve).
    monkeypatch.setattr(shared, "_holes", lambda seqs, rows: _gaps(seqs))
    held = [pool.take() for _ in range(3)]
    assert [b.slot for b in held] == [0, 1, 2]
    gap = held[1]
    gap.reset()
    gap.prefill(batched.encode(PROMPTS[5])[:20])
    gap.idle()
    cells = list(gap.tokens)
    pool.give(held[0])
    pool.give(held[2])
    before, got = shared.placeholders, [None] * 2

    def work(i: int) -> None:
        got[i] = batched.generate(PROMPTS[i], chat=True, max_new_tokens=30, drafter="ngram").token_ids

    _concurrently(work, 2)
    assert got == expected
    assert shared.placeholders > before
    # The held sequence's stream ends where it ended: every placeholder was removed.
    llama = lib()
    assert llama.llama_memory_seq_pos_max(llama.llama_get_memory(shared.ctx), gap.slot) == len(cells) - 1
    pool.give(gap)


def test_a_gap_is_filled_only_where_a_row_costs_less_than_the_forward_it_saves():
    from specdec.backends.llamacpp_batched import _filled, _gaps, forwards

    assert _gaps([0, 2, 5]) == [1, 3, 4] and _gaps([3, 4]) == [] and _gaps([]) == []
    assert _filled([0, 2], [3, 1], [1]) == ([0, 1, 2], [3, 1, 1])
    # Sequences 0 and 2 of one row each: two forwards, or one of three rows with sequence 1's placeholder.
    assert forwards([0, 2], [1, 1], 64) == [(1, 1), (1, 1)]
    assert forwards(*_filled([0, 2], [1, 1], [1]), 64) == [(3, 3)]
    # On a curve of 1 + 0.1 a row: one forward of 3 rows (1.2) beats two of one (2); 16 rows for
    # two sequences at 0 and 15 (2.5) do not.
    from types import SimpleNamespace

    from specdec.backends.llamacpp_batched import SharedSequences

    curve = CostModel({n: 1.0 + 0.1 * (n - 1) for n in range(1, 17)})
    shared = SharedSequences.__new__(SharedSequences)
    shared.weights, shared.costs = SimpleNamespace(n_batch=512, n_ubatch=512), lambda: curve
    assert shared._holes([0, 2], [1, 1]) == [1]
    assert shared._holes([0, 15], [1, 1]) == []
    assert shared._holes([0, 1], [1, 1]) == []
    # Without a measured curve: filled where it saves forwards.
    shared.costs = None
    assert shared._holes([0, 2], [1, 1]) == [1]
    assert shared._holes([0, 9], [1, 1]) == []


def test_batching_is_refused_where_the_backend_cannot(tiny):
    with pytest.raises(SpecdecError, match="cannot batch"):
        tiny.loaded.enable_batching(4)


@pytest.fixture(scope="module")
def served():
    """(url, model) of a batched server on llama.cpp, running for the module's tests."""
    model = specdec.load(MODEL, backend="llamacpp")
    server = Server(model, config=ServeConfig(slots=8, max_tokens=24))
    assert server.config.batch and model.loaded.batched is not None  # on by default on llama.cpp
    server.warm_up()
    with serving(server.app()) as url:
        yield url, model


def test_the_server_answers_concurrent_requests_as_it_answers_each_alone(alone_answers, served):
    url, model = served
    bodies = [{"model": model.name, "messages": [{"role": "user", "content": PROMPTS[i % 8]}],
               "max_tokens": 24, "temperature": 0, "drafter": ["ngram", "none", "recycle"][i % 3]}
              for i in range(16)]
    expected = alone_answers
    report = asyncio.run(run_load(url, bodies, clients=8, time_limit=240, path="/v1/chat/completions", stream=True))
    assert report.failures == 0, [r.error for r in report.results if r.status != 200][:3]
    for i, body in enumerate(bodies):
        assert report.indexed[i].text == expected[body["messages"][0]["content"]]
    assert httpx.get(url + "/health").status_code == 200


def test_a_client_that_leaves_frees_its_sequence_and_the_others_go_on(alone_answers, served):
    url, model = served
    expected = alone_answers[PROMPTS[1]]
    result: dict = {}

    def other() -> None:
        body = {"model": model.name, "messages": [{"role": "user", "content": PROMPTS[1]}], "max_tokens": 24,
                "temperature": 0}
        result["text"] = httpx.post(url + "/v1/chat/completions", json=body, timeout=120).json()[
            "choices"][0]["message"]["content"]

    thread = threading.Thread(target=other)
    thread.start()
    body = {"model": model.name, "messages": [{"role": "user", "content": PROMPTS[0]}], "max_tokens": 200,
            "temperature": 0, "stream": True}
    with httpx.Client(timeout=60) as http:
        with http.stream("POST", url + "/v1/chat/completions", json=body) as response:
            assert response.status_code == 200
            next(response.iter_lines())  # under way, then gone
    thread.join(120)
    assert result["text"] == expected
    deadline = time.time() + 10
    while model.loaded.batched._active:
        assert time.time() < deadline, "the abandoned generation kept its sequence in the batch"
        time.sleep(0.05)


def test_a_repeated_chat_prompt_reports_its_cached_tokens(alone, served):
    url, model = served
    body = {"model": model.name, "messages": [{"role": "user", "content": PROMPTS[2]}], "max_tokens": 8,
            "temperature": 0}
    expected = alone.generate(PROMPTS[2], chat=True, max_new_tokens=8, drafter="none").text
    answers = [httpx.post(url + "/v1/chat/completions", json=body, timeout=120).json() for _ in range(2)]
    for answer in answers:
        assert answer["choices"][0]["message"]["content"] == expected
    usage = answers[1]["usage"]
    # Everything but the prompt's last token (whose logits start the answer) came from the first one.
    assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] - 1


def test_generations_take_the_lowest_free_sequences(batched):
    # llama.cpp slices a batch wherever sequence ids are not consecutive: a generation that starts
    # while 0 and 2 run must get 1, not whichever sequence went idle last.
    pool = batched.loaded.pool
    held = [pool.take() for _ in range(4)]
    assert sorted(b.slot for b in held) == [0, 1, 2, 3]
    for b in sorted(held, key=lambda b: b.slot):
        pool.give(b)  # slot 3 is the last given back
    first, second = pool.take(), pool.take()
    assert (first.slot, second.slot) == (0, 1)
    pool.give(first)
    pool.give(second)


def test_a_sequence_prices_its_rows_on_top_of_the_others_and_leaves_the_curve_to_the_ticks():
    curve = CostModel({1: 1.0, 2: 1.5, 3: 2.0, 4: 2.4}, switch=0.2)
    others = [0]
    margin = MarginalCosts(curve, lambda: others[0])
    assert [margin.forward(n) for n in (1, 2, 3)] == [curve.forward(n) for n in (1, 2, 3)]  # alone
    assert margin.step(3) == curve.step(3) and margin.unit == curve.unit and margin.switch == curve.switch
    others[0] = 2  # its first row rides in the shared slice, the rest are a forward of their own
    first = curve.forward(3) - curve.forward(2)
    assert margin.forward(1) == pytest.approx(first)
    assert margin.forward(3) == pytest.approx(first + curve.forward(2))
    assert margin.step(3) == margin.forward(3)  # the shape changes every tick anyway: no switch
    assert margin.ratio(3) == pytest.approx(margin.forward(3) / curve.unit)
    margin.observe(1, 50.0)  # a sequence's own wait holds the others' rows: ticks teach the curve
    assert curve.observations == 0 and curve.unit == 1.0


@pytest.fixture(scope="module")
def served_pair():
    """(url, model, draft model) of a batched server whose requests draft with a draft model: both
    models' forwards batched (SmolLM2 drafting for a second load of itself)."""
    model = specdec.load(MODEL, backend="llamacpp")
    draft = specdec.load(MODEL, backend="llamacpp")
    server = Server(model, draft, config=ServeConfig(slots=8, max_tokens=24))
    assert model.loaded.batched is not None and draft.loaded.batched is not None
    server.warm_up()
    draft.loaded.batched.trace = []  # rows per submission of every draft tick
    with serving(server.app()) as url:
        yield url, model, draft


def test_drafting_requests_share_draft_model_forwards_and_answer_as_alone(alone_answers, served_pair):
    url, model, draft = served_pair
    # A fixed draft length: a draft model as slow as its target would never pay, and the adaptive
    # policy would not run it.
    bodies = [{"model": model.name, "messages": [{"role": "user", "content": PROMPTS[i % 8]}],
               "max_tokens": 24, "temperature": 0, "drafter": "model" if i % 4 else "none", "policy": "fixed",
               "num_draft": 3, "lookup": False} for i in range(16)]
    expected = alone_answers
    report = asyncio.run(run_load(url, bodies, clients=8, time_limit=240, path="/v1/chat/completions", stream=True))
    assert report.failures == 0, [r.error for r in report.results if r.status != 200][:3]
    for i, body in enumerate(bodies):
        assert report.indexed[i].text == expected[body["messages"][0]["content"]]
    shared = [rows for rows, _ in draft.loaded.batched.trace if len(rows) > 1]
    assert len(shared) > 0.3 * len(draft.loaded.batched.trace), "drafts were not batched across requests"


def test_a_drafting_client_that_leaves_frees_its_rows_in_both_batches(alone_answers, served_pair):
    url, model, draft = served_pair
    body = {"model": model.name, "messages": [{"role": "user", "content": PROMPTS[0]}], "max_tokens": 200,
            "temperature": 0, "stream": True, "drafter": "model", "policy": "fixed", "num_draft": 3,
            "lookup": False}
    with httpx.Client(timeout=60) as http:
        with http.stream("POST", url + "/v1/chat/completions", json=body) as response:
            assert response.status_code == 200
            next(response.iter_lines())  # under way, then gone
    deadline = time.time() + 10
    while model.loaded.batched._active or draft.loaded.batched._active:
        assert time.time() < deadline, (f"the abandoned generation kept its rows in a batch: target "
                                        f"{model.loaded.batched._active}, draft {draft.loaded.batched._active}")
        time.sleep(0.05)
    expected = alone_answers[PROMPTS[1]]
    body = {**body, "messages": [{"role": "user", "content": PROMPTS[1]}], "max_tokens": 24, "stream": False}
    assert httpx.post(url + "/v1/chat/completions", json=body, timeout=120).json()[
        "choices"][0]["message"]["content"] == expected


def test_batched_generations_on_repacked_weights_give_the_tokens_each_gives_alone():
    """Qwen2.5-Coder-0.5B: repacked weights. On specdec's patched library every micro-batch of the
    shared context is exact whatever rows it holds; on the stock one decoding keeps to 3 rows a
    micro-batch (the one-row GEMV), and with a KV stream per sequence llama.cpp admitted one sequence
    more than n_ubatch into a micro-batch: four sequences stepping one row each made 4 rows, on the
    4-row GEMM, and about a third of served answers parted from the same request served alone
    (checked: 1 of 4 here before n_ubatch 2)."""
    # Four sequences stepping together: the case that parted answers (see above).
    prompts = [q.prompt for q in load_questions("humaneval", None, None)[:2]]
    prompts += [q.prompt for q in load_questions("spec-bench", ["coding", "writing"], 1)]
    kinds = [dict(drafter="none"), dict(drafter="ngram")] * 2
    alone = specdec.load("qwen2.5-coder-0.5b", backend="llamacpp")
    expected = [alone.generate(p, chat=True, max_new_tokens=40, **k).token_ids for p, k in zip(prompts, kinds)]
    batched = specdec.load("qwen2.5-coder-0.5b", backend="llamacpp")
    batched.loaded.enable_batching(len(prompts))
    got: list = [None] * len(prompts)

    def run(i: int) -> None:
        got[i] = batched.generate(prompts[i], chat=True, max_new_tokens=40, **kinds[i]).token_ids

    _concurrently(run, len(prompts))
    assert max(batched.loaded.batched.rows / max(batched.loaded.batched.ticks, 1), 0) > 2, "the generations were not batched"
    assert [i for i in range(len(prompts)) if got[i] != expected[i]] == []
