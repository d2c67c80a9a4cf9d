"""Workloads of several turns: the repair loop's sandbox, its conversation, Spec-Bench's two-turn
chats, ``SET:FILE``, and the bench running every turn of a question with one method."""

from __future__ import annotations

import builtins
import json

import pytest

from conftest import FakeCosts

from specdec.bench.base import Method, RunResult
from specdec.bench.conversations import FEEDBACK, RepairLoop, ScriptedTurns
from specdec.bench.questions import Question, load_questions
from specdec.bench.runner import run_bench, summarize
from specdec.bench.sandbox import run_tests
from specdec.cli import main
from specdec.errors import SpecdecError

PROMPT = 'from typing import List\n\n\ndef total(xs: List[int]) -> int:\n    """Sum of xs."""\n'
TEST = "def check(candidate):\n    assert candidate([1, 2, 3]) == 6\n    assert candidate([]) == 0\n"
RIGHT = "```python\ndef total(xs: List[int]) -> int:\n    return sum(xs)\n```\nThis sums them."
WRONG = "```python\ndef total(xs: List[int]) -> int:\n    return len(xs)\n```"


def test_passing_code_passes_and_failing_code_fails_with_its_traceback():
    assert run_tests("def total(xs):\n    return sum(xs)\n", TEST, "total").passed
    failed = run_tests("def total(xs):\n    return len(xs)\n", TEST, "total")
    assert not failed.passed and "AssertionError" in failed.output and "candidate([1, 2, 3]) == 6" in failed.output
    broken = run_tests("def total(xs) return 1\n", TEST, "total")
    assert not broken.passed and "SyntaxError" in broken.output


def test_the_code_runs_outside_our_process_within_limits(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = ("import builtins, os\nbuiltins.SPECDEC_TOUCHED = True\nopen('left.txt', 'w').write('x')\n"
            "def total(xs):\n    return sum(xs)\n")
    assert run_tests(code, TEST, "total").passed
    assert not hasattr(builtins, "SPECDEC_TOUCHED") and not (tmp_path / "left.txt").exists()
    slow = run_tests("def total(xs):\n    while True: pass\n", TEST, "total", time_limit_s=1.0)
    assert not slow.passed and "Timed out" in slow.output
    hog = run_tests("def total(xs):\n    b = bytearray(4 << 30)\n    return sum(xs)\n", TEST, "total")
    assert not hog.passed and "MemoryError" in hog.output


def test_the_repair_loop_feeds_failures_back_until_the_tests_pass_or_three_answers():
    loop = RepairLoop(PROMPT, TEST, "total")
    assert loop.code(RIGHT).startswith("from typing import List\n")  # the prompt's imports first
    assert "This sums" not in loop.code(RIGHT)  # the code block, not the prose
    body_only = loop.code("    return sum(xs)\n")  # a bare body continues the prompt's signature
    assert run_tests(body_only, TEST, "total").passed
    feedback = loop.reply([WRONG])
    assert feedback is not None and feedback.startswith(FEEDBACK.split("{")[0]) and "AssertionError" in feedback
    assert loop.reply([WRONG, RIGHT]) is None
    assert loop.outcome([WRONG, RIGHT]) == {"passed": True, "turns": 2}
    assert loop.reply([WRONG, WRONG, WRONG]) is None  # three answers: over
    assert loop.outcome([WRONG, WRONG, WRONG]) == {"passed": False, "turns": 3}


def test_scripted_turns_follow_each_answer_once():
    turns = ScriptedTurns(("second?",))
    assert turns.max_turns == 2 and turns.reply(["a"]) == "second?" and turns.reply(["a", "b"]) is None


def test_the_shipped_workloads_and_a_set_built_from_another_file(tmp_path):
    repair = load_questions("humaneval-repair")
    assert len(repair) == 82 and {q.category for q in repair} == {"repair"}
    assert all(isinstance(q.conversation, RepairLoop) for q in repair)
    chats = load_questions("spec-bench-2turn")
    assert len(chats) == 40 and len({q.category for q in chats}) == 8
    assert all(isinstance(q.conversation, ScriptedTurns) for q in chats)
    problem = {"task_id": "Mine/0", "prompt": PROMPT, "canonical_solution": "    return sum(xs)\n",
               "entry_point": "total", "test": TEST}
    path = tmp_path / "problems.jsonl"
    path.write_text(json.dumps(problem) + "\n")
    for name in ("humaneval", "humaneval-edit", "humaneval-repair"):
        (question,) = load_questions(f"{name}:{path}")
        assert question.question_id.startswith("Mine/0") and "def total" in question.prompt
    with pytest.raises(SpecdecError, match="not found"):
        load_questions(f"humaneval-repair:{tmp_path / 'missing.jsonl'}")
    path.write_text(json.dumps({"question_id": 1, "category": "x", "turns": ["hi"]}) + "\n")
    with pytest.raises(SpecdecError, match="does not fit the set"):
        load_questions(f"humaneval-repair:{path}")


class _Scripted(Method):
    """Answers the repair loop wrong first, then right; counts the prompts it was given."""

    def __init__(self, name):
        self.name, self.family, self.prompts = name, "ours", []

    def run(self, prompt_ids, max_new_tokens, seed):
        self.prompts.append(list(prompt_ids))
        return RunResult([1] if len(prompt_ids) <= 3 else [2], 1.0, gen_s=0.5)


class _ChatModel(FakeCosts):
    has_chat_template = True
    name = "fake"

    @property
    def loaded(self):
        return self

    @property
    def codec(self):
        return self

    def encode(self, text, chat=False):
        return [7, 7, 7]

    def encode_messages(self, messages):
        assert [m["role"] for m in messages] == ["user", "assistant", "user"]
        assert messages[1]["content"] == WRONG and "AssertionError" in messages[2]["content"]
        return [7, 7, 7, 8, 9]

    def decode(self, ids):
        return {1: WRONG, 2: RIGHT}[ids[0]]


def test_the_bench_runs_every_turn_and_reports_the_pass_rate():
    method = _Scripted("plain")
    question = Question("T/0", "repair", "write total", RepairLoop(PROMPT, TEST, "total"))
    bench = run_bench(_ChatModel(), [method], [question], 8, greedy=True)
    (result,) = bench.runs["plain"]
    assert result.token_ids == [1, 2] and result.turns == 2 and result.outcome == {"passed": True, "turns": 2}
    assert result.wall_s == 2.0 and result.first_turn == 1
    assert method.prompts[-2:] == [[7, 7, 7], [7, 7, 7, 8, 9]]
    stats = summarize(bench, _ChatModel(), divergences=False)["plain"]["overall"]
    assert stats["pass_rate"] == 1.0 and stats["turns"] == 2


def test_a_base_model_cannot_run_a_conversation():
    class Base(_ChatModel):
        has_chat_template = False

    with pytest.raises(SpecdecError, match="no chat template"):
        run_bench(Base(), [_Scripted("plain")], [Question(1, "c", "x", ScriptedTurns(("y",)))], 8, greedy=True)


def test_two_turn_chats_end_to_end_on_a_tiny_model(capsys, tmp_path, tiny_model_dir):
    rows = [{"question_id": i, "category": "chat", "turns": [first, "Now say it again, the same way."]}
            for i, first in enumerate(["the quick brown fox jumps over the lazy dog", "hello world, hello there"])]
    rows.append({"question_id": 9, "category": "chat", "turns": ["one turn only: not in the two-turn set"]})
    path = tmp_path / "chats.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = tmp_path / "out"
    code = main(["bench", "--model", str(tiny_model_dir), "--questions", f"spec-bench-2turn:{path}",
                 "--max-new-tokens", "10", "--methods", "plain,ngram", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    results = json.loads((out / "results.json").read_text())
    for name in ("plain", "ngram"):
        overall = results["methods"][name]["overall"]
        assert overall["questions"] == 2 and overall["turns"] == 4 and overall["identical"] is True
    lines = [json.loads(line) for line in (out / "outputs.jsonl").read_text().splitlines()]
    assert {line["turns"] for line in lines} == {2}
