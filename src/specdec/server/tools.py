"""Tool calls in OpenAI's chat API, for models whose chat template writes them as Hermes does
(``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``: Qwen2.5, Hermes, and most open
models fine-tuned for tools).

The request's ``tools`` go to the model's own chat template (as ``apply_chat_template(tools=...)``
renders them), and earlier turns' ``tool_calls`` and ``tool`` messages with them; the model's text
is parsed back into ``tool_calls``. With ``tool_choice`` ``required`` or a named function the answer
is constrained (:mod:`specdec.constraints`) to tool calls whose arguments follow the function's
parameter schema; with ``auto`` the model chooses; with ``none`` no tools are shown to it.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from specdec.constraints import Spec
from specdec.errors import SpecdecError

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_CALL = re.compile(re.escape(OPEN) + r"\s*(.*?)\s*" + re.escape(CLOSE), re.S)


def supports_tools(chat_template: str | None) -> bool:
    """Whether a chat template renders tool calls in the Hermes form this module parses."""
    return bool(chat_template) and OPEN in chat_template


def template_messages(messages: list[dict]) -> list[dict]:
    """OpenAI's messages as chat templates take them: an assistant's ``tool_calls`` with their
    arguments as objects (OpenAI sends them as JSON text), a tool's result as its content."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            calls = []
            for call in m["tool_calls"]:
                function = dict(call["function"])
                try:
                    function["arguments"] = json.loads(function["arguments"])
                except (TypeError, json.JSONDecodeError):
                    raise SpecdecError(f"tool call {call.get('id', '')!r}: arguments are not a JSON object") from None
                calls.append({"type": "function", "id": call.get("id"), "function": function})
            m["tool_calls"] = calls
            m["content"] = m.get("content") or ""
        out.append(m)
    return out


def markers(tokenizer) -> tuple[str, str]:
    """``<tool_call>`` and ``</tool_call>`` as a grammar writes them for this tokenizer: the token
    itself where the vocabulary has it as one added token (Qwen2.5's, which the model writes and
    which text would never tokenize to), else the text."""
    added = getattr(tokenizer, "get_added_vocab", lambda: {})()
    return tuple(f"<[{added[m]}]>" if m in added else json.dumps(m) for m in (OPEN, CLOSE))


def call_constraint(tools: list[dict], choice: Any, parallel: bool,
                    marks: tuple[str, str] = (json.dumps(OPEN), json.dumps(CLOSE))) -> Spec | None:
    """The grammar of an answer that must call a tool (``required``) or the named one: each call a
    ``<tool_call>`` block (``marks``: :func:`markers`) of the function's name and arguments valid
    against its parameters."""
    if choice in (None, "auto", "none"):
        return None
    functions = [t["function"] for t in tools]
    if isinstance(choice, dict):
        name = choice["function"]["name"]
        functions = [f for f in functions if f["name"] == name]
        if not functions:
            raise SpecdecError(f"tool_choice names {name!r}, which is not among the tools")
    alternatives = []
    for i, function in enumerate(functions):
        schema = {"type": "object", "properties": {"name": {"const": function["name"]},
                                                   "arguments": function.get("parameters") or {"type": "object"}},
                  "required": ["name", "arguments"], "additionalProperties": False}
        alternatives.append(f"call_{i}: %json {json.dumps(schema)}")
    rules = "\n".join(alternatives)
    calls = " | ".join(f"call_{i}" for i in range(len(functions)))
    block = f'{marks[0]} "\\n" ({calls}) "\\n" {marks[1]}'
    start = 'start: block ("\\n" block)*' if parallel else "start: block"
    return Spec("lark", f"{start}\nblock: {block}\n{rules}\n")


@dataclass
class Parsed:
    """A reply split into its text and its tool calls (OpenAI's shape)."""

    content: str | None
    calls: list[dict]


def parse(text: str) -> Parsed:
    """The tool calls written in ``text`` (each a ``<tool_call>`` block of JSON with a name and
    arguments) and the text around them; a block that is not such JSON stays text."""
    calls, kept, at = [], [], 0
    for match in _CALL.finditer(text):
        try:
            value = json.loads(match.group(1))
            name, arguments = value["name"], value.get("arguments", {})
        except (json.JSONDecodeError, KeyError, TypeError):
            continue
        if not isinstance(name, str):
            continue
        kept.append(text[at:match.start()])
        at = match.end()
        calls.append({"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                      "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}})
    kept.append(text[at:])
    content = "".join(kept).strip()
    return Parsed(content or None, calls)


def held_back(text: str) -> int:
    """Where streamed text must stop while a tool call may be starting: the start of a ``<tool_call>``
    block, or of a tail that could begin one (the rest waits for the answer's end)."""
    at = text.find(OPEN)
    if at >= 0:
        return at
    for n in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if OPEN.startswith(text[-n:]):
            return len(text) - n
    return len(text)
