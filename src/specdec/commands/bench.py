"""``specdec bench``: argument parsing, the live table, and the files it writes."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from specdec import option_forms
from specdec.commands.common import (add_model_options, add_options, add_sampling_options, announce, check_context,
                                     check_positive, choose_backend, load_options)
from specdec.errors import SpecdecError
from specdec.files import atomic_open, write_atomic

NAME = "bench"
ORDER = 10


def add_parser(sub) -> None:
    from specdec.bench.methods import method_forms
    from specdec.bench.questions import prompt_set_names

    bench = sub.add_parser(NAME, help="benchmark methods on a prompt set (Spec-Bench, HumanEval, ...)",
                           description="Run plain decoding, our speculative methods and the peers' "
                                       "on the same questions, interleaved, and write results.json and plots.")
    add_model_options(bench)
    bench.add_argument("--questions", metavar="SET|FILE",
                       help="a prompt set shipped with specdec: " + ", ".join(prompt_set_names()) + " (Spec-Bench's "
                            "13 categories; HumanEval functions to complete; the same functions to edit; an agent's "
                            "repair loop on them, tests run between turns; Spec-Bench's two-turn chats; files asked "
                            "about; answers as JSON following a schema), SET:FILE (the set built from another file "
                            "of its format), or a .jsonl file of Spec-Bench questions (question_id, category, turns), "
                            "HumanEval problems (task_id, prompt, ...) or OpenAI chat request bodies (messages, and "
                            "optionally id, category, response_format, max_tokens)")
    bench.add_argument("--categories", help="comma-separated categories to keep")
    bench.add_argument("--limit", type=int, help="first N questions of each category")
    add_options(bench, ("max_new_tokens",))
    bench.add_argument("--repeats", type=int, default=1, metavar="R",
                       help="run each method R times per question and keep the fastest (timing noise on a "
                            "shared VM only adds time; default 1)")
    bench.add_argument("--min-seconds", type=float, default=0.0, metavar="S",
                       help="add rounds of a question (beyond --repeats, up to 12 in all) until each method has "
                            "run it for S seconds in total: short answers get more runs, so their fastest run is "
                            "as sure as a long answer's (default 0: --repeats rounds)")
    add_sampling_options(bench)
    bench.add_argument("--methods", help="comma-separated: " + ", ".join(method_forms()))
    bench.add_argument("--cost-curve", action="store_true",
                       help="measure the forward cost for K = 1..32 new tokens and print speed-up bounds")
    bench.add_argument("--out", default="bench-out", help="output folder (default: bench-out)")


def run(args: argparse.Namespace) -> int:
    check_positive(args.limit, "--limit")
    check_positive(args.repeats, "--repeats")
    if not args.min_seconds >= 0:
        raise SpecdecError(f"--min-seconds must be >= 0, got {args.min_seconds}")
    # The length and sampling every method shares (checked here); a method adds its own options.
    base = option_forms.from_args(args)
    choose_backend(args)  # the methods are checked against the backend that will run them
    specs = [m.strip() for m in (args.methods or "").split(",") if m.strip()]
    if not specs and not args.cost_curve:
        raise SpecdecError("give --methods (e.g. plain,ngram,hf-plain,hf-lookup) and/or --cost-curve")
    if specs and not args.questions:
        from specdec.bench.questions import prompt_set_names

        raise SpecdecError("--methods needs --questions (" + ", ".join(prompt_set_names()) + " or FILE.jsonl)")
    from specdec.bench.methods import check_specs

    check_specs(specs, args.backend, base, model=args.model)
    out = _output_folder(args.out)
    _refuse_unpublishable(out)
    questions = []
    if specs:
        from specdec.bench.questions import load_questions

        categories = [c.strip() for c in args.categories.split(",")] if args.categories else None
        questions = load_questions(args.questions, categories, args.limit)

    from specdec.api import load
    from specdec.bench import cost_curve, plots
    from specdec.bench.methods import MethodFactory, baseline
    from specdec.commands.common import quiet_libraries
    from specdec.cpu import machine_tag
    from specdec.commands.common import resolve_model

    check_context(resolve_model(args.model, args.backend), args.max_new_tokens)  # after the cheap checks: it may download
    quiet_libraries()
    model = load(args.model, **load_options(args))
    announce(args, model)
    factory = MethodFactory(model, args.model, args.backend, args.dtype, base)
    methods = [factory.build(s) for s in specs]
    # Every speed-up needs its family's plain method in the same run.
    for family in {m.family for m in methods}:
        if baseline(family) not in [m.name for m in methods]:
            methods.insert(0, factory.build(baseline(family)))
    console = Console(stderr=True)
    results: dict = {"model": args.model, "backend": args.backend, "dtype": args.dtype, "exact": model.exact,
                     "max_new_tokens": args.max_new_tokens, "temperature": args.temperature,
                     "repeats": args.repeats, "min_seconds": args.min_seconds, "cpu": machine_tag(),
                     # the prompts, as asked and as loaded: the results index reads which set (held out
                     # from tuning or not) from here
                     "questions": args.questions, "categories": args.categories, "limit": args.limit,
                     "question_ids": [q.question_id for q in questions],
                     **provenance(), "methods": {}}
    if methods:
        bench, results["methods"] = _run(model, methods, questions, args, console)
        if bench.failed:
            results["failed"] = bench.failed  # peer methods that crashed: name -> error
        _write_outputs(out, bench, model)
        _count_valid(results, bench, model)
        plots.plot_speedups(results, out / "speedup_by_category.png")
        plots.plot_tokens_per_s(results, out / "tokens_per_s.png")
    if args.cost_curve:
        curve = cost_curve.measure(model)
        results["cost_curve"] = {"seconds": {str(k): v for k, v in curve.items()},
                                 "bounds": {m: cost_curve.bounds(curve, r["overall"])
                                            for m, r in results["methods"].items()}}
        plots.plot_cost_curve(results["cost_curve"]["seconds"], out / "cost_curve.png",
                              f"{args.model} ({args.backend}, {args.dtype}): cost of one forward")
        _print_cost_curve(console, curve, results)
    write_atomic(out / "results.json", json.dumps(results, indent=2))
    console.print(f"wrote {out / 'results.json'}" + (" and plots" if methods else ""))
    return 0


def provenance() -> dict:
    """What reproduces a result file: the command line, the specdec version and the git commit
    (with ``+dirty`` when the checkout had changes), and when it ran."""
    import shlex
    import subprocess
    import sys
    import time

    import specdec

    root = _checkout()
    commit = None
    if root is not None:
        try:
            commit = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"],
                                    capture_output=True, text=True, timeout=5).stdout.strip() or None
            # Dirty means the code changed (CODE_PATHS): results written by earlier runs, pages and
            # notes do not change what runs (make results' later workloads follow its earlier ones'
            # outputs, tracked files of the same checkout).
            if commit and _uncommitted(root):
                commit += "+dirty"
        except (OSError, subprocess.SubprocessError):
            commit = None
    return {"command": "specdec " + shlex.join(sys.argv[1:]), "version": specdec.__version__, "commit": commit,
            "date": time.strftime("%Y-%m-%d %H:%M %Z")}


# What results depend on: a change to any of these makes a results file unreproducible from its commit.
CODE_PATHS = ("src", "scripts", "patches", "Makefile", "pyproject.toml")


def _checkout() -> Path | None:
    """The git checkout specdec runs from (None: an installed package)."""
    import subprocess

    import specdec

    here = Path(specdec.__file__).resolve().parent
    try:
        top = subprocess.run(["git", "-C", str(here), "rev-parse", "--show-toplevel"], capture_output=True,
                             text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return Path(top) if top else None


def _uncommitted(root: Path) -> list[str]:
    """The code files of ``root`` with uncommitted changes (:data:`CODE_PATHS`)."""
    import subprocess

    listed = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=all", "--",
                             *CODE_PATHS], capture_output=True, text=True, timeout=10).stdout
    return [line[3:] for line in listed.splitlines() if line.strip()]


def _refuse_unpublishable(out: Path) -> None:
    """Results written into the checkout's ``bench-results/`` are published: they must come from
    committed code, so that the commit they record reproduces them. Elsewhere a dirty checkout is
    allowed (and recorded: ``+dirty``)."""
    root = _checkout()
    if root is None or not out.resolve().is_relative_to((root / "bench-results").resolve()):
        return
    changed = _uncommitted(root)
    if changed:
        shown = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
        raise SpecdecError(f"--out {out} is in bench-results/, and the checkout has uncommitted changes ({shown}): "
                           "commit them first, so that the commit the results record reproduces them, or write "
                           "the results elsewhere")


def _output_folder(name: str) -> Path:
    """``--out``: a folder that exists or can be made, and can be written (checked before loading)."""
    from specdec.cache import writable_dir

    out = Path(name)
    if out.exists() and not out.is_dir():
        raise SpecdecError(f"--out {name} is a file: give a folder for results.json and the plots")
    try:
        return writable_dir(out)
    except SpecdecError:
        raise SpecdecError(f"--out {name}: cannot write to this folder") from None


def _run(model, methods, questions, args, console: Console):
    from specdec.bench.runner import run_bench, summarize

    progress = Progress(TextColumn("[bold]bench"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        TextColumn("{task.description}"), console=console)
    task = progress.add_task("", total=len(questions))
    with Live(Group(progress), console=console, refresh_per_second=4, transient=True) as live:
        def update(bench, i):
            progress.update(task, completed=i + 1, description=questions[i].category)
            live.update(Group(progress, results_table(summarize(bench, model, i + 1, divergences=False), overall_only=True)))

        bench = run_bench(model, methods, questions, args.max_new_tokens, args.temperature == 0, args.seed, update,
                          args.repeats, args.min_seconds)
    summary = summarize(bench, model)
    console.print(results_table(summary))
    for name, error in bench.failed.items():
        console.print(f"[yellow]{name} failed and was dropped:[/yellow] {error}")
    return bench, summary


def results_table(methods: dict, overall_only: bool = False) -> Table:
    """Speed-up per category (rows) and method (columns), or one overall row while running."""
    table = Table(title="speed-up over plain of the same backend (tokens/s)", header_style="bold")
    table.add_column("category")
    for m in methods:
        table.add_column(m, justify="right")
    cats = [] if overall_only else sorted({c for r in methods.values() for c in r["categories"]})
    for cat in cats + ["overall"]:
        cells = []
        for r in methods.values():
            s = r["overall"] if cat == "overall" else r["categories"].get(cat)
            if s is None:
                cells.append("-")
                continue
            sp = "-" if s["speedup"] is None else f"{s['speedup']:.2f}x"
            mark = "" if s["identical"] in (None, True) else "*"
            noise = "~" if s.get("within_noise") else ""
            cells.append(f"{sp}{mark}{noise} ({s['tokens_per_s']:.1f})")
        table.add_row(cat, *cells, style="bold" if cat == "overall" else None)
    from specdec.compare import MIN_EFFECT

    table.caption = ("* = greedy output not token-identical to the baseline (see results.json); ~ = within "
                     "run-to-run noise: the middle half of the per-question speed-ups (speedup_spread) "
                     f"includes 1.00x, or the speed-up is within {MIN_EFFECT:.0%} of it")
    return table


def _write_outputs(out: Path, bench, model) -> None:
    """Every answer: its tokens and text, what it cost, and, where its question gave a JSON Schema,
    whether the text is JSON valid against it."""
    with atomic_open(out / "outputs.jsonl") as fh:
        for m in bench.methods:
            for q, r in zip(bench.questions, bench.runs[m.name]):
                s = r.stats
                text = model.loaded.codec.final_text(r.token_ids)
                extra = {"valid": schema_valid(text, q.schema)} if q.schema is not None else {}
                fh.write(json.dumps({"question_id": q.question_id, "category": q.category, "method": m.name,
                                     "token_ids": r.token_ids, "text": text, **extra, "wall_s": round(r.wall_s, 4),
                                     "target_forwards": r.target_forwards, "drafted": None if s is None else s.drafted,
                                     "accepted": None if s is None else s.accepted, "turns": r.turns,
                                     **({"outcome": r.outcome} if r.outcome is not None else {})}) + "\n")


def _count_valid(results: dict, bench, model) -> None:
    """Each method's share of answers valid against their question's JSON Schema (where any had one)."""
    asked = [i for i, q in enumerate(bench.questions) if q.schema is not None]
    if not asked:
        return
    for m in bench.methods:
        runs = bench.runs[m.name]
        valid = sum(schema_valid(model.loaded.codec.final_text(runs[i].token_ids), bench.questions[i].schema)
                    for i in asked if i < len(runs))
        results["methods"][m.name]["overall"]["schema_valid"] = round(valid / len(asked), 4)


def schema_valid(text: str, schema: dict) -> bool:
    """Whether ``text`` is one JSON value valid against ``schema`` (an end-of-sequence token's text,
    if any, is not part of it)."""
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), schema)
    except (json.JSONDecodeError, jsonschema.ValidationError):
        return False
    return True


def _print_cost_curve(console: Console, curve: dict[int, float], results: dict) -> None:
    table = Table(title="cost of one target forward (~200-token cache)", header_style="bold")
    table.add_column("K new tokens", justify="right")
    table.add_column("ms", justify="right")
    table.add_column("ms/token", justify="right")
    table.add_column("x one token", justify="right")
    for k, s in sorted(curve.items()):
        table.add_row(str(k), f"{s * 1000:.1f}", f"{s * 1000 / k:.1f}", f"{s / curve[1]:.2f}")
    console.print(table)
    rows = [(m, b) for m, b in results["cost_curve"]["bounds"].items() if b]
    if not rows:
        return
    bt = Table(title="expected speed-up vs measured", header_style="bold")
    for col in ("method", "alpha", "K", "c", "Leviathan bound", "CPU-corrected bound", "measured"):
        bt.add_column(col, justify="right")
    for m, b in rows:
        measured = results["methods"][m]["overall"]["speedup"]
        bt.add_row(m, f"{b['alpha']:.3f}", f"{b['K']:.2f}", f"{b['c']:.4f}", f"{b['leviathan_bound']:.2f}x",
                   f"{b['cpu_bound']:.2f}x", "-" if measured is None else f"{measured:.2f}x")
    console.print(bt)
