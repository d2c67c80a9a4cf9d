"""What every benchmark method is (ours and the peers'): a :class:`Method` that generates and a
:class:`RunResult` of one run, which plain method each family is measured against, and the
registry of peers (:data:`PEERS`): each peer is one file of :mod:`specdec.bench.peers` that
registers its method heads with :func:`peer`, their written form, family, backend and how they
are parsed, checked and built. Our own methods are in :mod:`specdec.bench.methods`; both import
this module (never the reverse)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from specdec.errors import SpecdecError
from specdec.registry import Registry
from specdec.stats import GenerationStats

OURS = "ours"  # our methods' family, measured against ``plain``


@dataclass
class RunResult:
    """One method on one question.

    ``stats`` are our generation's own counters (:class:`specdec.stats.GenerationStats`; None for
    the peers, which do not expose them); ``peer_forwards`` the target forwards a peer made,
    counted by a hook where its library allows one (or from its own counters), ``peer_drafted`` /
    ``peer_accepted`` its draft tokens where it reports them.

    ``gen_s`` is the generation time after the prompt (None where unknown) and ``gen_tokens`` the
    tokens made in it, so that ``gen_tokens / gen_s`` is a generation rate that leaves the prompt
    out. Ours: ``wall_s - prefill_s`` of our stats and every new token (the target's prompt left
    out, except its last token, whose forward yields the first new token; a draft model's own
    prompt is inside). llama.cpp's (``llama-server-*``, ``llamacpp-*``): from the first new token
    to the last and the tokens after the first, its ``predicted_per_second``.

    A question of several turns (:mod:`specdec.bench.conversations`) is one result: its turns'
    tokens one after the other, their times and counters summed (:func:`joined`).
    """

    token_ids: list[int]
    wall_s: float
    stats: GenerationStats | None = None
    peer_forwards: int | None = None
    gen_s: float | None = None
    gen_tokens: int | None = None
    peer_drafted: int | None = None
    peer_accepted: int | None = None
    outcome: dict | None = None  # what a conversation achieved (a repair loop: passed, turns)
    turns: int = 1
    first_turn: int | None = None  # a conversation's: how many of token_ids its first answer holds

    @property
    def target_forwards(self) -> int | None:
        return self.stats.target_forwards if self.stats is not None else self.peer_forwards

    @classmethod
    def of(cls, out, wall_s: float) -> RunResult:
        """One of our generations (a :class:`specdec.api.Output`) that took ``wall_s``: its
        counters, and its time after the prompt as ``gen_s`` with every new token."""
        return cls(out.token_ids, wall_s, stats=out.stats, gen_s=out.stats.wall_s - out.stats.prefill_s,
                   gen_tokens=len(out.token_ids))


def joined(parts: list[RunResult], outcome: dict | None = None) -> RunResult:
    """The turns of one conversation as one result: tokens in turn order, times and counters
    summed (a counter that one turn lacks is unknown for the whole)."""
    def total(name: str):
        values = [getattr(p, name) for p in parts]
        return None if any(v is None for v in values) else sum(values)

    stats = None
    if all(p.stats is not None for p in parts):
        stats = GenerationStats.total(p.stats for p in parts)
    gen_tokens = None
    if all(p.gen_s is not None for p in parts):
        gen_tokens = sum(len(p.token_ids) if p.gen_tokens is None else p.gen_tokens for p in parts)
    return RunResult([t for p in parts for t in p.token_ids], sum(p.wall_s for p in parts), stats=stats,
                     peer_forwards=total("peer_forwards"), gen_s=total("gen_s"), gen_tokens=gen_tokens,
                     peer_drafted=total("peer_drafted"), peer_accepted=total("peer_accepted"),
                     outcome=outcome, turns=len(parts), first_turn=len(parts[0].token_ids))


class Method(ABC):
    """A way to generate: ``run`` returns the new token ids and the wall time of the call."""

    name: str
    family: str  # "ours", "hf" or "llamacpp": which plain method is its baseline
    takes_schema: ClassVar[bool] = False  # whether run() can constrain an answer to a JSON Schema

    @property
    def baseline(self) -> str:
        return baseline(self.family)

    @abstractmethod
    def run(self, prompt_ids: list[int], max_new_tokens: int, seed: int | None,
            schema: dict | None = None) -> RunResult:
        """Generate after ``prompt_ids`` (the answer a JSON value valid against ``schema``, where
        given and :attr:`takes_schema`); only the generation call itself is timed."""


# -- peers --------------------------------------------------------------------------------------
@dataclass
class PeerContext:
    """What a peer method is built from: the bench's target (our loaded :class:`specdec.Model` and
    its name), the run's backend, dtype and options (the sampling), and a cache so that each peer
    model or server is loaded at most once per bench."""

    model: Any  # specdec.api.Model
    model_name: str
    backend: str
    dtype: str
    options: Any  # specdec.options.GenerationOptions
    _cache: dict = field(default_factory=dict)

    def once(self, key, make: Callable[[], Any]) -> Any:
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]


@dataclass(frozen=True)
class PeerEntry:
    """One peer method head (``hf-lookup``) as :func:`peer` registered it.

    ``parse(spec, args, pairs, target)`` checks a method string and returns its settings (mistakes
    read ``method 'SPEC': ...``; ``target`` is the model's name, None when not yet known);
    ``available()`` raises where the peer is not installed; ``build(context, spec, settings)`` makes
    the :class:`Method`. ``backend``: the ``--backend`` the run must have (None: any)."""

    name: str
    form: str
    family: str
    build: Callable[[PeerContext, str, Any], Method]
    parse: Callable[[str, list, dict, str | None], Any]
    backend: str | None = None
    available: Callable[[], Any] | None = None
    baseline: bool = False  # the plain method its family is measured against
    order: int = 50


PEERS: Registry[PeerEntry] = Registry("bench method", "specdec.bench.peers")


def peer(name: str, form: str, family: str, *, parse: Callable[[str, list, dict, str | None], Any],
         backend: str | None = None, available: Callable[[], Any] | None = None, baseline: bool = False,
         order: int = 50):
    """Register the decorated ``build(context, spec, settings) -> Method`` as the peer ``name``."""
    def register(build: Callable[[PeerContext, str, Any], Method]):
        PEERS.add(name, PeerEntry(name, form, family, build, parse, backend, available, baseline, order))
        return build
    return register


def baseline(family: str) -> str:
    """The plain method a family is measured against."""
    if family == OURS:
        return "plain"
    for entry in PEERS:
        if entry.family == family and entry.baseline:
            return entry.name
    raise SpecdecError(f"no plain method is registered for the {family} family")


def baselines() -> dict[str, str]:
    """Every family's plain method."""
    return {OURS: "plain", **{e.family: e.name for e in PEERS if e.baseline}}


def split(spec: str) -> tuple[str, list[str], dict[str, str]]:
    """A method string's head, bare words and ``key=value`` pairs."""
    parts = spec.strip().split(":")
    if not parts or not parts[0]:
        raise SpecdecError(f"unknown method {spec!r}")
    args = [p for p in parts[1:] if "=" not in p]
    pairs = dict(p.split("=", 1) for p in parts[1:] if "=" in p)
    return parts[0], args, pairs


def positive(spec: str, value: str, name: str = "k") -> int:
    """A peer's whole-number setting (its own library's parameter, not one of our options)."""
    try:
        k = int(value)
    except ValueError:
        k = 0
    if k < 1:
        raise SpecdecError(f"method {spec!r}: {name} must be a whole number >= 1")
    return k


def no_more(spec: str, pairs: dict) -> None:
    if pairs:
        raise SpecdecError(f"method {spec!r}: unknown option(s) {', '.join(pairs)}")
