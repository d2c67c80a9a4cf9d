"""The generated parts of specdec's documentation, committed as Markdown, and the MkDocs hooks.

A generated section of a page sits between a begin marker that says what it holds and
``<!-- /generated -->``; ``python scripts/docs_hooks.py --write`` (``make docs``) rewrites every
section from its source, so the pages read whole on GitHub and nothing the code or a results file
knows is copied by hand. ``--check`` lists the sections that are stale (``tests/test_docs.py`` fails
on them). The begin markers:

- ``<!-- cli: COMMAND -->``: the command's usage and options, from ``specdec``'s own argparse
  parsers (which are built from the option specs in :mod:`specdec.options` and the registries);
- ``<!-- registry: drafters|policies|backends -->``: what is registered, with its help and options;
- ``<!-- metrics: server -->``: the server's Prometheus metrics (:mod:`specdec.server.metrics`);
- ``<!-- api: DOTTED.NAME [members=a,b] -->``: a function's or class's signature and docstring;
- ``<!-- bench: RUN [methods=a,b] -->`` and ``<!-- bench-categories: RUN [methods=a,b] -->``:
  tables from ``bench-results/RUN/results.json`` (:mod:`bench_tables`);
- ``<!-- loadtest: FILE [servers=a,b] -->``: a load test's table from its ``results.jsonl``
  (:func:`bench_tables.loadtest`); ``loadtest-ticks``: what its levels' ticks held
  (:func:`bench_tables.loadtest_ticks`);
- ``<!-- kernels: RUN -->``: a ``scripts/costs.py kernels`` run's table (:func:`bench_tables.kernels`);
- ``<!-- gpu: architectures|pair|smollm2|paged|serve -->``: the GPU check's tables from
  ``bench-results/gpu-check/*.json`` (:mod:`gpu_tables`).

One number in the prose is a value marker instead (``<!-- v: FILE FIELD -->VALUE<!-- /v -->``,
:mod:`doc_values`, ``python scripts/doc_values.py --write``). As MkDocs hooks (``mkdocs.yml``), this
module shows value markers as their values and publishes the committed results (``bench-results/``)
with the site, so pages can link to the raw numbers.

    python scripts/docs_hooks.py --write    # regenerate every section in place
    python scripts/docs_hooks.py --check    # list stale sections; exit 1 if any
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "scripts"))

import bench_tables  # noqa: E402
import doc_values  # noqa: E402
import gpu_tables  # noqa: E402

KINDS = "cli|registry|metrics|api|bench|bench-categories|loadtest|loadtest-ticks|kernels|gpu"
END = "<!-- /generated -->"
SECTION = re.compile(r"(?P<begin><!--\s*(?P<kind>" + KINDS + r"):\s*(?P<arg>[^\s>]+)(?P<rest>(?:\s+\w+=[^\s>]+)*)"
                     r"\s*-->)(?P<body>.*?)" + re.escape(END), re.S)
PAGES = sorted((ROOT / "docs").rglob("*.md"))
PUBLISHED = (".json", ".jsonl", ".png", ".txt")


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
    """A ``specdec`` command's usage line and a table of its options with their defaults."""
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
        shown = "" if default in (None, argparse.SUPPRESS, False) else f"`{default}`"
        out.append(f"| {_flags(action)} | {shown} | {_escape(action.help or '')} |")
    return "\n".join(out) + "\n"


def registry_table(kind: str) -> str:
    """What a registry holds: drafters, policies or backends, with their help (and options)."""
    from specdec.options import all_options
    from specdec.registry import BACKENDS, DRAFTERS, POLICIES

    if kind == "drafters":
        owned: dict[str, list[str]] = {}
        for opt in all_options():
            if getattr(opt, "owner", None):
                owned.setdefault(opt.owner, []).append(f"`{opt.name}`")
        rows = ["| drafter | what it drafts from | needs a draft model | its own options |", "|---|---|:---:|---|"]
        for entry in DRAFTERS:
            rows.append(f"| `{entry.name}` | {_escape(entry.help)} | {'yes' if entry.needs_draft_model else ''} | "
                        f"{', '.join(owned.get(entry.name, []))} |")
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


def metrics_table(what: str) -> str:
    """The server's metrics as ``/metrics`` exposes them: name, type, labels, what each counts."""
    if what != "server":
        raise ValueError(f"no metrics {what!r}")
    from prometheus_client import Counter, Gauge, Histogram

    from specdec.server.metrics import ServerMetrics, _BatchCollector

    rows = ["| metric | type | labels | what it counts |", "|---|---|---|---|"]
    for metric in vars(ServerMetrics()).values():
        if isinstance(metric, (Counter, Gauge, Histogram)):
            kind = metric._type
            name = metric._name + ("_total" if kind == "counter" else "")
            if kind == "histogram":
                name += "_bucket / _sum / _count"
            labels = ", ".join(f"`{label}`" for label in metric._labelnames)
            rows.append(f"| `{name}` | {kind} | {labels} | {_escape(metric._documentation)} |")
    for _, name, help_text in _BatchCollector.COUNTERS:
        rows.append(f"| `specdec:{name}_total` | counter (batched servers) | | {_escape(help_text)} |")
    return "\n".join(rows) + "\n"


def _docstring(obj) -> str:
    """A docstring as Markdown: reST's double backticks and roles become code spans."""
    text = inspect.getdoc(obj) or "(no docstring)"
    text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text)
    text = text.replace("``", "`")
    text = re.sub(r"^:param (\w+):", r"- `\1`:", text, flags=re.M)
    text = re.sub(r"^:(returns?|raises \w+):", r"- \1:", text, flags=re.M)
    return text


def _signature(name: str, obj) -> str:
    try:
        signature = inspect.signature(obj, eval_str=True)
    except (NameError, TypeError, ValueError):  # an annotation only a type checker can evaluate
        try:
            signature = inspect.signature(obj)
        except (TypeError, ValueError):
            return f"```python\n{name}\n```\n"
    params = [p for p in signature.parameters.values() if p.name not in ("self", "cls")]
    signature = re.sub(r"\b(?:collections\.abc|typing)\.", "", str(signature.replace(parameters=params)))
    return f"```python\n{name}{signature}\n```\n"


def api_reference(dotted: str, members: list[str] | None = None) -> str:
    """A function's or class's signature and docstring, and the listed members' of a class."""
    module_name, _, attr = dotted.rpartition(".")
    obj = getattr(importlib.import_module(module_name), attr)
    short = f"{module_name.split('.')[0]}.{attr}" if module_name == "specdec.api" else dotted
    out = [f"### `{short}`\n", _signature(short, obj), _docstring(obj), ""]
    if inspect.isclass(obj):
        for member in members or []:
            try:
                value = inspect.getattr_static(obj, member)
            except AttributeError:
                raise ValueError(f"{dotted} has no member {member!r}") from None
            shown = f"{attr}.{member}"
            out.append(f"#### `{shown}`\n")
            if isinstance(value, property):
                out += [f"Property.\n", _docstring(value), ""]
                continue
            function = value.__func__ if isinstance(value, (classmethod, staticmethod)) else value
            out += [_signature(shown, function), _docstring(function), ""]
    return "\n".join(out).rstrip() + "\n"


def render(kind: str, arg: str, rest: str = "") -> str:
    """One section's content, from its marker's kind, argument and parameters."""
    params = dict(p.split("=", 1) for p in rest.split())
    methods = params["methods"].split(",") if "methods" in params else None
    servers = params["servers"].split(",") if "servers" in params else None
    if kind == "cli":
        return cli_reference(arg)
    if kind == "registry":
        return registry_table(arg)
    if kind == "metrics":
        return metrics_table(arg)
    if kind == "api":
        return api_reference(arg, params["members"].split(",") if "members" in params else None)
    if kind == "bench":
        return bench_tables.table(arg, methods)
    if kind == "bench-categories":
        return bench_tables.categories(arg, methods)
    if kind == "gpu":
        return gpu_tables.table(arg)
    if kind == "loadtest":
        return bench_tables.loadtest(arg, servers)
    if kind == "loadtest-ticks":
        return bench_tables.loadtest_ticks(arg, servers)
    return bench_tables.kernels(arg)


def regenerate(text: str, page: Path | None = None) -> str:
    """``text`` with every generated section rewritten from its source; links to ``bench-results/``
    are made relative to ``page`` (a file under ``docs/``), so they work on GitHub and in the site."""
    up = Path(os.path.relpath(ROOT, (page or ROOT / "docs" / "page.md").parent)).as_posix()

    def one(match: re.Match) -> str:
        body = render(match.group("kind"), match.group("arg"), match.group("rest")).strip("\n")
        body = body.replace("](bench-results/", f"]({up}/bench-results/")
        return f"{match.group('begin')}\n\n{body}\n\n{END}"
    return SECTION.sub(one, text)


def sections(text: str) -> list[re.Match]:
    """The generated sections of a page, in order."""
    return list(SECTION.finditer(text))


def stale(pages: list[Path] = PAGES) -> list[str]:
    """The pages whose committed sections are not what their sources give now."""
    found = []
    for page in pages:
        text = page.read_text(encoding="utf-8")
        current = regenerate(text, page)
        if current != text:
            old, new = sections(text), sections(current)
            names = [o.group("begin") for o, n in zip(old, new) if o.group(0) != n.group(0)]
            found.append(f"{page.relative_to(ROOT)}: {', '.join(names)}")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--write", action="store_true", help="regenerate every section in place")
    what.add_argument("--check", action="store_true", help="list stale sections; exit 1 if any")
    args = parser.parse_args(argv)
    if args.check:
        found = stale()
        print("\n".join(found) or "every generated section is current")
        return 1 if found else 0
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        current = regenerate(text, page)
        if current != text:
            page.write_text(current, encoding="utf-8")
            print(f"wrote {page.relative_to(ROOT)}")
    return 0


# --- MkDocs hooks ------------------------------------------------------------------------------------

# A link to a results file as GitHub resolves it from a page under docs/ (``../bench-results/...``);
# the site publishes bench-results/ inside itself (on_files), one level up. Its Markdown READMEs are
# not pages of the site, so a link to one is left as its text there.
RESULTS_LINK = re.compile(r"\]\(\.\./((?:\.\./)*)bench-results/")
README_LINK = re.compile(r"\[([^\]]*)\]\((?:\.\./)+bench-results/[^)]*\.md\)")


def on_page_markdown(markdown: str, page, config, files) -> str:
    # A value marker (``<!-- v: FILE FIELD -->1.57x<!-- /v -->``) is left as its value: the pages are
    # checked against their results files by tests/test_doc_numbers.py, not re-rendered here.
    return RESULTS_LINK.sub(r"](\1bench-results/", README_LINK.sub(r"\1", doc_values.strip(markdown)))


def on_files(files, config):
    from mkdocs.structure.files import File

    results = ROOT / "bench-results"
    for path in sorted(results.rglob("*")):
        if path.is_file() and path.suffix in PUBLISHED:
            files.append(File(str(path.relative_to(ROOT)), str(ROOT), config["site_dir"],
                              config["use_directory_urls"]))
    return files


if __name__ == "__main__":
    raise SystemExit(main())
