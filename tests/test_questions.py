"""Prompt sets: the ones shipped with specdec by name (Spec-Bench, HumanEval, HumanEval as edits),
.jsonl files of either format, and clear errors for the rest."""

from __future__ import annotations

import ast
import json
import re
from collections import Counter
from importlib import resources

import pytest

from specdec.bench.questions import EDITS, load_questions, mixed_questions, prompt_set_names
from specdec.cli import main
from specdec.errors import SpecdecError


def problems() -> list[dict]:
    text = resources.files("specdec.data").joinpath("prompts", "humaneval.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines()]


def test_the_shipped_sets_load_by_name_with_their_licences():
    assert prompt_set_names() == ["spec-bench", "humaneval", "humaneval-edit", "humaneval-repair", "spec-bench-2turn",
                                  "humaneval-files", "structured"]
    prompts = resources.files("specdec.data").joinpath("prompts")
    assert "Apache License" in prompts.joinpath("spec_bench.LICENSE").read_text()
    assert "MIT License" in prompts.joinpath("humaneval.LICENSE").read_text()
    spec = load_questions("spec-bench")
    assert len(spec) == 240
    counts = Counter(q.category for q in spec)
    assert len(counts) == 13 and counts["summarization"] == 40 and counts["writing"] == 5
    assert all(q.prompt.strip() for q in spec)
    assert len(load_questions("humaneval")) == len(load_questions("humaneval-edit")) == len(problems()) == 82


def test_file_questions_ask_about_every_function_of_a_file_with_the_file_in_the_prompt():
    rows = problems()
    questions = load_questions("humaneval-files")
    assert len(questions) == (len(rows) // 2) * 2 * 3 and {q.category for q in questions} == {"files"}
    first = [q for q in questions if q.question_id.startswith("file0:")]
    assert len(first) == 6 and len({q.prompt.split("```")[1] for q in first}) == 1  # one file, six asks
    for row in rows[:2]:
        assert row["canonical_solution"].strip() in first[0].prompt
    assert first[0].question_id == f"file0:{rows[0]['entry_point']}:explain"
    assert f"`{rows[0]['entry_point']}`" in first[0].prompt.split("```")[-1]


def test_humaneval_asks_to_complete_the_function_in_a_code_block():
    rows = problems()
    questions = load_questions("humaneval")
    assert {q.category for q in questions} == {"humaneval"}
    assert [q.question_id for q in questions] == [r["task_id"] for r in rows]
    for q, row in zip(questions, rows):
        assert q.prompt.startswith("Complete the following Python function:\n```python\n")
        assert q.prompt.endswith("```")
        code = q.prompt.split("```python\n", 1)[1][:-3]
        assert code.strip() == row["prompt"].strip()  # the function to complete, whole and unchanged
        ast.parse(code)


def test_humaneval_edit_gives_the_whole_function_and_one_change_cycling_through_the_edits():
    rows = problems()
    questions = load_questions("humaneval-edit")
    assert {q.category for q in questions} == {"editing"}
    kinds = [q.question_id.split(":")[1] for q in questions]
    assert [q.question_id.split(":")[0] for q in questions] == [r["task_id"] for r in rows]
    assert Counter(kinds).keys() == set(EDITS) and min(Counter(kinds).values()) >= 15
    for i, (q, row, kind) in enumerate(zip(questions, rows, kinds)):
        code = re.search(r"```python\n(.*?)```", q.prompt, re.S).group(1)
        # Most of the answer is this code again: the whole solved function is in the prompt.
        assert code.strip() == (row["prompt"] + row["canonical_solution"]).strip()
        func = next(n for n in ast.walk(ast.parse(code)) if isinstance(n, ast.FunctionDef)
                    and n.name == row["entry_point"])
        # The cycle's own edit, or the next one when the function admits no such edit.
        planned = EDITS[i % 3]
        if kind != planned:
            assert (planned, kind) == ("hints", "docstring"), (q.question_id, planned)
            assert all(a.annotation is not None for a in func.args.args) and func.returns is not None
        if kind == "rename":
            name = re.search(r"Rename the (?:parameter|variable) `(\w+)` in `(\w+)`", q.prompt)
            assert name and name.group(2) == row["entry_point"]
            assert re.search(rf"\b{name.group(1)}\b", code)  # it names something that is there
        elif kind == "hints":
            assert f"Add type hints to `{row['entry_point']}` where they are missing" in q.prompt
            named = re.findall(r"`(\w+)`", q.prompt.split("missing:", 1)[1].split("\n", 1)[0])
            assert named == [a.arg for a in func.args.args if a.annotation is None]
            assert ("the return value" in q.prompt) == (func.returns is None)
        else:
            assert f"Reword the docstring of `{row['entry_point']}`" in q.prompt
            assert ast.get_docstring(func)
    assert [q.prompt for q in load_questions("humaneval-edit")] == [q.prompt for q in questions]  # deterministic


def test_a_file_of_either_format_is_read_by_its_fields(tmp_path):
    row = problems()[3]
    path = tmp_path / "mixed.jsonl"
    path.write_text(json.dumps({"question_id": 7, "category": "qa", "turns": ["Why?", "And then?"]}) + "\n\n"
                    + json.dumps(row) + "\n")
    spec, code = load_questions(path)
    assert (spec.question_id, spec.category, spec.prompt) == (7, "qa", "Why?")
    assert (code.question_id, code.category) == (row["task_id"], "humaneval")
    assert row["prompt"].strip() in code.prompt
    assert load_questions(str(path), ["humaneval"]) == [code]


def test_categories_and_limit_select_the_first_questions_of_each_in_file_order():
    got = load_questions("spec-bench", ["writing", "qa"], limit=2)
    assert Counter(q.category for q in got) == {"writing": 2, "qa": 2}
    seen: Counter = Counter()
    expected = []
    for q in load_questions("spec-bench"):
        if q.category in ("writing", "qa") and seen[q.category] < 2:
            seen[q.category] += 1
            expected.append(q)
    assert got == expected


@pytest.mark.parametrize("source, message", [
    ("spec-bnch", "unknown prompt set 'spec-bnch': give spec-bench, humaneval, humaneval-edit, humaneval-repair, spec-bench-2turn, humaneval-files, structured or a path"),
    ("missing/q.jsonl", "questions file not found: missing/q.jsonl"),
    ("q.jsonl", "questions file not found: q.jsonl"),
])
def test_unknown_names_and_missing_files_are_told_apart(source, message):
    with pytest.raises(SpecdecError, match="^" + re.escape(message)):
        load_questions(source)


def test_a_folder_is_refused(tmp_path):
    with pytest.raises(SpecdecError, match="is a folder: give spec-bench"):
        load_questions(tmp_path)


@pytest.mark.parametrize("row, message", [
    ({"task_id": "X/1", "prompt": "", "entry_point": "f"}, "'prompt' must be a non-empty string"),
    ({"task_id": "X/1"}, "'prompt'"),
    ({"id": 1, "text": "hello"}, "a Spec-Bench row has question_id, category and turns"),
    ([1, 2], "a Spec-Bench row has"),
])
def test_rows_of_neither_format_are_refused_with_their_line(tmp_path, row, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"question_id": 1, "category": "a", "turns": ["ok"]}) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(SpecdecError) as err:
        load_questions(path)
    assert str(err.value).startswith(f"{path}:2 is not a Spec-Bench question, HumanEval problem or chat request")
    assert message in str(err.value)


def test_a_line_that_is_not_json_is_named(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"question_id": 1, "category": "a", "turns": ["ok"]}\n{"oops"\n')
    with pytest.raises(SpecdecError, match=rf"^{re.escape(str(path))}:2 is not a JSON line"):
        load_questions(path)


def test_no_question_in_the_categories_names_the_ones_there():
    with pytest.raises(SpecdecError, match=r"^no questions in categories coding in humaneval \(it has humaneval\)$"):
        load_questions("humaneval", ["coding"])


@pytest.mark.parametrize("argv, message", [
    (["--questions", "humaneval-edits"], "error: unknown prompt set 'humaneval-edits'"),
    ([], "error: --methods needs --questions (spec-bench, humaneval, humaneval-edit, humaneval-repair, spec-bench-2turn, humaneval-files, structured or FILE.jsonl)"),
])
def test_bench_refuses_a_bad_set_in_one_line_before_loading(capsys, tmp_path, tiny_model_dir, no_loading, argv,
                                                             message):
    code = main(["bench", "--model", str(tiny_model_dir), "--methods", "plain", "--out", str(tmp_path / "o"), *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert no_loading == []
    assert code == 2 and len(err) == 1 and err[0].startswith(message), err


def test_bench_help_lists_the_sets(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "spec-bench, humaneval, humaneval-edit" in out


def test_the_structured_set_asks_for_json_valid_against_a_schema_per_kind(tmp_path):
    (tmp_path / "two.jsonl").write_text("".join(json.dumps(row) + "\n" for row in problems()[:2]))
    questions = load_questions("structured")
    counts = Counter(q.category for q in questions)
    assert counts == {"json-function": 82, "json-article": 40, "json-extraction": 5}
    for q in questions:
        assert q.schema["type"] == "object" and q.schema["additionalProperties"] is False
        assert q.messages == ({"role": "user", "content": q.prompt},)
    function = next(q for q in questions if q.category == "json-function")
    assert "def has_close_elements" in function.prompt and "examples" in function.schema["properties"]
    held_out = load_questions("structured:" + str(tmp_path / "two.jsonl"))  # rows given: those alone
    assert [q.category for q in held_out] == ["json-function"] * 2


def test_chat_request_bodies_are_questions(tmp_path):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    rows = [{"id": "r1", "category": "json", "max_tokens": 40, "messages": [
                {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Give a."}],
             "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}},
            {"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_object"}},
            {"messages": [{"role": "user", "content": "plain"}]}]
    path = tmp_path / "requests.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    first, second, third = load_questions(path)
    assert (first.question_id, first.category, first.prompt, first.max_tokens) == ("r1", "json", "Give a.", 40)
    assert first.schema == schema and len(first.messages) == 2
    assert second.schema == {"type": "object"} and third.schema is None and third.category == "requests"


@pytest.mark.parametrize("row, message", [
    ({"messages": [{"role": "user", "content": "x"}], "tools": []}, "the bench does not send tools"),
    ({"messages": []}, "messages must be a non-empty list"),
    ({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema"}}, "must carry a schema"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens must be"),
])
def test_bad_request_bodies_are_refused_with_their_line(tmp_path, row, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(SpecdecError, match=re.escape(message)) as err:
        load_questions(path)
    assert str(err.value).startswith(f"{path}:1")



def test_a_load_tests_requests_take_each_set_in_turn_and_its_categories_in_turn():
    mixed = mixed_questions(["humaneval", "spec-bench"])
    humaneval, spec_bench = load_questions("humaneval"), load_questions("spec-bench")
    assert len(mixed) == len(humaneval) + len(spec_bench)
    assert [q.prompt for q in mixed[:6:2]] == [q.prompt for q in humaneval[:3]]
    categories = list(dict.fromkeys(q.category for q in spec_bench))
    assert [q.category for q in mixed[1:6:2]] == categories[:3]  # each category's first question first
    assert mixed[1].prompt == next(q.prompt for q in spec_bench if q.category == categories[0])
    # A request is one message: a two-turn question keeps its first turn.
    chats = load_questions("spec-bench-2turn")
    firsts = mixed_questions(["spec-bench-2turn"])
    assert chats[0].conversation is not None and all(q.conversation is None for q in firsts)
    assert firsts[0].prompt == chats[0].prompt and firsts[0].question_id == chats[0].question_id
