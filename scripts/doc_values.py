"""Every measured number on README.md and docs/*.md, bound to the results file and field it comes from.

A number a page states is written inside a value marker that names its source::

    editing <!-- v: policy-ablation/timed-runs/edit methods/adaptive/overall/speedup -->1.572x<!-- /v -->

``FILE`` is relative to ``bench-results/`` (a folder stands for its ``results.json``); the rest is
the field, an expression of lookups in that file:

- JSON: a path of keys and list indexes, ``methods/ngram/overall/gen_speedup``; in a list of
  records (a load test's ``results.jsonl``, one record per line) a segment ``key=value[,key=value]``
  picks the one record that has those values (a bare ``key``: that has the key):
  ``server=specdec,clients=8/tokens_per_s``, ``server=team-index,compared/compared``; a key with a
  slash in it writes it ``\\/`` (``serve/specdec\\/ngram/8/tokens_per_s``).
- text (``.txt``, a script's printed report): a regular expression with one group, which must
  match exactly once: ``nc=8960 rows=2 .* ratio (\\S+)``.
- Lookups and numbers combined with `` / ``, `` * ``, `` + ``, `` - `` (spaces around each),
  evaluated left to right: ``nc=8960 8 rows: gemm\\(8\\) (\\S+) / 8 / nc=8960 rows=1 .*gemv x1: (\\S+)``.

The value between the markers is written as the page wants it shown, and its form says how to
render the field: the number of decimals; a trailing ``x`` or ``×`` (a ratio); ``%`` (the field is
a share, shown times 100); a thousands comma (``10,387``); ``m:ss`` (seconds as minutes and
seconds). A swapped number, a value copied from another method's field, or a results file that
changed under the page then fails :func:`problems` (and ``tests/test_doc_numbers.py``).

    python scripts/doc_values.py            # list what is stale or unbound; exit 1 if anything is
    python scripts/doc_values.py --write    # re-render every marked value from its file, in place

``--write`` keeps each value's written form and changes only its digits, so after a results file is
regenerated (``make results``, a load test, the GPU check) one command brings the pages up to date.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench-results"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

VALUE = re.compile(r"<!-- v: (?P<file>\S+) (?P<expr>.+?) -->(?P<shown>.*?)<!-- /v -->", re.S)
# How a value may be written: sign, digits (with thousands commas), decimals, and a unit that says
# how to render the field (x/× a ratio, % a share times 100), or minutes:seconds.
SHOWN = re.compile(r"^(?P<sign>[-−]?)(?P<whole>\d{1,3}(?:,\d{3})+|\d+)(?:\.(?P<decimals>\d+))?(?P<unit>[x×%]?)$")
CLOCK = re.compile(r"^(?P<minutes>\d+):(?P<seconds>\d\d)$")
OPERATOR = re.compile(r" ([/*+-]) ")


class Unresolved(ValueError):
    """A marker that cannot be resolved: the file, the field or the written form is wrong."""


@dataclass(frozen=True)
class Marker:
    """One marked value on a page: where it is, what it names, what it shows."""

    page: Path
    line: int
    file: str
    expr: str
    shown: str
    start: int
    end: int

    def where(self) -> str:
        return f"{self.page.relative_to(ROOT) if self.page.is_relative_to(ROOT) else self.page}:{self.line}"


def markers(page: Path, text: str | None = None) -> list[Marker]:
    """The value markers of a page, in order."""
    text = page.read_text(encoding="utf-8") if text is None else text
    return [Marker(page, text.count("\n", 0, m.start()) + 1, m.group("file"), m.group("expr"), m.group("shown"),
                   m.start("shown"), m.end("shown")) for m in VALUE.finditer(text)]


def source_path(file: str, results: Path = RESULTS) -> Path:
    path = results / file
    return path / "results.json" if path.is_dir() else path


_CACHE: dict[Path, object] = {}


def load(path: Path):
    """A results file as data (JSON, JSON lines as a list of records) or, for ``.txt``, its text."""
    key = path.resolve()
    if key not in _CACHE:
        if not path.exists():
            raise Unresolved(f"{path} does not exist")
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".jsonl":
            _CACHE[key] = [json.loads(line) for line in text.splitlines() if line.strip()]
        elif path.suffix == ".json":
            _CACHE[key] = json.loads(text)
        else:
            _CACHE[key] = text
    return _CACHE[key]


def _select(records: list, segment: str):
    """The one record with the segment's values (``key=value``) and keys (a bare ``key``)."""
    parts = segment.split(",")
    wanted = dict(part.split("=", 1) for part in parts if "=" in part)
    keys = [part for part in parts if "=" not in part]
    found = [r for r in records if isinstance(r, dict) and all(str(r.get(k)) == v for k, v in wanted.items())
             and all(k in r for k in keys)]
    if len(found) != 1:
        raise Unresolved(f"{segment!r} picks {len(found)} records, not one")
    return found[0]


def lookup(data, field: str) -> float:
    """One field of a results file: a JSON path, or a regular expression's group in a text report."""
    if isinstance(data, str):
        found = [m for m in re.finditer(field, data, re.M)]
        if len(found) != 1:
            raise Unresolved(f"/{field}/ matches {len(found)} times, not once")
        return float(found[0].group(1))
    value = data
    for segment in (part.replace("\\/", "/") for part in re.split(r"(?<!\\)/", field)):
        if isinstance(value, list) and "=" in segment:
            value = _select(value, segment)
        elif isinstance(value, list) and segment.lstrip("-").isdigit():
            value = value[int(segment)]
        elif isinstance(value, dict) and segment in value:
            value = value[segment]
        else:
            raise Unresolved(f"no {segment!r} in {field!r}")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Unresolved(f"{field!r} is {value!r}, not a number")
    return float(value)


def evaluate(file: str, expr: str, results: Path = RESULTS) -> float:
    """A marker's value: its lookups in ``file``, combined left to right."""
    data = load(source_path(file, results))
    parts = OPERATOR.split(expr)
    total = None
    for i in range(0, len(parts), 2):
        term = parts[i].strip()
        value = float(term) if re.fullmatch(r"-?\d+(?:\.\d+)?", term) else lookup(data, term)
        if total is None:
            total = value
        else:
            op = parts[i - 1]
            total = {"/": total / value if value else math.nan, "*": total * value,
                     "+": total + value, "-": total - value}[op]
    assert total is not None
    return total


def render(value: float, shown: str) -> str:
    """``value`` written in the form of ``shown`` (decimals, unit, commas, sign, m:ss)."""
    clock = CLOCK.match(shown.strip())
    if clock:
        seconds = round(value)
        return f"{seconds // 60}:{seconds % 60:02d}"
    form = SHOWN.match(shown.strip())
    if form is None:
        raise Unresolved(f"cannot read {shown!r} as a number (digits, decimals, then x, × or %)")
    decimals = len(form.group("decimals") or "")
    unit = form.group("unit")
    if unit == "%":
        value *= 100
    text = f"{abs(value):,.{decimals}f}" if "," in form.group("whole") else f"{abs(value):.{decimals}f}"
    sign = ("−" if form.group("sign") == "−" else "-") if round(value, decimals) < 0 else ""
    return sign + text + unit


def stale(marker: Marker, results: Path = RESULTS) -> str | None:
    """What is wrong with one marker (None when its written value is its field's)."""
    try:
        expected = render(evaluate(marker.file, marker.expr, results), marker.shown)
    except (Unresolved, OSError, ZeroDivisionError) as error:
        return f"{marker.where()}: {marker.file} {marker.expr}: {error}"
    if expected != marker.shown.strip():
        return (f"{marker.where()}: writes {marker.shown.strip()!r}, {marker.file} {marker.expr} "
                f"gives {expected!r}")
    return None


# --- numbers outside markers -----------------------------------------------------------------------

# What looks like a measurement when it is not inside a marker: a decimal number, a share, a ratio,
# a time, a rate, a size, a count of forwards. Whole numbers alone are counts and settings (16
# clients, 256 new tokens) and stay free.
MEASURED = re.compile(
    r"(?<![\w.,/+-])(?<![A-Za-z]-)"
    r"(?:\d+:\d\d(?![\d:])"                                          # 13:38
    r"|\d[\d,]*(?:\.\d+)?\s*(?:[x×](?![\w])|%|tok(?:en)?s/s\b|ms\b|µs\b|us\b|s\b|seconds?\b|min\b"
    r"|minutes?\b|GB\b|MB\b|kB\b|GiB\b|MiB\b|bytes\b|(?:target |draft[- ]model )?forwards\b)"
    r"|\d+\.\d+(?!\.?\d|\+)(?![\w.]*[A-Za-z_]))")                  # 0.72, not 1.5B, 2.13.0 or 3.10+
# Generated blocks (the README's table, the sections scripts/docs_hooks.py writes) hold no hand-written number.
GENERATED = re.compile(r"<!-- results-table: begin -->.*?<!-- results-table: end -->"
                       r"|<!--\s*(?:cli|registry|metrics|api|bench|bench-categories|loadtest|loadtest-ticks|kernels|gpu):[^>]*-->"
                       r".*?<!-- /generated -->", re.S)


def prose(text: str) -> str:
    """What a reader reads as text, the bound values and generated parts left out: no fenced code,
    code spans, link targets, HTML comments or value markers (with their values)."""
    text = GENERATED.sub(" ", text)
    text = VALUE.sub(" ", text)
    text = re.sub(r"```.*?```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    text = re.sub(r"<!--.*?-->", " ", text, flags=re.S)
    text = re.sub(r"`[^`\n]*`", " ", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    return text


# Numbers that look measured and are not: (page, the words around it, the number as written), each
# with its why. Short on purpose: a setting, a threshold, a published size, a worked example.
NOT_MEASURED: set[tuple[str, str, str]] = {
    ("endpoints.md", "(default 1.0, as OpenAI's)", "1.0"),  # the temperature's default
    ("endpoints.md", "a body over 1 MiB", "1 MiB"),  # the server's body limit
    ("cost-model.md", "nobody drafting by 15%", "15%"),  # MARGIN, a setting of the batched ticker
    # --compare's verdict: its thresholds, and a worked example of its arithmetic
    ("cli.md", "disagree on the side of 1.0", "1.0"),
    ("cli.md", "when it is under 3%", "3%"),
    ("cli.md", "160 tokens in 158 forwards", "158 forwards"),
    ("cli.md", "cannot be 1.28x faster", "1.28x"),
    ("cli.md", "more than the 1.01x its target forwards allow", "1.01x"),
    # the bench's settings: the sandbox's limits, and what counts as within noise
    ("cli.md", "10 s and 1 GiB limits", "10 s"),
    ("cli.md", "10 s and 1 GiB limits", "1 GiB"),
    ("benchmark.md", "the spread includes 1.00x", "1.00x"),
    ("benchmark.md", "within 3% of it", "3%"),
    ("quickstart.md", "over 15 minutes, setup included", "15 minutes"),  # make test's budget
    ("exactness.md", "(at most 1 GiB of them)", "1 GiB"),  # the prompt cache's bound
}


def unbound(page: Path, text: str | None = None) -> list[str]:
    """Measurement-like numbers a page writes outside value markers (and outside NOT_MEASURED)."""
    text = page.read_text(encoding="utf-8") if text is None else text
    flat = prose(text)
    found = []
    for match in MEASURED.finditer(flat):
        shown = match.group(0).strip()
        line = flat.count("\n", 0, match.start()) + 1
        context = re.sub(r"\s+", " ", flat[max(0, match.start() - 60):match.end() + 60])
        if any(p == page.name and shown.startswith(n) and words in context for p, words, n in NOT_MEASURED):
            continue
        found.append(f"{page.name}:{line}: {shown!r} in ...{context.strip()}...")
    return found


def misplaced(page: Path, text: str | None = None) -> list[str]:
    """Markers that begin a line: Markdown would take the line for an HTML block."""
    text = page.read_text(encoding="utf-8") if text is None else text
    return [f"{page.name}:{text.count(chr(10), 0, m.start()) + 1}: a value marker begins a line"
            for m in re.finditer(r"^[ \t]*<!-- v: ", text, re.M)]


def problems(pages: list[Path] = PAGES, results: Path = RESULTS) -> list[str]:
    """Everything wrong with the pages' numbers: stale or unresolvable markers, unbound numbers."""
    out: list[str] = []
    for page in pages:
        text = page.read_text(encoding="utf-8")
        out += [p for m in markers(page, text) if (p := stale(m, results))]
        out += unbound(page, text) + misplaced(page, text)
    return out


def rewrite(text: str, page: Path, results: Path = RESULTS, strict: bool = True) -> str:
    """The page with every marked value re-rendered from its file (its written form kept). With
    ``strict`` False a marker that cannot be resolved is left as it is (the check reports it)."""
    def one(match: re.Match) -> str:
        try:
            value = render(evaluate(match.group("file"), match.group("expr"), results), match.group("shown"))
        except (Unresolved, OSError, ZeroDivisionError):
            if strict:
                raise
            return match.group(0)
        return match.group(0)[:match.start("shown") - match.start()] + value + "<!-- /v -->"
    return VALUE.sub(one, text)


def strip(text: str) -> str:
    """The page as a reader sees it: each value marker replaced by its value (the docs build)."""
    return VALUE.sub(lambda m: m.group("shown"), text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="re-render every marked value in place")
    args = parser.parse_args(argv)
    if args.write:
        for page in PAGES:
            text = page.read_text(encoding="utf-8")
            new = rewrite(text, page, strict=False)
            if new != text:
                page.write_text(new, encoding="utf-8")
                print(f"updated {page.relative_to(ROOT)}")
    found = problems()
    for line in found:
        print(line, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
