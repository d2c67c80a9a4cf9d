"""How far drafting could raise a batched server's tokens/s over plain decoding at each load on this
machine, beside how far apart the same load test puts servers that did the same work.

The ceiling. On a CPU a tick's forwards are compute-bound: a forward costs about a + b·rows (a fit
over the layouts of ``scripts/tick_costs.py``). Plain decoding's rows are its tokens; drafting's are
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

    python scripts/load_ceiling.py --ticks bench-results/tick-costs/results.json \\
        --loadtest bench-results/loadtest-qwen/results.jsonl \\
        --loadtest bench-results/loadtest-qwen-heldout/results.jsonl --out bench-results/load-ceiling
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

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
    (line,) = [x for x in lines if x.get("server") == server and x.get("clients") == 1]
    counts = line["counts"]
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ticks", default="bench-results/tick-costs/results.json")
    parser.add_argument("--loadtest", action="append", required=True,
                        help="a load test's merged results.jsonl (several: one entry each)")
    parser.add_argument("--server", default="specdec", help="the drafting server whose 1-client counters give c")
    parser.add_argument("--out", default=None, help="a folder for results.json")
    args = parser.parse_args()

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
        "ticks": args.ticks, "tick_costs_commit": ticks.get("commit"), "cpu": ticks.get("cpu"),
        "context": ticks.get("context"), "forward_ms": round(a, 1), "row_ms": round(b, 1),
        # the share of a plain token's cost a draft token verified in its tick's forward saves at most
        "saving": {str(n): round(a / (a + b * n), 3) for n in LEVELS},
        "runs": runs,
        "command": "python scripts/load_ceiling.py " + " ".join(
            ["--ticks", args.ticks] + [x for p in args.loadtest for x in ("--loadtest", p)]
            + (["--server", args.server] if args.server != "specdec" else [])
            + (["--out", args.out] if args.out else [])),
    }
    text = json.dumps(results, indent=1)
    print(text)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "results.json").write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
