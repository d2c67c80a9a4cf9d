"""The README's one results table, generated from the results files it cites (never typed by hand).

Each row is one ``specdec bench`` run (one workload): our plain decoding and `ngram`, and stock
llama-server's plain and best n-gram type where that run had them, in tokens per second after the
prompt (``gen_tokens_per_s``: what speculation changes) with the end-to-end speed-up beside it.

    python scripts/readme_table.py            # print the table
    python scripts/readme_table.py --write    # put it into README.md between its markers

A test checks that README.md holds exactly what this prints.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from bench_tables import load

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- results-table: begin -->", "<!-- results-table: end -->"
PEER_PLAIN = "llama-server-plain"

# (workload, what it ran on, results folder): the current run of each workload.
ROWS = (
    ("editing", "8 held-out functions, 400 tokens", "bench-results/qwen-heldout-edit-dip"),
    ("agent repair loop", "8 held-out problems, tests between turns", "bench-results/qwen-heldout-repair-dip-rerun"),
    ("two-turn chats", "16 held-out conversations", "bench-results/qwen-heldout-2turn-peers-dip"),
    ("Spec-Bench", "13 categories x 4 questions", "bench-results/qwen-spec-bench-dip"),
    ("HumanEval", "12 problems to complete", "bench-results/qwen-humaneval"),
)


def _rate(method: dict) -> str:
    o = method["overall"]
    return f"{o['gen_tokens_per_s']:.1f}"


def _with_speedup(method: dict) -> str:
    o = method["overall"]
    mark = "" if o.get("identical") in (None, True) else ", answers differ"
    return f"{o['gen_tokens_per_s']:.1f} ({o['gen_speedup']:.2f}x; {o['speedup']:.2f}x{mark})"


def table(root: Path = ROOT) -> str:
    """The table with its caption: metric, machine, dates and commits read from the files."""
    lines = ["| workload | specdec plain | specdec `ngram` | llama-server plain | llama-server best n-gram type |",
             "|---|---:|---:|---:|---:|"]
    machines, dates, identical = set(), set(), True
    for workload, what, folder in ROWS:
        results = load(root / folder)
        methods = results["methods"]
        machines.add(results.get("cpu", "?"))
        dates.add(results.get("date", "?")[:10])
        identical &= all(m["overall"].get("identical") is not False for n, m in methods.items()
                         if not n.startswith("llama-server-"))
        peers = {n: m for n, m in methods.items() if n.startswith("llama-server-") and n != PEER_PLAIN}
        best = max(peers, key=lambda n: peers[n]["overall"]["gen_tokens_per_s"], default=None)
        lines.append(
            f"| [{workload}]({folder}/results.json) ({what}; `{results.get('commit') or '?'}`) | "
            f"{_rate(methods['plain'])} | {_with_speedup(methods['ngram'])} | "
            f"{_rate(methods[PEER_PLAIN]) if PEER_PLAIN in methods else 'not in this run'} | "
            f"{f'`{best[len(PEER_PLAIN) - 5:]}` ' + _with_speedup(peers[best]) if best else 'not in this run'} |")
    caption = (f"Qwen2.5-Coder-1.5B-Instruct (Q4_K_M) on llama.cpp, greedy, {', '.join(sorted(machines))}, "
               f"{' to '.join(sorted(dates)[::max(1, len(dates) - 1)])}. **Tokens per second after the prompt** "
               "(`gen_tokens_per_s`), in brackets the speed-up after the prompt and end to end (prompt "
               "included) over the same server's plain decoding; "
               + ("every specdec answer identical to plain decoding's. " if identical else
                  "**some specdec answers differ from plain decoding's** (see the results files). ")
               + "Each workload links its `results.json` (its command inside); the commit it ran at beside it.")
    return caption + "\n\n" + "\n".join(lines) + "\n"


def written(readme: str) -> str:
    """What README.md holds between the markers (a clear error if they are missing)."""
    match = re.search(re.escape(BEGIN) + r"\n(.*?)" + re.escape(END), readme, re.S)
    if match is None:
        raise ValueError(f"README.md has no {BEGIN} ... {END} block")
    return match.group(1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="put the table into README.md")
    args = parser.parse_args(argv)
    text = table()
    if args.write:
        path = ROOT / "README.md"
        readme = path.read_text(encoding="utf-8")
        written(readme)  # the markers must be there
        block = re.compile(re.escape(BEGIN) + r"\n.*?" + re.escape(END), re.S)
        path.write_text(block.sub(lambda _: f"{BEGIN}\n{text}{END}", readme, count=1), encoding="utf-8")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
