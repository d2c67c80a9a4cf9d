"""Every number README.md and docs/*.md state is bound to the results file and field it comes from.

A measured number on a page sits inside a value marker naming its file under bench-results/ and its
field (method, metric, category; ``scripts/doc_values.py``): the value written must be the field's,
rendered at the written precision. So a number changed in a results file and not on the page fails,
and so does a page edited by hand: two numbers swapped inside a paragraph, or one method's value put
in another's place, no longer match their fields (the negative controls below). A number that looks
measured (a decimal, a ratio, a share, a time, a rate) written outside a marker fails too, so no
number escapes the binding by being written without one.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import doc_values  # noqa: E402

PAGES = doc_values.PAGES


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_marked_value_is_its_fields(page):
    """Each value marker's written value is its field's, rendered at the written precision."""
    stale = [p for m in doc_values.markers(page) if (p := doc_values.stale(m))]
    assert not stale, "\n".join(stale) + "\n(after regenerating results: python scripts/doc_values.py --write)"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_measured_number_is_written_outside_a_marker(page):
    """A decimal, ratio, share, time, rate or size outside code and generated blocks is either in a
    value marker or listed in doc_values.NOT_MEASURED with its why."""
    found = doc_values.unbound(page) + doc_values.misplaced(page)
    assert not found, "numbers with no results file and field:\n" + "\n".join(found)


def test_the_pages_state_their_numbers_through_markers():
    """The binding is used, not bypassed: the pages that report results hold many marked values,
    and every results file a marker names exists."""
    counts = {page.name: len(doc_values.markers(page)) for page in PAGES}
    assert sum(counts.values()) >= 60, counts
    for name in ("cost-model.md", "results.md", "exactness.md", "quickstart.md"):
        assert counts[name] >= 3, f"{name} binds {counts[name]} values"


# --- negative controls: the check fails when a page is edited by hand ---------------------------------

def _paragraphs_with_markers(text: str) -> list[tuple[int, int, list[re.Match]]]:
    """(start, end, markers) for each paragraph (block between blank lines) with two or more
    markers."""
    out = []
    for block in re.finditer(r"(?:[^\n]+\n?)+", text):
        found = list(doc_values.VALUE.finditer(text, block.start(), block.end()))
        if len(found) >= 2:
            out.append((block.start(), block.end(), found))
    return out


def _swap(text: str, a: re.Match, b: re.Match) -> str:
    """``text`` with the values shown by markers ``a`` and ``b`` exchanged (a before b)."""
    return (text[:a.start("shown")] + b.group("shown") + text[a.end("shown"):b.start("shown")]
            + a.group("shown") + text[b.end("shown"):])


def _problems(page: Path, text: str) -> list[str]:
    return [p for m in doc_values.markers(page, text) if (p := doc_values.stale(m))]


def test_negative_control_a_swap_inside_a_paragraph_fails():
    """On every page, in every paragraph that states two different values, exchanging the first two
    makes the check fail on both; the page as written passes (the control's control)."""
    controlled = 0
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        assert _problems(page, text) == []
        for _, _, found in _paragraphs_with_markers(text):
            pair = next(((a, b) for i, a in enumerate(found) for b in found[i + 1:]
                         if a.group("shown") != b.group("shown")), None)
            if pair is None:
                continue
            swapped = _swap(text, *pair)
            stale = _problems(page, swapped)
            assert len(stale) == 2, f"{page.name}: swapping {pair[0].group('shown')} and " \
                                    f"{pair[1].group('shown')} gives {stale}"
            controlled += 1
    assert controlled >= 8  # the pages with results: cost model, results, exactness, quickstart


def test_negative_control_two_workloads_swapped_in_the_when_it_pays_table_fail():
    """cost-model.md's "When does it pay?" table: the editing and repair workloads' speed-ups
    exchanged, which reverses which workload gains more, fails on both."""
    page = ROOT / "docs" / "explanation" / "cost-model.md"
    text = page.read_text(encoding="utf-8")
    found = [m for m in doc_values.VALUE.finditer(text) if m.group("expr") == "methods/ngram/overall/speedup"
             and m.group("file") in ("readme-editing", "readme-repair")]
    assert len(found) == 2 and found[0].group("shown") != found[1].group("shown")
    assert _problems(page, text) == []
    assert len(_problems(page, _swap(text, *found))) == 2


def _sibling(marker: re.Match, results: Path) -> tuple[str, str] | None:
    """Another method's (or server's) value of the same field, rendered as this marker shows its own:
    (the sibling's field, its rendered value), where one differs."""
    expr = marker.group("expr")
    data = doc_values.load(doc_values.source_path(marker.group("file"), results))
    candidates = []
    method = re.match(r"methods/([^/]+)/", expr)
    if method and isinstance(data, dict):
        candidates = [expr.replace(f"methods/{method.group(1)}/", f"methods/{other}/", 1)
                      for other in data.get("methods", {}) if other != method.group(1)]
    server = re.search(r"server=([^,/]+)", expr)
    if server and isinstance(data, list):
        candidates = [expr.replace(f"server={server.group(1)}", f"server={other}", 1)
                      for other in dict.fromkeys(r.get("server") for r in data if isinstance(r, dict))
                      if other and other != server.group(1)]
    for field in candidates:
        try:
            value = doc_values.render(doc_values.evaluate(marker.group("file"), field, results),
                                      marker.group("shown"))
        except (doc_values.Unresolved, ZeroDivisionError):
            continue
        if value != marker.group("shown").strip():
            return field, value
    return None


def test_negative_control_a_value_moved_between_methods_fails():
    """For every marker of a method's (or a load test's server's) field, writing another method's
    value of the same field in its place fails the check."""
    controlled = 0
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for marker in doc_values.VALUE.finditer(text):
            sibling = _sibling(marker, doc_values.RESULTS)
            if sibling is None:
                continue
            moved = text[:marker.start("shown")] + sibling[1] + text[marker.end("shown"):]
            stale = _problems(page, moved)
            assert len(stale) == 1, f"{page.name}: {marker.group('expr')} showing {sibling[0]}'s " \
                                    f"{sibling[1]} passes"
            controlled += 1
    assert controlled >= 20


def test_negative_control_the_serving_figures_moved_between_servers_fail():
    """cost-model.md: the n-gram server's figure written in place of plain decoding's fails."""
    page = ROOT / "docs" / "explanation" / "cost-model.md"
    text = page.read_text(encoding="utf-8")
    plain = [m for m in doc_values.VALUE.finditer(text) if "server=specdec-plain," in m.group("expr")]
    assert plain, "cost-model.md states no figure of specdec-plain"
    marker = plain[0]
    ngram = doc_values.render(doc_values.evaluate(
        marker.group("file"), marker.group("expr").replace("server=specdec-plain,", "server=specdec,")),
        marker.group("shown"))
    assert ngram != marker.group("shown")
    moved = text[:marker.start("shown")] + ngram + text[marker.end("shown"):]
    assert len(_problems(page, moved)) == 1


def test_negative_control_a_number_written_without_a_marker_fails():
    """A speed-up typed into a paragraph by hand, or a marker's value with its marker dropped, is
    reported as unbound."""
    page = ROOT / "docs" / "explanation" / "cost-model.md"
    text = page.read_text(encoding="utf-8")
    assert doc_values.unbound(page, text) == []
    typed = text.replace("\n\n", "\n\nIt is 1.57x faster here.\n\n", 1)
    assert any("1.57x" in p for p in doc_values.unbound(page, typed))
    first = doc_values.VALUE.search(text)
    bare = text[:first.start()] + first.group("shown") + text[first.end():]
    assert any(first.group("shown").strip() in p for p in doc_values.unbound(page, bare))


def test_a_changed_results_file_fails_the_check_and_write_renders_it(tmp_path):
    """A results file that changes under a page fails the page's check; ``--write``'s rewrite puts
    the new value in, in the form the page writes it."""
    page = ROOT / "docs" / "explanation" / "cost-model.md"
    text = page.read_text(encoding="utf-8")
    marker = next(m for m in doc_values.VALUE.finditer(text) if m.group("file") == "readme-editing")
    results = tmp_path / "bench-results"
    shutil.copytree(doc_values.RESULTS, results)
    path = doc_values.source_path(marker.group("file"), results)
    data = json.loads(path.read_text(encoding="utf-8"))
    node = data
    keys = marker.group("expr").split("/")
    for key in keys[:-1]:
        node = node[key]
    node[keys[-1]] = node[keys[-1]] * 1.5 + 1
    path.write_text(json.dumps(data), encoding="utf-8")
    copy = tmp_path / "cost-model.md"
    copy.write_text(text, encoding="utf-8")
    stale = [p for m in doc_values.markers(copy) if m.file == "readme-editing"
             and (p := doc_values.stale(m, results))]
    assert stale
    rewritten = doc_values.rewrite(text, copy, results)
    assert rewritten != text
    assert [p for m in doc_values.markers(copy, rewritten) if m.file == "readme-editing"
            and (p := doc_values.stale(m, results))] == []
    # a marker whose file is gone stops a strict rewrite, and is left as it is otherwise
    gone = text + "\nSee <!-- v: no-such-run methods/x/y -->1.0<!-- /v --> there.\n"
    with pytest.raises(doc_values.Unresolved):
        doc_values.rewrite(gone, copy, results)
    assert "<!-- v: no-such-run methods/x/y -->1.0<!-- /v -->" in doc_values.rewrite(gone, copy, results, strict=False)


@pytest.mark.parametrize("shown, value, rendered", [
    ("1.572x", 1.5724, "1.572x"), ("2.03x", 2.029, "2.03x"), ("69.5%", 0.6952, "69.5%"),
    ("10,387", 10387.0, "10,387"), ("13:38", 818.4, "13:38"), ("-1.1%", -0.0112, "-1.1%"),
    ("484", 484.2, "484"), ("0.72", 0.7212, "0.72"), ("1.40×", 1.4049, "1.40×"),
])
def test_a_value_is_rendered_in_the_form_the_page_writes_it(shown, value, rendered):
    assert doc_values.render(value, shown) == rendered


def test_fields_of_json_jsonl_and_text_reports(tmp_path):
    """A JSON path, a record picked by its values in JSON lines, a text report's regular expression,
    and lookups combined left to right; a field that is not there, or not one, is an error."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "results.json").write_text(json.dumps(
        {"methods": {"plain": {"overall": {"speedup": 1.0}}, "ngram": {"overall": {"speedup": 1.5}}}}))
    (tmp_path / "load.jsonl").write_text("\n".join(json.dumps(r) for r in (
        {"server": "a", "clients": 1, "tokens_per_s": 10.0}, {"server": "a", "clients": 8, "tokens_per_s": 40.0},
        {"server": "b", "clients": 8, "tokens_per_s": 30.0})))
    (tmp_path / "out.txt").write_text("rows=1 time: 4.0 us\nrows=2 time: 6.0 us\n")
    assert doc_values.evaluate("run", "methods/ngram/overall/speedup", tmp_path) == 1.5
    assert doc_values.evaluate("load.jsonl", "server=a,clients=8/tokens_per_s", tmp_path) == 40.0
    assert doc_values.evaluate("out.txt", r"rows=2 time: (\S+) / 2 / rows=1 time: (\S+)", tmp_path) == 0.75
    for file, expr in (("run", "methods/hf/overall/speedup"), ("load.jsonl", "server=a/tokens_per_s"),
                       ("out.txt", r"time: (\S+)"), ("run", "methods/ngram/overall"), ("gone", "x")):
        with pytest.raises(doc_values.Unresolved):
            doc_values.evaluate(file, expr, tmp_path)


def test_a_marker_that_begins_a_line_is_refused():
    """Markdown takes a line that begins with an HTML comment for an HTML block: a value marker must
    sit inside its line."""
    page = ROOT / "docs" / "drafters.md"
    assert doc_values.misplaced(page, "text\n<!-- v: run methods/a/b -->1.0<!-- /v --> more\n")
    assert not doc_values.misplaced(page, "text <!-- v: run methods/a/b -->1.0<!-- /v --> more\n")
