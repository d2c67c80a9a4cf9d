"""Questions of more than one turn: what the user says after each of the model's answers.

A :class:`Conversation` gets the model's answers so far and returns the next user message, or None
when the conversation is over; the bench runs every turn with the same method, each turn's prompt
holding the earlier turns and answers, and counts the whole conversation's tokens and time.

- :class:`ScriptedTurns`: the user's turns are fixed (Spec-Bench's two-turn conversations, the
  first answer in the context of the second question).
- :class:`RepairLoop`: an agent's repair loop on a HumanEval problem. The model writes the
  function; the problem's tests run on it in a subprocess (:mod:`specdec.bench.sandbox`); while they
  fail, the failure goes back to the model, which revises its code, up to ``max_turns`` answers.
  Most of a revision copies the previous answer. Its outcome (passed, and in how many turns) is
  reported beside the speed: greedy and exact, it cannot depend on the drafter.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from specdec.bench.sandbox import TestOutcome, run_tests

FEEDBACK = ("The code fails its tests:\n```\n{output}\n```\nFix the function. Reply with the whole "
            "corrected code in one Python code block.")
CODE_BLOCK = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)(?:```|\Z)", re.S)


class Conversation(ABC):
    """The user's side of a conversation of several turns."""

    max_turns: int

    @abstractmethod
    def reply(self, answers: list[str]) -> str | None:
        """The user's next message after the model's ``answers`` so far (one per turn, oldest
        first), or None: the conversation ends."""

    def outcome(self, answers: list[str]) -> dict | None:
        """What the conversation achieved, for the bench's results (None: nothing to report)."""
        return None


@dataclass(eq=False)
class ScriptedTurns(Conversation):
    """Fixed user turns after the first (the question's prompt)."""

    turns: tuple[str, ...]

    @property
    def max_turns(self) -> int:  # type: ignore[override]
        return 1 + len(self.turns)

    def reply(self, answers: list[str]) -> str | None:
        i = len(answers) - 1
        return self.turns[i] if 0 <= i < len(self.turns) else None


@dataclass(eq=False)
class RepairLoop(Conversation):
    """Write, test, revise: HumanEval's ``prompt`` (whose imports the model's code may lack),
    ``test`` and ``entry_point``; at most ``max_turns`` answers."""

    prompt: str
    test: str
    entry_point: str
    max_turns: int = 3
    _tested: dict[str, TestOutcome] = field(default_factory=dict, repr=False)

    def code(self, answer: str) -> str:
        """The code of an answer: its first Python code block (or all of it), after the problem's
        imports, and after the problem's signature where the answer holds only a body."""
        blocks = CODE_BLOCK.findall(answer)
        code = blocks[0] if blocks else answer
        imports = "".join(line + "\n" for line in self.prompt.splitlines()
                          if line.startswith(("import ", "from ")))
        if not re.search(rf"^\s*def\s+{re.escape(self.entry_point)}\s*\(", code, re.M):
            code = self.prompt + code  # a body only: it continues the prompt's signature
        return imports + code

    def test_answer(self, answer: str) -> TestOutcome:
        code = self.code(answer)
        if code not in self._tested:  # reply and outcome ask about the same answer
            self._tested[code] = run_tests(code, self.test, self.entry_point)
        return self._tested[code]

    def reply(self, answers: list[str]) -> str | None:
        if not answers or len(answers) >= self.max_turns:
            return None
        result = self.test_answer(answers[-1])
        return None if result.passed else FEEDBACK.format(output=result.output)

    def outcome(self, answers: list[str]) -> dict | None:
        passed = bool(answers) and self.test_answer(answers[-1]).passed
        return {"passed": passed, "turns": len(answers)}
