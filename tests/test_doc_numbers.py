"""The numbers the pages write are the numbers their results files hold.

Every paragraph of README.md and docs/*.md that links a file under bench-results/ (a Markdown link
or a path in backticks; a folder stands for the results files in it) is checked: each number
written in it, outside code, must be one of the linked files' values at the precision it is
written with (``1.77x`` is any value in [1.765, 1.775]; ``69.5%`` also matches 0.695). A table
without a link of its own is checked against the paragraph that introduces it. So a number changed
in a results file and not on the page fails here, as does a page that cites a file no longer kept.

A paragraph of the pages this suite guards that states a measurement (a speed-up, tokens/s, a time,
a share) without linking its results file must name the commit it was measured at instead.
"""

from __future__ import annotations

import copy
import json
import math
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench-results"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# The pages whose unlinked measurements must name a commit (the others are generated or guarded by
# their own tests: README.md, benchmarks.md, gpu.md, exactness.md).
GUARDED = ["drafters.md", "serving.md", "ray.md", "quickstart.md", "cli.md", "python.md", "tracing.md",
           "index.md", "layout.md"]

# A whole number followed by one of these says what a run was asked to do (256 new tokens, 4 slots,
# 16 clients, a 2-core machine) or names something (issue 35), not what it measured; the results
# files do not all record their settings, so these are not looked up.
SETTING_AFTER = re.compile(r"\s*(?:-?cores?\b|new tokens|tokens (?:a|an|per) \w+|slots?\b|clients?\b|"
                           r"questions?\b|categor|requests?\b|repeats?\b|replicas?\b|rounds?\b|groups?\b|"
                           r"problems?\b|prompts?\b|(?:HumanEval|Spec-Bench)\b)")
SETTING_BEFORE = re.compile(r"(?:issue|issues|top|top-)\s*$")
# Numbers in linked paragraphs that are not measurements, so no file holds them:
# (page, the words around the number as written, the number). Short on purpose, each with its why.
NOT_MEASURED = {
    # the aims the load tests were run against, stated beside what they reached
    ("serving.md", "at 1.6x its 1-client figure", "1.6"),
    ("serving.md", "short of the 1.8x gain", "1.8"),
}

REFERENCE = re.compile(r"(?:\]\(|`)(?:\.\./)?(bench-results/[^)`\s#]*)")
RESULT_SUFFIXES = (".json", ".jsonl", ".txt")
NUMBER = re.compile(
    r"(?<![\w.,/+])(?<![A-Za-z]-)"         # not inside a word, a version, a path or a name (Gemma-3)
    r"(\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d+))?"  # 10,387 / 1.77 / 64
    r"(?![\w.]*[A-Za-z_])"                # not a name: 1.5B, 270M, 16k, fp32, 2t
    r"(\s*%)?")
# A trailing x or × is the unit of a speed-up, not part of a name.
SPEEDUP = re.compile(r"(\d)[x×]")


def prose(text: str) -> str:
    """What a reader reads as text: no fenced code, comments, code spans, link targets or dates."""
    text = re.sub(r"```.*?```", " ", text, flags=re.S)
    text = re.sub(r"<!--.*?-->", " ", text, flags=re.S)
    text = re.sub(r"`[^`]*`", " ", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    text = re.sub(r"\b\d{4}-\d{2}-\d{2}\b", " ", text)
    text = re.sub(r"^\s*(?:[-*]|\d+\.)\s", " ", text, flags=re.M)  # list markers
    text = re.sub(r"^#+ ", " ", text, flags=re.M)
    return re.sub(r"\s+", " ", SPEEDUP.sub(r"\1 ", text))


def paragraphs(markdown: str) -> list[tuple[str, list[str]]]:
    """(text, the bench-results references it is checked against) for each paragraph: blocks
    between blank lines, list items apart; a table with no reference of its own takes the
    paragraph's before it."""
    markdown = re.sub(r"```.*?```", lambda m: "\n" * m.group(0).count("\n"), markdown, flags=re.S)
    out: list[tuple[str, list[str]]] = []
    for block in re.split(r"\n\s*\n", markdown):
        items = re.split(r"\n(?=\s*(?:[-*]|\d+\.) )", block)
        for item in items:
            if not item.strip():
                continue
            refs = REFERENCE.findall(item)
            is_table = all(line.strip().startswith("|") for line in item.strip().splitlines())
            if is_table and not refs and out:
                refs = out[-1][1]
            out.append((item, refs))
    return out


def written_numbers(text: str) -> list[tuple[str, float, int, bool]]:
    """(as written, value, decimals, is a percentage) for each number in the prose that states a
    result: a whole number that gives a setting (see SETTING_AFTER) is left out."""
    found = []
    text = prose(text)
    for match in NUMBER.finditer(text):
        whole, decimals, percent = match.group(1), match.group(2) or "", match.group(3)
        if not decimals and not percent and (SETTING_AFTER.match(text, match.end())
                                             or SETTING_BEFORE.search(text, 0, match.start())):
            continue
        value = float(whole.replace(",", "") + ("." + decimals if decimals else ""))
        found.append((match.group(0).strip(), value, len(decimals), bool(percent)))
    return found


def _leaves(value, numbers: list[float], integers: set[int]) -> None:
    if isinstance(value, bool) or value is None:
        return
    if isinstance(value, (int, float)):
        if math.isfinite(value):
            numbers.append(float(value))
    elif isinstance(value, str):
        # A count inside a command line, a name or an error (--max-new-tokens 64, EPYC-avx512-2t) is
        # a setting the page may repeat; a model's answer (long, several lines) holds no result.
        if len(value) <= 400 and "\n" not in value:
            integers.update(int(n) for n in re.findall(r"\d+", value))
    elif isinstance(value, dict):
        integers.add(len(value))
        for key, item in value.items():
            integers.update(int(n) for n in re.findall(r"\d+", str(key)))
            _leaves(item, numbers, integers)
    elif isinstance(value, list):
        integers.add(len(value))
        for item in value:
            _leaves(item, numbers, integers)


def load(path: Path) -> list:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".txt":  # a script's report: every number in it is a value
        return [float(n) for n in re.findall(r"-?\d+(?:\.\d+)?", text)]
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    return json.loads(text)


def paths_of(ref: str, root: Path = ROOT) -> list[Path]:
    """What a reference names: a file, a folder, or every path a pattern (bench-results/*/...) matches."""
    if "*" in ref:
        return sorted(root.glob(ref))
    return [root / ref] if (root / ref).exists() else []


def files_of(ref: str, root: Path = ROOT) -> list[Path]:
    """The results files behind a reference: a folder stands for the results files in it."""
    files = []
    for path in paths_of(ref, root):
        if path.is_dir():
            files += sorted(p for p in path.iterdir() if p.suffix in RESULT_SUFFIXES)
        elif path.suffix in RESULT_SUFFIXES:
            files.append(path)
    return files


def values(files: list[Path]) -> tuple[list[float], set[int]]:
    numbers: list[float] = []
    integers: set[int] = set()
    for path in files:
        _leaves(load(path), numbers, integers)
    return numbers, integers


def matches(value: float, decimals: int, percent: bool, numbers: list[float], integers: set[int]) -> bool:
    tolerance = 0.5 * 10 ** -decimals + 1e-9
    candidates = [(value, tolerance)]
    if percent:
        candidates.append((value / 100, tolerance / 100))
    if any(abs(n - v) <= t for v, t in candidates for n in numbers):
        return True
    return decimals == 0 and not percent and value in integers


def checked_numbers(page: str, text: str) -> list[tuple[str, float, int, bool]]:
    """The written numbers a paragraph is held to: all but the allow-listed ones (NOT_MEASURED)."""
    flat = re.sub(r"\s+", " ", text)
    return [n for n in written_numbers(text)
            if not any(p == page and shown == n[0] and words in flat for p, words, shown in NOT_MEASURED)]


def unmatched(page: str, text: str, refs: list[str], root: Path = ROOT) -> list[str]:
    """The numbers a paragraph writes that none of its linked files holds at the written precision."""
    numbers, integers = values([f for ref in refs for f in files_of(ref, root)])
    return [shown for shown, value, decimals, percent in checked_numbers(page, text)
            if not matches(value, decimals, percent, numbers, integers)]


def linked_paragraphs():
    for page in PAGES:
        for text, refs in paragraphs(page.read_text(encoding="utf-8")):
            if refs:
                yield page, text, refs


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_number_a_linked_paragraph_writes_is_in_its_files(page):
    """Each paragraph that cites results files writes only numbers they hold, and cites files that
    are still there."""
    problems = []
    for text, refs in paragraphs(page.read_text(encoding="utf-8")):
        if not refs:
            continue
        missing = [ref for ref in refs if not paths_of(ref)]
        if missing:
            problems.append(f"cites {missing}, which bench-results/ no longer has:\n  {text.strip()[:200]}")
            continue
        if not any(files_of(ref) for ref in refs):
            continue  # a link to a plot, a log or a README: nothing to hold a page's number
        wrong = unmatched(page.name, text, refs)
        if wrong:
            problems.append(f"{wrong} not in {refs}:\n  {text.strip()[:300]}")
    assert not problems, f"{page.name}:\n" + "\n".join(problems)


# A measurement as a page writes one: a speed-up, a rate, a share, a time, a size or a duration.
MEASUREMENT = re.compile(r"\b\d[\d,]*(?:\.\d+)?\s*(?:[x×](?![\w])|%|tok(?:en)?s/s\b|ms\b|s\b|GB\b|MB\b|kB\b)"
                         r"|\b\d+:\d\d\b")
COMMIT = re.compile(r"commits?\s+`([0-9a-f]{7,12})`")
# Measurement-like numbers in unlinked paragraphs that no run produced: (page, the phrase, as
# written). Short on purpose, each with its why.
NOT_A_RUN = {
    ("serving.md", "waits at least 20 ms"),  # GATHER_S, a setting of the batched ticker
    ("cli.md", "when it is under 3%"),  # the verdict's threshold
    ("cli.md", "cannot be 1.28x faster"),  # a worked example of the verdict's arithmetic
    ("cli.md", "more than the 1.01x its target forwards allow"),  # the same example
    ("quickstart.md", "(1.09 GB, checked by sha256)"),  # the published model files' size
}


def unlinked_measurements(page: str, text: str) -> list[str]:
    """The measurements a paragraph without a results link writes, if it names no commit."""
    flat = re.sub(r"\s+", " ", text)
    if COMMIT.search(flat):
        return []
    for p, phrase in NOT_A_RUN:
        if p == page:
            flat = flat.replace(phrase, " ")
    flat = re.sub(r"```.*?```|<!--.*?-->|`[^`]*`|\]\([^)]*\)", " ", flat)
    return MEASUREMENT.findall(flat)


@pytest.mark.parametrize("name", GUARDED)
def test_a_measurement_without_its_results_file_names_its_commit(name):
    """The pages this issue covers state no measurement that neither links its results file nor
    names the commit it was measured at."""
    page = ROOT / "docs" / name
    problems = []
    for text, refs in paragraphs(page.read_text(encoding="utf-8")):
        if refs:
            continue
        found = unlinked_measurements(name, text)
        if found:
            problems.append(f"{found}: {text.strip()[:200]}")
    assert not problems, (f"{name}: measurements with neither a results file nor a commit:\n"
                          + "\n".join(problems))


def test_every_commit_a_page_names_is_one_of_this_repository():
    """A commit named for a measurement is one git knows, so it can be checked out and rerun."""
    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    named = set()
    for name in GUARDED:
        text = re.sub(r"\s+", " ", (ROOT / "docs" / name).read_text(encoding="utf-8"))
        named.update(COMMIT.findall(text))
    assert len(named) >= 10
    unknown = [c for c in sorted(named)
               if subprocess.run([git, "-C", str(ROOT), "cat-file", "-e", f"{c}^{{commit}}"],
                                 capture_output=True).returncode != 0]
    assert not unknown, f"no such commit: {unknown}"


def _perturb(value, target: float, tolerance: float):
    """The JSON value with every number that shows as ``target`` moved well away from it."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (int, float)):
        return value * 1.1 + 1 if abs(value - target) <= tolerance else value
    if isinstance(value, dict):
        return {k: _perturb(v, target, tolerance) for k, v in value.items()}
    if isinstance(value, list):
        return [_perturb(v, target, tolerance) for v in value]
    return value


def _changed_copy(files: list[Path], root: Path, target: float, tolerance: float) -> None:
    """The results files copied under ``root`` (same relative paths), ``target`` changed in each."""
    for path in files:
        copy_path = root / path.relative_to(ROOT)
        copy_path.parent.mkdir(parents=True, exist_ok=True)
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".txt":
            text = re.sub(r"-?\d+(?:\.\d+)?", lambda m: str(_perturb(float(m.group(0)), target, tolerance))
                          if abs(float(m.group(0)) - target) <= tolerance else m.group(0), text)
        elif path.suffix == ".jsonl":
            text = "\n".join(json.dumps(_perturb(json.loads(line), target, tolerance))
                             for line in text.splitlines() if line.strip())
        else:
            text = json.dumps(_perturb(json.loads(text), target, tolerance))
        copy_path.write_text(text, encoding="utf-8")


def test_the_check_fails_when_a_cited_value_changes(tmp_path):
    """Negative control, by hand: drafters.md says staged drafting needs 1.51 draft-model forwards per
    accepted token; a copy of its results file with that value changed no longer supports it."""
    page = ROOT / "docs" / "drafters.md"
    text, refs = next((t, r) for t, r in paragraphs(page.read_text(encoding="utf-8"))
                      if "staged-smollm2-llamacpp" in " ".join(r) and "1.51" in t)
    assert unmatched(page.name, text, refs) == []
    source = RESULTS / "staged-smollm2-llamacpp" / "results.json"
    results = json.loads(source.read_text(encoding="utf-8"))
    overall = results["methods"]["staged:smollm2-135m"]["overall"]
    assert round(overall["draft_forwards_per_accepted"], 2) == 1.51
    changed = copy.deepcopy(results)
    changed["methods"]["staged:smollm2-135m"]["overall"]["draft_forwards_per_accepted"] = 1.5631
    copy_path = tmp_path / "bench-results" / "staged-smollm2-llamacpp" / "results.json"
    copy_path.parent.mkdir(parents=True)
    copy_path.write_text(json.dumps(changed), encoding="utf-8")
    assert unmatched(page.name, text, refs, root=tmp_path) == ["1.51"]
    copy_path.write_text(json.dumps(results), encoding="utf-8")  # the control's control: unchanged passes
    assert unmatched(page.name, text, refs, root=tmp_path) == []


def test_every_checked_paragraph_fails_when_its_numbers_change(tmp_path):
    """Negative control over every page: for each linked paragraph that passes, the first measured
    number it writes (one with decimals) is changed in a copy of its results files, and the check
    must then report it, so no paragraph passes whatever its files hold."""
    controlled = 0
    for n, (page, text, refs) in enumerate(linked_paragraphs()):
        files = [f for ref in refs for f in files_of(ref)]
        if not files or unmatched(page.name, text, refs):
            continue  # nothing to hold its numbers, or already failing the check above
        measured = [(shown, v, d) for shown, v, d, percent in checked_numbers(page.name, text)
                    if d and not percent]
        if not measured:
            continue
        shown, value, decimals = measured[0]
        root = tmp_path / str(n)
        _changed_copy(files, root, value, 0.5 * 10 ** -decimals + 1e-9)
        assert shown in unmatched(page.name, text, refs, root=root), \
            f"{page.name}: {shown} changed in {refs} and the check still passes:\n  {text.strip()[:200]}"
        controlled += 1
    assert controlled >= 15
