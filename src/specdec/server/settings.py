"""What a server is set up with, by name.

``specdec serve``'s flags and a Ray Serve config file's ``args`` (``specdec.server.ray_app:app``,
e.g. a KubeRay RayService) say the same things: the model and how it loads, the drafting defaults
of requests that do not choose, the server's limits (:class:`ServeConfig`) and, on Ray, its
replicas. The command line
calls down into this module for what the two share (:data:`PER_REQUEST`, :class:`Scaling`); a
config file's ``args`` are read by :func:`settings_from` alone. Nothing in the server package
imports :mod:`specdec.commands`.

Mistakes read as the front end spells a setting: ``--min-replicas`` on the command line,
``min_replicas`` in a config file.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from specdec.errors import SpecdecError
from specdec.options import GenerationOptions

# Chosen by each request's body (OpenAI's fields), not by the server.
PER_REQUEST = ("max_new_tokens", "temperature", "top_k", "top_p", "seed", "stop")
ROUTINGS = ("prefix", "default")
DEFAULT_REPLICAS = 2

Spell = Callable[[str], str]


@dataclass
class ServeConfig:
    """The options of requests that do not choose, and the server's limits."""

    defaults: GenerationOptions = field(default_factory=GenerationOptions)  # drafting (sampling: OpenAI's)
    slots: int = 4  # generations in progress at once (each holds a KV cache)
    max_tokens: int = 256  # when a request gives no max_tokens
    max_body: int = 1 << 20  # bytes
    batch: bool | None = None  # step generations in one forward (None: where the backend can)


def as_flag(name: str) -> str:
    """A setting as the command line spells it."""
    return "--" + name.replace("_", "-")


@dataclass
class Scaling:
    """How many model replicas Ray Serve runs (a fixed number, or autoscaled between two on queue
    length), the CPUs it reserves for each and how requests are routed to them."""

    replicas: int | None = None
    min_replicas: int | None = None
    max_replicas: int | None = None
    replica_cpus: float | None = None
    routing: str = "prefix"

    @property
    def autoscaled(self) -> bool:
        return self.min_replicas is not None or self.max_replicas is not None

    @property
    def fixed(self) -> int | None:
        """The number of replicas when not autoscaled (None when autoscaled)."""
        return None if self.autoscaled else (self.replicas or DEFAULT_REPLICAS)

    def check(self, spell: Spell = str) -> Scaling:
        """The first mistake as one :class:`SpecdecError`; ``self`` if there is none."""
        for name in ("replicas", "min_replicas", "max_replicas"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or value < 1):
                raise SpecdecError(f"{spell(name)} must be a whole number >= 1, got {value!r}")
        cpus = self.replica_cpus
        if cpus is not None and (not isinstance(cpus, (int, float)) or isinstance(cpus, bool) or cpus < 0):
            raise SpecdecError(f"{spell('replica_cpus')} must be >= 0, got {cpus!r}")
        if self.replicas is not None and self.autoscaled:
            raise SpecdecError(f"give {spell('replicas')} or {spell('min_replicas')}/{spell('max_replicas')}, "
                               f"not both")
        if self.min_replicas is not None and self.max_replicas is not None and self.min_replicas > self.max_replicas:
            raise SpecdecError(f"{spell('min_replicas')} ({self.min_replicas}) must be <= {spell('max_replicas')} "
                               f"({self.max_replicas})")
        if self.routing not in ROUTINGS:
            raise SpecdecError(f"{spell('routing')} must be one of {', '.join(ROUTINGS)}, got {self.routing!r}")
        return self


@dataclass
class ServeSettings:
    """Everything a server is told: what to load, its :class:`ServeConfig`, its replicas on Ray."""

    model: str
    load: dict[str, Any] = field(default_factory=dict)  # specdec.load's keywords: backend, dtype, exact
    draft_model: str | None = None
    memory: str | None = None
    config: ServeConfig = field(default_factory=ServeConfig)
    scaling: Scaling = field(default_factory=Scaling)


LOAD = ("backend", "dtype", "exact")
SERVER = ("slots", "max_tokens", "batch")
SCALING = ("replicas", "min_replicas", "max_replicas", "replica_cpus", "routing")


def settings_from(values: Mapping[str, Any] | None) -> ServeSettings:
    """The settings ``values`` name (``specdec serve``'s flags by name, with their defaults),
    checked before anything loads: one :class:`SpecdecError` for the first mistake."""
    from specdec import options
    from specdec.models import DEFAULT_MODEL, default_draft_model
    from specdec.registry import BACKENDS, DRAFTERS

    values = {k: v for k, v in dict(values or {}).items() if v is not None}
    drafting = {o.name: o for o in options.generation_options() if o.name not in PER_REQUEST}
    model_scope = {o.name: o for o in options.all_options() if o.scope == "model"}
    known = {"model", "draft_model", *LOAD, *SERVER, *SCALING, *drafting, *model_scope}
    for name in values:
        if name in PER_REQUEST:
            raise SpecdecError(f"{name} is chosen by each request, not by the server")
        if name not in known:
            raise SpecdecError(f"unknown setting {name!r}: use one of {', '.join(sorted(known))}")

    model = _typed(values, "model", str, DEFAULT_MODEL)
    backend = _typed(values, "backend", str, "transformers")
    if backend not in BACKENDS:
        raise SpecdecError(f"backend must be one of {', '.join(BACKENDS.names())}, got {backend!r}")
    dtype = _typed(values, "dtype", str, "float32")
    if dtype not in BACKENDS.get(backend).dtypes:
        raise SpecdecError(f"dtype {dtype} is not available on the {backend} backend")
    for opt in model_scope.values():
        wrong = opt.problem(values.get(opt.name))
        if wrong:
            raise SpecdecError(wrong)
    defaults = GenerationOptions.of({k: v for k, v in values.items() if k in drafting}).validate()

    draft_model = _typed(values, "draft_model", str, None)
    entry = DRAFTERS.get(defaults.drafter)
    if entry.needs_draft_model and draft_model is None:
        draft_model = default_draft_model(model)
        if draft_model is None:
            raise SpecdecError(f"drafter {defaults.drafter} needs draft_model ({model} names no default draft model)")
    elif draft_model is not None and not entry.needs_draft_model:
        raise SpecdecError(f"draft_model is only used with a drafter that runs a model "
                           f"({', '.join(e.name for e in DRAFTERS if e.needs_draft_model)})")

    config = ServeConfig(defaults=defaults, slots=_count(values, "slots", 4), max_tokens=_count(values, "max_tokens", 256),
                         batch=_typed(values, "batch", bool, None))
    scaling = Scaling(**{k: values[k] for k in SCALING if k in values}).check()
    return ServeSettings(model=model, load={"backend": backend, "dtype": dtype, "exact": _typed(values, "exact", bool, None)},
                         draft_model=draft_model, memory=values.get("memory"), config=config, scaling=scaling)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _typed(values: Mapping[str, Any], name: str, kind: type, default: Any) -> Any:
    value = values.get(name, default)
    if value is not None and not isinstance(value, kind):
        raise SpecdecError(f"{name} must be {'true or false' if kind is bool else 'a string'}, got {value!r}")
    return value


def _count(values: Mapping[str, Any], name: str, default: int) -> int:
    value = values.get(name, default)
    if not _is_int(value) or value < 1:
        raise SpecdecError(f"{name} must be a whole number >= 1, got {value!r}")
    return value
