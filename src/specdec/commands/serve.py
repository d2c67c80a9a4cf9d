"""``specdec serve``: the OpenAI-compatible HTTP server."""

from __future__ import annotations

import argparse
import sys

from specdec import option_forms
from specdec.commands.common import add_generation_options, add_model_options, announce, generation_options, \
    load_options, quiet_libraries
from specdec.errors import SpecdecError
from specdec.load_options import SERVE
from specdec.server.settings import PER_REQUEST, ROUTINGS, Scaling, ServeConfig, check_memory_sharing

NAME = "serve"
ORDER = 5


def add_parser(sub) -> None:
    srv = sub.add_parser(NAME, help="serve the model over an OpenAI-compatible HTTP API",
                         description="Serve /v1/completions and /v1/chat/completions (streaming or not), /v1/models, "
                                     "/health and /metrics (Prometheus). Requests may choose the drafting "
                                     "options (drafter, num_draft, policy, tree, verify, drafters' own) in "
                                     "the body; these flags are their defaults.")
    add_model_options(srv)
    # Requests choose sampling, stops and length in their bodies (OpenAI's defaults); the drafting
    # flags are the defaults for requests that do not choose.
    add_generation_options(srv, skip=PER_REQUEST)
    srv.add_argument("--host", default="127.0.0.1", help="default: 127.0.0.1")
    srv.add_argument("--port", type=int, default=8000, help="default: 8000")
    option_forms.add_spec_arguments(srv, SERVE)
    ray = srv.add_argument_group("Ray Serve (pip install 'specdec[ray]')")
    ray.add_argument("--ray", action="store_true",
                     help="serve the same app from Ray Serve replicas, requests sharing a prompt prefix routed to "
                          "the same replica while it is not overloaded")
    ray.add_argument("--replicas", type=int, default=None, metavar="N", help="model replicas (default: 2)")
    ray.add_argument("--min-replicas", type=int, default=None, metavar="N",
                     help="autoscale on queue length between --min-replicas and --max-replicas")
    ray.add_argument("--max-replicas", type=int, default=None, metavar="N")
    ray.add_argument("--replica-cpus", type=float, default=None, metavar="N",
                     help="CPUs Ray reserves for each model replica, so a cluster spreads them over nodes "
                          "(default: 0, any number on one machine)")
    ray.add_argument("--routing", choices=ROUTINGS, default="prefix",
                     help="prefix: a prompt goes to the replica that served its prefix while it is not overloaded "
                          "(default); default: Ray Serve's own routing (power of two choices)")
    ray.add_argument("--address", default=None,
                     help="join this Ray cluster (e.g. auto, ray://head:10001; default: a local Ray instance)")


def check_args(args: argparse.Namespace) -> None:
    args.options = generation_options(args)
    serve_config(args).validate(spell=option_forms.flag)
    check_memory_sharing(args.memory, args.shared_index, spell=option_forms.flag)
    if not 0 <= args.port <= 65535:
        raise SpecdecError(f"--port must be in 0..65535, got {args.port}")
    check_ray(args)
    check_port(args.host, args.port)
    try:
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise SpecdecError(f"the server needs the serve extra: pip install 'specdec[serve]' ({exc.name} is missing)")


def check_ray(args: argparse.Namespace) -> None:
    """The Ray flags: only with --ray, and as the server's settings check them; Ray itself installed."""
    given = [f for f, v in (("--replicas", args.replicas), ("--min-replicas", args.min_replicas),
                            ("--max-replicas", args.max_replicas), ("--replica-cpus", args.replica_cpus),
                            ("--address", args.address)) if v is not None]
    if not args.ray:
        if given:
            raise SpecdecError(f"{given[0]} needs --ray")
        return
    scaling(args).check(spell=option_forms.flag)
    from specdec.server.ray_app import ray_modules

    ray_modules()


def scaling(args: argparse.Namespace) -> Scaling:
    return Scaling(args.replicas, args.min_replicas, args.max_replicas, args.replica_cpus, args.routing)


def check_port(host: str, port: int) -> None:
    """A taken port or an unknown host is refused before the model loads (seconds later)."""
    import socket

    try:
        with socket.create_server((host, port)):
            pass
    except OSError as exc:
        raise SpecdecError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def serve_config(args: argparse.Namespace) -> ServeConfig:
    """The server's :class:`~specdec.server.settings.ServeConfig` from checked flags: every drafting
    flag (``--verify`` and drafters' own options included) is the default of requests."""
    return ServeConfig(defaults=args.options, **option_forms.spec_values(args, SERVE))


def run(args: argparse.Namespace) -> int:
    check_args(args)
    if args.ray:
        return run_ray(args)
    from specdec.commands.common import resolve_model
    from specdec.commands.generate import check_draft_vocabulary

    resolved = resolve_model(args.model, args.backend)
    if args.draft_model:  # given, or the alias's default when the default drafter runs a model
        check_draft_vocabulary(args.options.drafter, resolve_model(args.draft_model, args.backend), resolved)
    from specdec.api import load
    from specdec.server.app import Server, freeze_loaded, serve_forever

    quiet_libraries()
    model = load(args.model, **load_options(args))
    announce(args, model)
    draft_model = load(args.draft_model, **load_options(args)) if args.draft_model else None
    if args.memory:
        model.loaded.enable_memory(args.memory)
    server = Server(model, draft_model, serve_config(args))
    print(f"calibrating {model.name} on this machine ...", file=sys.stderr)
    server.warm_up()
    freeze_loaded()
    print(f"serving {model.name} at http://{args.host}:{args.port}/v1 (drafter {args.options.drafter}; Ctrl-C stops)",
          file=sys.stderr)
    try:
        serve_forever(server, args.host, args.port)
    finally:
        if args.memory:
            model.loaded.memory.save(args.memory)
            print(f"memory saved to {args.memory} ({len(model.loaded.memory)} n-grams)", file=sys.stderr)
    return 0


def run_ray(args: argparse.Namespace) -> int:
    """Deploy the app on Ray Serve (a local instance, or the cluster at --address) and wait."""
    import time

    from specdec.commands.common import resolve_model
    from specdec.server.ray_app import ModelSpec, deployments, ray_modules

    resolve_model(args.model, args.backend)  # an unknown alias fails here, not in every replica
    ray, serve = ray_modules()
    spec = ModelSpec(model=args.model, load=load_options(args), draft_model=args.draft_model, memory=args.memory,
                     config=serve_config(args))
    import logging

    logging.getLogger("ray.serve").setLevel(logging.WARNING)
    ray.init(address=args.address, logging_level="warning", log_to_driver=False)
    try:
        serve.start(http_options={"host": args.host, "port": args.port})
        chosen = scaling(args)
        print("starting the replicas (each loads and calibrates the model) ...", file=sys.stderr)
        serve.run(deployments(spec, chosen.fixed, chosen.min_replicas, chosen.max_replicas,
                              replica_cpus=chosen.replica_cpus or 0.0, routing=chosen.routing), name="specdec",
                  route_prefix="/")
        print(f"serving {args.model} on Ray at http://{args.host}:{args.port}/v1 (Ctrl-C stops)", file=sys.stderr)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        serve.shutdown()
        ray.shutdown()
    return 0
