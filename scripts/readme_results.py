"""``make results``: every workload of the README's table run at one clean commit, then the table,
the results index and the pages' bound values regenerated from what it wrote.

    python scripts/readme_results.py             # run all five workloads (under an hour on 2 cores)
    python scripts/readme_results.py --dry-run   # print the commands

Each workload is one ``specdec bench`` run (:data:`readme_table.WORKLOADS`: our plain decoding and
`ngram` beside stock llama-server's plain decoding and n-gram types, in one process, interleaved per
question) into its ``bench-results/readme-*`` folder. The checkout must be clean, and stay at one
commit through all five runs: the table names one commit, and that commit reproduces every row. The
peers come from ``make llama-peers`` (``SPECDEC_LLAMA_CPP_BIN`` points at another build).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import readme_table

ROOT = Path(__file__).resolve().parent.parent
BUDGET_S = 60 * 60
TIMING = "bench-results/make-results"  # how long the runs took, where


def _git(*args: str, root: Path = ROOT) -> str:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True).stdout.strip()


# What the results depend on (as `specdec bench` refuses to publish from a dirty checkout): the
# runs themselves write bench-results/ and the pages, so those may change under them.
CODE_PATHS = ("src", "scripts", "patches", "Makefile", "pyproject.toml")


def clean_commit(root: Path = ROOT) -> str:
    """The commit the runs will record; an error when the checkout's code has uncommitted changes."""
    changed = _git("status", "--porcelain", "--untracked-files=all", "--", *CODE_PATHS, root=root)
    if changed:
        raise SystemExit("error: make results runs at a clean commit: commit or stash these first:\n" + changed)
    return _git("rev-parse", "--short=12", "HEAD", root=root)


def run_bench(command: list[str], root: Path) -> None:
    """One workload's bench, with the checkout's own specdec."""
    specdec = Path(sys.executable).parent / "specdec"
    subprocess.run([str(specdec) if specdec.exists() else command[0], *command[1:]], cwd=root, check=True)


def regenerate(root: Path = ROOT) -> None:
    """The README's table, the results index and the pages' bound values, from the new results."""
    import doc_values
    import results_index

    readme_table.write(root)
    (root / "bench-results" / "README.md").write_text(results_index.index(root / "bench-results"), encoding="utf-8")
    for page in doc_values.PAGES:
        text = page.read_text(encoding="utf-8")
        new = doc_values.rewrite(text, page, strict=False)
        if new != text:
            page.write_text(new, encoding="utf-8")


def run_all(root: Path = ROOT, bench: Callable[[list[str], Path], None] = run_bench) -> dict:
    """Every workload at the checkout's clean commit; then the generated pages. Returns the timing."""
    commit = clean_commit(root)
    started = time.time()
    seconds = {}
    for workload in readme_table.WORKLOADS:
        print(f"== {workload.name}: {' '.join(workload.command())}", flush=True)
        t = time.time()
        bench(workload.command(), root)
        seconds[workload.name] = round(time.time() - t, 1)
        if clean_commit(root) != commit:
            raise SystemExit(f"error: the checkout moved from {commit} during make results: run it again")
    recorded = {json.loads((root / w.folder / "results.json").read_text(encoding="utf-8")).get("commit")
                for w in readme_table.WORKLOADS}
    if recorded != {commit}:
        raise SystemExit(f"error: the runs recorded commits {sorted(map(str, recorded))}, not {commit} alone")
    timing = {"what": "make results: the README table's workloads, one specdec bench run each",
              "commit": commit, "machine": json.loads((root / readme_table.WORKLOADS[0].folder / "results.json")
                                                      .read_text(encoding="utf-8")).get("cpu"),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "seconds": seconds,
              "total_s": round(time.time() - started, 1), "budget_s": BUDGET_S}
    out = root / TIMING
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(timing, indent=1) + "\n", encoding="utf-8")
    regenerate(root)
    print(f"make results: {timing['total_s'] / 60:.1f} minutes at {commit}: {seconds}")
    if timing["total_s"] > BUDGET_S:
        print(f"warning: over the {BUDGET_S // 60}-minute budget", file=sys.stderr)
    return timing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = parser.parse_args(argv)
    if args.dry_run:
        for workload in readme_table.WORKLOADS:
            print(" ".join(workload.command()))
        return 0
    run_all()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
