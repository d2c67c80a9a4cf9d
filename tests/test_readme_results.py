"""`make results`: the README table's five workloads run at one clean commit, llama-server's plain
decoding and n-gram types in every row, and the table regenerated from what the runs recorded."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import readme_results  # noqa: E402


def _method(gen: float, plain_gen: float, speedup: float = 1.0, identical=True) -> dict:
    return {"overall": {"gen_tokens_per_s": gen, "gen_speedup": gen / plain_gen, "speedup": speedup,
                        "identical": identical}}


def _results(commit: str, questions: str, peers: dict[str, float]) -> dict:
    methods = {"plain": _method(30.0, 30.0), "ngram": _method(45.0, 30.0, 1.3),
               "llama-server-plain": _method(31.0, 31.0, identical=None)}
    methods.update({name: _method(gen, 31.0, 1.05, identical=False) for name, gen in peers.items()})
    return {"model": "qwen2.5-coder-1.5b", "cpu": "Test CPU-avx2-2t", "commit": commit, "date": "2026-11-28 10:00",
            "questions": questions, "limit": 2, "question_ids": [1, 2], "methods": methods}


def test_every_row_runs_the_peers_and_the_workloads_name_their_prompts():
    """Each workload's command runs our plain decoding and ngram beside llama-server's plain
    decoding and n-gram types, into its own bench-results folder; the editing, repair and two-turn
    rows ask the held-out prompts."""
    for w in readme_results.WORKLOADS:
        command = w.command()
        methods = command[command.index("--methods") + 1].split(",")
        assert {"plain", "ngram", "llama-server-plain"} <= set(methods)
        assert any(m.startswith("llama-server-ngram-") for m in methods)
        assert command[command.index("--out") + 1] == w.folder and w.folder.startswith("bench-results/")
    held_out = {w.name for w in readme_results.WORKLOADS if readme_results.HELDOUT in w.questions}
    assert held_out == {"editing", "agent repair loop", "two-turn chats", "structured output"}


def test_the_table_reads_prompts_commit_machine_and_the_best_peer_from_the_records(tmp_path):
    for i, w in enumerate(readme_results.WORKLOADS):
        folder = tmp_path / w.folder
        folder.mkdir(parents=True)
        peers = {"llama-server-ngram-simple": 33.0, "llama-server-ngram-mod": 35.0 if i % 2 else 32.0}
        (folder / "results.json").write_text(json.dumps(_results("abc123def456", w.questions, peers)))
    table = readme_results.table(tmp_path)
    rows = [line for line in table.splitlines() if line.startswith("| [")]
    assert len(rows) == len(readme_results.WORKLOADS)
    assert "2 held-out functions" in rows[0] and "2 tuning questions" in rows[3]
    assert "`ngram-simple` 33.0" in rows[0] and "`ngram-mod` 35.0" in rows[1]  # the faster type of each run
    assert "answers differ" in rows[0]  # the peer's answers are not plain decoding's
    assert "commit `abc123def456`" in table and "Test CPU-avx2-2t" in table
    assert "every specdec answer identical" in table


def test_a_workload_not_yet_run_says_so_and_a_structured_row_says_how_many_answers_are_valid(tmp_path):
    """A workload whose folder make results has not written yet is a row saying so (the table still
    renders); a structured run's row carries the share of specdec answers valid against the schema."""
    structured = next(w for w in readme_results.WORKLOADS if w.name == "structured output")
    folder = tmp_path / structured.folder
    folder.mkdir(parents=True)
    results = _results("abc123def456", structured.questions, {"llama-server-ngram-simple": 30.0})
    results["methods"]["plain"]["overall"]["schema_valid"] = 1.0
    results["methods"]["ngram"]["overall"]["schema_valid"] = 0.875
    (folder / "results.json").write_text(json.dumps(results))
    rows = readme_results.table(tmp_path).splitlines()
    assert sum("not yet run by `make results`" in r for r in rows) == len(readme_results.WORKLOADS) - 1
    assert any(r.startswith("| [structured output]") and "specdec answers valid: 88%" in r for r in rows)


def test_a_run_recorded_without_its_prompts_says_so():
    assert readme_results.prompts({"command": "specdec bench --questions spec-bench --limit 4"}) == "tuning"
    assert readme_results.prompts({"command": "specdec bench --questions humaneval-edit:bench-results/"
                                            "heldout-inputs/humaneval-p8-15.jsonl"}) == "held-out"
    assert readme_results.prompts({"command": "python scripts/costs.py kernels"}) == "not recorded"


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture()
def checkout(tmp_path) -> Path:
    """A git checkout with one commit: code under src/, the README with its table's markers."""
    root = tmp_path / "checkout"
    (root / "src").mkdir(parents=True)
    (root / "src" / "code.py").write_text("x = 1\n")
    (root / "README.md").write_text(f"# r\n\n{readme_results.BEGIN}\nold\n{readme_results.END}\n")
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    return root


def test_make_results_refuses_a_checkout_with_uncommitted_code(checkout):
    (checkout / "src" / "code.py").write_text("x = 2\n")
    with pytest.raises(SystemExit, match="clean commit"):
        readme_results.run_all(checkout, bench=lambda command, root: None)


def test_make_results_runs_every_workload_at_one_commit_and_regenerates(checkout, monkeypatch):
    commit = _git(checkout, "rev-parse", "--short=12", "HEAD")
    ran = []

    def bench(command, root):
        ran.append(command)
        out = root / command[command.index("--out") + 1]
        out.mkdir(parents=True, exist_ok=True)
        questions = command[command.index("--questions") + 1]
        (out / "results.json").write_text(json.dumps(_results(commit, questions, {"llama-server-ngram-mod": 33.0})))

    regenerated = []
    monkeypatch.setattr(readme_results, "regenerate", lambda root: regenerated.append(root))
    timing = readme_results.run_all(checkout, bench=bench)
    assert [c[c.index("--out") + 1] for c in ran] == [w.folder for w in readme_results.WORKLOADS]
    assert regenerated == [checkout] and timing["commit"] == commit
    recorded = json.loads((checkout / readme_results.TIMING / "results.json").read_text())
    assert set(recorded["seconds"]) == {w.name for w in readme_results.WORKLOADS}
    assert recorded["machine"] == "Test CPU-avx2-2t"
    readme_results.write(checkout)
    assert f"commit `{commit}`" in (checkout / "README.md").read_text()


def test_make_results_refuses_runs_that_recorded_another_commit(checkout, monkeypatch):
    def bench(command, root):
        out = root / command[command.index("--out") + 1]
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(_results("0123456789ab+dirty", "spec-bench", {})))

    monkeypatch.setattr(readme_results, "regenerate", lambda root: None)
    with pytest.raises(SystemExit, match="recorded commits"):
        readme_results.run_all(checkout, bench=bench)


def test_the_benchmarks_page_shows_the_commands_make_results_runs():
    """docs/how-to/benchmark.md lists make results' commands as they are (tests/test_readme_commands.py
    then runs each through the bench's checks)."""
    page = (ROOT / "docs" / "how-to" / "benchmark.md").read_text(encoding="utf-8")
    for workload in readme_results.WORKLOADS:
        assert " ".join(workload.command()) in page, workload.name
