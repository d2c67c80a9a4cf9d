"""Request bodies of the OpenAI API as the server accepts them (pydantic, strict types).

Fields the OpenAI API has and specdec does not use (``user``, ``frequency_penalty`` at 0, ...) are
ignored; ones that would change the answer and are not supported (``n`` > 1, ``logprobs``,
``echo``, ...) are refused with a 400 rather than silently dropped.

specdec's own fields (``drafter``, ``num_draft``, ``policy``, ``tree``, ``verify`` and every
drafter-declared option; the openai client sends them with ``extra_body``) are not spelled out
here: :func:`with_specdec_fields` adds one per option of :func:`specdec.option_forms.server_fields`
that OpenAI has no field for, when the app is built. They are typed here and checked by
:meth:`specdec.options.GenerationOptions.validate`, so a bad value reads as it does on the CLI.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, create_model, \
    model_validator

from specdec import option_forms
from specdec.options import Option

Number = StrictInt | StrictFloat
STRICT: dict[type, Any] = {int: StrictInt, float: Number, bool: StrictBool, str: StrictStr}


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

    @property
    def max_new_tokens(self) -> int | None:
        """OpenAI's ``max_tokens``, by specdec's name (None: the server's default)."""
        return self.max_tokens

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
