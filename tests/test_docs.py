"""The front door: a README short enough to read, one link from everything a newcomer looks for,
and a documentation site that builds without a warning (a broken link or reference fails it)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def readme_links() -> dict[str, str]:
    text = README.read_text(encoding="utf-8")
    return {label: target for label, target in re.findall(r"\[([^\]]+)\]\(([^)#\s]+)[^)]*\)", text)}


def test_the_readme_is_short():
    assert README.stat().st_size <= 10 * 1024, f"README.md is {README.stat().st_size} bytes"


def test_every_link_of_the_readme_reaches_a_file():
    for label, target in readme_links().items():
        if target.startswith(("http://", "https://")):
            continue
        assert (ROOT / target).exists(), f"README link {label!r} -> {target} does not exist"


@pytest.mark.parametrize("topic, page, words", [
    ("install", "docs/quickstart.md", ["pip install", "make setup"]),
    ("generate", "docs/how-to/generate.md", ["specdec generate"]),
    ("every option", "docs/reference/cli.md", ["<!-- cli: generate -->"]),
    ("the Python API", "docs/reference/python.md", ["specdec.load", "<!-- api: specdec.api.Model"]),
    ("serve", "docs/how-to/serve.md", ["specdec serve"]),
    ("Ray", "docs/how-to/ray.md", ["Ray"]),
    ("every drafter", "docs/reference/drafters.md", ["<!-- registry: drafters -->"]),
    ("exact vs fast", "docs/explanation/exactness.md", ["--no-exact"]),
    ("when it pays", "docs/explanation/cost-model.md", ["When does it pay?"]),
    ("the benchmark results", "docs/reference/results.md", ["<!-- bench:"]),
    ("troubleshooting", "docs/how-to/troubleshooting.md", ["llamafile"]),
])
def test_each_topic_is_one_link_from_the_readme(topic, page, words):
    assert page in readme_links().values(), f"the README does not link {page} ({topic})"
    text = (ROOT / page).read_text(encoding="utf-8")
    for word in words:
        assert word in text, f"{page} does not cover {topic}: no {word!r}"


def test_the_documentation_builds_strictly(tmp_path):
    pytest.importorskip("mkdocs", reason="the docs extra is not installed (make setup installs it)")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-f",
                           str(ROOT / "mkdocs.yml"), "-d", str(tmp_path / "site")],
                          capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
    cli = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    assert "--max-new-tokens" in cli and "--drafter" in cli  # the generated reference


def test_the_gpu_results_readme_is_what_its_reports_give(tmp_path):
    """bench-results/gpu-check/README.md is generated from the reports beside it: a number changed in
    a report and not regenerated (``python scripts/gpu_tables.py --write``) fails here."""
    import json
    import shutil
    import sys

    sys.path.insert(0, str(ROOT / "scripts"))
    import gpu_tables

    folder = ROOT / "bench-results" / "gpu-check"
    written = (folder / "README.md").read_text(encoding="utf-8")
    assert written == gpu_tables.readme(folder)
    copy = tmp_path / "gpu-check"
    shutil.copytree(folder, copy)
    report = json.loads((copy / "smollm2.json").read_text())
    report["smollm2_spec_bench"]["overall"]["tokens_per_s"]["plain"] += 1.0
    (copy / "smollm2.json").write_text(json.dumps(report))
    assert gpu_tables.readme(copy) != written
    for name in gpu_tables.TABLES:
        assert f"<!-- gpu: {name} -->" in (ROOT / "docs" / "reference" / "results.md").read_text(encoding="utf-8")


def test_the_readme_has_one_results_table_and_it_is_what_its_results_files_give(tmp_path):
    """README.md's table is generated from the results files it cites (scripts/readme_results.py): a
    number changed in one of them and not regenerated fails here; the README stays short."""
    import json
    import shutil
    import sys

    sys.path.insert(0, str(ROOT / "scripts"))
    import readme_results

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.encode()) < 8 * 1024
    assert sum(line.startswith("|---") for line in readme.splitlines()) == 1
    assert readme_results.written(readme) == readme_results.table()
    copy = tmp_path / "checkout"
    for workload in readme_results.WORKLOADS:
        shutil.copytree(ROOT / workload.folder, copy / workload.folder)
    assert readme_results.table(copy) == readme_results.table()
    first = copy / readme_results.WORKLOADS[0].folder / "results.json"
    results = json.loads(first.read_text())
    results["methods"]["ngram"]["overall"]["gen_tokens_per_s"] += 0.1
    first.write_text(json.dumps(results))
    assert readme_results.table(copy) != readme_results.written(readme)


# Pages whose defaults are checked against the code (results.md reports measurements).
DOC_PAGES = sorted(p for p in (ROOT / "docs").rglob("*.md") if p.name != "results.md")


def test_the_overview_gives_the_default_sampling_mode():
    """docs/index.md once said sampled output went through rejection sampling; the default is
    coupled (verification by the target's seeded choice), rejection only on request."""
    from specdec import options

    text = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    stated = re.search(r"by default verified\s+\*\*(\w+)\*\*", text)
    assert stated, "docs/index.md does not say how sampled output is verified by default"
    assert stated.group(1) == options.option("verify").default
    assert "--verify rejection" in text  # the other mode is named as the option it is


def test_the_defaults_the_pages_state_are_the_codes():
    """Every "`--flag VALUE` (default)" / "`--flag N` (default N)" on a page, for a flag of a
    generation, load or serve option, names that option's declared default."""
    from specdec import load_options, options

    by_flag = {o.cli_flag: o for o in (*options.all_options(), *load_options.LOAD, *load_options.SERVE)
               if o.cli_flag}
    checked = 0
    for page in DOC_PAGES:
        text = re.sub(r"\s+", " ", page.read_text(encoding="utf-8"))
        found = re.findall(r"`(--[a-z][a-z-]*) ([a-z][\w.-]*)`,? \(?(?:the )?default\b", text)
        found += re.findall(r"`(--[a-z][a-z-]*)(?: [A-Z]+)?` \(default ([\w.]+)", text)
        for flag, value in found:
            option = by_flag.get(flag)
            if option is None or option.default is None:
                continue  # not a declared option, or its default is the policy's (e.g. --num-draft)
            assert value == str(option.default), f"{page.name}: {flag} {value} stated as the default, " \
                                                 f"the code's is {option.default}"
            checked += 1
    assert checked >= 4  # --policy, --verify, --slots, --head-rows at least


def test_the_results_index_names_every_folder_kept_and_is_generated(tmp_path, monkeypatch):
    """bench-results/README.md is written by scripts/results_index.py from one line per folder and the
    pages that cite each: a run added without its line, a line left after its run went, and a run
    that no page cites and no test reads fail here; bench-results/ keeps at most 20 runs."""
    import shutil
    import sys

    sys.path.insert(0, str(ROOT / "scripts"))
    import results_index

    results = ROOT / "bench-results"
    assert (results / "README.md").read_text(encoding="utf-8") == results_index.index(results)
    assert len([p for p in results.iterdir() if p.is_dir()]) <= 20
    copy = tmp_path / "bench-results"
    shutil.copytree(results, copy)
    (copy / "an-unindexed-run").mkdir()
    with pytest.raises(ValueError, match="without a line in scripts/results_index.py: an-unindexed-run"):
        results_index.index(copy)
    monkeypatch.setitem(results_index.FOLDERS, "an-unindexed-run", "a run nothing cites")
    with pytest.raises(ValueError, match="no page cites and no test reads: an-unindexed-run"):
        results_index.index(copy)
    shutil.rmtree(copy / "an-unindexed-run")
    monkeypatch.delitem(results_index.FOLDERS, "an-unindexed-run")
    shutil.rmtree(copy / "tick-costs")
    with pytest.raises(ValueError, match="names folders that are gone: tick-costs"):
        results_index.index(copy)


def test_the_results_index_says_where_each_run_is_cited():
    """The *cited in* column is computed from the pages: the cost model's page cites the load test it
    binds values to, and a test that reads a folder is named beside it."""
    import sys

    sys.path.insert(0, str(ROOT / "scripts"))
    import results_index

    cited = results_index.citations()
    assert any("cost-model.md" in where for where in cited["loadtest-qwen-heldout"])
    assert "`tests/test_suite_time.py`" in cited["make-test"]


# How a page narrates the work instead of documenting the software: who ran what and when, what was
# not done for lack of time, issue numbers, commits and dates in prose. That history lives in
# CHANGELOG.md and bench-results/README.md; a results file records its own commit, date and machine.
NARRATION = {
    "an issue number": r"\bissues?\s*#?\d+|(?<![\w/&])#\d{2,}\b",
    "lack of time": r"\black of time\b|\bnot re-?run\b|\b(?:was|were) not run\b|\bstill to be (?:re-?)?run\b|"
                    r"\bnot investigated\b",
    "who did what": r"\bwe (?:ran|tried|measured|found|timed|fixed|saw|did not|got|looked)\b|"
                    r"\b(?:in|of) (?:this|that|the same) (?:session|round)\b",
    "a run's history": r"\breported in commit\b|\bno results file kept\b|\bearlier runs?\b|\bthe run before\b|"
                       r"\bfound late\b|\bin git history\b|\bwhen (?:they|it) (?:were|was) taken\b|"
                       r"\bthe closing note\b|\bbefore this round\b|\bnot kept\b",
    "a commit in prose": r"\bcommits?\s+[0-9a-f]{7,12}\b|\b(?:at|in|for|with|by) commit\b",
    "a date": r"\b20\d\d-\d\d-\d\d\b",
}


def narration(text: str) -> list[str]:
    """The narration a page's prose holds (code, comments, link targets and generated blocks aside)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import doc_values

    flat = re.sub(r"\s+", " ", doc_values.prose(text))
    return [f"{what}: ...{flat[max(0, m.start() - 50):m.end() + 50]}..."
            for what, pattern in NARRATION.items() for m in re.finditer(pattern, flat, re.I)]


@pytest.mark.parametrize("page", [README, *sorted((ROOT / "docs").rglob("*.md"))], ids=lambda p: p.name)
def test_no_page_narrates_the_work(page):
    """Each page documents the software as it is; the history of the work is in CHANGELOG.md."""
    found = narration(page.read_text(encoding="utf-8"))
    assert not found, f"{page.name} narrates the work (move it to CHANGELOG.md):\n" + "\n".join(found)


@pytest.mark.parametrize("sentence", [
    "The 16-client level is missing (not re-run for lack of time).",
    "What this says, against the aim of issue 35: not met.",
    "We did not get to the bottom of it in this session.",
    "Measured on 2026-11-25 at commit `ad4d6f2`, as reported in commit 6cb0e1b.",
])
def test_the_narration_check_finds_narration(sentence):
    """Negative control: sentences the pages once held are found."""
    assert narration(f"Some text.\n\n{sentence}\n")


# Each page is one kind (Diataxis): the tutorial, how-to guides, reference and explanation.
KINDS = {"quickstart.md": "tutorial", "index.md": "home"}


def kind(page: Path) -> str:
    return KINDS.get(page.name) or {"how-to": "how-to", "reference": "reference",
                                    "explanation": "explanation"}.get(page.parent.name, "unsorted")


def test_every_page_is_one_kind_and_listed_in_the_site():
    """docs/ holds the tutorial, how-to guides, reference and explanation pages, each in its folder,
    and the site's navigation lists every page under its kind."""
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for page in sorted((ROOT / "docs").rglob("*.md")):
        assert kind(page) != "unsorted", f"{page.relative_to(ROOT)} is in no kind's folder"
        assert str(page.relative_to(ROOT / "docs")) in nav, f"{page.relative_to(ROOT)} is not in mkdocs.yml's nav"
    assert {kind(p) for p in (ROOT / "docs").rglob("*.md")} == {"home", "tutorial", "how-to", "reference",
                                                                  "explanation"}


def test_every_page_opens_as_its_kind_does():
    """How-to guides and the tutorial open with a command or code example within their first lines;
    reference pages with a table, code or a generated section; explanation pages say what they
    explain and hold no command to follow before it. No how-to or tutorial opens with measurements."""
    for page in sorted((ROOT / "docs").rglob("*.md")):
        text = page.read_text(encoding="utf-8")
        head = "\n".join(text.splitlines()[:30])
        if kind(page) in ("how-to", "tutorial", "home"):
            assert "```" in head, f"{page.name} does not open with how to use it"
            first_section = re.search(r"^## (.*)$", text, re.M)
            assert first_section is None or not re.search(r"result|measured|benchmark", first_section.group(1),
                                                          re.I), f"{page.name} opens with measurements"
        elif kind(page) == "reference":
            assert re.search(r"^\||```|<!-- (?:registry|cli|api|metrics|bench):", head, re.M), \
                f"{page.name} does not open with its reference"
        else:
            assert re.search(r"^(?:Why|What|How)\b", "\n".join(text.splitlines()[2:6]), re.M), \
                f"{page.name} does not say what it explains"


def _hooks():
    sys.path.insert(0, str(ROOT / "scripts"))
    import docs_hooks

    return docs_hooks


def test_the_generated_sections_are_committed_as_their_sources_give_them():
    """Option tables, registries, metrics, the API reference and the results tables are committed
    Markdown, so the pages read whole on GitHub; one whose source changed and was not regenerated
    (``make docs``, or ``python scripts/docs_hooks.py --write``) fails here."""
    stale = _hooks().stale()
    assert not stale, "stale generated sections (run python scripts/docs_hooks.py --write):\n" + "\n".join(stale)


def test_no_generated_section_is_empty():
    """Every generated section holds its content in the committed page: a table, code or a heading."""
    hooks = _hooks()
    kinds = set()
    for page in hooks.PAGES:
        for section in hooks.sections(page.read_text(encoding="utf-8")):
            body = section.group("body").strip()
            assert re.search(r"^\|.*\|$|^```|^###", body, re.M), \
                f"{page.relative_to(ROOT)}: {section.group('begin')} is empty"
            kinds.add(section.group("kind"))
    assert {"cli", "registry", "metrics", "api", "bench", "loadtest", "gpu"} <= kinds, kinds


def test_a_stale_or_emptied_section_is_found():
    """Negative control: a section whose body was edited by hand, or left empty, is regenerated."""
    hooks = _hooks()
    page = ROOT / "docs" / "reference" / "cli.md"
    text = page.read_text(encoding="utf-8")
    assert hooks.regenerate(text, page) == text
    section = hooks.sections(text)[0]
    for body in ("\n\n| option | default | what it does |\n|---|---|---|\n\n", "\n"):
        edited = text[:section.start("body")] + body + text[section.end("body"):]
        assert hooks.regenerate(edited, page) == text
