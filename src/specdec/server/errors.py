"""Errors of the server, all answered in OpenAI's format (``{"error": {"message", "type", "param",
"code"}}``) with a fitting status: :class:`ApiError`, the app's exception handlers, and the
request-body size limit (413)."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from specdec.server.metrics import ServerMetrics

# The paths the request counter names; any other is counted as "other" (bounded label values).
KNOWN_PATHS = {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics"}


class ApiError(Exception):
    """An error answered in the OpenAI format."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = status, message, kind, param, code

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}
        return JSONResponse(body, status_code=self.status)


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
        elif first.get("type") == "extra_forbidden":  # never ignored: the client would get another answer
            message = f"{where}: not a field specdec serve implements"
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

    app.add_middleware(CountRequests, metrics=metrics)


class CountRequests:
    """Count every answered request by path and status. Plain ASGI: Starlette's ``@app.middleware``
    (BaseHTTPMiddleware) passes each streamed chunk through a memory stream and a task of its own,
    work on the event loop's thread for every token of every stream, beside the batch's forwards
    on the same cores."""

    def __init__(self, app, metrics: ServerMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = 500  # what the client gets when the app fails before answering

        async def sending(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            path = scope["path"]
            self.metrics.requests.labels(endpoint=path if path in KNOWN_PATHS else "other", status=str(status)).inc()


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
    """A chunked body went over the limit while it was read."""
