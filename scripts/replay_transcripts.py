"""Replay recorded greedy answers through the real decoding loop, drafters and policy, priced on a
measured cost curve: a drafter or policy change measured on a whole prompt set in a minute.

Greedy output is fixed by the prompt, so how a drafter and policy would do on it can be computed
without the model: a target that knows the answer (each logits row is one-hot at the recorded next
token) runs the engine exactly as a real target would, and each forward is charged what the cost
curve says ``step(rows)`` costs, plus a fixed per-step overhead (sampling, logits: 6.5 ms here,
what makes the curve's 30.5 ms one-row forward the 37 ms plain step measured), plus the drafter's
own measured time. It finds what a timed run hides in noise (the window rule held at the curve's
dip: issue 42's repair loop), and is checked against timed runs, not instead of them.

    # plain decoding's answers, turn by turn (the repair loop's turns follow its tests), once:
    .venv/bin/python scripts/replay_transcripts.py record --questions humaneval-repair --out /tmp/repair.json
    # then any drafters, on the machine's measured curve (specdec's cost cache):
    .venv/bin/python scripts/replay_transcripts.py replay /tmp/repair.json \\
        --costs ~/.cache/specdec/costs/<key>.json --methods ngram,arctic-suffix:k=16,oracle
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from specdec.backends.base import Backend
from specdec.bench.oracle import HindsightCut, OracleDrafter
from specdec.costs import CostModel, _parse_seconds
from specdec.drafters.base import Drafter
from specdec.engine import DecodeConfig, DecodeRun

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


def record(questions: str, limit: int | None, max_new_tokens: int, out: str) -> None:
    """Plain decoding of a prompt set through the bench's own loop (conversations turn by turn);
    each turn's prompt and answer, with its question and turn number."""
    import specdec
    from specdec.bench.base import Method, RunResult
    from specdec.bench.methods import MethodFactory
    from specdec.bench.questions import load_questions
    from specdec.bench.runner import run_bench
    from specdec.options import GenerationOptions

    model = specdec.load("qwen2.5-coder-1.5b", backend="llamacpp")
    plain = MethodFactory(model, "qwen2.5-coder-1.5b", "llamacpp", "auto", GenerationOptions()).build("plain")
    turns: list[dict] = []

    class Recorded(Method):
        family, name = "ours", "plain"

        def run(self, prompt_ids, max_new, seed) -> RunResult:
            result = plain.run(prompt_ids, max_new, seed)
            turns.append({"prompt": list(prompt_ids), "output": list(result.token_ids)})
            return result

    for question in load_questions(questions, None, limit):
        run_bench(model, [Recorded()], [question], max_new_tokens, greedy=True)
        mine = [t for t in turns if "qid" not in t]
        # The bench warms up on a short prompt first: not one of the question's turns.
        warm = [t for t in mine if t["prompt"] != mine[-1]["prompt"] and len(t["output"]) <= 4]
        for n, t in enumerate([t for t in mine if t not in warm], start=1):
            t.update(qid=question.question_id, turn=n)
        turns[:] = [t for t in turns if t not in warm]
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"questions": questions, "max_new_tokens": max_new_tokens, "turns": turns}, f)


def held_out(qid, skip: set[str]) -> bool:
    """Whether a recorded question is one of ``skip``: Spec-Bench's ids are numbers, and an edit
    task's id is its problem's with the task after a colon (``HumanEval/16:rename``)."""
    qid = str(qid)
    return qid in skip or qid.split(":")[0] in skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("--questions", required=True)
    rec.add_argument("--limit", type=int)
    rec.add_argument("--max-new-tokens", type=int, default=256)
    rec.add_argument("--out", required=True)
    rep = sub.add_parser("replay")
    rep.add_argument("transcripts")
    rep.add_argument("--costs", required=True, help="a cost curve JSON from specdec's cache (costs/)")
    rep.add_argument("--methods", default="ngram,arctic-suffix:k=16,oracle")
    rep.add_argument("--skip", default="", help="question ids to leave out (held-out prompts), comma-separated; a problem's id leaves its edit tasks out too")
    rep.add_argument("--vocab-size", type=int, default=151936)
    rep.add_argument("--overhead", type=float, default=OVERHEAD_S)
    args = parser.parse_args(argv)
    if args.command == "record":
        record(args.questions, args.limit, args.max_new_tokens, args.out)
        return
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
