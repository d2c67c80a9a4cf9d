"""The README's one results table and ``make results``, which measures it.

The table: each row is one ``specdec bench`` run of one workload (:data:`WORKLOADS`) on
Qwen2.5-Coder-1.5B: our plain decoding and `ngram`, and stock llama-server's plain decoding and its
best n-gram type in the same run, in tokens per second after the prompt (``gen_tokens_per_s``: what
speculation changes) with the speed-ups beside them, generated from the results files (never typed
by hand); the prompts of each row (held out from tuning or not), the commit and the machine are read
from the runs' own records. A test checks that README.md holds exactly what ``--table`` prints.

``make results`` runs every workload at one clean commit, one ``specdec bench`` run each into its
``bench-results/readme-*`` folder (our methods beside stock llama-server's in one process,
interleaved per question), then regenerates the table, the results index and the pages' bound
values from what it wrote. The checkout must be clean, and stay at one commit through all six runs:
the table names one commit, and that commit reproduces every row. The peers come from ``make
llama-peers`` (``SPECDEC_LLAMA_CPP_BIN`` points at another build).

    python scripts/readme_results.py               # run all six workloads (under an hour on 2 cores)
    python scripts/readme_results.py --dry-run     # print the commands
    python scripts/readme_results.py --table       # print the table
    python scripts/readme_results.py --write-table # put it into README.md between its markers
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench_tables import load

ROOT = Path(__file__).resolve().parent.parent

# --- the table ------------------------------------------------------------------------------------
BEGIN, END = "<!-- results-table: begin -->", "<!-- results-table: end -->"
PEER_PLAIN = "llama-server-plain"
HELDOUT = "bench-results/heldout-inputs/"
MODEL = "qwen2.5-coder-1.5b"
# Our methods, and llama-server's plain decoding and the n-gram types that led on these workloads
# before (its best per workload is the row's; the others stay in results.json).
METHODS = ("plain", "ngram", PEER_PLAIN, "llama-server-ngram-simple", "llama-server-ngram-mod")


@dataclass(frozen=True)
class Workload:
    """One row: what it is called, what it asks, where its results go, and the bench's arguments."""

    name: str
    what: str
    folder: str
    questions: str
    limit: int
    max_new_tokens: int
    repeats: int = 1
    def command(self) -> list[str]:
        """The ``specdec bench`` command of this row (``make results`` runs it)."""
        return ["specdec", "bench", "--model", MODEL, "--backend", "llamacpp", "--questions", self.questions,
                "--limit", str(self.limit), "--max-new-tokens", str(self.max_new_tokens),
                "--repeats", str(self.repeats), "--methods", ",".join(METHODS), "--out", self.folder]


# Sized so that the six runs take under an hour on a 2-core machine, peers included.
WORKLOADS = (
    Workload("editing", "functions to return with one change", "bench-results/readme-editing",
             f"humaneval-edit:{HELDOUT}humaneval-p8-15.jsonl", 8, 400),
    Workload("agent repair loop", "problems to solve, tests between turns", "bench-results/readme-repair",
             f"humaneval-repair:{HELDOUT}humaneval-p8-15.jsonl", 8, 256),
    Workload("two-turn chats", "conversations", "bench-results/readme-2turn",
             f"spec-bench-2turn:{HELDOUT}spec-bench-2turn-q3q4.jsonl", 1, 256),
    Workload("Spec-Bench", "questions, 2 of each of 13 categories", "bench-results/readme-spec-bench",
             "spec-bench", 2, 256),
    Workload("HumanEval", "problems to complete", "bench-results/readme-humaneval", "humaneval", 12, 256),
    # Every method is given the JSON Schema (ours constrain with it, llama-server turns it into its grammar).
    Workload("structured output", "functions described as JSON, to a schema", "bench-results/readme-structured",
             f"structured:{HELDOUT}humaneval-p8-15.jsonl", 8, 256),
)


def prompts(results: dict) -> str:
    """Which prompts a run used, from its record: ``held-out`` (a file of bench-results/heldout-inputs,
    prompts no tuning looked at) or ``tuning`` (the shipped sets the drafters and policy were tuned
    on). Runs recorded before results.json named its prompts are read from their command."""
    asked = results.get("questions")
    if not isinstance(asked, str):  # older runs: the command says
        asked = None
        found = re.search(r"--questions\s+(\S+)", results.get("command", ""))
        asked = found.group(1) if found else None
    if asked is None:
        return "not recorded"
    return "held-out" if HELDOUT in asked or "heldout-inputs/" in asked else "tuning"


def _rate(method: dict) -> str:
    return f"{method['overall']['gen_tokens_per_s']:.1f}"


def _with_speedup(method: dict) -> str:
    o = method["overall"]
    mark = "" if o.get("identical") in (None, True) else ", answers differ"
    return f"{o['gen_tokens_per_s']:.1f} ({o['gen_speedup']:.2f}x; {o['speedup']:.2f}x{mark})"


def best_peer(methods: dict) -> str | None:
    """llama-server's n-gram type with the most tokens per second after the prompt in this run."""
    peers = {n: m for n, m in methods.items() if n.startswith("llama-server-") and n != PEER_PLAIN}
    return max(peers, key=lambda n: peers[n]["overall"]["gen_tokens_per_s"], default=None)


def table(root: Path = ROOT) -> str:
    """The table with its caption: metric, machine, commit and prompts read from the files."""
    lines = ["| workload | prompts | specdec plain | specdec `ngram` | llama-server plain | "
             "llama-server's best n-gram type |",
             "|---|---|---:|---:|---:|---:|"]
    machines, commits, dates, identical = set(), set(), set(), True
    for w in WORKLOADS:
        folder = w.folder
        if not (root / folder / "results.json").exists():
            lines.append(f"| {w.name} | not yet run by `make results` | | | | |")
            continue
        results = load(root / folder)
        methods = results["methods"]
        machines.add(results.get("cpu", "?"))
        commits.add(results.get("commit") or "?")
        dates.add(results.get("date", "?")[:10])
        identical &= all(m["overall"].get("identical") is not False for n, m in methods.items()
                         if not n.startswith("llama-server-"))
        best = best_peer(methods)
        count = len(results.get("question_ids") or []) or results.get("limit") or _limit(results)
        asked = f"{count} {prompts(results)} {w.what}"
        valid = [m["overall"]["schema_valid"] for n, m in methods.items()
                 if not n.startswith("llama-server-") and "schema_valid" in m["overall"]]
        if valid:
            asked += "; every specdec answer valid" if min(valid) == 1 else f"; specdec answers valid: {min(valid):.0%}"
        lines.append(
            f"| [{w.name}]({folder}/results.json) | {asked} | "
            f"{_rate(methods['plain'])} | {_with_speedup(methods['ngram'])} | "
            f"{_rate(methods[PEER_PLAIN]) if PEER_PLAIN in methods else 'not in this run'} | "
            f"{f'`{best[len(PEER_PLAIN) - 5:]}` ' + _with_speedup(methods[best]) if best else 'not in this run'} |")
    commit = ", ".join(f"`{c}`" for c in sorted(commits))
    caption = (f"Qwen2.5-Coder-1.5B-Instruct (Q4_K_M) on llama.cpp, greedy, {', '.join(sorted(machines))}, "
               f"commit {commit}, {' to '.join(sorted(dates)[::max(1, len(dates) - 1)])} (`make results`). "
               "**Tokens per second after the prompt** (`gen_tokens_per_s`), in brackets the speed-up after the "
               "prompt and end to end (prompt included) over the same server's plain decoding; "
               + ("every specdec answer identical to plain decoding's. " if identical else
                  "**some specdec answers differ from plain decoding's** (see the results files). ")
               + "*Held-out* prompts are ones no tuning looked at (`bench-results/heldout-inputs`), *tuning* "
               "prompts the shipped sets the drafter and policy were tuned on. Each workload links its "
               "`results.json`, its command inside.")
    return caption + "\n\n" + "\n".join(lines) + "\n"


def _limit(results: dict) -> str:
    """How many prompts a run asked for, from its command (``--limit``), where its record does not say."""
    found = re.search(r"--limit\s+(\d+)", results.get("command", ""))
    return found.group(1) if found else "some"


def written(readme: str) -> str:
    """What README.md holds between the markers (a clear error if they are missing)."""
    match = re.search(re.escape(BEGIN) + r"\n(.*?)" + re.escape(END), readme, re.S)
    if match is None:
        raise ValueError(f"README.md has no {BEGIN} ... {END} block")
    return match.group(1)


def write(root: Path = ROOT) -> None:
    """Put the table into ``root``'s README.md between its markers."""
    path = root / "README.md"
    readme = path.read_text(encoding="utf-8")
    written(readme)  # the markers must be there
    block = re.compile(re.escape(BEGIN) + r"\n.*?" + re.escape(END), re.S)
    path.write_text(block.sub(lambda _: f"{BEGIN}\n{table(root)}{END}", readme, count=1), encoding="utf-8")


# --- make results: the workloads run ------------------------------------------------------------
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

    write(root)
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
    for workload in WORKLOADS:
        print(f"== {workload.name}: {' '.join(workload.command())}", flush=True)
        t = time.time()
        bench(workload.command(), root)
        seconds[workload.name] = round(time.time() - t, 1)
        if clean_commit(root) != commit:
            raise SystemExit(f"error: the checkout moved from {commit} during make results: run it again")
    recorded = {json.loads((root / w.folder / "results.json").read_text(encoding="utf-8")).get("commit")
                for w in WORKLOADS}
    if recorded != {commit}:
        raise SystemExit(f"error: the runs recorded commits {sorted(map(str, recorded))}, not {commit} alone")
    timing = {"what": "make results: the README table's workloads, one specdec bench run each",
              "commit": commit, "machine": json.loads((root / WORKLOADS[0].folder / "results.json")
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
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--dry-run", action="store_true", help="print the workloads' commands, run nothing")
    what.add_argument("--table", action="store_true", help="print the table from the results files, run nothing")
    what.add_argument("--write-table", action="store_true", help="put the table into README.md, run nothing")
    args = parser.parse_args(argv)
    if args.dry_run:
        for workload in WORKLOADS:
            print(" ".join(workload.command()))
    elif args.table:
        print(table())
    elif args.write_table:
        write()
    else:
        run_all()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
