"""What a shared tick costs by its layout on the batched llama.cpp context: sequences at a given
context length, each putting one row (a plain step) or more (its step and draft rows) in one
``llama_decode``, with llama.cpp's split of the tick into forwards. It answers what a draft costs
the other sequences of a tick on this machine: a tick of 4 one-row steps against the same tick
with one sequence's 3 draft rows (an extra forward) or with every sequence's row doubled.

    python scripts/tick_costs.py --out bench-results/tick-costs --context 700 --rounds 5

Layouts are timed in turn, round after round (the median of the rounds counts: a shared machine's
slow minute then weighs on every layout alike); each tick's rows are removed after it, so every
round sees the same cache.
"""

from __future__ import annotations

import argparse
import datetime
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

# "NxR": N sequences (ids 0, 1, ...) of R rows each; "+k": the first of them has k draft rows more
# ("+4x3": the first four, 3 each).
LAYOUTS = {
    "1x1": [1], "1x1+3": [4],
    "4x1": [1] * 4, "4x2": [2] * 4, "4x4": [4] * 4, "4x1+3": [4, 1, 1, 1],
    "8x1": [1] * 8, "8x2": [2] * 8, "8x1+1": [2] + [1] * 7, "8x1+3": [4] + [1] * 7, "8x1+4x3": [4] * 4 + [1] * 4,
    "16x1": [1] * 16, "16x2": [2] * 16,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--context", type=int, default=700, help="cells each sequence holds before the tick")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default=None, help="a folder for results.json")
    parser.add_argument("--unified", action="store_true",
                        help="one KV cache for all sequences instead of a stream each: llama.cpp then "
                             "computes any layout in one forward, and each row's attention scans every "
                             "sequence's cells (what unequal rows would cost there; specdec's batching "
                             "keeps a stream per sequence, whose cells stay in position order)")
    args = parser.parse_args()

    import specdec
    from specdec.backends.llamacpp_batched import forwards
    from specdec.backends.llamacpp_lib import lib
    from specdec.cpu import machine_tag

    model = specdec.load(args.model, backend="llamacpp")
    model.loaded.enable_batching(16)
    shared = model.loaded.batched
    if args.unified:  # the same sequences on another context (the streams' one freed: its KV cache is large)
        lib().llama_free(shared.ctx)
        shared.layout = (shared.layout[0], shared.layout[1], True)
        shared.ctx = shared.weights.context(shared.layout)
    backends = [shared.backend() for _ in range(16)]
    rng = random.Random(0)
    for backend in backends:
        backend.reset()
        backend.prefill([rng.randrange(1000, 20000) for _ in range(args.context)])
    llama = lib()
    memory = llama.llama_get_memory(shared.ctx)

    def tick(rows: list[int]) -> float:
        subs = []
        for seq, n in enumerate(rows):
            base = len(backends[seq].tokens)
            subs.append(shared.submission(seq, [100 + i for i in range(n)], [base + i for i in range(n)],
                                          [[seq]] * n, [True] * n))
        t0 = time.perf_counter()
        shared._run(subs)
        seconds = time.perf_counter() - t0
        for seq in range(len(rows)):
            llama.llama_memory_seq_rm(memory, seq, len(backends[seq].tokens), -1)
        return seconds

    times: dict[str, list[float]] = {name: [] for name in LAYOUTS}
    for _ in range(args.rounds):
        for name, rows in LAYOUTS.items():
            times[name].append(tick(rows))
    ms = {name: round(1000 * statistics.median(v), 1) for name, v in times.items()}
    plain = {n: ms[f"{n}x1"] for n in (1, 4, 8, 16)}
    results = {
        "model": args.model, "cpu": machine_tag(), "context": args.context, "rounds": args.rounds,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True).stdout.strip(),
        "command": "python scripts/tick_costs.py " + " ".join(sys.argv[1:]),
        "ms": ms,
        # each layout's tick over the tick of the same sequences' one-row steps
        "over_plain_tick": {name: round(ms[name] / plain[len(rows)], 2) for name, rows in LAYOUTS.items()},
        "kv": "unified" if args.unified else "a stream per sequence",
        # split_simple (unified) takes n_ubatch rows a forward, whatever their sequences
        "forwards": {name: ([(sum(rows), len(rows))] if args.unified and sum(rows) <= shared.weights.n_ubatch
                            else forwards(list(range(len(rows))), rows, shared.weights.n_ubatch))
                     for name, rows in LAYOUTS.items()},
    }
    text = json.dumps(results, indent=1)
    print(text)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "results.json").write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
