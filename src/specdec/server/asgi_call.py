"""One HTTP request through an ASGI app in this process, its response streamed back as items.

``specdec serve --ray``'s model replicas run the single-process server's app for requests the
ingress hands them through a deployment handle. Ray Serve's FastAPI ingress (``@serve.ingress``)
cannot run it there: it serves only requests that come from Ray's HTTP proxy, which picks the
replica before the body (and so the prompt) is read, so routing by prompt prefix needs an ingress
of our own that reads the body first, and Ray allows one FastAPI ingress per application (ray 2.60
refuses a second: "Found multiple FastAPI deployments in application"). A handle call is a method
call, not an ASGI request, so this small adapter turns one into the ASGI messages the app expects,
and runs the app's lifespan start-up once (:class:`Lifespan`).
"""

import asyncio
from collections.abc import AsyncIterator

from specdec.server.ray_router import Routed


class AsgiCall:
    """``req`` through ``app``: iterate for ("start", status, headers), then body bytes. Headers in
    ``extra_headers`` join the response's. The app sees the client leave when the iteration stops."""

    def __init__(self, app, req: Routed, extra_headers: list[tuple[bytes, bytes]]) -> None:
        self.app = app
        self.req = req
        self.extra = extra_headers
        self.gone = asyncio.Event()
        self.out: asyncio.Queue = asyncio.Queue()
        self.sent_body = False

    async def receive(self) -> dict:
        if not self.sent_body:
            self.sent_body = True
            return {"type": "http.request", "body": self.req.body, "more_body": False}
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict) -> None:
        if message["type"] == "http.response.start":
            await self.out.put(("start", message["status"], list(message.get("headers", [])) + self.extra))
        elif message["type"] == "http.response.body":
            if message.get("body"):
                await self.out.put(bytes(message["body"]))
            if not message.get("more_body", False):
                await self.out.put(None)

    async def __aiter__(self) -> AsyncIterator:
        req = self.req
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": req.method,
                 "scheme": "http", "path": req.path, "raw_path": req.path.encode(), "query_string": req.query,
                 "root_path": "", "headers": req.headers, "client": ("127.0.0.1", 0),
                 "server": ("127.0.0.1", 80)}

        failure: list[BaseException] = []

        async def run():
            try:
                await self.app(scope, self.receive, self.send)
            except Exception as exc:  # noqa: BLE001 - Starlette answered 500 already, if it could
                failure.append(exc)
            finally:
                await self.out.put(None)

        task = asyncio.ensure_future(run())
        started = False
        try:
            while True:
                item = await self.out.get()
                if item is None:
                    break
                started = True
                yield item
            await task
            if not started:  # no answer at all: the ingress turns this into a 500 JSON error
                raise RuntimeError(f"the app gave no answer ({failure[0]!r})" if failure else "the app gave no answer")
        finally:
            self.gone.set()  # the client went away (or the answer is complete)
            if not task.done():
                await asyncio.wait_for(asyncio.shield(task), 30)


class Lifespan:
    """Runs an ASGI app's lifespan start-up (its shutdown half goes with the replica's process)."""

    def __init__(self, app) -> None:
        self.app = app
        self.inbox: asyncio.Queue = asyncio.Queue()
        self.started = asyncio.Event()
        self.task = None

    async def start(self) -> None:
        async def send(message):
            if message["type"].startswith("lifespan.startup"):
                self.started.set()

        await self.inbox.put({"type": "lifespan.startup"})
        self.task = asyncio.ensure_future(self.app({"type": "lifespan", "asgi": {"version": "3.0"}},
                                                   self.inbox.get, send))
        await self.started.wait()
