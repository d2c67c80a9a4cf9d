"""Markdown tables from ``specdec bench`` results (``bench-results/*/results.json``), for the docs.

The documentation's benchmark tables are generated from the committed results by this script (the
docs build calls :func:`table`), never copied by hand:

    python scripts/bench_tables.py bench-results/readme-editing          # one run's table
    python scripts/bench_tables.py bench-results/readme-spec-bench --categories
    python scripts/bench_tables.py bench-results/loadtest-qwen/results.jsonl --loadtest
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
    """One line: what ran, where, when, and the command (files written before provenance was
    recorded have no date, commit or command: the page names the commit that added them)."""
    backend = results["backend"]
    if backend == "llamacpp":
        backend += f" ({'exact' if results.get('exact') else 'fast'} kernels)"
    else:
        backend += f" {results.get('dtype', '')}".rstrip()
    when = (f"{results['date']}, commit `{results.get('commit', '?')}`; " if "date" in results
            else "date and commit not recorded; ")
    command = f"\n```bash\n{results['command']}\n```\n" if "command" in results else ""
    return (f"`{results['model']}` on {backend}, {results.get('cpu', '?')}, {when}"
            f"[results.json]({run}/results.json)\n{command}")


def table(run: str, methods: list[str] | None = None) -> str:
    """Methods as rows: end-to-end and after-the-prompt tokens/s, their speed-ups over the same
    backend's plain, mean accepted length and whether every output equals plain decoding's."""
    results = load(run)
    chosen = {name: m["overall"] for name, m in results["methods"].items() if not methods or name in methods}
    # Runs from before the bench timed the prompt apart have no after-the-prompt figures.
    gen = any(o.get("gen_tokens_per_s") is not None for o in chosen.values())
    rows = ["| method | tokens/s | speed-up | " + ("after the prompt: tokens/s | speed-up | " if gen else "")
            + "accepted per step | identical |",
            "|---|---:|---:|" + ("---:|---:|" if gen else "") + "---:|:---:|"]
    for name, o in chosen.items():
        after = f"{_num(o.get('gen_tokens_per_s'))} | {_num(o.get('gen_speedup'), 2)}x | " if gen else ""
        rows.append(f"| `{name}` | {_num(o.get('tokens_per_s'))} | {_num(o.get('speedup'), 2)}x | {after}"
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


def _levels(paths: str) -> list[dict]:
    """The lines of one or more load-test files (comma-separated), one per server and level."""
    lines = []
    for name in paths.split(","):
        path = Path(name)
        path = path if path.is_absolute() else ROOT / path
        lines += [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [line for line in lines if "clients" in line]  # not the answers' comparison lines


def _seconds(value: float) -> str:
    return f"{value:.2f}" if value < 10 else f"{value:.1f}"


def _cell(level: dict, ttft_p95: bool = False) -> str:
    """Total tokens/s · latency p50 / p95 · time to first token p50 (and p95), then how many
    requests failed and how many answers differ from the same request at the first level. A level
    with failures has no figures in files written since the load test stopped computing them over
    the answered requests alone; older files have them, and the page says they do not compare."""
    parts = []
    if level.get("tokens_per_s") is not None:
        ttft = f"{level['ttft_p50_s']:.2f}" + (f" / {_seconds(level['ttft_p95_s'])}" if ttft_p95 else "")
        latency = f"{_seconds(level['p50_s'])} / {_seconds(level['p95_s'])} s"
        parts += [f"**{level['tokens_per_s']:.1f}**", latency, f"{ttft} s"]
    if level.get("failures"):
        parts.append(f"{level['failures']} failed")
    if level.get("retried"):
        parts.append(f"{level['retried']} sent again")
    if level.get("differ_from_first_level"):
        parts.append(f"{level['differ_from_first_level']} differ")
    return " · ".join(parts) or "-"


def loadtest(path: str, servers: list[str] | None = None) -> str:
    """A load test's results (``scripts/loadtest.py``, one JSON line per server and
    level; several files comma-separated): clients as rows and servers as columns, or, where every
    server ran one level, servers as rows with each one's total tokens/s over the first's."""
    levels = _levels(path)
    names = list(dict.fromkeys(line["server"] for line in levels))
    names = [n for n in (servers or names) if n in names] if servers else names
    clients = sorted({line["clients"] for line in levels if line["server"] in names})
    at = {(line["server"], line["clients"]): line for line in levels}
    if len(clients) == 1:
        first = at[(names[0], clients[0])].get("tokens_per_s")
        rows = [f"| server, {clients[0]} clients | **total tokens/s** · latency p50 / p95 · "
                f"time to first token p50 / p95 | total tokens/s over `{names[0]}` |", "|---|---|---:|"]
        for name in names:
            level = at[(name, clients[0])]
            ratio = level.get("tokens_per_s")
            ratio = f"{ratio / first:.2f}x" if ratio is not None and first else "-"
            rows.append(f"| `{name}` | {_cell(level, ttft_p95=True)} | {ratio} |")
        return "\n".join(rows) + "\n"
    rows = ["| clients | " + " | ".join(f"`{n}`" for n in names) + " |", "|---:|" + "---:|" * len(names)]
    for c in clients:
        cells = [_cell(at[(n, c)]) if (n, c) in at else "-" for n in names]
        rows.append(f"| {c} | " + " | ".join(cells) + " |")
    return ("Cells: **total tokens/s** · latency p50 / p95 · time to first token p50.\n\n"
            + "\n".join(rows) + "\n")


def loadtest_ticks(path: str, servers: list[str] | None = None) -> str:
    """What each level's ticks held, for the servers that count them (``scripts/loadtest.py``'s
    tick figures): clients as rows, servers as columns."""
    levels = [line for line in _levels(path) if line.get("ticks")]
    names = list(dict.fromkeys(line["server"] for line in levels))
    names = [n for n in servers if n in names] if servers else names
    clients = sorted({line["clients"] for line in levels if line["server"] in names})
    at = {(line["server"], line["clients"]): line for line in levels}
    timed = all("outside_ms_per_tick" in at[key] for key in at if key[0] in names)
    rows = ["| clients | " + " | ".join(f"`{n}`" for n in names) + " |", "|---:|" + "---:|" * len(names)]
    for c in clients:
        cells = []
        for n in names:
            t = at.get((n, c))
            times = f" · {t['forward_ms_per_tick']:.1f} · {t['outside_ms_per_tick']:.2f}" if t and timed else ""
            cells.append("-" if t is None else
                         f"{t['sequences_per_tick']:.1f} · {t['drafted_per_tick']:.2f} · {t['accepted_per_tick']:.2f} · "
                         f"{t['ticks_per_token']:.3f} · {100 * t['no_draft_share']:.0f}%{times}")
        rows.append(f"| {c} | " + " | ".join(cells) + " |")
    times = (" · milliseconds per tick in its forwards · milliseconds per tick outside them (the level's wall "
             "time less the forwards', over its ticks)") if timed else ""
    return ("Cells: sequences · draft rows · accepted draft tokens per tick · ticks per generated token · "
            f"share of ticks that verified no draft{times}.\n\n" + "\n".join(rows) + "\n")


KERNEL_SETTINGS = {
    "exact": "exact, specdec's kernels (the default)",
    "fast": "fast (`--no-exact`), the same build",
    "capped": "exact capped at 3 rows a micro-batch (`SPECDEC_MULTIROW=0`)",
    "stock": "exact on a stock build without llamafile (capped)",
    "stock-fast": "the llama.cpp users get (`make llama-peers`: llamafile on), its own kernels",
    "previous": "exact, the build given as `--previous-lib` (the command above)",
}


def kernels(run: str) -> str:
    """A ``scripts/costs.py kernels`` run (its folder, or a .json file of one): milliseconds of a
    forward of k rows per kernel setting, exact over each other setting, and how many rows of a
    k-row forward differ from k one-row forwards, with where it ran."""
    results = load(run)
    link = run if run.endswith(".json") else f"{run}/results.json"
    sizes = list(results["ms"]["exact"])
    head = "| kernels | " + " | ".join(sizes) + " |\n|---|" + "---:|" * len(sizes)
    rows = [f"| {KERNEL_SETTINGS.get(name, name)} | " + " | ".join(_num(ms[k]) for k in sizes) + " |"
            for name, ms in results["ms"].items()]
    for name in results["ms"]:
        if name != "exact":
            rows.append(f"| exact over {name} | " + " | ".join(
                f"{results['ms']['exact'][k] / results['ms'][name][k]:.2f}x" for k in sizes) + " |")
    for model, settings in results.get("rows_differing_from_one_row_forwards", {}).items():
        for name, differing in settings.items():
            rows.append(f"| rows differing from one-row forwards: {name}, {model} | "
                        + " | ".join(str(differing.get(k, "-")) for k in sizes) + " |")
    where = (f"`{results.get('model', '?')}`, {results.get('cpu', '?')} ({results.get('build_isa', '?')} build), "
             f"{results.get('date', '?')}, commit `{results.get('commit') or 'not recorded'}`; "
             f"[{Path(link).name}]({link}); milliseconds of one forward of k new rows (the fastest round)")
    return f"{where}\n\n```bash\n{results['command']}\n```\n\n{head}\n" + "\n".join(rows) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", help="a bench-results folder (or its results.json)")
    parser.add_argument("--methods", help="comma-separated: only these")
    parser.add_argument("--categories", action="store_true", help="the per-category speed-up table")
    parser.add_argument("--loadtest", action="store_true", help="RUN is a load test's results.jsonl")
    args = parser.parse_args()
    methods = args.methods.split(",") if args.methods else None
    if args.loadtest:
        print(loadtest(args.run, methods))
    else:
        print(categories(args.run, methods) if args.categories else table(args.run, methods))


if __name__ == "__main__":
    main()
