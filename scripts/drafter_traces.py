"""Every registered drafter's steps on a few of the bench's prompts, recorded, to check that a
refactor changed no decision: the tokens, and what each step drafted and kept.

Greedy output equals plain decoding's whatever a drafter does, so comparing tokens alone would
not notice a drafter that drafts differently; the steps do. Sampled with rejection verification,
the tokens themselves depend on the drafts.

    python scripts/drafter_traces.py record --out before.json
    python scripts/drafter_traces.py record --out after.json
    python scripts/drafter_traces.py compare before.json after.json

SmolLM2-135M on llama.cpp (exact) and on transformers (float32), one prompt per set (Spec-Bench
writing, summarization and coding; HumanEval editing), 48 new tokens, greedy and rejection sampling
with a seed; the fixed policy (K=4) beside the adaptive one, whose decisions read timed forwards:
its steps are recorded, and only its greedy tokens compared (the combined drafter's too: it
chooses between its sources on measured wall time).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

PROMPTS = (("spec-bench", "writing"), ("spec-bench", "summarization"), ("spec-bench", "coding"),
           ("humaneval-edit", "editing"))
SAMPLING = {"greedy": {}, "rejection": {"temperature": 0.8, "top_p": 0.95, "seed": 7, "verify": "rejection"}}


def record(out: Path, tokens: int) -> None:
    import specdec
    from specdec.bench.questions import load_questions
    from specdec.context import Learned
    from specdec.registry import DRAFTERS

    prompts = []
    for source, category in PROMPTS:
        prompts.append(next(q for q in load_questions(source) if q.category == category))
    result: dict = {}
    for backend in ("llamacpp", "transformers"):
        model = specdec.load("smollm2-135m", backend=backend)
        draft = specdec.load("smollm2-135m", backend=backend)  # a draft model with the target's weights
        for entry in DRAFTERS:
            if entry.missing():
                continue
            extra = {"draft_model": draft} if entry.needs_draft_model else {}
            for policy in ("fixed", "adaptive"):
                for mode, sampling in SAMPLING.items():
                    # Each configuration learns from scratch: drafters share tables (the recycle
                    # drafter reads the n-gram drafter's), and what an adaptive run learned follows
                    # its timing, which would leak into the deterministic runs after it.
                    for loaded in (model.loaded, draft.loaded):
                        loaded.learned = Learned()
                    for q in prompts:
                        key = f"{backend}|{entry.name}|{policy}|{mode}|{q.question_id}"
                        try:
                            out_ = model.generate(q.prompt, chat=True, max_new_tokens=tokens, drafter=entry.name,
                                                  policy=policy, **({"num_draft": 4} if policy == "fixed" else {}),
                                                  **sampling, **extra)
                        except specdec.SpecdecError as error:
                            result[key] = {"error": str(error)}
                            continue
                        result[key] = {"tokens": out_.token_ids,
                                       "steps": [[list(s.drafted), s.accepted] for s in out_.trace]}
                        print(key, len(out_.token_ids), out_.stats.drafted, out_.stats.accepted, flush=True)
    out.write_text(json.dumps(result) + "\n")


def compare(before: Path, after: Path) -> int:
    a, b = json.loads(before.read_text()), json.loads(after.read_text())
    problems = [f"only in {before.name}: {k}" for k in a if k not in b]
    problems += [f"only in {after.name}: {k}" for k in b if k not in a]
    for key in sorted(set(a) & set(b)):
        # The adaptive policy decides on timed forwards, and the combined drafter between its sources
        # on measured wall time (drafters/combined.py; two recordings of one commit differ on
        # transformers), so their drafts (and, sampled with rejection, their tokens) follow the
        # machine's noise: only their greedy tokens must stay the same.
        timed = "|adaptive|" in key or "|combined|" in key
        if a[key].get("tokens") != b[key].get("tokens") and (not timed or "|greedy|" in key):
            problems.append(f"tokens differ: {key}")
        elif not timed and a[key].get("steps") != b[key].get("steps"):
            problems.append(f"steps differ: {key}")
    print("\n".join(problems) or f"identical: {len(a)} generations")
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("--out", type=Path, required=True)
    rec.add_argument("--tokens", type=int, default=48)
    cmp_ = sub.add_parser("compare")
    cmp_.add_argument("before", type=Path)
    cmp_.add_argument("after", type=Path)
    args = parser.parse_args(argv)
    if args.command == "record":
        record(args.out, args.tokens)
        return 0
    return compare(args.before, args.after)


if __name__ == "__main__":
    raise SystemExit(main())
