"""The OpenAI-compatible app: ``/v1/completions``, ``/v1/chat/completions`` (streamed as server-sent
events or not), ``/v1/models``, ``/health`` and ``/metrics``.

Concurrency: each request gets its own backend (its own KV cache) from the model's pool, at most
``slots`` at a time (the rest wait in line), and target forwards run one at a time, step by step,
in FIFO order, so concurrent generations interleave fairly on this CPU and cannot touch each
other's cache. A step is never interrupted; a client that goes away frees its slot and backend
after the step in flight.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException

from specdec.api import Model, Output
from specdec.engine import DecodeRun
from specdec.errors import SpecdecError
from specdec.server.metrics import ServerMetrics
from specdec.server.schemas import ChatRequest, Common, CompletionRequest
from specdec.stats import GenerationStats
from specdec.text import StopStrings, TextDeltas
from specdec.types import StepTrace

FINISH = {"eos": "stop", "stop": "stop", "length": "length"}


@dataclass
class ServeConfig:
    """Defaults for requests that do not choose, and the server's limits."""

    drafter: str = "ngram"
    num_draft: int | None = None
    policy: str = "adaptive"
    tree: bool = False
    slots: int = 4  # generations in progress at once (each holds a KV cache)
    max_tokens: int = 256  # when a request gives no max_tokens
    max_body: int = 1 << 20  # bytes


class ApiError(Exception):
    """An error answered in the OpenAI format."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = status, message, kind, param, code

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}
        return JSONResponse(body, status_code=self.status)


class Scheduler:
    """Slots for generations, and one target forward at a time in arrival order."""

    def __init__(self, slots: int, metrics: ServerMetrics) -> None:
        self.slots = asyncio.Semaphore(slots)
        self.compute = asyncio.Lock()
        self.metrics = metrics

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        t0 = time.perf_counter()
        self.metrics.waiting.inc()
        try:
            await self.slots.acquire()
        finally:
            self.metrics.waiting.dec()
        self.metrics.queue.observe(time.perf_counter() - t0)
        self.metrics.running.inc()
        try:
            yield
        finally:
            self.metrics.running.dec()
            self.slots.release()

    async def run(self, call, *args):
        """``call(*args)`` in a worker thread, alone on the CPU; a cancelled caller waits for it to end."""
        with anyio.CancelScope(shield=True):
            async with self.compute:
                return await anyio.to_thread.run_sync(call, *args)

    async def steps(self, run: DecodeRun) -> AsyncIterator[StepTrace]:
        steps = iter(run)
        try:
            while (step := await self.run(next, steps, None)) is not None:
                yield step
        finally:
            steps.close()  # hands the backend back now, also when the client went away


class Server:
    """A loaded model (and optional draft model) behind the OpenAI API."""

    def __init__(self, model: Model, draft_model: Model | None = None, config: ServeConfig | None = None) -> None:
        self.model = model
        self.draft_model = draft_model
        self.config = config or ServeConfig()
        self.metrics = ServerMetrics()
        self.scheduler: Scheduler | None = None
        self.started = time.time()

    def warm_up(self) -> None:
        """Measure what the first request would otherwise pay for: the cost curve, first allocations."""
        if self.config.policy == "adaptive":
            self.model.cost_model()
        self.model.generate("Hello", max_new_tokens=2, **self._drafting(None, None, None, None))

    # -- requests -> generations --------------------------------------------------------------------
    def _drafting(self, drafter, num_draft, policy, tree) -> dict:
        cfg = self.config
        return dict(drafter=drafter or cfg.drafter, draft_model=self.draft_model,
                    num_draft=num_draft if num_draft is not None else cfg.num_draft,
                    policy=policy or cfg.policy, tree=cfg.tree if tree is None else tree)

    def _kwargs(self, req: Common, max_tokens: int | None) -> dict:
        if req.model not in self.names():
            raise ApiError(404, f"model {req.model!r} is not served here (try {self.model.name!r})",
                           param="model", code="model_not_found")
        if max_tokens is not None and max_tokens < 1:
            raise ApiError(400, f"max_tokens must be >= 1, got {max_tokens}", param="max_tokens")
        if req.num_draft is not None and req.num_draft < 1:
            raise ApiError(400, f"num_draft must be >= 1, got {req.num_draft}", param="num_draft")
        return dict(max_new_tokens=max_tokens or self.config.max_tokens, temperature=float(req.temperature),
                    top_p=float(req.top_p), top_k=req.top_k, seed=req.seed, stop=req.stop,
                    **self._drafting(req.drafter, req.num_draft, req.policy, req.tree))

    def names(self) -> list[str]:
        return [self.model.name]

    def _start(self, prompt, kwargs: dict) -> DecodeRun:
        try:
            return self.model.start(prompt, **kwargs)
        except SpecdecError as exc:
            raise ApiError(400, str(exc)) from None

    async def _generate(self, prompt, kwargs: dict, request: Request) -> Output:
        async with self.scheduler.slot():
            run = await anyio.to_thread.run_sync(self._start, prompt, kwargs)
            try:
                async with aclosing(self.scheduler.steps(run)) as steps:
                    async for _ in steps:
                        if await request.is_disconnected():
                            break
            finally:
                self.metrics.generation(run.result.stats)
            return self.model.finish(run, run.result, kwargs.get("stop"))

    async def _stream(self, prompt, kwargs: dict, chunk, include_usage: bool, t0: float) -> AsyncIterator[str]:
        """Server-sent events: one chunk per step that released text, the finish reason, [DONE]."""
        async with self.scheduler.slot():
            run = await anyio.to_thread.run_sync(self._start, prompt, kwargs)
            deltas = TextDeltas(self.model.codec, StopStrings(kwargs.get("stop"), self.model.codec))
            first = True
            try:
                yield sse(chunk(None, None, start=True))
                async with aclosing(self.scheduler.steps(run)) as steps:
                    async for _ in steps:
                        text = deltas.update(run.result.token_ids, run.done)
                        if text:
                            if first:
                                self.metrics.first_token.observe(time.perf_counter() - t0)
                                first = False
                            yield sse(chunk(text, None))
                yield sse(chunk(None, FINISH[run.result.finish_reason]))
                if include_usage:
                    yield sse({**chunk(None, None), "choices": [], **usage(run.result.stats, run.result.seed)})
                yield "data: [DONE]\n\n"
            finally:
                self.metrics.generation(run.result.stats)
                self.metrics.latency.observe(time.perf_counter() - t0)

    # -- the app ------------------------------------------------------------------------------------
    def app(self) -> FastAPI:
        @asynccontextmanager
        async def lifespan(app: FastAPI):
            self.scheduler = Scheduler(self.config.slots, self.metrics)
            yield

        app = FastAPI(title="specdec", lifespan=lifespan, docs_url=None, redoc_url=None)
        install_error_handlers(app, self.metrics)
        app.add_middleware(BodyLimit, limit=self.config.max_body)

        @app.get("/health")
        async def health() -> dict:
            return {"status": "ok", "model": self.model.name, "uptime_s": round(time.time() - self.started, 1)}

        @app.get("/v1/models")
        async def models() -> dict:
            return {"object": "list", "data": [{"id": name, "object": "model", "created": int(self.started),
                                                "owned_by": "specdec"} for name in self.names()]}

        @app.get("/metrics")
        async def metrics() -> PlainTextResponse:
            return PlainTextResponse(self.metrics.render(), media_type=CONTENT_TYPE_LATEST)

        @app.post("/v1/completions")
        async def completions(req: CompletionRequest, request: Request):
            t0 = time.perf_counter()
            kwargs = self._kwargs(req, req.max_tokens)
            ident, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())

            def chunk(text: str | None, finish: str | None, start: bool = False) -> dict:
                choices = [] if start else [{"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}]
                return {"id": ident, "object": "text_completion", "created": created, "model": req.model,
                        "choices": choices}

            if req.stream:
                include = bool(req.stream_options and req.stream_options.include_usage)
                return await self._respond_stream(req.prompt, kwargs, chunk, include, t0, skip_start=True)
            out = await self._generate(req.prompt, kwargs, request)
            self.metrics.latency.observe(time.perf_counter() - t0)
            body = chunk(out.text, FINISH[out.finish_reason])
            return {**body, **usage(out.stats, out.seed)}

        @app.post("/v1/chat/completions")
        async def chat(req: ChatRequest, request: Request):
            t0 = time.perf_counter()
            kwargs = self._kwargs(req, req.max_completion_tokens if req.max_completion_tokens is not None
                                  else req.max_tokens)
            try:
                prompt = self.model.codec.encode_messages([{"role": "system" if m.role == "developer" else m.role,
                                                            "content": m.text()} for m in req.messages])
            except SpecdecError as exc:
                raise ApiError(400, str(exc), param="messages") from None
            ident, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())

            def chunk(text: str | None, finish: str | None, start: bool = False) -> dict:
                delta = {"role": "assistant", "content": ""} if start else ({"content": text} if text else {})
                return {"id": ident, "object": "chat.completion.chunk", "created": created, "model": req.model,
                        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}

            if req.stream:
                include = bool(req.stream_options and req.stream_options.include_usage)
                return await self._respond_stream(prompt, kwargs, chunk, include, t0)
            out = await self._generate(prompt, kwargs, request)
            self.metrics.latency.observe(time.perf_counter() - t0)
            return {"id": ident, "object": "chat.completion", "created": created, "model": req.model,
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": out.text},
                                 "logprobs": None, "finish_reason": FINISH[out.finish_reason]}],
                    **usage(out.stats, out.seed)}

        return app

    async def _respond_stream(self, prompt, kwargs, chunk, include_usage, t0, skip_start: bool = False):
        events = self._stream(prompt, kwargs, chunk, include_usage, t0)
        # Bad requests must fail with a status, not inside a 200 stream: run up to the first event.
        try:
            first = await events.__anext__()
        except ApiError:
            await events.aclose()
            raise

        async def body() -> AsyncIterator[str]:
            try:
                if not skip_start:
                    yield first
                async for event in events:
                    yield event
            finally:
                # Also when the client went away and this task is being cancelled: free the slot now.
                with anyio.CancelScope(shield=True):
                    await events.aclose()

        return StreamingResponse(body(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def usage(stats: GenerationStats, seed: int | None) -> dict:
    """OpenAI's ``usage``, and specdec's speculation counters (named like llama.cpp's timings) beside it."""
    spec = {"drafted": stats.drafted, "accepted": stats.accepted, "draft_n": stats.drafted,
            "draft_n_accepted": stats.accepted, "acceptance_rate": round(stats.acceptance_rate, 4),
            "mean_accepted_length": round(stats.mean_accepted_length, 4), "target_forwards": stats.target_forwards,
            "tokens_per_s": round(stats.tokens_per_s, 3)}
    if seed is not None:
        spec["seed"] = seed
    return {"usage": {"prompt_tokens": stats.prompt_tokens, "completion_tokens": stats.new_tokens,
                      "total_tokens": stats.prompt_tokens + stats.new_tokens},
            "speculative": spec}


def sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def install_error_handlers(app: FastAPI, metrics: ServerMetrics) -> None:
    """Every error is an OpenAI-style JSON body with a fitting status; nothing brings the server down."""

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError):
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        errors = exc.errors()
        first = errors[0] if errors else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        if first.get("type") == "json_invalid":
            message = "the request body is not valid JSON"
        elif first.get("type") == "missing":
            message = f"missing field: {where}"
        else:
            message = f"{where}: {first.get('msg', 'invalid value')}".lstrip(": ")
        return ApiError(400, message, param=where or None).response()

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return ApiError(exc.status_code, str(exc.detail), kind).response()

    @app.exception_handler(Exception)
    async def internal(request: Request, exc: Exception):
        return ApiError(500, f"internal error ({type(exc).__name__}: {exc})", "server_error").response()

    @app.middleware("http")
    async def count(request: Request, call_next):
        response = await call_next(request)
        metrics.requests.labels(endpoint=request.url.path if request.url.path in KNOWN_PATHS else "other",
                                status=str(response.status_code)).inc()
        return response


KNOWN_PATHS = {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics"}


class BodyLimit:
    """Refuse bodies over ``limit`` bytes with 413 before they are read (by Content-Length) or
    while they are (chunked uploads)."""

    def __init__(self, app, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or ()).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            return await self._refuse(scope, receive, send)
        seen = 0

        async def limited():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise TooLarge
            return message

        try:
            await self.app(scope, limited, send)
        except TooLarge:
            await self._refuse(scope, receive, send)

    async def _refuse(self, scope, receive, send) -> None:
        error = ApiError(413, f"the request body is larger than {self.limit} bytes")
        await error.response()(scope, receive, send)


class TooLarge(Exception):
    pass


def serve_forever(server: Server, host: str, port: int) -> None:
    """Run the app with uvicorn until interrupted."""
    import uvicorn

    uvicorn.run(server.app(), host=host, port=port, log_level="warning", timeout_graceful_shutdown=5)

