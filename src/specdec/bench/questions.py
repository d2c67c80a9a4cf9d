"""Spec-Bench questions (``question_id``, ``category``, ``turns``): the first turn is the prompt."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from specdec.errors import SpecdecError


@dataclass(frozen=True)
class Question:
    question_id: int | str
    category: str
    prompt: str


def load_questions(path: str | Path, categories: list[str] | None = None, limit: int | None = None) -> list[Question]:
    """Questions from a Spec-Bench jsonl file, optionally filtered by category, first ``limit`` of each."""
    path = Path(path)
    if not path.is_file():
        raise SpecdecError(f"questions file not found: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise SpecdecError(f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise SpecdecError(f"cannot read {path}: {exc.strerror or exc}") from None
    questions: list[Question] = []
    seen: dict[str, int] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            q = _question(json.loads(line))
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise SpecdecError(f"{path}:{n} is not a Spec-Bench question ({exc})") from exc
        if categories and q.category not in categories:
            continue
        if limit is not None and seen.get(q.category, 0) >= limit:
            continue
        seen[q.category] = seen.get(q.category, 0) + 1
        questions.append(q)
    if not questions:
        wanted = f" in categories {', '.join(categories)}" if categories else ""
        raise SpecdecError(f"no questions{wanted} in {path}")
    return questions


def _question(row: dict) -> Question:
    turns = row["turns"]
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
        raise ValueError("'turns' must be a non-empty list of strings")
    if not turns[0].strip():
        raise ValueError("the first turn is empty")
    if not isinstance(row["category"], str):
        raise ValueError("'category' must be a string")
    return Question(row["question_id"], row["category"], turns[0])
