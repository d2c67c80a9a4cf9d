"""MkDocs hooks for specdec's documentation (``mkdocs.yml``: ``hooks``).

Generated parts of pages, so that nothing the code knows is copied by hand:

- ``<!-- cli: COMMAND -->``: the command's usage and options, from ``specdec``'s own argparse
  parsers (which are built from the option specs in :mod:`specdec.options` and the registries);
- ``<!-- registry: drafters|policies|backends -->``: what is registered, with its help and options;
- ``<!-- bench: RUN [methods=a,b] -->`` and ``<!-- bench-categories: RUN [methods=a,b] -->``:
  tables from ``bench-results/RUN/results.json`` (:mod:`bench_tables`);
- ``<!-- loadtest: FILE [servers=a,b] -->``: a load test's table from its ``results.jsonl``
  (:func:`bench_tables.loadtest`); ``loadtest-ticks``: what its levels' ticks held
  (:func:`bench_tables.loadtest_ticks`);
- ``<!-- kernels: RUN -->``: a ``scripts/costs.py kernels`` run's table (:func:`bench_tables.kernels`);
- ``<!-- gpu: architectures|pair|smollm2 -->``: the GPU check's tables from
  ``bench-results/gpu-check/*.json`` (:mod:`gpu_tables`);
- ``<!-- v: FILE FIELD -->VALUE<!-- /v -->``: one number in the prose, bound to its results file and
  field (:mod:`doc_values`), shown as its value.

The committed benchmark results are also published with the site (``bench-results/``), so the
pages can link to the raw numbers.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "scripts"))

import bench_tables  # noqa: E402
import doc_values  # noqa: E402
import gpu_tables  # noqa: E402

MARKER = re.compile(r"<!--\s*(cli|registry|bench|bench-categories|loadtest|loadtest-ticks|kernels|gpu):\s*([^\s>]+)"
                    r"((?:\s+\w+=[^\s>]+)*)\s*-->")
PUBLISHED = (".json", ".jsonl", ".png")


def _escape(text: str) -> str:
    """Help text as table-cell Markdown: no cell breaks, and brackets are text, not links."""
    for char in "\\|[]<*":
        text = text.replace(char, "\\" + char)
    return text.replace("\n", " ")


def _flags(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.dest}`"
    names = ", ".join(f"`{o}`" for o in action.option_strings)
    if action.nargs == 0:
        return names
    metavar = action.metavar or (("{" + ",".join(map(str, action.choices)) + "}") if action.choices
                                 else action.dest.upper())
    return f"{names} `{metavar}`"


def cli_reference(command: str) -> str:
    from specdec.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    if command not in sub.choices:
        raise ValueError(f"no specdec command {command!r}")
    cmd = sub.choices[command]
    out = [f"```text\n{cmd.format_usage().strip()}\n```\n", cmd.description or "", "",
           "| option | default | what it does |", "|---|---|---|"]
    for action in cmd._actions:
        if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
            continue
        default = action.default
        shown = "" if default in (None, argparse.SUPPRESS, False) or action.nargs == 0 and default is False else f"`{default}`"
        out.append(f"| {_flags(action)} | {shown} | {_escape(action.help or '')} |")
    return "\n".join(out) + "\n"


def registry_table(kind: str) -> str:
    from specdec.options import all_options
    from specdec.registry import BACKENDS, DRAFTERS, POLICIES

    if kind == "drafters":
        owned = {}
        for opt in all_options():
            if getattr(opt, "owner", None):
                owned.setdefault(opt.owner, []).append(f"`{opt.name}`")
        rows = ["| drafter | what it drafts from | needs a draft model | its own options |", "|---|---|:---:|---|"]
        for entry in DRAFTERS:
            rows.append(f"| `{entry.name}` | {_escape(entry.help)} | {'yes' if entry.needs_draft_model else ''} | "
                        f"{', '.join(owned.get(entry.name, [])) } |")
        return "\n".join(rows) + "\n"
    if kind == "policies":
        rows = ["| policy | what it verifies |", "|---|---|"]
        rows += [f"| `{e.name}` | {_escape(e.help)} |" for e in POLICIES]
        return "\n".join(rows) + "\n"
    if kind == "backends":
        rows = ["| backend | what it runs | dtypes |", "|---|---|---|"]
        rows += [f"| `{e.name}` | {_escape(e.help)} | {', '.join(e.dtypes)} |" for e in BACKENDS]
        return "\n".join(rows) + "\n"
    raise ValueError(f"no registry {kind!r}")


def _render(match: re.Match) -> str:
    kind, arg, rest = match.group(1), match.group(2), match.group(3)
    params = dict(p.split("=", 1) for p in rest.split())
    methods = params["methods"].split(",") if "methods" in params else None
    servers = params["servers"].split(",") if "servers" in params else None
    if kind == "cli":
        return cli_reference(arg)
    if kind == "registry":
        return registry_table(arg)
    if kind == "bench":
        return bench_tables.table(arg, methods)
    if kind == "gpu":
        return gpu_tables.table(arg)
    if kind == "loadtest":
        return bench_tables.loadtest(arg, servers)
    if kind == "loadtest-ticks":
        return bench_tables.loadtest_ticks(arg, servers)
    if kind == "kernels":
        return bench_tables.kernels(arg)
    return bench_tables.categories(arg, methods)


def on_page_markdown(markdown: str, page, config, files) -> str:
    # A value marker (``<!-- v: FILE FIELD -->1.57x<!-- /v -->``) is left as its value: the pages are
    # checked against their results files by tests/test_doc_numbers.py, not re-rendered here.
    return MARKER.sub(_render, doc_values.strip(markdown))


def on_files(files, config):
    from mkdocs.structure.files import File

    results = ROOT / "bench-results"
    for path in sorted(results.rglob("*")):
        if path.is_file() and path.suffix in PUBLISHED:
            files.append(File(str(path.relative_to(ROOT)), str(ROOT), config["site_dir"],
                              config["use_directory_urls"]))
    return files
