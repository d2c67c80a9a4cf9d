"""The HTTP routes: ``/v1/completions``, ``/v1/chat/completions`` (streamed as server-sent events
or not), ``/v1/models``, ``/health`` and ``/metrics``.

The request types are built when the app is (they carry a field per registered option, see
:func:`specdec.server.schemas.with_specdec_fields`), so this module does not postpone its
annotations: FastAPI reads them from the route functions themselves.
"""

import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from specdec.errors import SpecdecError
from specdec.server.errors import ApiError
from specdec.server.openai import ChatCompletion, Completion
from specdec.server.schemas import ChatRequest, CompletionRequest, with_specdec_fields

if TYPE_CHECKING:
    from specdec.server.app import Server


def router(server: "Server") -> APIRouter:
    """The routes of ``server``'s app."""
    routes = APIRouter()
    CompletionBody = with_specdec_fields(CompletionRequest)
    ChatBody = with_specdec_fields(ChatRequest)

    @routes.get("/health")
    async def health() -> dict:
        return {"status": "ok", "model": server.model.name, "uptime_s": round(time.time() - server.started, 1)}

    @routes.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": name, "object": "model", "created": int(server.started),
                                            "owned_by": "specdec"} for name in server.names()]}

    @routes.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(server.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @routes.post("/v1/completions")
    async def completions(req: CompletionBody, request: Request):
        t0 = time.perf_counter()
        opts = server.options(req, req.max_tokens)
        answer = Completion(req.model)
        if req.stream:
            return await streamed(server.events(req.prompt, opts, answer, include_usage(req), t0))
        out = await server.generate(req.prompt, opts, request)
        server.metrics.latency.observe(time.perf_counter() - t0)
        return answer.whole(out)

    @routes.post("/v1/chat/completions")
    async def chat(req: ChatBody, request: Request):
        t0 = time.perf_counter()
        opts = server.options(req, req.max_completion_tokens if req.max_completion_tokens is not None
                              else req.max_tokens)
        try:
            prompt = server.model.codec.encode_messages([{"role": "system" if m.role == "developer" else m.role,
                                                          "content": m.text()} for m in req.messages])
        except SpecdecError as exc:
            raise ApiError(400, str(exc), param="messages") from None
        answer = ChatCompletion(req.model)
        if req.stream:
            return await streamed(server.events(prompt, opts, answer, include_usage(req), t0))
        out = await server.generate(prompt, opts, request)
        server.metrics.latency.observe(time.perf_counter() - t0)
        return answer.whole(out)

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

    return StreamingResponse(body(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
