"""What the index of earlier outputs costs: memory and lookup time at its default bound.

Fills an index (``specdec.drafting.suffix_index.NgramMemory``) with the tokens of HumanEval solutions
and Spec-Bench questions (Qwen2.5-Coder's tokenizer) until it is full, several times over so
eviction runs and common n-grams have many occurrences, then times the drafter's lookups at
random points of that text against the model's one-token forward (the cost curve's unit).

    python scripts/index_costs.py --out bench-results/index-costs
"""

from __future__ import annotations

import argparse
import json
import random
import time
import tracemalloc
from pathlib import Path

import specdec
from specdec.bench.questions import load_questions
from specdec.cpu import machine_tag
from specdec.drafting.suffix_index import DEFAULT_CAPACITY, NgramMemory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--capacity", type=int, default=DEFAULT_CAPACITY)
    parser.add_argument("--lookups", type=int, default=20000)
    parser.add_argument("--out", default="bench-results/index-costs")
    args = parser.parse_args()
    model = specdec.load(args.model, backend="llamacpp")
    texts = [q.prompt for q in load_questions("humaneval-files")[::3]] + [q.prompt for q in load_questions("spec-bench")]
    outputs = [model.encode(t) for t in texts]
    tracemalloc.start()
    memory = NgramMemory(capacity=args.capacity)
    added, t0 = 0, time.perf_counter()
    while added < 2 * args.capacity:
        for tokens in outputs:
            memory.add(tokens)
            added += len(tokens)
    add_s = time.perf_counter() - t0
    used, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rng = random.Random(0)
    tails = []
    for _ in range(args.lookups):
        tokens = rng.choice(outputs)
        end = rng.randrange(2, len(tokens))
        tails.append(tokens[max(0, end - 64):end])
    t0 = time.perf_counter()
    hits = sum(bool(memory.matches(t)[0]) for t in tails)
    lookup_s = (time.perf_counter() - t0) / len(tails)
    unit = model.loaded.cost_model().unit
    result = {"model": args.model, "cpu": machine_tag(), "capacity_tokens": args.capacity, "tokens_kept": len(memory),
              "outputs_kept": memory.outputs, "tokens_added": added, "bytes": used, "bytes_per_token": used / len(memory),
              "add_us_per_token": 1e6 * add_s / added, "lookup_us": 1e6 * lookup_s, "lookup_hit_rate": hits / len(tails),
              "one_token_forward_ms": 1e3 * unit, "lookup_over_forward": lookup_s / unit,
              "command": "python scripts/index_costs.py " + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items())}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
