"""``specdec serve --ray``: the same OpenAI-compatible app, on Ray Serve replicas.

Two deployments make the application:

- ``SpecdecModel`` (``--replicas N``, or autoscaled between ``--min-replicas`` and
  ``--max-replicas`` on queue length): each replica loads the model and runs the very app
  :meth:`specdec.server.app.Server.app` builds for the single-process server (routes, errors,
  metrics, body limit), called in-process as an ASGI app; its answers carry the replica's id in an
  ``X-Specdec-Replica`` header.
- ``SpecdecIngress`` (the HTTP entry point): reads a request (up to the body limit), takes the
  prompt's text out of a completion or chat body and hands the request to a model replica through a
  deployment handle. The handle routes with :class:`PrefixRouter`, Ray Serve's
  ``PrefixCacheAffinityRouter``: a request whose prompt shares a prefix with earlier ones goes to
  the replica that served them while the queue lengths differ by at most ``imbalanced_threshold``,
  otherwise to the less loaded of two replicas. A replica that dies under a request ends it with a
  clean OpenAI-style 503 (or, once a stream has started, a final ``error`` event); Ray Serve starts
  a new replica.

Learned state: every replica has its own n-gram memory, acceptance estimates and cost curve. With
``--memory FILE``, replica of rank r starts from ``FILE.replica-r`` if it exists (what the replica
of that rank learned before it was restarted), else from ``FILE``, and writes ``FILE.replica-r``
(atomically, every ``save_every`` seconds and when it stops): no two replicas write one file, and
``FILE`` itself is only read.
"""

import asyncio
import json
import os
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specdec.errors import SpecdecError


PREFIX_CHARS = 2000  # the routing key: the prompt's first characters
REPLICA_HEADER = "x-specdec-replica"


def ray_modules():
    """(ray, serve), or one clear error when the ``ray`` extra is missing."""
    try:
        import ray
        from ray import serve
    except ImportError as exc:
        raise SpecdecError(f"serving on Ray needs the ray extra: pip install 'specdec[ray]' ({exc.name} is missing)") \
            from None
    return ray, serve


@dataclass
class ModelSpec:
    """What a replica loads: :func:`specdec.load` arguments and the server's config."""

    model: str
    load: dict[str, Any] = field(default_factory=dict)
    draft_model: str | None = None
    memory: str | None = None  # FILE: replicas start from it and write FILE.replica-<rank>
    config: Any = None  # ServeConfig
    save_every: float = 60.0  # seconds between memory saves
    torch_threads: int | None = None


@dataclass
class Routed:
    """An HTTP request as the ingress hands it to a model replica. ``prompt`` is the routing key
    (Ray's prefix router reads an argument's ``prompt``); None for requests without one."""

    method: str
    path: str
    query: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes
    prompt: str | None = None


def routing_text(path: str, body: bytes) -> str | None:
    """The text requests are routed by: a completion's prompt, a chat's messages' text."""
    if not path.endswith("completions"):
        return None
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(data, dict):
        return None
    text: Any = None
    if path.endswith("chat/completions"):
        messages = data.get("messages")
        if isinstance(messages, list):
            parts = []
            for m in messages:
                content = m.get("content") if isinstance(m, dict) else None
                if isinstance(content, list):
                    content = "".join(p.get("text", "") for p in content if isinstance(p, dict)
                                      and isinstance(p.get("text"), str))
                if isinstance(content, str):
                    parts.append(f"{m.get('role')}:{content}\n")
            text = "".join(parts)
    else:
        text = data.get("prompt")
        if isinstance(text, list):
            text = json.dumps(text)
    return text[:PREFIX_CHARS] if isinstance(text, str) and text else None


# -- memory: one file per replica rank -------------------------------------------------------------
def replica_memory_file(memory: str, rank: int) -> str:
    return f"{memory}.replica-{rank}"


def memory_start(memory: str, rank: int) -> str:
    """The file a replica of ``rank`` starts from: its own if it wrote one, else the shared one."""
    own = replica_memory_file(memory, rank)
    return own if Path(own).exists() else memory


def save_atomically(mem, path: str) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    mem.save(tmp)
    os.replace(tmp, path)


# -- the replica: the single-process app, called in-process -----------------------------------------
class AsgiCall:
    """One request through an ASGI app, its response as ("start", status, headers) then body bytes."""

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


class ModelReplica:
    """One model replica (the deployment's class): the single-process server's app, in-process."""

    def __init__(self, spec: ModelSpec) -> None:
        from ray import serve

        import specdec
        from specdec.server.app import Server

        if spec.torch_threads:
            import torch

            torch.set_num_threads(spec.torch_threads)
        context = serve.get_replica_context()
        self.replica_id = context.replica_id.to_full_id_str()
        rank = getattr(context, "rank", None)
        self.rank = getattr(rank, "rank", rank) if rank is not None else 0
        self.spec = spec
        model = specdec.load(spec.model, **spec.load)
        draft = specdec.load(spec.draft_model, **spec.load) if spec.draft_model else None
        self.memory_file = None
        if spec.memory:
            model.enable_memory(memory_start(spec.memory, self.rank))
            self.memory_file = replica_memory_file(spec.memory, self.rank)
        self.server = Server(model, draft, spec.config)
        self.server.warm_up()
        self.app = self.server.app()
        self.lifespan: Lifespan | None = None
        self.lock = asyncio.Lock()
        self.stop = threading.Event()
        if self.memory_file:
            threading.Thread(target=self._save_loop, daemon=True, name="specdec-memory").start()

    def _save_loop(self) -> None:
        while not self.stop.wait(self.spec.save_every):
            self.save_memory()

    def save_memory(self) -> None:
        if self.memory_file and self.server.model.memory is not None:
            save_atomically(self.server.model.memory, self.memory_file)

    def replica(self) -> dict:
        return {"replica": self.replica_id, "rank": self.rank, "pid": os.getpid()}

    async def handle(self, req: Routed) -> AsyncIterator:
        """The app's answer to ``req``: ("start", status, headers), then body chunks."""
        async with self.lock:
            if self.lifespan is None:
                self.lifespan = Lifespan(self.app)
                await self.lifespan.start()
        async for item in AsgiCall(self.app, req, [(REPLICA_HEADER.encode(), self.replica_id.encode())]):
            yield item

    def __del__(self) -> None:  # Ray Serve stops a replica gracefully: keep what it learned
        self.stop.set()
        try:
            self.save_memory()
        except Exception:  # noqa: BLE001 - nothing to report to at this point
            pass


def _replica_died(exc: BaseException) -> bool:
    import ray.exceptions

    return isinstance(exc, (ray.exceptions.RayActorError, ray.exceptions.ActorDiedError,
                            ray.exceptions.ActorUnavailableError, ray.exceptions.WorkerCrashedError))


def error_body(message: str, kind: str = "server_error", code: str = "replica_unavailable") -> dict:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def build_ingress(max_body: int):
    """The ingress: a FastAPI app with one catch-all route that forwards to a model replica."""
    from fastapi import FastAPI, Request  # no postponed annotations here: FastAPI reads them in the replica
    from fastapi.responses import JSONResponse, StreamingResponse

    app = FastAPI(title="specdec-ingress", docs_url=None, redoc_url=None, openapi_url=None)

    class Ingress:
        def __init__(self, model) -> None:
            self.model = model.options(stream=True)

        @app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"])
        async def forward(self, request: Request):
            body = bytearray()
            async for chunk in request.stream():
                body += chunk
                if len(body) > max_body:
                    break  # the replica's app answers 413 for what is over the limit
            path = request.url.path
            req = Routed(request.method, path, request.url.query.encode(), list(request.headers.raw), bytes(body),
                         routing_text(path, bytes(body)) if request.method == "POST" else None)
            stream = self.model.handle.remote(req)
            try:
                start = await stream.__anext__()
            except StopAsyncIteration:
                return JSONResponse(error_body("the replica gave no answer"), status_code=502)
            except Exception as exc:  # noqa: BLE001 - any failure of the replica is the server's
                died = _replica_died(exc)
                message = ("the replica serving this request stopped; retry" if died else
                           f"the replica failed: {type(exc).__name__}")
                return JSONResponse(error_body(message, code="replica_unavailable" if died else "replica_error"),
                                    status_code=503 if died else 500)
            _, status, headers = start

            async def rest():
                try:
                    async for chunk in stream:
                        yield chunk
                except Exception as exc:  # noqa: BLE001 - the stream already started: say so in it
                    yield ("data: " + json.dumps(error_body(f"the replica serving this request stopped "
                                                            f"({type(exc).__name__})")) + "\n\n").encode()
                finally:
                    stream.cancel()

            response = StreamingResponse(rest(), status_code=status)
            response.raw_headers = [(k, v) for k, v in headers
                                    if k.lower() not in (b"content-length", b"transfer-encoding")]
            return response

    return app, Ingress


def deployments(spec: ModelSpec, replicas: int | None = 2, min_replicas: int | None = None,
                max_replicas: int | None = None, imbalanced_threshold: int = 2, target_ongoing: float = 2.0,
                replica_cpus: float = 0.0, routing: str = "prefix"):
    """The Ray Serve application (bind it with ``serve.run``); ``routing`` "prefix" (the prefix-
    affinity router) or "default" (Ray Serve's own power-of-two-choices, to compare with)."""
    ray, serve = ray_modules()
    from ray.serve.config import RequestRouterConfig

    slots = spec.config.slots
    scaling: dict[str, Any]
    if min_replicas is not None or max_replicas is not None:
        lo = min_replicas if min_replicas is not None else 1
        scaling = {"autoscaling_config": {"min_replicas": lo, "max_replicas": max_replicas or max(lo, 1),
                                          "target_ongoing_requests": target_ongoing}}
    else:
        scaling = {"num_replicas": replicas or 1}
    routed = {}
    if routing == "prefix":
        routed["request_router_config"] = RequestRouterConfig(
            request_router_class=PrefixRouter, request_router_kwargs={"imbalanced_threshold": imbalanced_threshold})
    model = serve.deployment(ModelReplica, name="SpecdecModel", max_ongoing_requests=max(slots * 4, 8),
                             graceful_shutdown_timeout_s=10, **routed,
                             ray_actor_options={"num_cpus": replica_cpus}, **scaling)
    app, ingress_cls = build_ingress(spec.config.max_body)
    ingress = serve.deployment(serve.ingress(app)(ingress_cls), name="SpecdecIngress",
                               ray_actor_options={"num_cpus": 0}, max_ongoing_requests=1000)
    return ingress.bind(model.bind(spec))


try:  # ray.serve.llm.request_router re-exports it, but that module needs pyarrow (ray[llm]); Ray is pinned
    from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router import \
        PrefixCacheAffinityRouter as _PrefixBase
except ImportError:  # without Ray this module still imports (``specdec serve --ray`` says what is missing)
    _PrefixBase = object


class PrefixRouter(_PrefixBase):
    """Ray's prefix-affinity router on :class:`Routed` requests: requests without a prompt
    (health, models, metrics, bad bodies) go by load alone."""

    def _extract_text_from_request(self, pending_request):
        for arg in pending_request.args:  # by shape: the ingress's Routed may be a by-value copy of the class
            if hasattr(arg, "prompt") and hasattr(arg, "body"):
                return arg.prompt or None
        return None

    async def _choose_replica_for_request(self, pending_request, *, is_retry: bool = False):
        # Ray calls on_request_routed (which records the prompt against the replica) only with
        # strict max_ongoing_requests, off by default: record every routed prompt here instead.
        replica = await super()._choose_replica_for_request(pending_request, is_retry=is_retry)
        text = self._extract_text_from_request(pending_request)
        if text:
            import ray

            ray.get(self._tree_actor.insert.remote(text, replica.replica_id.to_full_id_str(), time.time()))
        return replica

    def on_request_routed(self, pending_request, replica_id, result) -> None:
        pass  # recorded above


def app(args: dict[str, Any]):
    """The application for a Ray Serve config file (``import_path: specdec.server.ray_app:app``,
    e.g. a KubeRay RayService): ``args`` holds ``specdec serve``'s flags by name (``model``,
    ``backend``, ``dtype``, ``memory``, ``slots``, ``max_tokens``, ``replicas`` or
    ``min_replicas``/``max_replicas``, and drafting defaults such as ``drafter``, ``num_draft``)."""
    from specdec.cli import build_parser

    argv = ["serve", "--ray"]
    for key, value in (args or {}).items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is False:
            argv.append("--no-" + key.replace("_", "-"))
        elif value is not None:
            argv += [flag, str(value)]
    parsed = build_parser().parse_args(argv)
    from specdec.commands.serve import check_ray, generation_options, serve_config

    parsed.options = generation_options(parsed)
    check_ray(parsed)
    spec = ModelSpec(model=parsed.model, load={"dtype": parsed.dtype, "backend": parsed.backend,
                                               "exact": parsed.exact},
                     draft_model=parsed.draft_model, memory=parsed.memory, config=serve_config(parsed))
    replicas = None if parsed.min_replicas or parsed.max_replicas else (parsed.replicas or 2)
    return deployments(spec, replicas, parsed.min_replicas, parsed.max_replicas,
                       replica_cpus=parsed.replica_cpus or 0.0, routing=parsed.routing)
