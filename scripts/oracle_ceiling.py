"""The speed-up a perfect drafter reaches on a workload, beside real drafters in the same run.

The oracle's draft tokens are the target's own (the plain output of the same prompt, decoded
first and not timed), each at confidence 1, so every token it drafts is kept and the adaptive
policy verifies the draft length the cost curve prices cheapest per token: what remains is the
price of verifying rows on this machine. No drafter beats it on this target, so ``oracle /
DRAFTER`` bounds how far any drafter can get ahead of DRAFTER there (issue 42's editing target
against SuffixDecoding is checked this way). Greedy; multi-turn prompt sets (the repair loop) run
the oracle turn by turn like any method.

    .venv/bin/python scripts/oracle_ceiling.py --questions humaneval-edit:bench-results/heldout-inputs/humaneval-p8-15.jsonl \\
        --max-new-tokens 400 --methods plain,ngram,arctic-suffix:policy=fixed:k=16 --out /tmp/oracle-edit
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import specdec
from specdec.bench.base import Method, RunResult
from specdec.bench.methods import MethodFactory
from specdec.bench.oracle import OracleDrafter
from specdec.bench.questions import load_questions
from specdec.bench.runner import run_bench, summarize
from specdec.commands.bench import provenance
from specdec.cpu import machine_tag
from specdec.options import GenerationOptions


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--backend", default="llamacpp")
    parser.add_argument("--questions", required=True, help="a prompt set, as specdec bench takes it")
    parser.add_argument("--limit", type=int)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--methods", default="plain,ngram", help="specdec bench's method strings (ours and peers)")
    parser.add_argument("--oracle-k", default="", help="comma-separated fixed draft lengths to add beside the "
                                                       "adaptive oracle (e.g. 15,31)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
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
        **provenance(), "command": "scripts/oracle_ceiling.py " + shlex.join(sys.argv[1:]), "cpu": machine_tag(),
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


if __name__ == "__main__":
    main()
