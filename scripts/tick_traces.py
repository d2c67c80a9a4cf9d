"""What a batch's ticks did, summed up from a tick trace (``SPECDEC_TICK_TRACE=FILE specdec serve
...`` writes every tick of the batched llama.cpp context as a JSON line: its sequences, their rows
and the draft rows each offered, the forwards llama.cpp split it into, its seconds).

    python scripts/tick_traces.py ticks.jsonl [more.jsonl ...] [--out summary.json]

For each file: the decoding ticks (prompts' ticks apart: a submission of several rows that verifies
no draft is a prompt), split into those that verified a draft and those that did not, with their
mean seconds, sequences, rows and forwards; how often running sequences were left out of a tick
(they then step in one of their own); the draft rows offered to the batch's choice and taken.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def summary(lines: list[dict]) -> dict:
    """The figures of one trace (one context's ticks)."""
    prompt = [t for t in lines if any(r > 1 and d == 0 for r, d in zip(t["rows"], t["drafted"]))]
    decoding = [t for t in lines if t not in prompt]
    drafting = [t for t in decoding if any(t["drafted"])]
    plain = [t for t in decoding if not any(t["drafted"])]
    busy = [t for t in decoding if len(t["running"]) >= 2]
    behind = [len(set(t["running"]) - set(t["seqs"])) for t in busy]

    def kind(ticks: list[dict]) -> dict:
        if not ticks:
            return {"ticks": 0}
        return {"ticks": len(ticks), "seconds": round(sum(t["seconds"] for t in ticks), 2),
                "mean_s": round(statistics.mean(t["seconds"] for t in ticks), 3),
                "sequences": round(statistics.mean(len(t["seqs"]) for t in ticks), 2),
                "rows": round(statistics.mean(sum(t["rows"]) for t in ticks), 2),
                "draft_rows": round(statistics.mean(sum(t["drafted"]) for t in ticks), 2),
                "forwards": round(statistics.mean(len(t["forwards"]) for t in ticks), 2)}

    offered = sum(o for t in lines for o in t["offered"] if o is not None)
    taken = sum(d for t in lines for o, d in zip(t["offered"], t["drafted"]) if o is not None)
    return {"prompt_ticks": kind(prompt), "drafting_ticks": kind(drafting), "plain_ticks": kind(plain),
            "ticks_leaving_some_behind": round(sum(b > 0 for b in behind) / len(busy), 3) if busy else None,
            "left_behind_per_tick": round(statistics.mean(behind), 2) if behind else None,
            "offered_rows": offered, "taken_rows": taken}


def summarize(path: Path) -> dict:
    """Every context's summary in a trace file (a draft model's ticks are a context of their own)."""
    by_context: dict[int, list[dict]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            tick = json.loads(line)
            by_context.setdefault(tick.get("context", 0), []).append(tick)
    return {str(i): summary(ticks) for i, ticks in enumerate(by_context.values())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=None, help="also write the summaries here (JSON)")
    args = parser.parse_args(argv)
    out = {path.name: summarize(path) for path in args.traces}
    text = json.dumps(out, indent=1)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
