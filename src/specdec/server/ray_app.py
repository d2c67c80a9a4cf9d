"""``specdec serve --ray``: the same OpenAI-compatible app, on Ray Serve replicas.

Two deployments make the application:

- ``SpecdecModel`` (``--replicas N``, or autoscaled between ``--min-replicas`` and
  ``--max-replicas`` on queue length): each replica loads the model and runs the very app
  :meth:`specdec.server.app.Server.app` builds for the single-process server (routes, errors,
  metrics, body limit), called in-process for each request the ingress hands it
  (:mod:`specdec.server.asgi_call`, which says why Ray Serve's FastAPI ingress cannot be used
  there); its answers carry the replica's id in an ``X-Specdec-Replica`` header.
- ``SpecdecIngress`` (the HTTP entry point, a FastAPI ingress): reads a request (up to the body
  limit), takes the prompt's text out of a completion or chat body and hands the request to a
  model replica through a deployment handle that routes by prompt prefix
  (:mod:`specdec.server.ray_router`). A replica that dies under a request ends it with a clean
  OpenAI-style 503 (or, once a stream has started, a final ``error`` event); Ray Serve starts a
  new replica.

Learned state: every replica has its own n-gram memory, acceptance estimates and cost curve. With
``--memory FILE``, replica of rank r starts from ``FILE.replica-r`` if it exists (what the replica
of that rank learned before it was restarted), else from ``FILE``, and writes ``FILE.replica-r``
(atomically, every ``save_every`` seconds and when it stops): no two replicas write one file, and
``FILE`` itself is only read.

:func:`app` is the application of a Ray Serve config file (``import_path:
specdec.server.ray_app:app``); its ``args`` are read by :func:`specdec.server.settings.settings_from`.
"""

import asyncio
import json
import os
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specdec.errors import SpecdecError
from specdec.server.asgi_call import AsgiCall, Lifespan
from specdec.server.ray_router import PrefixRouter, Routed, routing_text
from specdec.server.settings import DEFAULT_REPLICAS, ServeConfig, check_memory_sharing, settings_from


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
    config: ServeConfig = field(default_factory=ServeConfig)
    save_every: float = 60.0  # seconds between memory saves
    torch_threads: int | None = None

    def __post_init__(self) -> None:
        # Refused here, in the driver, rather than in each replica after its model has loaded.
        check_memory_sharing(self.memory, self.config.shared_index, spell=str)


# -- memory: one file per replica rank -------------------------------------------------------------
def replica_memory_file(memory: str, rank: int) -> str:
    return f"{memory}.replica-{rank}"


def memory_start(memory: str, rank: int) -> str:
    """The file a replica of ``rank`` starts from: its own if it wrote one, else the shared one."""
    own = replica_memory_file(memory, rank)
    return own if Path(own).exists() else memory


# -- the replica: the single-process app, called in-process -----------------------------------------
class ModelReplica:
    """One model replica (the deployment's class): the single-process server's app, in-process."""

    def __init__(self, spec: ModelSpec) -> None:
        from ray import serve

        import specdec
        from specdec.server.app import Server, freeze_loaded

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
            model.loaded.enable_memory(memory_start(spec.memory, self.rank))
            self.memory_file = replica_memory_file(spec.memory, self.rank)
        self.server = Server(model, draft, spec.config)
        self.server.warm_up()
        freeze_loaded()  # a replica is a server process: what it loaded lives as long as it does
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
        if self.memory_file and self.server.model.loaded.memory is not None:
            self.server.model.loaded.memory.save(self.memory_file)  # whole or not at all

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


def deployments(spec: ModelSpec, replicas: int | None = DEFAULT_REPLICAS, min_replicas: int | None = None,
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


def app(args: dict[str, Any]):
    """The application for a Ray Serve config file (``import_path: specdec.server.ray_app:app``,
    e.g. a KubeRay RayService): ``args`` holds ``specdec serve``'s settings by name (``model``,
    ``backend``, ``dtype``, ``memory``, ``slots``, ``max_tokens``, ``replicas`` or
    ``min_replicas``/``max_replicas``, and drafting defaults such as ``drafter``, ``num_draft``),
    read by :func:`specdec.server.settings.settings_from`."""
    settings = settings_from(args)
    ray_modules()
    spec = ModelSpec(model=settings.model, load=settings.load, draft_model=settings.draft_model,
                     memory=settings.memory, config=settings.config)
    scaling = settings.scaling
    return deployments(spec, scaling.fixed, scaling.min_replicas, scaling.max_replicas,
                       replica_cpus=scaling.replica_cpus or 0.0, routing=scaling.routing)
