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

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from specdec.errors import SpecdecError
from specdec.load_options import LOAD, SERVE, LoadOptions, ServeOptions, draft_model_for
from specdec.options import GenerationOptions, Spell, flag

# Chosen by each request's body (OpenAI's fields), not by the server.
PER_REQUEST = ("max_new_tokens", "temperature", "top_k", "top_p", "seed", "stop")
ROUTINGS = ("prefix", "default")
DEFAULT_REPLICAS = 2


@dataclass(frozen=True)
class ServeConfig(ServeOptions):
    """A server's set-up: its serve options (:class:`~specdec.load_options.ServeOptions`: slots,
    max_tokens, batch, shared_index, index_tokens, declared there), the options of requests that do
    not choose, and the largest request body it reads."""

    defaults: GenerationOptions = field(default_factory=GenerationOptions)  # drafting (sampling: OpenAI's)
    max_body: int = 1 << 20  # bytes


def check_memory_sharing(memory: str | None, shared_index: bool, spell: Spell = flag) -> None:
    """A memory file is one index of every client's outputs: a server keeps one only when its
    clients share the index (``shared_index``); otherwise each API key has its own
    (:mod:`specdec.server.tenants`) and nothing would go into the file."""
    if memory and not shared_index:
        raise SpecdecError(f"{spell('memory')} keeps one index of earlier outputs for every client: add "
                           f"{spell('shared_index')} to share it (by default each API key has its own)")


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
    load: dict[str, Any] = field(default_factory=dict)  # specdec.load's keywords (specdec.load_options.LOAD)
    draft_model: str | None = None
    memory: str | None = None
    config: ServeConfig = field(default_factory=ServeConfig)
    scaling: Scaling = field(default_factory=Scaling)


SCALING = ("replicas", "min_replicas", "max_replicas", "replica_cpus", "routing")


def settings_from(values: Mapping[str, Any] | None) -> ServeSettings:
    """The settings ``values`` name (``specdec serve``'s flags by name, with their defaults),
    checked before anything loads: one :class:`SpecdecError` for the first mistake."""
    from specdec import options
    from specdec.models import DEFAULT_MODEL

    values = {k: v for k, v in dict(values or {}).items() if v is not None}
    drafting = {o.name: o for o in options.generation_options() if o.name not in PER_REQUEST}
    model_scope = {o.name: o for o in options.all_options() if o.scope == "model"}
    load_names = [o.name for o in LOAD]
    serve_names = [o.name for o in SERVE]
    known = {"model", "draft_model", *load_names, *serve_names, *SCALING, *drafting, *model_scope}
    for name in values:
        if name in PER_REQUEST:
            raise SpecdecError(f"{name} is chosen by each request, not by the server")
        if name not in known:
            raise SpecdecError(f"unknown setting {name!r}: use one of {', '.join(sorted(known))}")

    model = _typed(values, "model", str, DEFAULT_MODEL)
    # The backend chosen for the model here (where it is auto), once: every replica loads the same.
    load = LoadOptions.of({k: values[k] for k in load_names if k in values}).for_model(model)
    for opt in model_scope.values():
        wrong = opt.problem(values.get(opt.name))
        if wrong:
            raise SpecdecError(wrong)
    defaults = GenerationOptions.of({k: v for k, v in values.items() if k in drafting}).validate()
    draft_model = draft_model_for(defaults.drafter, _typed(values, "draft_model", str, None), model)
    config = ServeConfig(defaults=defaults, **{k: values[k] for k in serve_names if k in values}).validate()
    scaling = Scaling(**{k: values[k] for k in SCALING if k in values}).check()
    check_memory_sharing(values.get("memory"), config.shared_index, spell=str)
    return ServeSettings(model=model, load=load.to_dict(), draft_model=draft_model, memory=values.get("memory"),
                         config=config, scaling=scaling)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _typed(values: Mapping[str, Any], name: str, kind: type, default: Any) -> Any:
    value = values.get(name, default)
    if value is not None and not isinstance(value, kind):
        raise SpecdecError(f"{name} must be {'true or false' if kind is bool else 'a string'}, got {value!r}")
    return value
