"""Request bodies of the OpenAI API as the server accepts them (pydantic, strict types).

Fields the OpenAI API has and specdec does not use (``user``, ``frequency_penalty`` at 0, ...) are
ignored; ones that would change the answer and are not supported (``n`` > 1, ``logprobs``,
``echo``, ...) are refused with a 400 rather than silently dropped. ``drafter``, ``num_draft``,
``policy`` and ``tree`` are specdec's own (the openai client sends them with ``extra_body``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, model_validator

Number = StrictInt | StrictFloat


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: StrictBool = False


class Common(BaseModel):
    """Fields shared by completions and chat completions."""

    model_config = ConfigDict(extra="ignore")

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
    drafter: StrictStr | None = None
    num_draft: StrictInt | None = None
    policy: StrictStr | None = None
    tree: StrictBool | None = None

    @model_validator(mode="after")
    def _supported(self):
        if self.n != 1:
            raise ValueError("n: only one choice per request is supported (n = 1)")
        if self.logprobs not in (None, False, 0):
            raise ValueError("logprobs: not supported")
        if isinstance(self.stop, list) and len(self.stop) > 4:
            raise ValueError("stop: at most 4 stop strings")
        return self


class CompletionRequest(Common):
    prompt: StrictStr | list[StrictInt]
    echo: StrictBool = False
    suffix: StrictStr | None = None

    @model_validator(mode="after")
    def _plain(self):
        if self.echo:
            raise ValueError("echo: not supported")
        if self.suffix:
            raise ValueError("suffix: not supported")
        return self


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: StrictStr


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant"]
    content: StrictStr | list[TextPart]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatRequest(Common):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = None
