"""What drafting could give at most, three ways, one subcommand each:

- ``record`` and ``replay``: recorded greedy answers replayed through the real decoding loop on a
  measured cost curve (bench-results/replay-ceilings, policy-ablation);
- ``oracle``: a perfect drafter timed beside real drafters on a workload
  (bench-results/qwen-heldout-*-oracle);
- ``load``: what drafting could raise a batched server's tokens/s by at each load, from the tick
  costs and the load tests' counters (bench-results/load-ceiling);
- ``single``: what a drafter could make of a load test's 1-client level, its answers replayed
  and its prompts' time measured (bench-results/load-ceiling/one-client-*.json).

``python scripts/ceilings.py SUBCOMMAND --help`` says more of each.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

import specdec
from specdec.backends.base import Backend
from specdec.bench.base import Method, RunResult
from specdec.bench.methods import MethodFactory
from specdec.bench.oracle import HindsightCut, OracleDrafter
from specdec.bench.questions import load_questions, mixed_questions
from specdec.bench.runner import run_bench, summarize
from specdec.commands.bench import provenance
from specdec.costs import CostModel, _parse_seconds
from specdec.cpu import machine_tag
from specdec.drafters.base import Drafter
from specdec.engine import DecodeConfig, DecodeRun
from specdec.options import GenerationOptions

REPLAY_DOC = """Replay recorded greedy answers through the real decoding loop, drafters and policy, priced on a
measured cost curve: a drafter or policy change measured on a whole prompt set in a minute.

Greedy output is fixed by the prompt, so how a drafter and policy would do on it can be computed
without the model: a target that knows the answer (each logits row is one-hot at the recorded next
token) runs the engine exactly as a real target would, and each forward is charged what the cost
curve says ``step(rows)`` costs, plus a fixed per-step overhead (sampling, logits: 6.5 ms here,
what makes the curve's 30.5 ms one-row forward the 37 ms plain step measured), plus the drafter's
own measured time. It finds what a timed run hides in noise (the window rule held at the curve's
dip: issue 42's repair loop), and is checked against timed runs, not instead of them.

    # plain decoding's answers, turn by turn (the repair loop's turns follow its tests), once:
    .venv/bin/python scripts/ceilings.py record --questions humaneval-repair --out /tmp/repair.json
    # then any drafters, on the machine's measured curve (specdec's cost cache):
    .venv/bin/python scripts/ceilings.py replay /tmp/repair.json \\
        --costs ~/.cache/specdec/costs/<key>.json --methods ngram,arctic-suffix:k=16,oracle
"""

ORACLE_DOC = """The speed-up a perfect drafter reaches on a workload, beside real drafters in the same run.

The oracle's draft tokens are the target's own (the plain output of the same prompt, decoded
first and not timed), each at confidence 1, so every token it drafts is kept and the adaptive
policy verifies the draft length the cost curve prices cheapest per token: what remains is the
price of verifying rows on this machine. No drafter beats it on this target, so ``oracle /
DRAFTER`` bounds how far any drafter can get ahead of DRAFTER there (issue 42's editing target
against SuffixDecoding is checked this way). Greedy; multi-turn prompt sets (the repair loop) run
the oracle turn by turn like any method.

    .venv/bin/python scripts/ceilings.py oracle --questions humaneval-edit:bench-results/heldout-inputs/humaneval-p8-15.jsonl \\
        --max-new-tokens 400 --methods plain,ngram,arctic-suffix:policy=fixed:k=16 --out /tmp/oracle-edit
"""

LOAD_DOC = """How far drafting could raise a batched server's tokens/s over plain decoding at each load on this
machine, beside how far apart the same load test puts servers that did the same work.

The ceiling. On a CPU a tick's forwards are compute-bound: a forward costs about a + b·rows (a fit
over the layouts of ``scripts/costs.py ticks``). Plain decoding's rows are its tokens; drafting's are
its tokens plus the draft tokens the target rejects. So all drafting can save is the fixed part of
the forwards it removes: with N generations a tick, a plain token costs a/N + b; a draft token
verified in the forward of a tick its sequence is in anyway still costs its row, b, and saves its
share of the fixed part of the tick it would have needed, a/N: a/(a + b·N) of a token's cost.
The drafter's accepted tokens make a share c of the answers' tokens at 1 client (the load test's
counters), where it drafts as it likes; if the same share were verified that way at N clients,
plain decoding's tokens/s would be multiplied by

    hindsight(N) = 1 / (1 − c · a / (a + b·N))

with no draft token rejected, and by

    with_rejects(N) = 1 / (1 − c · (a/N − r·b) / (a/N + b))

where each accepted token brings r rejected rows, as at 1 client. Both leave out the extra forward
llama.cpp runs for a sequence's unequal rows, prompt ticks, time outside the ticks, and that only
ticks taken off the slowest client's path shorten a level, so no policy with this drafter on this
machine gets past them.

The noise floor. At a level where several servers verified no draft row (the same ticks, the same
work), the spread of their tokens/s (largest over smallest) is the machine's, not the servers':
the merged figure and each pass's; ``twins``, that of the load test's two identical servers without
drafting (``specdec-plain`` and ``specdec-plain-twin``), at every level.

    python scripts/ceilings.py load --ticks bench-results/tick-costs/results.json \\
        --loadtest bench-results/loadtest-qwen/results.jsonl \\
        --loadtest bench-results/loadtest-qwen-heldout/results.jsonl --out bench-results/load-ceiling
"""


# --- record, replay: recorded answers through the real loop, priced on a curve -------------------
OVERHEAD_S = 0.0065  # a decoding step's own seconds beside its forward, measured on the 1.5B here


class FixedCurve(CostModel):
    """The measured curve, not refined by the replay's (instant) forwards."""

    def observe(self, n: int, seconds: float, after: int | None = None) -> None:
        pass


class KnownAnswer(Backend):
    """A target whose greedy next token after position p is ``reference[p + 1]``."""

    def __init__(self, reference: Sequence[int], vocab_size: int, curve: CostModel) -> None:
        self.reference, self.vocab_size, self.curve = list(reference), vocab_size, curve
        self.seq: list[int] = []

    @property
    def length(self) -> int:
        return len(self.seq)

    def extend(self, tokens, *, last_only=False, tree=None):
        start = len(self.seq)
        self.seq.extend(tokens)
        rows = range(len(tokens) - 1, len(tokens)) if last_only else range(len(tokens))
        out = torch.zeros(len(rows), self.vocab_size)
        for j, i in enumerate(rows):
            p = start + i + 1
            out[j, self.reference[p] if p < len(self.reference) else 0] = 1.0
        return out

    def truncate(self, length, keep=None):
        del self.seq[length:]

    def prefill(self, tokens):
        self.seq = list(tokens)
        return 0

    def forward_costs(self, costs):
        return self.curve


@dataclass
class Tally:
    tokens: int = 0
    forwards: int = 0
    seconds: float = 0.0
    by_turn: dict[str, list[float]] = field(default_factory=dict)  # "first"/"later": tokens, seconds

    def add(self, turn: int, tokens: int, forwards: int, seconds: float) -> None:
        self.tokens += tokens
        self.forwards += forwards
        self.seconds += seconds
        part = self.by_turn.setdefault("first" if turn == 1 else "later", [0, 0.0])
        part[0] += tokens
        part[1] += seconds


def build(spec: str, curve: CostModel, state: dict, reference: Sequence[int]):
    """A drafter and policy for a method string: ``ngram``, ``ngram+memory``, ``arctic-suffix``,
    ``oracle`` (drafting ``reference``); ``:k=N`` verifies a fixed N tokens instead of the adaptive
    policy; ``:cut=N`` drafts the drafter's chain of up to N tokens cut in hindsight where the
    target would reject it (:class:`HindsightCut`: the best any policy could do with its
    candidates). Learned state (acceptance tables, a global tree or memory) lives in ``state``
    across the replay's turns."""
    from specdec.policies.adaptive import AdaptiveK
    from specdec.policies.fixed import FixedK
    head, _, rest = spec.partition(":")
    settings = dict(p.split("=", 1) for p in rest.split(":") if "=" in p)
    if head in ("ngram", "ngram+memory"):
        from specdec.drafters.ngram import NgramDrafter
        from specdec.drafting.acceptance import AcceptanceTable
        from specdec.drafting.suffix_index import NgramMemory, ngram_bucket, ngram_prior
        table = state.setdefault("table", AcceptanceTable(ngram_prior, ngram_bucket))
        memory = state.setdefault("memory", NgramMemory()) if head == "ngram+memory" else None
        drafter: Drafter = NgramDrafter(table=table, memory=memory)
    elif head == "arctic-suffix":
        from specdec.drafters.arctic_suffix import ARCTIC_CACHE, ArcticSuffixDrafter
        drafter = ArcticSuffixDrafter(state.setdefault("cache", ARCTIC_CACHE.make()))
    elif head == "oracle":
        drafter = OracleDrafter(reference)
    else:
        raise SystemExit(f"unknown method {spec!r}: ngram, ngram+memory, arctic-suffix, oracle")
    if "cut" in settings:
        return HindsightCut(drafter, reference), FixedK(int(settings["cut"]))
    if "k" in settings:
        return drafter, FixedK(int(settings["k"]))
    # Any other setting names a number of the adaptive policy's Tuning: an ablation
    # (e.g. ngram:calibration_prior=0 replays without the per-generation calibration).
    from dataclasses import fields, replace

    from specdec.policies.adaptive import Tuning
    known = {f.name: type(getattr(Tuning(), f.name)) for f in fields(Tuning)}
    unknown = [key for key in settings if key not in known]
    if unknown:
        raise SystemExit(f"unknown setting {', '.join(unknown)} of {spec!r}: k, cut or a Tuning field "
                         f"({', '.join(known)})")
    tuning = replace(Tuning(), **{key: known[key](value) for key, value in settings.items()})
    return drafter, AdaptiveK(curve, tuning=tuning)


def replay(turns: list[dict], spec: str, curve: CostModel, vocab_size: int, overhead: float = OVERHEAD_S) -> Tally:
    """Every turn decoded by ``spec`` against its recorded answer (checked identical); the tally."""
    state: dict = {}
    tally = Tally()
    for turn in turns:
        reference = turn["prompt"] + turn["output"]
        drafter, policy = build(spec, curve, state, reference) if spec != "plain" else (None, None)
        run = DecodeRun(KnownAnswer(reference, vocab_size, curve), turn["prompt"],
                        DecodeConfig(max_new_tokens=len(turn["output"])), drafter, policy)
        out = run.run()
        if out.token_ids != turn["output"]:
            raise SystemExit(f"{spec}: output differs from the recorded answer ({turn.get('qid')})")
        seconds = sum(curve.step(len(s.drafted) + 1) + overhead + s.draft_s for s in out.trace)
        tally.add(turn.get("turn", 1), len(out.token_ids), len(out.trace), seconds)
    return tally


def record(questions: str, limit: int | None, max_new_tokens: int, out: str, load_mix: bool = False) -> None:
    """Plain decoding of a prompt set through the bench's own loop (conversations turn by turn);
    each turn's prompt and answer, with its question and turn number. ``load_mix``: the requests
    of a load test on ``questions`` instead (comma-separated sets,
    :func:`~specdec.bench.questions.mixed_questions`, the first ``limit``)."""
    model = specdec.load("qwen2.5-coder-1.5b", backend="llamacpp")
    plain = MethodFactory(model, "qwen2.5-coder-1.5b", "llamacpp", "auto", GenerationOptions()).build("plain")
    turns: list[dict] = []

    class Recorded(Method):
        family, name = "ours", "plain"

        def run(self, prompt_ids, max_new, seed) -> RunResult:
            result = plain.run(prompt_ids, max_new, seed)
            turns.append({"prompt": list(prompt_ids), "output": list(result.token_ids)})
            return result

    chosen = (mixed_questions(questions.split(","))[:limit] if load_mix
              else load_questions(questions, None, limit))
    for question in chosen:
        run_bench(model, [Recorded()], [question], max_new_tokens, greedy=True)
        mine = [t for t in turns if "qid" not in t]
        # The bench warms up on a short prompt first: not one of the question's turns.
        warm = [t for t in mine if t["prompt"] != mine[-1]["prompt"] and len(t["output"]) <= 4]
        for n, t in enumerate([t for t in mine if t not in warm], start=1):
            t.update(qid=question.question_id, turn=n)
        turns[:] = [t for t in turns if t not in warm]
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"questions": questions, **({"load_mix": True, "limit": limit} if load_mix else {}),
                   "max_new_tokens": max_new_tokens, "turns": turns}, f)


def held_out(qid, skip: set[str]) -> bool:
    """Whether a recorded question is one of ``skip``: Spec-Bench's ids are numbers, and an edit
    task's id is its problem's with the task after a colon (``HumanEval/16:rename``)."""
    qid = str(qid)
    return qid in skip or qid.split(":")[0] in skip


# --- oracle: a perfect drafter beside real ones ---------------------------------------------------
class OracleMethod(Method):
    """Plain decoding first (untimed) for the reference, then the timed run with the oracle."""

    family = "ours"

    def __init__(self, name: str, model: specdec.Model, policy: str | None, k: int | None) -> None:
        self.name, self.model, self.policy, self.k = name, model, policy, k

    def run(self, prompt_ids, max_new_tokens, seed):
        ids = list(prompt_ids)
        reference = self.model.generate(ids, max_new_tokens=max_new_tokens).token_ids
        extra = {k: v for k, v in (("policy", self.policy), ("num_draft", self.k)) if v is not None}
        self.model.loaded.forget_prompts()  # cold, like every method of the bench
        t0 = time.perf_counter()
        out = self.model.generate(ids, max_new_tokens=max_new_tokens, drafter=OracleDrafter(ids + reference), **extra)
        wall = time.perf_counter() - t0
        if out.token_ids != reference:
            raise RuntimeError("the oracle's output differs from plain decoding")
        return RunResult.of(out, wall)


def oracle(args: argparse.Namespace) -> None:
    """Time the oracle beside ``args.methods`` and write ``args.out``/results.json."""
    model = specdec.load(args.model, backend=args.backend)
    factory = MethodFactory(model, args.model, args.backend, "auto", GenerationOptions())
    methods: list[Method] = [factory.build(s.strip()) for s in args.methods.split(",") if s.strip()]
    methods.append(OracleMethod("oracle", model, None, None))
    for k in (int(x) for x in args.oracle_k.split(",") if x.strip()):
        methods.append(OracleMethod(f"oracle:policy=fixed:k={k}", model, "fixed", k))
    questions = load_questions(args.questions, None, args.limit)
    bench = run_bench(model, methods, questions, args.max_new_tokens, greedy=True, repeats=args.repeats)
    summary = summarize(bench, model, divergences=False)
    overall = {name: s["overall"] for name, s in summary.items()}
    gen = {name: o["gen_tokens_per_s"] for name, o in overall.items()}
    best_oracle = max((n for n in gen if n.startswith("oracle")), key=gen.get)
    report = {
        **provenance(), "command": "scripts/ceilings.py " + shlex.join(sys.argv[1:]), "cpu": machine_tag(),
        "model": args.model, "backend": args.backend, "exact": model.exact, "questions": len(questions),
        "max_new_tokens": args.max_new_tokens,
        "gen_tokens_per_s": gen,
        "gen_speedup": {name: o["gen_speedup"] for name, o in overall.items()},
        "mean_accepted_length": {name: o["mean_accepted_length"] for name, o in overall.items()},
        "best_oracle": best_oracle,
        "best_oracle_over": {name: round(gen[best_oracle] / g, 3) for name, g in gen.items() if g},
        "methods": summary,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(report, indent=2))
    print(json.dumps({k: report[k] for k in ("gen_tokens_per_s", "gen_speedup", "mean_accepted_length",
                                             "best_oracle", "best_oracle_over")}, indent=1))


# --- single: what drafting could make of a load test's 1-client level ----------------------------
SINGLE_DOC = """What a drafter could make of a load test's 1-client level on this machine: its answers
replayed through drafters and the adaptive policy (``replay``), its prompts' time as the load test
measured it.

At 1 client a server's time is its prompts' (the same whoever drafts) and its steps'. With ``P``
the plain server's summed time to first token and ``W`` its wall time, a method whose replayed
steps are ``s`` times as fast as plain decoding's would make

    predicted = W / (P + (W − P) / s)

times plain's tokens/s. The drafting server's own method (``ngram``) is predicted beside what the
load test measured, as a check of the replay; ``ngram:cut=32`` (its candidates cut in hindsight
where the target rejects them: the best any length policy could do with them) and ``oracle`` (the
target's own answer: the best any drafter could do on this cost curve) bound what a better policy
or a better drafter could reach.

    # the load test's requests (its --questions and --requests), answered by plain decoding, once:
    .venv/bin/python scripts/ceilings.py record --load-mix --questions humaneval,spec-bench --limit 16 \\
        --max-new-tokens 128 --out bench-results/load-ceiling/one-client-tuning-answers.json
    .venv/bin/python scripts/ceilings.py single bench-results/load-ceiling/one-client-tuning-answers.json \\
        --costs ~/.cache/specdec/costs/<key>.json --loadtest bench-results/loadtest-qwen/results.jsonl \\
        --out bench-results/load-ceiling/one-client-tuning.json
"""
SINGLE_METHODS = "ngram,ngram:cut=32,oracle"


def predicted_ratio(plain_wall: float, prompt_s: float, step_speedup: float) -> float:
    """Plain's 1-client wall time over a method's whose steps are ``step_speedup`` times as fast,
    the prompts (``prompt_s`` of ``plain_wall``) as long."""
    if not 0 <= prompt_s < plain_wall or step_speedup <= 0:
        raise ValueError(f"need 0 <= prompt_s < plain_wall and a speed-up > 0, got {prompt_s}, {plain_wall}, "
                         f"{step_speedup}")
    return plain_wall / (prompt_s + (plain_wall - prompt_s) / step_speedup)


def one_client(lines: list[dict], server: str) -> dict:
    """``server``'s merged line at 1 client of a load test's results."""
    found = [x for x in lines if x.get("server") == server and x.get("clients") == 1]
    if len(found) != 1 or "tokens_per_s" not in found[0]:
        raise SystemExit(f"the load test has no figures of {server} at 1 client")
    return found[0]


def single(args: argparse.Namespace) -> None:
    """The 1-client predictions of ``args.methods`` on ``args.transcripts``; ``args.out`` (JSON)."""
    with open(args.costs, encoding="utf-8") as f:
        seconds, fraction = _parse_seconds(json.load(f))
    curve = FixedCurve(seconds, fraction * seconds[1])
    turns = json.loads(Path(args.transcripts).read_text(encoding="utf-8"))["turns"]
    lines = [json.loads(x) for x in Path(args.loadtest).read_text(encoding="utf-8").splitlines() if x.strip()]
    plain, drafting = one_client(lines, args.plain_server), one_client(lines, args.server)
    # A step's own time beside its forward: what the plain server spent outside its ticks' forwards.
    overhead = args.overhead if args.overhead is not None else plain["outside_ms_per_tick"] / 1000
    wall, prompt_s = plain["wall_s"], sum(plain["ttfts_s"])
    base = replay(turns, "plain", curve, args.vocab_size, overhead)
    methods = {}
    for spec in args.methods.split(","):
        t = replay(turns, spec, curve, args.vocab_size, overhead)
        speedup = (t.tokens / t.seconds) / (base.tokens / base.seconds)
        methods[spec] = {"step_speedup": round(speedup, 3), "steps": t.forwards,
                         "predicted_1_client": round(predicted_ratio(wall, prompt_s, speedup), 3)}
    results = {
        **provenance(), "command": "scripts/ceilings.py " + shlex.join(sys.argv[1:]), "cpu": machine_tag(),
        "transcripts": args.transcripts, "answers": len(turns), "tokens": base.tokens,
        "costs": Path(args.costs).name,
        "overhead_ms": round(overhead * 1000, 2), "loadtest": args.loadtest,
        "loadtest_commit": next((x["commit"] for x in lines if "run" in x), None),
        "loadtest_tokens": plain["tokens"], "plain_wall_s": wall, "prompt_s": round(prompt_s, 2),
        "prompt_share": round(prompt_s / wall, 3),
        "measured_1_client": {"server": args.server, "over": args.plain_server,
                              "ratio": round(drafting["tokens_per_s"] / plain["tokens_per_s"], 3)},
        "methods": methods,
    }
    text = json.dumps(results, indent=1)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n", encoding="utf-8")


# --- load: what drafting could give a batched server under load ----------------------------------
LEVELS = (4, 8, 16)
NOISE_LEVELS = (1, *LEVELS)  # a load test's twin servers without drafting give it at 1 client too


def fit_forward_costs(ticks: dict) -> tuple[float, float]:
    """(a, b): a forward's fixed milliseconds and each row's, fitted to a tick-costs file's layouts
    (each layout's ticks as its forwards: ``len(forwards)`` fixed parts, its rows' parts)."""
    names = sorted(ticks["ms"])
    x = np.array([[len(ticks["forwards"][n]), sum(rows for rows, _ in ticks["forwards"][n])] for n in names], float)
    y = np.array([ticks["ms"][n] for n in names], float)
    (a, b), *_ = np.linalg.lstsq(x, y, rcond=None)
    return float(a), float(b)


def ceiling(share: float, a: float, b: float, n: int, rejected_per_accepted: float = 0.0) -> float:
    """Plain decoding's tokens/s times this at most at ``n`` generations a tick, where a ``share``
    of the tokens are draft tokens verified in their tick's forward, each bringing
    ``rejected_per_accepted`` rejected rows (a forward costs ``a + b·rows``)."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"a share of tokens is between 0 and 1, got {share}")
    if a < 0 or b <= 0 or n < 1 or rejected_per_accepted < 0:
        raise ValueError(f"a forward's costs are a >= 0 and b > 0 at n >= 1, got a={a}, b={b}, n={n}")
    token = a / n + b
    saved = a / n - rejected_per_accepted * b
    return 1.0 / (1.0 - share * saved / token)


def drafting_counts(lines: list[dict], server: str) -> tuple[float, float]:
    """(share of generated tokens that were accepted draft tokens, rejected rows per accepted
    token) of ``server`` at 1 client, from a load test's tick counters."""
    counts = one_client(lines, server)["counts"]
    return counts["accepted"] / counts["generated"], (counts["drafted"] - counts["accepted"]) / counts["accepted"]


TWINS = ("specdec-plain", "specdec-plain-twin")  # the load test's two identical servers without drafting


def noise_floor(lines: list[dict], level: int, servers: tuple[str, ...] | None = None) -> dict | None:
    """The spread of tokens/s among the servers that drafted no row at ``level`` (of ``servers``
    only, if given): merged, and the largest of the passes' (each pass runs every server in turn)."""
    same = [x for x in lines if x.get("clients") == level and x.get("counts", {}).get("drafted") == 0
            and (servers is None or x.get("server") in servers)]
    if len(same) < 2:
        return None
    merged = [x["tokens_per_s"] for x in same]
    by_pass = [x.get("tokens_per_s_by_pass", [x["tokens_per_s"]]) for x in same]
    passes = min(len(p) for p in by_pass)
    pass_spread = max(max(p[i] for p in by_pass) / min(p[i] for p in by_pass) for i in range(passes))
    return {"servers": [x["server"] for x in same], "tokens_per_s": merged,
            "spread": round(max(merged) / min(merged), 3), "largest_pass_spread": round(pass_spread, 3)}


def load(args: argparse.Namespace) -> None:
    """The ceilings and noise floors of ``args.loadtest``'s runs; ``args.out``/results.json."""

    ticks = json.loads(Path(args.ticks).read_text(encoding="utf-8"))
    a, b = fit_forward_costs(ticks)
    runs = {}
    for path in args.loadtest:
        lines = [json.loads(x) for x in Path(path).read_text(encoding="utf-8").splitlines() if x.strip()]
        share, rejected = drafting_counts(lines, args.server)
        run = {
            "file": path, "commit": next((x["commit"] for x in lines if "run" in x), None),
            "accepted_share_1_client": round(share, 3), "rejected_per_accepted_1_client": round(rejected, 3),
            "hindsight": {str(n): round(ceiling(share, a, b, n), 3) for n in LEVELS},
            "with_rejects": {str(n): round(ceiling(share, a, b, n, rejected), 3) for n in LEVELS},
            "noise_floor": {str(n): noise_floor(lines, n) for n in NOISE_LEVELS},
            "twins": {str(n): noise_floor(lines, n, TWINS) for n in NOISE_LEVELS},
        }
        twins = [f for f in run["twins"].values() if f]
        if twins:  # the widest the two identical servers were apart at any level
            run["twins_widest"] = {"spread": max(f["spread"] for f in twins),
                                   "pass_spread": max(f["largest_pass_spread"] for f in twins)}
        runs[Path(path).parent.name] = run
    results = {
        **provenance(), "ticks": args.ticks, "tick_costs_commit": ticks.get("commit"),
        "cpu": ticks.get("cpu"),
        "context": ticks.get("context"), "forward_ms": round(a, 1), "row_ms": round(b, 1),
        # the share of a plain token's cost a draft token verified in its tick's forward saves at most
        "saving": {str(n): round(a / (a + b * n), 3) for n in LEVELS},
        "runs": runs,
        "command": "python scripts/ceilings.py load " + " ".join(
            ["--ticks", args.ticks] + [x for p in args.loadtest for x in ("--loadtest", p)]
            + (["--server", args.server] if args.server != "specdec" else [])
            + (["--out", args.out] if args.out else [])),
    }
    text = json.dumps(results, indent=1)
    print(text)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "results.json").write_text(text + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    top = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = top.add_subparsers(dest="command", required=True)
    raw = argparse.RawDescriptionHelpFormatter
    rec = sub.add_parser("record", description=REPLAY_DOC, formatter_class=raw, help="record plain answers")
    rec.add_argument("--questions", required=True)
    rec.add_argument("--limit", type=int)
    rec.add_argument("--max-new-tokens", type=int, default=256)
    rec.add_argument("--out", required=True)
    rec.add_argument("--load-mix", action="store_true",
                     help="the requests scripts/loadtest.py sends for these --questions (comma-separated "
                          "sets, taken in turn, first turns only), the first --limit of them")
    rep = sub.add_parser("replay", description=REPLAY_DOC, formatter_class=raw, help="replay them through drafters")
    rep.add_argument("transcripts")
    rep.add_argument("--costs", required=True, help="a cost curve JSON from specdec's cache (costs/)")
    rep.add_argument("--methods", default="ngram,arctic-suffix:k=16,oracle")
    rep.add_argument("--skip", default="", help="question ids to leave out (held-out prompts), comma-separated; a problem's id leaves its edit tasks out too")
    rep.add_argument("--vocab-size", type=int, default=151936)
    rep.add_argument("--overhead", type=float, default=OVERHEAD_S)
    orc = sub.add_parser("oracle", description=ORACLE_DOC, formatter_class=raw, help="a perfect drafter, timed")
    orc.add_argument("--model", default="qwen2.5-coder-1.5b")
    orc.add_argument("--backend", default="llamacpp")
    orc.add_argument("--questions", required=True, help="a prompt set, as specdec bench takes it")
    orc.add_argument("--limit", type=int)
    orc.add_argument("--max-new-tokens", type=int, default=256)
    orc.add_argument("--methods", default="plain,ngram", help="specdec bench's method strings (ours and peers)")
    orc.add_argument("--oracle-k", default="", help="comma-separated fixed draft lengths to add beside the "
                                                    "adaptive oracle (e.g. 15,31)")
    orc.add_argument("--repeats", type=int, default=1)
    orc.add_argument("--out", required=True)
    lim = sub.add_parser("load", description=LOAD_DOC, formatter_class=raw, help="the ceiling under load")
    lim.add_argument("--ticks", default="bench-results/tick-costs/results.json")
    lim.add_argument("--loadtest", action="append", required=True,
                        help="a load test's merged results.jsonl (several: one entry each)")
    lim.add_argument("--server", default="specdec", help="the drafting server whose 1-client counters give c")
    lim.add_argument("--out", default=None, help="a folder for results.json")
    one = sub.add_parser("single", description=SINGLE_DOC, formatter_class=raw,
                         help="what a drafter could make of a load test's 1-client level")
    one.add_argument("transcripts", help="the load test's requests answered (record --load-mix)")
    one.add_argument("--costs", required=True, help="a cost curve JSON from specdec's cache (costs/)")
    one.add_argument("--loadtest", required=True, help="a load test's merged results.jsonl")
    one.add_argument("--server", default="specdec", help="the drafting server measured")
    one.add_argument("--plain-server", default="specdec-plain", help="the server without drafting")
    one.add_argument("--methods", default=SINGLE_METHODS)
    one.add_argument("--vocab-size", type=int, default=151936)
    one.add_argument("--overhead", type=float, default=None,
                     help="seconds a step takes beside its forward (default: the plain server's, measured)")
    one.add_argument("--out", default=None, help="a JSON file for the results")
    args = top.parse_args(argv)
    if args.command == "record":
        record(args.questions, args.limit, args.max_new_tokens, args.out, args.load_mix)
    elif args.command == "oracle":
        oracle(args)
    elif args.command == "load":
        load(args)
    elif args.command == "single":
        single(args)
    else:
        replay_report(args)


def replay_report(args: argparse.Namespace) -> None:
    """Print each method's simulated tokens/s on ``args.transcripts``, beside plain decoding's."""
    with open(args.costs, encoding="utf-8") as f:
        seconds, fraction = _parse_seconds(json.load(f))
    curve = FixedCurve(seconds, fraction * seconds[1])
    with open(args.transcripts, encoding="utf-8") as f:
        skip = set(filter(None, args.skip.split(",")))
        turns = [t for t in json.load(f)["turns"] if not held_out(t.get("qid"), skip)]
    results = {spec: replay(turns, spec, curve, args.vocab_size, args.overhead)
               for spec in ["plain", *args.methods.split(",")]}
    base = results["plain"].tokens / results["plain"].seconds
    for spec, t in results.items():
        rate = t.tokens / t.seconds
        parts = "  ".join(f"{name} {tok / s:6.2f}" for name, (tok, s) in sorted(t.by_turn.items()))
        print(f"{spec:28s} {rate:7.2f} tok/s {rate / base:5.3f}x  forwards {t.forwards:6d}  {parts}")


if __name__ == "__main__":
    main(sys.argv[1:])
