"""The HTTP routes: ``/v1/completions``, ``/v1/chat/completions`` (streamed as server-sent events
or not), ``/v1/models``, ``/health`` and ``/metrics``.

The routes read the server through the few methods of :class:`Served` (what
:class:`specdec.server.app.Server` offers them), never its model or metrics: this module does not
import the app, the app imports it.

The request types are built when the app is (they carry a field per registered option, see
:func:`specdec.server.schemas.with_specdec_fields`), so this module does not postpone its
annotations: FastAPI reads them from the route functions themselves.
"""

import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from specdec.api import Output
from specdec.options import GenerationOptions
from specdec.server.errors import ApiError
from specdec.constraints import Spec
from specdec.server.openai import Answer, ChatCompletion, Completion
from specdec.server.schemas import ChatRequest, Common, CompletionRequest, with_specdec_fields
from specdec.server.tenants import tenant_of


@dataclass(frozen=True)
class Asked:
    """What one request asks the engine for: its prompt and options, whose index of earlier outputs
    it drafts from (:mod:`specdec.server.tenants`), what the answer must follow (None: free text)
    and how many likeliest tokens each token's log-probability comes with (None: no logprobs)."""

    prompt: str | Sequence[int]
    opts: GenerationOptions
    tenant: str | None = None
    constraint: Spec | None = None
    logprobs: int | None = None


class Served(Protocol):
    """What the routes ask of the server."""

    def health(self) -> dict: ...

    def models(self) -> list[dict]: ...

    def metrics_text(self) -> str: ...

    def options(self, req: Common, max_new_tokens: int | None, prompt: list[int]) -> GenerationOptions: ...

    def prompt_ids(self, prompt: str | list[int]) -> list[int]: ...

    def constraint(self, req: Common) -> Spec | None: ...

    def token_text(self, token: int) -> str: ...

    def chat_prompt(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]: ...

    async def generate(self, asked: Asked, request: Request, t0: float) -> Output: ...

    def events(self, asked: Asked, answer: Answer, include_usage: bool, t0: float) -> AsyncIterator[str]: ...


def router(server: Served) -> APIRouter:
    """The routes of ``server``'s app."""
    routes = APIRouter()
    CompletionBody = with_specdec_fields(CompletionRequest)
    ChatBody = with_specdec_fields(ChatRequest)

    @routes.get("/health")
    async def health() -> dict:
        return server.health()

    @routes.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": server.models()}

    @routes.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(server.metrics_text(), media_type=CONTENT_TYPE_LATEST)

    @routes.post("/v1/completions")
    async def completions(req: CompletionBody, request: Request):
        t0 = time.perf_counter()
        prompt = server.prompt_ids(req.prompt)
        opts = server.options(req, req.max_new_tokens, prompt)
        asked = Asked(prompt, opts, tenant_of(request), server.constraint(req), req.logprob_count())
        answer = Completion(req.model, text_of=server.token_text)
        if req.stream:
            return await streamed(server.events(asked, answer, include_usage(req), t0))
        return answer.whole(await server.generate(asked, request, t0))

    @routes.post("/v1/chat/completions")
    async def chat(req: ChatBody, request: Request):
        t0 = time.perf_counter()
        prompt = server.chat_prompt([m.as_dict() for m in req.messages], req.tool_list())
        opts = server.options(req, req.max_new_tokens, prompt)
        asked = Asked(prompt, opts, tenant_of(request), server.constraint(req), req.logprob_count())
        answer = ChatCompletion(req.model, text_of=server.token_text, tools=bool(req.tool_list()))
        if req.stream:
            return await streamed(server.events(asked, answer, include_usage(req), t0))
        return answer.whole(await server.generate(asked, request, t0))

    return routes


def include_usage(req: CompletionRequest | ChatRequest) -> bool:
    return bool(req.stream and req.stream_options and req.stream_options.include_usage)


async def streamed(events: AsyncIterator[str]) -> StreamingResponse:
    """A streaming response of ``events``, whose first event (possibly empty) comes once the
    generation has started: a bad request fails with its status, not inside a 200 stream."""
    try:
        first = await events.__anext__()
    except ApiError:
        await events.aclose()
        raise

    async def body() -> AsyncIterator[str]:
        try:
            if first:
                yield first
            async for event in events:
                yield event
        finally:
            # Also when the client went away and this task is being cancelled: free the slot now.
            with anyio.CancelScope(shield=True):
                await events.aclose()

    return ClosingStream(body(), media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


class ClosingStream(StreamingResponse):
    """A streaming response that closes its events however it ends: cancelled while sending to a
    client that left, Starlette would leave them to the garbage collector, and the generation
    would hold its sequence in the batch until then."""

    async def stream_response(self, send) -> None:
        try:
            await super().stream_response(send)
        finally:
            with anyio.CancelScope(shield=True):
                await self.body_iterator.aclose()
