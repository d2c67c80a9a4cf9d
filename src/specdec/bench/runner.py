"""Run every method on every question, interleaved, and aggregate into ``results.json``'s shape."""

from __future__ import annotations

import copy
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from specdec.api import Model
from specdec.bench.base import Method, RunResult, joined
from specdec.bench.questions import Question
from specdec.compare import spread
from specdec.context import Learned
from specdec.costs import CostModel
from specdec.errors import SpecdecError
from specdec.loaded import Held
from specdec.stats import GenerationStats


@dataclass
class BenchRun:
    """Raw results: ``runs[method][i]`` is the result on ``questions[i]``."""

    questions: list[Question]
    prompts: list[list[int]]
    methods: list[Method]
    greedy: bool
    runs: dict[str, list[RunResult]] = field(default_factory=dict)  # the fastest round of each question
    failed: dict[str, str] = field(default_factory=dict)  # peer method -> the error that stopped it
    rounds: dict[str, list[list[RunResult]]] = field(default_factory=dict)  # every round of each question


WARMUP_PROMPT = "Say hello."
MAX_ROUNDS = 12  # most rounds of a question that min_seconds adds


def snapshot(state: Learned) -> Learned:
    """A copy of learned state: its containers and counters are new, while tensors and cost
    curves are shared (tensors there are only ever replaced, never written into, and the cost
    curve measures the machine, not a method)."""
    keep: dict[int, object] = {}
    seen: set[int] = set()
    stack: list[object] = [state]
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, (torch.Tensor, CostModel)):
            keep[id(obj)] = obj
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set)):
            stack.extend(obj)
        elif hasattr(obj, "__dict__") and not callable(obj):
            stack.extend(vars(obj).values())
    return copy.deepcopy(state, keep)


def run_bench(model: Model, methods: list[Method], questions: list[Question], max_new_tokens: int,
              greedy: bool, seed: int | None = None,
              on_result: Callable[[BenchRun, int], None] | None = None, repeats: int = 1,
              min_seconds: float = 0.0) -> BenchRun:
    """Each question runs every method, the order rotating per question (and per repeat), so that
    machine noise hits all methods alike; one warm-up call per method comes first.

    With ``repeats`` > 1 each method runs that many times per question and the fastest run counts:
    on this VM noise only ever adds time (identical runs differ by up to +-12% per category at two
    questions each), and the minimum is the estimate least affected by it; every round is kept
    (``rounds``) for the median beside it. ``min_seconds`` adds rounds (up to :data:`MAX_ROUNDS`)
    until every method has spent that long on the question: a 20-token answer takes under a second,
    and three runs of it can all fall in one slow spell of the machine, where three runs of a
    256-token answer cannot.

    Every round of a question starts from the same state of what the method has learned (its
    tables, and its own copy of the cost curve, which our policies refine as they time forwards),
    so that rounds differ by the machine's noise, not by decisions; the first round's state goes on
    to the next question.
    """
    chat = model.has_chat_template
    if not chat and any(q.conversation is not None for q in questions):
        raise SpecdecError(f"these questions have several turns, and {model.name} has no chat template "
                           "(a base model): give a chat model")
    if not chat and any(q.messages for q in questions):
        raise SpecdecError(f"these questions are chat requests, and {model.name} has no chat template (a base model): "
                           "give a chat model")
    prompts = [model.loaded.codec.encode_messages(list(q.messages)) if q.messages else model.encode(q.prompt, chat=chat)
               for q in questions]
    bench = BenchRun(questions, prompts, methods, greedy, {m.name: [] for m in methods},
                     rounds={m.name: [] for m in methods})
    def attempt(method: Method, ids: list[int], n: int, seed_i: int | None,
                question: Question | None = None) -> RunResult | None:
        # A peer that crashes (a library bug on some input) is reported, not allowed to end the
        # run; ours must never crash, so their errors propagate.
        try:
            return run_question(method, model, question, ids, n, seed_i)
        except Exception as exc:
            if method.family == "ours":
                raise
            bench.failed[method.name] = f"{type(exc).__name__}: {exc}"[:300]
            bench.methods.remove(method)
            bench.runs.pop(method.name, None)
            return None

    bench.methods = list(methods)
    # What each of our methods has learned (recycled tables, a self-drafter's head, acceptance
    # tables, the cost curve as its policy refined it) is its own: a table primed by another
    # method's pass over the same question would be a second pass, not an unseen prompt.
    calibrated = copy.deepcopy(model.loaded.cost_model()) if any(m.family == "ours" for m in methods) else None
    learned = {m.name: Learned() for m in methods}
    costs = {m.name: copy.deepcopy(calibrated) for m in methods}
    warmup = model.encode(WARMUP_PROMPT, chat=chat)

    def run_as(method: Method, state: Learned, curve: CostModel | None, ids: list[int], n: int,
               seed_i: int | None, question: Question | None = None) -> tuple[RunResult | None, Held]:
        with model.loaded.learning_as(state, curve) as held:
            return attempt(method, ids, n, seed_i, question), held

    for method in list(bench.methods):
        run_as(method, learned[method.name], costs[method.name], warmup, min(4, max_new_tokens), seed)
    for i, ids in enumerate(prompts):
        fastest: dict[str, RunResult] = {}
        every: dict[str, list[RunResult]] = {m.name: [] for m in bench.methods}
        before = {name: (snapshot(state), copy.deepcopy(costs[name])) for name, state in learned.items()} \
            if repeats > 1 or min_seconds else {}
        spent: dict[str, float] = {}  # seconds each method has run this question
        r = 0
        def short() -> bool:
            return min((spent.get(m.name, 0.0) for m in bench.methods), default=min_seconds) < min_seconds
        while r < repeats or (r < MAX_ROUNDS and short()):
            current = list(bench.methods)
            shift = (i + r) % len(current)
            for method in current[shift:] + current[:shift]:
                if method not in bench.methods:
                    continue
                seed_i = None if seed is None else seed + i
                if r == 0:  # this round's state goes on to the next question
                    result, held = run_as(method, learned[method.name], costs[method.name], ids, max_new_tokens,
                                          seed_i, questions[i])
                    learned[method.name], costs[method.name] = held.learned, held.costs
                else:
                    state, curve = before[method.name]
                    result, _ = run_as(method, snapshot(state), copy.deepcopy(curve), ids, max_new_tokens, seed_i,
                                       questions[i])
                if result is not None:
                    every[method.name].append(result)
                    spent[method.name] = spent.get(method.name, 0.0) + result.wall_s
                    if method.name not in fastest or result.wall_s < fastest[method.name].wall_s:
                        fastest[method.name] = result
            r += 1
        for method in bench.methods:
            bench.runs[method.name].append(fastest[method.name])
            bench.rounds[method.name].append(every[method.name])
        if on_result:
            on_result(bench, i)
    return bench


def run_question(method: Method, model: Model, question: Question | None, ids: list[int], max_new_tokens: int,
                 seed: int | None) -> RunResult:
    """One question with one method: one call, or for a conversation every turn, each turn's prompt
    the conversation so far through the chat template (``max_new_tokens`` a turn)."""
    schema = question.schema if question is not None else None
    if schema is not None and not method.takes_schema:
        raise SpecdecError(f"{method.name} cannot constrain an answer to a JSON Schema (a response_format)")
    if question is None or question.conversation is None:
        n = (question.max_tokens or max_new_tokens) if question is not None else max_new_tokens
        return method.run(ids, n, seed, schema=schema) if schema is not None else method.run(ids, n, seed)
    messages = [{"role": "user", "content": question.prompt}]
    parts: list[RunResult] = []
    answers: list[str] = []
    while True:
        part = method.run(ids, max_new_tokens, seed)
        parts.append(part)
        answers.append(model.decode(part.token_ids))
        follow = question.conversation.reply(answers)
        if follow is None or len(answers) >= question.conversation.max_turns:
            break
        messages += [{"role": "assistant", "content": answers[-1]}, {"role": "user", "content": follow}]
        ids = model.loaded.codec.encode_messages(messages)
    return joined(parts, question.conversation.outcome(answers))


def summarize(bench: BenchRun, model: Model, upto: int | None = None, divergences: bool = True) -> dict:
    """``{METHOD: {"overall": STATS, "categories": {CATEGORY: STATS}}}`` over the first ``upto`` questions.

    ``divergences`` adds, per method, the baseline's top-2 logit margin where greedy output first
    differs: one target forward per differing question, so the live table leaves it out."""
    n = len(bench.prompts) if upto is None else upto
    by_category: dict[str, list[int]] = defaultdict(list)
    for i in range(n):
        by_category[bench.questions[i].category].append(i)
    out = {}
    for method in bench.methods:
        base = bench.runs.get(method.baseline)
        out[method.name] = {
            "overall": _stats(bench, method, base, list(range(n))),
            "categories": {c: _stats(bench, method, base, idx) for c, idx in sorted(by_category.items())},
        }
        if divergences and bench.greedy and base is not None and method.name != method.baseline:
            out[method.name]["divergences"] = _divergences(bench, method, base, n, model)
    return out


def _stats(bench: BenchRun, method: Method, base: list[RunResult] | None, idx: list[int]) -> dict:
    runs = bench.runs[method.name]
    rs = [runs[i] for i in idx if i < len(runs)]
    new = sum(len(r.token_ids) for r in rs)
    wall = sum(r.wall_s for r in rs)
    stats = {"questions": len(rs), "new_tokens": new, "tokens_per_s": round(new / wall, 3) if wall else 0.0,
             "speedup": None, "mean_accepted_length": None, "acceptance_rate": None, "identical": None}
    median = _median_stats(bench, method, idx)
    if median is not None:
        stats["median"] = median
    # Generation after the prompt (RunResult.gen_s; llama.cpp's predicted_per_second), and its ratio
    # to the baseline's: what speculation changes, without the prompt's share of the wall time.
    stats["gen_tokens_per_s"], stats["gen_speedup"] = _gen_rate(rs), None
    if base is not None and len(base) >= len(runs):
        base_wall = sum(base[i].wall_s for i in idx if i < len(runs))
        # Wall-time ratio over the same questions: equals the tokens/s ratio whenever outputs are
        # identical, and still says "how much sooner did I get my answers" when they are not.
        stats["speedup"] = round(base_wall / wall, 3) if wall else None
        base_gen = _gen_rate([base[i] for i in idx if i < len(runs)])
        if stats["gen_tokens_per_s"] and base_gen:
            stats["gen_speedup"] = round(stats["gen_tokens_per_s"] / base_gen, 3)
        if method.name != method.baseline and stats["speedup"] is not None:
            # How far the questions' own speed-ups scatter: an overall 1.03x whose middle half spans
            # 1.0 is noise, not a gain.
            ratios = [base[i].wall_s / runs[i].wall_s for i in idx if i < len(runs) and runs[i].wall_s > 0]
            stats.update(spread(ratios, stats["speedup"]))
        if bench.greedy:
            diff = next((i for i in idx if i < len(runs) and runs[i].token_ids != base[i].token_ids), None)
            stats["identical"] = diff is None
            if diff is not None:
                q = bench.questions[diff]
                stats["first_difference"] = {"question_id": q.question_id, "category": q.category,
                                             "position": _first_mismatch(runs[diff].token_ids, base[diff].token_ids)}
    if any(r.turns > 1 or r.outcome is not None for r in rs):
        stats["turns"] = sum(r.turns for r in rs)
    outcomes = [r.outcome for r in rs if r.outcome is not None]
    if outcomes and all("passed" in o for o in outcomes):
        stats["pass_rate"] = round(sum(bool(o["passed"]) for o in outcomes) / len(outcomes), 4)
    if rs and rs[0].stats is not None:
        stats.update(GenerationStats.total(r.stats for r in rs).bench_dict())
    elif rs and rs[0].target_forwards is not None:
        # A peer's forwards, counted by a hook or by its own counters: its mean accepted length, and
        # its acceptance rate where it counts its draft tokens (llama-server).
        counted = GenerationStats(new_tokens=new, target_forwards=sum(r.target_forwards for r in rs))
        stats["mean_accepted_length"] = counted.bench_dict()["mean_accepted_length"]
        drafted = sum(r.peer_drafted or 0 for r in rs)
        if drafted:
            stats["acceptance_rate"] = round(sum(r.peer_accepted or 0 for r in rs) / drafted, 4)
    return stats


def _median_stats(bench: BenchRun, method: Method, idx: list[int]) -> dict | None:
    """Tokens/s (end to end and after the prompt) and the speed-ups over the baseline with each
    question's median round instead of its fastest: beside the best, how far the best is from a
    typical round. None when each question ran once."""
    def median_rounds(name: str) -> list[RunResult] | None:
        rounds = bench.rounds.get(name) or []
        if len(rounds) < len(bench.runs[name]) or not any(len(rounds[i]) > 1 for i in idx if i < len(rounds)):
            return None
        return [sorted(rounds[i], key=lambda r: r.wall_s)[(len(rounds[i]) - 1) // 2] for i in idx if i < len(rounds)]

    mine = median_rounds(method.name)
    if mine is None:
        return None
    wall = sum(r.wall_s for r in mine)
    out = {"tokens_per_s": round(sum(len(r.token_ids) for r in mine) / wall, 3) if wall else 0.0,
           "gen_tokens_per_s": _gen_rate(mine), "speedup": None, "gen_speedup": None}
    base = median_rounds(method.baseline) if method.baseline in bench.runs else None
    if base is not None and len(base) == len(mine):
        base_wall = sum(r.wall_s for r in base)
        out["speedup"] = round(base_wall / wall, 3) if wall else None
        base_gen = _gen_rate(base)
        if out["gen_tokens_per_s"] and base_gen:
            out["gen_speedup"] = round(out["gen_tokens_per_s"] / base_gen, 3)
    return out


def _gen_rate(rs: list[RunResult]) -> float | None:
    """Tokens per second of generation after the prompt over ``rs`` (None unless every run knows it)."""
    if not rs or any(r.gen_s is None for r in rs):
        return None
    seconds = sum(r.gen_s for r in rs)
    tokens = sum(len(r.token_ids) if r.gen_tokens is None else r.gen_tokens for r in rs)
    return round(tokens / seconds, 3) if seconds > 0 else None


def _first_mismatch(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _divergences(bench: BenchRun, method: Method, base: list[RunResult], n: int, model: Model) -> list[dict]:
    """Where greedy output leaves the baseline's: the baseline model's top-2 logit margin there.

    A tiny margin says the two runs only rounded differently at a near-tie (batch-shape numerics),
    not that a token was wrongly accepted.
    """
    found = []
    runs = bench.runs[method.name]
    for i in range(min(n, len(runs))):
        mine, theirs = runs[i].token_ids, base[i].token_ids
        if mine == theirs:
            continue
        pos = _first_mismatch(mine, theirs)
        where = {"question_id": bench.questions[i].question_id, "category": bench.questions[i].category,
                 "position": pos, "top2_margin": None}
        if base[i].first_turn is None or pos < base[i].first_turn:  # a later turn's prompt is not kept
            logits = model.loaded.backend().extend(bench.prompts[i] + theirs[:pos])[-1]
            top2 = logits.topk(2).values
            where["top2_margin"] = round(float(top2[0] - top2[1]), 4)
        found.append(where)
    return found
