"""Measure memory across generations (``Model.enable_memory``): how much a second pass over the
same questions, and a pass over *other* questions of the same categories, gain from the outputs
of a first pass. Greedy, n-gram drafter, same machine, runs interleaved per question.

    .venv/bin/python scripts/memory_second_pass.py --backend llamacpp --per-category 4
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import specdec
from specdec.drafting.suffix_index import NgramMemory

QUESTIONS = Path(__file__).resolve().parent.parent.parent / "shared/data/spec_bench/questions.jsonl"


def measure(model, prompts, memory, max_new_tokens, drafter) -> dict:
    model.loaded.memory = memory
    tokens = forwards = 0
    seconds = 0.0
    for prompt in prompts:
        out = model.generate(prompt, chat=model.has_chat_template, max_new_tokens=max_new_tokens, drafter=drafter)
        tokens += out.stats.new_tokens
        forwards += out.stats.target_forwards
        seconds += out.stats.wall_s
    return {"tokens": tokens, "mean_accepted_length": round(tokens / forwards, 3), "tokens_per_s": round(tokens / seconds, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--backend", default="llamacpp")
    parser.add_argument("--per-category", type=int, default=4, help="questions per category: half build, half test")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--drafter", default="ngram")
    args = parser.parse_args()
    by_category = defaultdict(list)
    for line in QUESTIONS.read_text(encoding="utf-8").splitlines():
        q = json.loads(line)
        if len(by_category[q["category"]]) < args.per_category:
            by_category[q["category"]].append(q["turns"][0])
    half = args.per_category // 2
    build = [p for ps in by_category.values() for p in ps[:half]]
    other = [p for ps in by_category.values() for p in ps[half:]]
    model = specdec.load(args.model, backend=args.backend)
    model.generate("Hello", max_new_tokens=4)  # warm-up and cost curve
    memory = NgramMemory()
    first = measure(model, build, memory, args.max_new_tokens, args.drafter)  # fills the memory
    frozen = len(memory)
    results = {"first_pass": first, "memory_ngrams": frozen,
               "same_questions_without": measure(model, build, None, args.max_new_tokens, args.drafter),
               "same_questions_with": measure(model, build, memory, args.max_new_tokens, args.drafter),
               "other_questions_without": measure(model, other, None, args.max_new_tokens, args.drafter),
               "other_questions_with": measure(model, other, memory, args.max_new_tokens, args.drafter)}
    print(json.dumps({"model": args.model, "backend": args.backend, "drafter": args.drafter,
                      "questions": {"build": len(build), "other": len(other)}, **results}, indent=1))


if __name__ == "__main__":
    main()
