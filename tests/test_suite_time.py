"""The suite's 15-minute budget, checked from its own timing log (tests/suite_time.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

import suite_time  # noqa: E402  (tests/suite_time.py, beside this file)


def _log(setup_s: float, suite_s: float, full: bool = True, make: bool = True) -> dict:
    tests = {f"tests/test_{f}.py::test_{i}": {"setup": 30.0 if i == 0 else 0.0, "call": suite_s / 40, "teardown": 0.0}
             for f in ("a", "b") for i in range(20)}
    return {"date": "2026-11-28 10:00 UTC", "commit": "abc", "machine": "Test CPU-avx2-2t", "full_run": full,
            "exitstatus": 0, "make_start": 1000.0 if make else None, "started": 1000.0 + setup_s,
            "finished": 1000.0 + setup_s + suite_s, "wall_s": suite_s,
            "outcomes": {"passed": 40, "failed": 0, "skipped": 0}, "tests": tests}


def test_a_full_make_test_within_its_budget_passes_and_one_over_fails():
    assert suite_time.check(_log(setup_s=300, suite_s=590)) is None
    broken = suite_time.check(_log(setup_s=300, suite_s=610))  # 15:10 with setup
    assert broken and "15:10" in broken and "setup 5:00" in broken


def test_a_partial_run_or_one_not_started_by_make_is_reported_not_judged():
    assert suite_time.check(_log(300, 2000, full=False)) is None
    assert suite_time.check(_log(300, 2000, make=False)) is None


def test_the_report_says_where_the_time_went():
    text = suite_time.report(_log(setup_s=300, suite_s=600))
    assert "make test: 15:00 (setup 5:00, suite 10:00)" in text
    assert "tests/test_a.py" in text and "fixture setups" in text
    assert "30.0 s  tests/test_a.py::test_0" in text  # a slow fixture named by the test that paid for it


def test_a_parallel_run_reports_its_workers():
    log = {**_log(setup_s=300, suite_s=400), "workers": 2}
    log["tests"] = {k: {**t, "call": 15.0} for k, t in log["tests"].items()}  # 40 x 15 s + 60 s of setups
    assert "tests 660 s on 2 workers: 1.65 of them busy on average" in suite_time.report(log)


def test_check_exits_nonzero_over_budget(tmp_path, capsys):
    path = tmp_path / "times.json"
    path.write_text(json.dumps(_log(300, 700)))
    assert suite_time.main(["check", "--log", str(path)]) == 1
    assert "over its budget of 15:00" in capsys.readouterr().err
    assert suite_time.main(["check", "--log", str(path), "--budget", "1200"]) == 0


def test_a_record_names_its_failed_tests(tmp_path):
    log = {**_log(300, 400), "outcomes": {"passed": 39, "failed": 1, "skipped": 0}, "failed": ["tests/test_a.py::test_3"]}
    result = suite_time.record(log, tmp_path)
    assert result["failed_tests"] == ["tests/test_a.py::test_3"] and result["outcomes"]["failed"] == 1
    assert json.loads((tmp_path / "results.json").read_text())["failed_tests"] == ["tests/test_a.py::test_3"]


RECORD_TEST = "tests/test_suite_time.py::test_the_recorded_fresh_clone_make_test_kept_its_budget"


def test_the_recorded_fresh_clone_make_test_kept_its_budget():
    """bench-results/make-test: a fresh clone's full `make test` on a 2-core machine, setup included,
    under 15 minutes, and its log says where the time went."""
    path = ROOT / "bench-results" / "make-test" / "results.json"
    if not path.exists():
        pytest.skip("no make test run recorded yet (tests/suite_time.py record bench-results/make-test)")
    recorded = json.loads(path.read_text(encoding="utf-8"))
    assert recorded["total_s"] == pytest.approx(recorded["setup_s"] + recorded["suite_s"], abs=2)
    assert recorded["total_s"] <= recorded["budget_s"] == suite_time.BUDGET_S
    # This test judges the record a run starts with, not that run: the run that replaces a record
    # over the budget fails here, by design, and may fail nowhere else.
    failed = recorded.get("failed_tests", [])
    assert recorded["outcomes"]["failed"] == len(failed) and set(failed) <= {RECORD_TEST}
    assert recorded["outcomes"]["passed"] > 700
    assert recorded["machine"].endswith("-2t")
    # the tests' seconds fit in the suite's wall time on its workers (pytest-xdist: make test's -n)
    assert sum(recorded["files_s"].values()) <= recorded["suite_s"] * recorded.get("workers", 1)

