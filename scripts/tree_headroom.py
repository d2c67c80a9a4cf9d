"""How many tokens per target forward could the n-gram index give, chain vs tree, if verifying
were free? (Without ``--costs`` every step verifies the whole draft of the given size; with it,
the adaptive policy cuts each draft on that cost curve, as in the engine.)

Replays the plain greedy outputs a bench run wrote (``outputs.jsonl``): each step the drafter
proposes from the prompt + output so far, the longest path agreeing with the real output is
accepted, plus the target's own token. This bounds what ``ngram:tree`` can gain over ``ngram``
in mean accepted length on those prompts, whatever the cost curve.

    python scripts/tree_headroom.py BENCH_OUT_DIR --model gemma3-270m [--width 8] [--costs FILE]

Measured on Gemma-3-270M's greedy answers to 26 Spec-Bench prompts (2 per category, 64 tokens):
the tree's MAL is 1.01-1.03x the chain's of the same size, and a 64-node tree of width 8 is 2.63
vs 2.43 for the default 12-token chain (1.08x). The index rarely holds the right token where its
top continuation is wrong, so ``ngram:tree`` cannot reach 1.2x ``ngram``'s MAL on these prompts.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specdec import load
from specdec.costs import CostModel, _parse_seconds
from specdec.policies.adaptive import AdaptiveK
from specdec.bench.questions import load_questions
from specdec.drafting.acceptance import AcceptanceTable
from specdec.drafters import ngram
from specdec.drafters.ngram import NgramDrafter
from specdec.drafting.suffix_index import ngram_bucket, ngram_prior
from specdec.verify import verify_by_choice, verify_tree_by_choice


def replay(prompt: list[int], out: list[int], tree: bool, k: int, table,
           costs: CostModel | None = None) -> tuple[int, int, float]:
    """(tokens, steps, estimated seconds) of one replayed generation; with ``costs`` the adaptive
    policy cuts each draft to the prefix that pays, as in the engine."""
    drafter = NgramDrafter(tree=tree, table=table)
    drafter.begin(prompt, None)
    policy = AdaptiveK(costs, k) if costs is not None else None
    t = steps = 0
    seconds = 0.0
    while t < len(out):
        draft = drafter.propose(prompt + out[:t], k)
        if policy is not None and draft.tokens:
            draft = draft.truncated(policy.choose(draft))
        seconds += costs.step(len(draft) + 1) if costs is not None else 0.0
        # The engine's own greedy verification, with the recorded answer as the target's tokens
        # (-1 past its end: nothing matches there).
        def target_token(row: int, depth: int) -> int:
            return out[t + depth] if t + depth < len(out) else -1
        if draft.parents is not None:
            verdict = verify_tree_by_choice(draft.tokens, draft.parents, target_token)
        else:
            verdict = verify_by_choice(draft.tokens, lambda depth: target_token(depth, depth))
        if draft.tokens:
            drafter.verified(draft, verdict)
        t += verdict.num_accepted + 1
        steps += 1
    drafter.close()
    return min(t, len(out)), steps, seconds


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("bench_dir")
    ap.add_argument("--model", default="gemma3-270m")
    ap.add_argument("--questions", default="../shared/data/spec_bench/questions.jsonl")
    ap.add_argument("--sizes", default="1,2,4,8,16,32")
    ap.add_argument("--costs", help="a cached cost curve (specdec cache costs/*.json): cut drafts by the policy")
    ap.add_argument("--width", type=int, help="most children per tree node (default: the drafter's)")
    args = ap.parse_args()
    if args.width:
        ngram.WIDTH = args.width
    model = load(args.model, backend="llamacpp")
    questions = {q.question_id: q for q in load_questions(args.questions)}
    outs = [json.loads(line) for line in Path(args.bench_dir, "outputs.jsonl").read_text().splitlines()]
    outs = [o for o in outs if o["method"] == "plain"]
    prompts = {o["question_id"]: model.encode(questions[o["question_id"]].prompt, chat=model.has_chat_template)
               for o in outs}

    def curve() -> CostModel | None:
        # Cost files from before the shape-switch cost have no "switch" entry: read them as 0.
        return CostModel(*_parse_seconds({"switch": 0.0, **json.loads(Path(args.costs).read_text())})) if args.costs else None

    for k in map(int, args.sizes.split(",")):
        row = []
        for tree in (False, True):
            table = AcceptanceTable(ngram_prior, ngram_bucket)  # learns over the questions, as in bench
            costs = curve()
            tokens = steps = 0
            seconds = 0.0
            for o in outs:
                n, s, sec = replay(prompts[o["question_id"]], o["token_ids"], tree, k, table, costs)
                tokens += n
                steps += s
                seconds += sec
            row.append((tokens / steps, tokens * costs.forward(1) / seconds if costs else 0.0))
        print(f"size {k:3d}: chain MAL {row[0][0]:.3f} (x{row[0][1]:.2f})  tree MAL {row[1][0]:.3f} (x{row[1][1]:.2f})  "
              f"MAL ratio {row[1][0] / row[0][0]:.3f}")


if __name__ == "__main__":
    main()
