"""Where the test suite's time goes, from its own log, and whether `make test` kept its budget.

Every pytest run writes its timing log (``tests/conftest.py``: each test's setup, call and teardown
seconds, the session's wall time, the pytest-xdist workers that shared the tests, and under ``make
test`` when make started, so setup counts too) to ``.build/test-times.json``. This script reads it:

    python tests/suite_time.py report                 # setup, collection, the slowest files, tests and fixtures
    python tests/suite_time.py check --budget 900     # exit 1 when a full `make test` took longer (make test runs this)
    python tests/suite_time.py record bench-results/make-test   # keep a fresh clone's run as a results file

``check`` judges only a full run (the whole suite, nothing deselected) started by `make test`; a
partial run's log is reported, not judged.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOG = ROOT / ".build" / "test-times.json"
BUDGET_S = 15 * 60


def load(path: Path = LOG) -> dict:
    if not path.exists():
        raise SystemExit(f"error: no timing log at {path} (pytest writes it at the end of every run)")
    return json.loads(path.read_text(encoding="utf-8"))


def total_s(log: dict) -> float:
    """The run's time from make's start (setup included) where make started it, else the session's."""
    if log.get("make_start") is not None:
        return log["finished"] - log["make_start"]
    return log["wall_s"]


def setup_s(log: dict) -> float | None:
    """Seconds between make's start and the session's: `make setup` and the browser's install."""
    return None if log.get("make_start") is None else log["started"] - log["make_start"]


def by_file(log: dict) -> dict[str, float]:
    files: dict[str, float] = defaultdict(float)
    for nodeid, t in log["tests"].items():
        files[nodeid.split("::")[0]] += t["setup"] + t["call"] + t["teardown"]
    return dict(sorted(files.items(), key=lambda kv: -kv[1]))


def slowest(log: dict, phase: str | None = None, n: int = 25) -> list[tuple[str, float]]:
    """The n slowest tests (all phases), or the n slowest in one phase (``setup``: fixtures loading)."""
    rows = [(nodeid, t[phase] if phase else t["setup"] + t["call"] + t["teardown"])
            for nodeid, t in log["tests"].items()]
    return sorted(rows, key=lambda r: -r[1])[:n]


def _clock(seconds: float) -> str:
    seconds = round(seconds)
    return f"{seconds // 60}:{seconds % 60:02d}"


def report(log: dict, n: int = 15) -> str:
    tests_s = sum(t["setup"] + t["call"] + t["teardown"] for t in log["tests"].values())
    counts = ", ".join(f"{v} {k}" for k, v in log["outcomes"].items() if v)
    lines = [f"{'full' if log['full_run'] else 'partial'} run of {len(log['tests'])} tests ({counts}) on "
             f"{log.get('machine', '?')}, commit {log.get('commit') or '?'}"]
    if setup_s(log) is not None:
        lines.append(f"make test: {_clock(total_s(log))} (setup {_clock(setup_s(log))}, suite {_clock(log['wall_s'])})")
    else:
        lines.append(f"suite: {_clock(log['wall_s'])}")
    workers = log.get("workers", 1)
    if workers > 1:  # pytest-xdist: the tests' seconds add up over the workers
        lines.append(f"  tests {tests_s:.0f} s on {workers} workers: {tests_s / max(log['wall_s'], 1e-9):.2f} "
                     f"of them busy on average")
    else:
        lines.append(f"  collection and session overhead {log['wall_s'] - tests_s:.0f} s, tests {tests_s:.0f} s")
    lines.append(f"the {n} slowest files:")
    lines += [f"  {s:7.1f} s  {name}" for name, s in list(by_file(log).items())[:n]]
    lines.append(f"the {n} slowest fixture setups (a model loaded for the tests after it):")
    lines += [f"  {s:7.1f} s  {name}" for name, s in slowest(log, "setup", n) if s >= 0.5]
    lines.append(f"the {n} slowest tests:")
    lines += [f"  {s:7.1f} s  {name}" for name, s in slowest(log, None, n)]
    return "\n".join(lines)


def check(log: dict, budget_s: float = BUDGET_S) -> str | None:
    """Why a full `make test` run broke its budget (None when it kept it, or when it was not one)."""
    if not log["full_run"] or log.get("make_start") is None:
        return None
    if total_s(log) > budget_s:
        return (f"make test took {_clock(total_s(log))}, over its budget of {_clock(budget_s)} "
                f"(setup {_clock(setup_s(log))}, suite {_clock(log['wall_s'])}): see where the time went above")
    return None


def record(log: dict, out: Path) -> dict:
    """A fresh clone's `make test`, as a results file the docs can cite."""
    if not log["full_run"] or log.get("make_start") is None:
        raise SystemExit("error: only a full run started by `make test` is recorded")
    files = by_file(log)
    result = {
        "what": "make test from a fresh clone with empty caches (pip, specdec's models, matplotlib)",
        "machine": log.get("machine"), "commit": log.get("commit"), "date": log.get("date"),
        "total_s": round(total_s(log), 1), "setup_s": round(setup_s(log), 1), "suite_s": round(log["wall_s"], 1),
        "budget_s": BUDGET_S, "workers": log.get("workers", 1), "tests": len(log["tests"]), "outcomes": log["outcomes"],
        "failed_tests": log.get("failed", []),
        "files_s": {name: round(s, 1) for name, s in files.items()},
        "slowest_tests_s": {name: round(s, 1) for name, s in slowest(log)},
        "slowest_setups_s": {name: round(s, 1) for name, s in slowest(log, "setup", 10)},
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("report", "check", "record"))
    parser.add_argument("out", nargs="?", type=Path, help="record: the results folder")
    parser.add_argument("--log", type=Path, default=LOG)
    parser.add_argument("--budget", type=float, default=BUDGET_S, help="seconds (check)")
    args = parser.parse_args(argv)
    log = load(args.log)
    if args.action == "record":
        if args.out is None:
            parser.error("record needs the results folder")
        record(log, args.out)
        print(f"wrote {args.out / 'results.json'}")
        return 0
    print(report(log))
    if args.action == "check":
        broken = check(log, args.budget)
        if broken:
            print(f"error: {broken}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
