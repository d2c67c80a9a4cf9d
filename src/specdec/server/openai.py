"""OpenAI's response objects: finish reasons, the ``text_completion`` and ``chat.completion``
answers and their streamed chunks, ``usage`` (with specdec's speculation counters beside it) and
server-sent events."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, ClassVar

from specdec.api import Output
from specdec.engine import TokenLogprob
from specdec.server.tools import held_back, parse
from specdec.stats import GenerationStats

FINISH = {"eos": "stop", "stop": "stop", "length": "length"}  # specdec's finish reason -> OpenAI's


def usage(stats: GenerationStats, seed: int | None) -> dict:
    """OpenAI's ``usage``, and specdec's speculation counters beside it: llama.cpp's names
    (``draft_n``, ``draft_n_accepted``), then what the rates and timings add."""
    spec: dict[str, Any] = {"draft_n": stats.drafted, "draft_n_accepted": stats.accepted,
                            "acceptance_rate": round(stats.acceptance_rate, 4),
                            "mean_accepted_length": round(stats.mean_accepted_length, 4),
                            "target_forwards": stats.target_forwards,
                            "tokens_per_s": round(stats.tokens_per_s, 3)}
    if seed is not None:
        spec["seed"] = seed
    return {"usage": {"prompt_tokens": stats.prompt_tokens, "completion_tokens": stats.new_tokens,
                      "total_tokens": stats.prompt_tokens + stats.new_tokens,
                      "prompt_tokens_details": {"cached_tokens": stats.cached_tokens}},
            "speculative": spec}


def _entry(token: int, logprob: float, text_of) -> dict:
    text = text_of(token)
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


def chat_logprobs(entries: list[TokenLogprob], text_of) -> dict:
    """OpenAI's chat ``logprobs``: each token's text, log-probability and bytes, with its
    ``top_logprobs``."""
    return {"content": [{**_entry(e.token, e.logprob, text_of),
                         "top_logprobs": [_entry(t, lp, text_of) for t, lp in e.top]} for e in entries],
            "refusal": None}


def completion_logprobs(entries: list[TokenLogprob], text_of, offset: int = 0) -> dict:
    """OpenAI's completions ``logprobs``: tokens, their log-probabilities, the likeliest tokens'
    by text at each position, and where each token's text starts in the answer."""
    tokens = [text_of(e.token) for e in entries]
    offsets, at = [], offset
    for text in tokens:
        offsets.append(at)
        at += len(text)
    return {"tokens": tokens, "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [{text_of(t): lp for t, lp in e.top} for e in entries], "text_offset": offsets}


def sse(payload: dict) -> str:
    """One server-sent event."""
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


@dataclass
class Answer:
    """The objects of one request's answer: the whole answer or its streamed chunks, all with the
    same id and creation time."""

    model: str
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))
    text_of: Any = None  # a token's text (for logprobs), where the request asked for them
    _offset: int = 0  # the text the streamed logprobs covered so far (completions' text_offset)

    prefix: ClassVar[str] = ""
    chunk_object: ClassVar[str] = ""
    whole_object: ClassVar[str] = ""

    def __post_init__(self) -> None:
        self.id = self.id or f"{self.prefix}-{uuid.uuid4().hex}"

    def envelope(self, obj: str, choices: list[dict]) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices}

    def opening(self) -> dict | None:
        """The chunk a stream starts with, before any text (None: none)."""
        return None

    def chunk(self, text: str | None, finish: str | None = None, logprobs: list[TokenLogprob] | None = None) -> dict:
        """A streamed chunk with new ``text`` (or none), the log-probabilities of the tokens it
        adds where asked, and the finish reason in the last one."""
        raise NotImplementedError

    def usage_chunk(self, stats: GenerationStats, seed: int | None) -> dict:
        """The last chunk when the client asked for ``stream_options.include_usage``."""
        return {**self.envelope(self.chunk_object, []), **usage(stats, seed)}

    def whole(self, out: Output) -> dict:
        """The answer of a request that did not stream."""
        raise NotImplementedError


class Completion(Answer):
    """``/v1/completions``: ``text_completion`` objects, streamed or not."""

    prefix = "cmpl"
    chunk_object = whole_object = "text_completion"

    def chunk(self, text: str | None, finish: str | None = None, logprobs: list[TokenLogprob] | None = None) -> dict:
        shown = None
        if logprobs is not None:
            shown = completion_logprobs(logprobs, self.text_of, self._offset)
            self._offset += sum(len(t) for t in shown["tokens"])
        return self.envelope(self.chunk_object, [{"index": 0, "text": text or "", "logprobs": shown,
                                                  "finish_reason": finish}])

    def whole(self, out: Output) -> dict:
        return {**self.chunk(out.text, FINISH[out.finish_reason], out.logprobs), **usage(out.stats, out.seed)}


@dataclass
class ChatCompletion(Answer):
    """``/v1/chat/completions``: a ``chat.completion``, or ``chat.completion.chunk`` deltas that
    open with the assistant's role."""

    prefix = "chatcmpl"
    chunk_object = "chat.completion.chunk"
    whole_object = "chat.completion"
    tools: bool = False  # the model was shown tools: its text is parsed for tool calls
    _text: str = ""  # with tools, the streamed answer so far, and how much of it went out as content
    _sent: int = 0

    def opening(self) -> dict:
        return self._delta({"role": "assistant", "content": ""}, None)

    def chunk(self, text: str | None, finish: str | None = None, logprobs: list[TokenLogprob] | None = None) -> dict:
        if not self.tools:
            return self._delta({"content": text} if text else {}, finish, logprobs)
        # Text goes out as content up to where a tool call may be starting; the calls go out whole
        # once the answer is complete (OpenAI's clients join argument deltas, one delta is one).
        self._text += text or ""
        if finish is None:
            safe = held_back(self._text)
            new, self._sent = self._text[self._sent:safe], max(self._sent, safe)
            return self._delta({"content": new} if new else {}, None, logprobs)
        parsed = parse(self._text)
        if not parsed.calls:
            rest = self._text[self._sent:]
            return self._delta({"content": rest} if rest else {}, finish, logprobs)
        calls = [{"index": i, **call} for i, call in enumerate(parsed.calls)]
        return self._delta({"tool_calls": calls}, "tool_calls", logprobs)

    def _delta(self, delta: dict, finish: str | None, logprobs: list[TokenLogprob] | None = None) -> dict:
        shown = chat_logprobs(logprobs, self.text_of) if logprobs is not None else None
        return self.envelope(self.chunk_object, [{"index": 0, "delta": delta, "logprobs": shown,
                                                  "finish_reason": finish}])

    def whole(self, out: Output) -> dict:
        message: dict[str, Any] = {"role": "assistant", "content": out.text}
        finish = FINISH[out.finish_reason]
        if self.tools:
            parsed = parse(out.text)
            if parsed.calls:
                message = {"role": "assistant", "content": parsed.content, "tool_calls": parsed.calls}
                finish = "tool_calls"
        shown = chat_logprobs(out.logprobs, self.text_of) if out.logprobs is not None else None
        choice = {"index": 0, "message": message, "logprobs": shown, "finish_reason": finish}
        return {**self.envelope(self.whole_object, [choice]), **usage(out.stats, out.seed)}
