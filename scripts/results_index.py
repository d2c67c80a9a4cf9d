"""bench-results/README.md: the index of the results kept, generated from the folders themselves and
from the pages that cite them.

What each folder shows is written here, once (:data:`FOLDERS`); its prompts (held out from tuning or
not), date, commit and machine are read from its own results file, the README table's runs
(``make results``) from their records alone; where each is cited is computed from the links and
value markers of README.md and docs/, and which tests read it from tests/. A folder that nothing
cites or reads, a folder without its line here, and a line, link or marker whose folder is gone
all fail :func:`index` (and so ``tests/test_docs.py``), so bench-results/ holds what the pages
rely on and nothing else.

    python scripts/results_index.py            # print the index
    python scripts/results_index.py --write    # write bench-results/README.md
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import readme_results

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench-results"
TUNING, HELDOUT = "tuning", "held-out"

# folder -> what it shows
FOLDERS: dict[str, str] = {
    "heldout-inputs": "the held-out prompts themselves (HumanEval problems 16-30, Spec-Bench's 3rd and 4th two-turn "
                      "questions), not results",
    "qwen-kernels-stock": "an exact forward of k rows against the llama.cpp users get (make llama-peers, llamafile on) "
                          "and the same build's fast kernels, in one run (scripts/costs.py kernels); avx2.json: the "
                          "same on an AVX2-only CPU, beside the previous patch (4 rows a pass in the AVX2 loops)",
    "amx-kernels": "an exact forward of k rows with AMX buffers (tiles, and the multi-row VNNI kernels for 2-4 rows) "
                   "against the same patch's build without AMX and the llama.cpp users get (scripts/costs.py kernels)",
    "gpu-check": "the GPU check: the engine on CUDA graphs (random-weight 1.5B/0.5B/7B, SmolLM2-135M on Spec-Bench "
                 "against transformers, the GPU server under load)",
    "index-costs": "the n-gram index of earlier outputs: memory and lookup cost at its bound (scripts/costs.py index)",
    "grammar-costs": "what a grammar engine's token masks cost on Qwen2.5-Coder's vocabulary: llguidance and "
                     "xgrammar, beside a plain step (scripts/costs.py grammar)",
    "loadtest-qwen": "`specdec serve` against stock llama-server under 1-16 concurrent clients",
    "loadtest-qwen-heldout": "the same load test on held-out prompts (bench-results/heldout-inputs)",
    "tick-costs": "what a shared tick costs by its layout: drafts beside other sequences' steps "
                  "(scripts/costs.py ticks); a plain step and a prompt beside stock llama-server's, at a short "
                  "and a long context (scripts/step_check.py: step-check*.json)",
    "load-ceiling": "what drafting could give under load at most, from the tick costs and the load tests' counters, "
                    "beside servers that did the same work (scripts/ceilings.py load); one-client-*.json: "
                    "what a drafter could make of their 1-client level, their requests' answers "
                    "(one-client-*-answers.json) replayed through drafters on this CPU's cost curve "
                    "(cost-curve.json), the prompts' time as measured (scripts/ceilings.py single)",
    "loadtest-index": "serving clients that ask about the same files: the per-key index of earlier answers",
    "ray-routing": "Ray Serve routing by prompt prefix against round robin (scripts/ray_routing.py)",
}


# The prompts of folders whose records do not name them: other scripts' runs, and `specdec bench` runs
# from before results.json recorded its command (all on the shipped Spec-Bench set).
PROMPTS = {
    "heldout-inputs": HELDOUT, "gpu-check": TUNING, "loadtest-qwen": TUNING, "loadtest-qwen-heldout": HELDOUT,
    "grammar-costs": "fixed JSON answers", "tick-costs": "random tokens", "load-ceiling": "tuning and held-out",
    "loadtest-index": TUNING, "ray-routing": TUNING,
}
# The README table's runs and how long `make results` took: named by the workloads themselves.
GENERATED = {Path(w.folder).name: f"README table: {w.name}" for w in readme_results.WORKLOADS}
GENERATED["make-results"] = "how long `make results` took, per workload (scripts/readme_results.py)"
GENERATED["readme-editing"] += ("; aider.json: aider's whole-file edit through specdec serve and stock llama-server "
                                "(scripts/aider_check.py)")
GENERATED["make-test"] = "`make test` from a fresh clone: setup, the suite, where its time goes (tests/suite_time.py)"


def prompts(folder: Path) -> str:
    """Which prompts a run used, from its record (``specdec bench`` names them), else as listed."""
    path = folder / "results.json"
    if path.exists():
        data = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(data.get("questions"), str) or "--questions" in data.get("command", ""):
            return readme_results.prompts(data)
    return PROMPTS.get(folder.name, "-")


def provenance(folder: Path) -> tuple[str, str, str]:
    """(date, commit, machine) from the folder's results file, or what it lacks said so."""
    for name in ("results.json", "report.json", "architectures.json"):
        path = folder / name
        if path.exists():
            data = json.loads(path.read_text(encoding="utf-8"))
            date = str(data["date"])[:10] if data.get("date") else "not recorded"
            return (date, str(data.get("commit") or data.get("code") or "not recorded"),
                    str(data.get("cpu") or data.get("machine") or data.get("device") or "not recorded"))
    jsonl = folder / "results.jsonl"
    if jsonl.exists():
        # A load test's lines; since scripts/loadtest_servers.sh records it, one says where and when.
        for line in jsonl.read_text(encoding="utf-8").splitlines():
            data = json.loads(line) if line.strip() else {}
            if "run" in data and "date" in data:
                return str(data["date"])[:10], str(data.get("commit", "not recorded")), str(data.get("cpu", "not recorded"))
        return "not recorded", "not recorded", "not recorded"
    return "-", "-", "-"


# How a page names a folder: a link or path (bench-results/FOLDER), or a value marker (<!-- v: FOLDER...).
CITATION = re.compile(r"bench-results/([\w.-]+)|<!-- v: ([\w.-]+)[/ ]")


def _title(page: Path, root: Path) -> str:
    heading = re.search(r"^# (.+)$", page.read_text(encoding="utf-8"), re.M)
    return f"[{heading.group(1) if heading else page.stem}](../{page.relative_to(root).as_posix()})"


def citations(root: Path = ROOT) -> dict[str, list[str]]:
    """folder -> the pages (README.md, docs/) that cite it, and the tests that read it."""
    cited: dict[str, list[str]] = {}
    pages = [root / "README.md", *sorted((root / "docs").rglob("*.md"))]
    for page in pages:
        if not page.exists():
            continue
        for match in CITATION.finditer(page.read_text(encoding="utf-8")):
            name = match.group(1) or match.group(2)
            where = _title(page, root)
            if where not in cited.setdefault(name, []):
                cited[name].append(where)
    for test in sorted((root / "tests").glob("test_*.py")):
        text = test.read_text(encoding="utf-8")
        for name in sorted(set(re.findall(r'"bench-results"\s*/\s*"([\w.-]+)"', text))):
            if name in cited or (root / "bench-results" / name).is_dir():  # not a test's own scratch folder
                cited.setdefault(name, []).append(f"`tests/{test.name}`")
    return cited


def index(results: Path = RESULTS) -> str:
    """The README of ``results``: what every folder shows, where it came from and where it is cited."""
    root = results.parent if (results.parent / "docs").is_dir() else ROOT
    folders = sorted(p.name for p in results.iterdir() if p.is_dir())
    known = {**FOLDERS, **GENERATED}
    unknown = [f for f in folders if f not in known]
    if unknown:
        raise ValueError(f"bench-results/ folders without a line in scripts/results_index.py: {', '.join(unknown)}")
    missing = [f for f in FOLDERS if f not in folders]
    if missing:
        raise ValueError(f"scripts/results_index.py names folders that are gone: {', '.join(missing)}")
    cited = citations(root)
    gone = sorted(name for name in cited if name not in folders and name != "README.md")
    if gone:
        raise ValueError(f"pages cite bench-results folders that are gone: {', '.join(gone)}")
    uncited = [f for f in folders if not cited.get(f)]
    if uncited:
        raise ValueError(f"bench-results/ folders no page cites and no test reads: {', '.join(uncited)} "
                         "(remove them with git rm -r: git keeps them)")
    rows = ["| folder | what it shows | prompts | date | commit | machine | cited in |", "|---|---|---|---|---|---|---|"]
    for name in [f for f in GENERATED if f in folders] + list(FOLDERS):
        date, commit, machine = provenance(results / name)
        commit = commit if commit in ("-", "not recorded") else f"`{commit}`"
        rows.append(f"| [`{name}`]({name}/) | {known[name]} | {prompts(results / name)} | {date} | {commit} | "
                    f"{machine} | {', '.join(cited[name])} |")
    return ("# Benchmark results\n\nThe current result of each workload that README.md or docs/ cite or a test "
            "reads, one folder per run (superseded runs are not kept: git has them). Generated by "
            "`python scripts/results_index.py --write`; the *cited in* column is computed from the pages' links and "
            "value markers and the tests, and a test fails when a folder has no line, a line no folder, or a folder "
            "nothing cites. A `specdec bench` folder holds `results.json` (per method and category: tokens/s end to "
            "end and after the prompt, speed-ups over the same backend's plain method, the median round beside the "
            "fastest where a question ran several, accepted length, acceptance, whether greedy output is identical to "
            "plain decoding's; its command, commit, date and machine), `outputs.jsonl` and plots. *Held-out* prompts "
            "are ones no tuning looked at (`heldout-inputs`); *tuning* prompts are the shipped sets the drafters and "
            "policies were tuned on. \"not recorded\": a run whose script did not record it.\n\n"
            + "\n".join(rows) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="write bench-results/README.md")
    args = parser.parse_args(argv)
    text = index()
    if args.write:
        (RESULTS / "README.md").write_text(text, encoding="utf-8")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
