"""Request bodies of the OpenAI API as the server accepts them (pydantic, strict types).

Nothing is silently dropped: a field the server does not implement is refused with a 400 naming it.
The exceptions are OpenAI's fields that cannot change an answer (:data:`ADVISORY`: ``user``,
``metadata``, ...), accepted and ignored, and fields sent with the value that asks for nothing
(:data:`NEUTRAL`: ``frequency_penalty`` 0, ``logit_bias`` {}, ``response_format`` text, ...),
which the SDKs and agents send as a matter of course; any other value of those is refused too.

specdec's own fields (``drafter``, ``num_draft``, ``policy``, ``tree``, ``verify`` and every
drafter-declared option; the openai client sends them with ``extra_body``) are not spelled out
here: :func:`with_specdec_fields` adds one per option of :func:`specdec.option_forms.server_fields`
that OpenAI has no field for, when the app is built. They are typed here and checked by
:meth:`specdec.options.GenerationOptions.validate`, so a bad value reads as it does on the CLI.
"""

from __future__ import annotations

import json
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, create_model, \
    model_validator

from specdec import option_forms
from specdec.options import Option

Number = StrictInt | StrictFloat
STRICT: dict[type, Any] = {int: StrictInt, float: Number, bool: StrictBool, str: StrictStr}


# OpenAI's fields that do not change an answer (its documentation: end-user ids, stored-completion
# flags and tags, the processing tier, prompt-cache routing keys): accepted and ignored.
ADVISORY = ("user", "metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier")
# OpenAI's fields with a value that asks for nothing, by field: accepted with it, refused with any other.
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "frequency_penalty": (0, 0.0), "presence_penalty": (0, 0.0), "logit_bias": ({},),
}


TOP_LOGPROBS = 20  # the most likeliest tokens a position lists (OpenAI's bound for chat)


class Strict(BaseModel):
    """A part of a request body: every field it carries is one the server implements."""

    model_config = ConfigDict(extra="forbid")


class StreamOptions(Strict):
    include_usage: StrictBool = False


class Common(Strict):
    """Fields shared by completions and chat completions."""

    model: StrictStr
    max_tokens: StrictInt | None = None
    temperature: Number = 1.0
    top_p: Number = 1.0
    top_k: StrictInt = 0
    stop: StrictStr | list[StrictStr] | None = None
    seed: StrictInt | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    n: StrictInt = 1
    logprobs: StrictBool | StrictInt | None = None
    # What the answer must follow (specdec.constraints): OpenAI's response_format ({"type":
    # "json_schema", "json_schema": {"schema": ...}}, {"type": "json_object"} or {"type": "text"}),
    # or specdec's own regex or grammar (Lark, or GBNF: llama-server's field name).
    response_format: dict[str, Any] | None = None
    regex: StrictStr | None = None
    grammar: StrictStr | None = None

    @property
    def max_new_tokens(self) -> int | None:
        """OpenAI's ``max_tokens``, by specdec's name (None: the server's default)."""
        return self.max_tokens

    @model_validator(mode="before")
    @classmethod
    def _advisory_or_neutral(cls, body: Any) -> Any:
        """OpenAI's advisory fields dropped, neutral values taken as absent; any other value of a
        neutral field refused."""
        if not isinstance(body, dict):
            return body
        body = {k: v for k, v in body.items() if k not in ADVISORY}
        for name, neutral in NEUTRAL.items():
            if name in body:
                value = body.pop(name)
                if value is not None and not any(value == n and type(value) is type(n) for n in neutral):
                    raise ValueError(f"{name}: not supported by specdec serve (only "
                                     f"{' or '.join(json.dumps(n) for n in neutral)} is accepted)")
        return body

    @model_validator(mode="after")
    def _supported(self):
        if self.n != 1:
            raise ValueError("n: only one choice per request is supported (n = 1)")
        if isinstance(self.stop, list) and len(self.stop) > 4:
            raise ValueError("stop: at most 4 stop strings")
        return self


class CompletionRequest(Common):
    prompt: StrictStr | list[StrictInt]
    echo: StrictBool = False
    suffix: StrictStr | None = None

    def logprob_count(self) -> int | None:
        """How many likeliest tokens each new token's log-probability comes with (None: no logprobs)."""
        return self.logprobs

    @model_validator(mode="after")
    def _logprobs(self):
        if self.logprobs is not None and (isinstance(self.logprobs, bool) or not 0 <= self.logprobs <= TOP_LOGPROBS):
            raise ValueError(f"logprobs: a whole number 0..{TOP_LOGPROBS} (the likeliest tokens to list)")
        return self

    @model_validator(mode="after")
    def _plain(self):
        if self.echo:
            raise ValueError("echo: not supported")
        if self.suffix:
            raise ValueError("suffix: not supported")
        return self


class TextPart(Strict):
    type: Literal["text"]
    text: StrictStr


# Fields of a message that an SDK sends back empty with an assistant's earlier reply (the openai
# SDK's message objects dumped whole): accepted while empty.
EMPTY_IN_MESSAGES = ("refusal", "annotations", "audio", "function_call")


class CalledFunction(Strict):
    name: StrictStr
    arguments: StrictStr  # JSON text, as OpenAI sends it


class ToolCall(Strict):
    id: StrictStr
    type: Literal["function"] = "function"
    function: CalledFunction


class Message(Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: StrictStr | list[TextPart] | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's earlier calls
    tool_call_id: StrictStr | None = None  # a tool's result: the call it answers

    @model_validator(mode="after")
    def _shaped(self):
        if self.content is None and not self.tool_calls:
            raise ValueError("content: a message needs content (an assistant's may carry tool_calls instead)")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("tool_calls: only an assistant's message carries them")
        return self

    def as_dict(self) -> dict:
        """The message as a chat template takes it (OpenAI's developer role is the system's)."""
        out: dict = {"role": "system" if self.role == "developer" else self.role, "content": self.text()}
        if self.tool_calls:
            out["tool_calls"] = [c.model_dump() for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out

    @model_validator(mode="before")
    @classmethod
    def _empty_extras(cls, message: Any) -> Any:
        if not isinstance(message, dict):
            return message
        return {k: v for k, v in message.items() if not (k in EMPTY_IN_MESSAGES and v in (None, [], ""))}

    def text(self) -> str:
        if self.content is None:
            return ""
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class FunctionDef(Strict):
    name: StrictStr = Field(min_length=1)
    description: StrictStr | None = None
    parameters: dict[str, Any] | None = None  # a JSON Schema
    strict: StrictBool | None = None  # the arguments follow it exactly whenever a call is constrained


class Tool(Strict):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(Strict):
    name: StrictStr


class NamedChoice(Strict):
    type: Literal["function"]
    function: NamedFunction


class ChatRequest(Common):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = None
    top_logprobs: StrictInt | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedChoice | None = None
    parallel_tool_calls: StrictBool = True

    @model_validator(mode="after")
    def _tools(self):
        if self.tool_choice not in (None, "none", "auto") and not self.tools:
            raise ValueError("tool_choice: needs tools")
        if isinstance(self.tool_choice, NamedChoice) and all(
                t.function.name != self.tool_choice.function.name for t in self.tools or []):
            raise ValueError(f"tool_choice: {self.tool_choice.function.name!r} is not among the tools")
        if self.tool_choice is not None and self.tool_choice != "none" and (
                self.response_format or self.regex or self.grammar):
            raise ValueError("tool_choice: give tools or a response format, not both")
        return self

    def tool_list(self) -> list[dict] | None:
        """The tools shown to the model (None: none, also under tool_choice none)."""
        if not self.tools or self.tool_choice == "none":
            return None
        return [t.model_dump(exclude_none=True) for t in self.tools]

    def choice(self) -> str | dict | None:
        return self.tool_choice.model_dump() if isinstance(self.tool_choice, NamedChoice) else self.tool_choice

    def logprob_count(self) -> int | None:
        """How many likeliest tokens each new token's log-probability comes with (None: no logprobs)."""
        return (self.top_logprobs or 0) if self.logprobs else None

    @model_validator(mode="after")
    def _logprobs(self):
        if self.logprobs is not None and not isinstance(self.logprobs, bool):
            raise ValueError("logprobs: true or false (top_logprobs says how many likeliest tokens to list)")
        if self.top_logprobs not in (None, 0):
            if not self.logprobs:
                raise ValueError("top_logprobs: needs logprobs true")
            if not 0 <= self.top_logprobs <= TOP_LOGPROBS:
                raise ValueError(f"top_logprobs: a whole number 0..{TOP_LOGPROBS}")
        return self

    @property
    def max_new_tokens(self) -> int | None:
        """OpenAI's ``max_completion_tokens`` (its newer name for ``max_tokens``), else ``max_tokens``."""
        return self.max_tokens if self.max_completion_tokens is None else self.max_completion_tokens


Request = TypeVar("Request", bound=Common)


def specdec_fields() -> list[Option]:
    """The options a body may set that OpenAI has no field for (``temperature`` and the like are
    OpenAI's, with OpenAI's defaults, in :class:`Common`; ``max_new_tokens`` is its ``max_tokens``)."""
    return [o for o in option_forms.server_fields() if option_forms.body_name(o.name) not in Common.model_fields]


def with_specdec_fields(request: type[Request]) -> type[Request]:
    """``request`` plus a field per option of :func:`specdec_fields` (None when the body leaves it
    out: the server's default applies)."""
    fields: dict[str, Any] = {}
    for opt in specdec_fields():
        if opt.type not in STRICT:
            raise TypeError(f"option {opt.name!r} has type {opt.type.__name__}, "
                            "which a request body cannot carry")
        fields[opt.name] = (STRICT[opt.type] | None, Field(None, description=opt.help))
    return create_model(request.__name__, __base__=request, __module__=__name__, **fields)
