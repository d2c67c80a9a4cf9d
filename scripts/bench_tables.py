"""Markdown tables from ``specdec bench`` results (``bench-results/*/results.json``), for the docs.

The documentation's benchmark tables are generated from the committed results by this script (the
docs build calls :func:`table`), never copied by hand:

    python scripts/bench_tables.py bench-results/qwen-editing            # one run's table
    python scripts/bench_tables.py bench-results/qwen-spec-bench --categories
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load(run: str | Path) -> dict:
    path = Path(run)
    path = path if path.is_absolute() else ROOT / path
    if path.is_dir():
        path = path / "results.json"
    return json.loads(path.read_text(encoding="utf-8"))


def _num(value, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def header(results: dict, run: str) -> str:
    """One line: what ran, where, when, and the command."""
    kernels = "exact" if results.get("exact") else "fast"
    return (f"`{results['model']}` on {results['backend']} ({kernels} kernels), {results.get('cpu', '?')}, "
            f"{results.get('date', '?')}, commit `{results.get('commit', '?')}`; "
            f"[results.json]({run}/results.json)\n\n```bash\n{results['command']}\n```\n")


def table(run: str, methods: list[str] | None = None) -> str:
    """Methods as rows: end-to-end and after-the-prompt tokens/s, their speed-ups over the same
    backend's plain, mean accepted length and whether every output equals plain decoding's."""
    results = load(run)
    rows = ["| method | tokens/s | speed-up | after the prompt: tokens/s | speed-up | accepted per step | identical |",
            "|---|---:|---:|---:|---:|---:|:---:|"]
    for name, method in results["methods"].items():
        if methods and name not in methods:
            continue
        o = method["overall"]
        rows.append(f"| `{name}` | {_num(o.get('tokens_per_s'))} | {_num(o.get('speedup'), 2)}x | "
                    f"{_num(o.get('gen_tokens_per_s'))} | {_num(o.get('gen_speedup'), 2)}x | "
                    f"{_num(o.get('mean_accepted_length'), 2)} | {'yes' if o.get('identical') else 'no'} |")
    return header(results, run) + "\n" + "\n".join(rows) + "\n"


def categories(run: str, methods: list[str] | None = None, key: str = "speedup") -> str:
    """Categories as rows, methods as columns: each method's ``key`` (end-to-end speed-up by default)."""
    results = load(run)
    names = [m for m in results["methods"] if not methods or m in methods]
    cats = sorted({c for m in names for c in results["methods"][m]["categories"]})
    rows = ["| category | " + " | ".join(f"`{m}`" for m in names) + " |",
            "|---|" + "---:|" * len(names)]
    for cat in cats + ["overall"]:
        cells = []
        for m in names:
            data = results["methods"][m]
            c = data["overall"] if cat == "overall" else data["categories"].get(cat, {})
            value = c.get(key)
            mark = "" if c.get("identical", True) else " *"
            cells.append("-" if value is None else f"{value:.2f}x{mark}")
        rows.append(f"| {cat} | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", help="a bench-results folder (or its results.json)")
    parser.add_argument("--methods", help="comma-separated: only these")
    parser.add_argument("--categories", action="store_true", help="the per-category speed-up table")
    args = parser.parse_args()
    methods = args.methods.split(",") if args.methods else None
    print(categories(args.run, methods) if args.categories else table(args.run, methods))


if __name__ == "__main__":
    main()
