"""Our benchmark methods, through :meth:`specdec.Model.generate`, and the factory that builds every
method of a bench run, ours and the registered peers' (:data:`specdec.bench.base.PEERS`).

Method strings: ``plain`` and every registered drafter as
``NAME[:ALIAS][:k=K][:policy=P][:tree][:verify=V][:OPTION=VALUE]`` (``ALIAS`` for drafters that run a
model). Everything after the name is a generation option (:mod:`specdec.options`; ``k`` is
``num_draft``, a bare boolean option's name such as ``tree`` turns it on), so an option a drafter
declares in its own file works here unchanged; the sampling comes from the bench's flags, the same
for every method. The peers' forms are their own (:mod:`specdec.bench.peers`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from specdec import option_forms
from specdec.api import Model
from specdec.bench.base import PEERS, Method, PeerContext, RunResult, baseline, baselines, split
from specdec.errors import SpecdecError
from specdec.loaded import LoadedModel, load_model
from specdec.options import GenerationOptions, Option, generation_options
from specdec.registry import DRAFTERS

__all__ = ["MethodFactory", "OurMethod", "baseline", "baselines", "check_specs", "method_forms", "our_options"]


def method_forms() -> list[str]:
    """Every method string this build understands (ours from the drafter registry and the option
    specs, a drafter's own options on its form, then the peers')."""
    core = [o for o in _spec_options() if o.owner is None]
    ours = ["plain"]
    for entry in DRAFTERS:
        if not entry.drafts:  # plain decoding: the form "plain"
            continue
        own = [o for o in entry.options if o.bench and o.scope == "generation"]
        ours.append(entry.name + (":ALIAS" if entry.needs_draft_model else "")
                    + "".join(_form(o) for o in core + own))
    return ours + [entry.form for entry in PEERS]


def _spec_options() -> list[Option]:
    return [o for o in generation_options() if o.bench]


def _form(option: Option) -> str:
    key = option.bench_key or option.name
    if option.type is bool:
        return f"[:{key}]"
    return f"[:{key}={option.metavar or key[0].upper()}]"


@dataclass
class OurMethod(Method):
    name: str
    model: Model
    options: GenerationOptions  # validated; max_new_tokens and seed are set per question
    draft_model: LoadedModel | None = None
    family: str = "ours"

    takes_schema = True

    def run(self, prompt_ids, max_new_tokens, seed, schema=None):
        options = self.options.with_(max_new_tokens=max_new_tokens, seed=seed)
        # Cold, like the peers (whose caches are reset): another method's run of the same question
        # must not leave this one its prompt.
        for model in (self.model.loaded, self.draft_model):
            if model is not None:
                model.forget_prompts()
        t0 = time.perf_counter()
        out = self.model.generate(prompt_ids, options=options, draft_model=self.draft_model, response_format=schema)
        wall = time.perf_counter() - t0
        return RunResult.of(out, wall)


@dataclass
class MethodFactory:
    """Builds methods for one target model, loading each peer model or server at most once.

    ``options`` are the bench's (its sampling flags); each of our methods adds what its spec chose.
    """

    model: Model
    model_name: str
    backend: str
    dtype: str
    options: GenerationOptions
    _cache: dict = field(default_factory=dict)

    def build(self, spec: str) -> Method:
        head, args, pairs = _split(spec)
        if head == "plain" or head in DRAFTERS:
            return self._ours(spec)
        entry = _peer(spec, head)
        _check_backend(spec, entry, self.backend)
        settings = entry.parse(spec, args, pairs, self.model_name)
        context = PeerContext(self.model, self.model_name, self.backend, self.dtype, self.options, self._cache)
        return entry.build(context, spec, settings)

    def _ours(self, spec: str) -> Method:
        options, alias = our_options(spec, self.options)  # the loaded model knows its default draft model
        draft_model = None
        if alias is not None:
            draft_model = self._once(("ours", alias), lambda: load_model(alias, self.model.loaded.options))
        elif DRAFTERS.get(options.drafter).needs_draft_model:  # no ALIAS: the target's default draft model
            draft_model = self.model.loaded.default_draft_model()
            if draft_model is None:
                raise SpecdecError(f"method {spec!r}: write {options.drafter}:ALIAS ({self.model.name} names no "
                                   "default draft model)")
        return OurMethod(spec, self.model, options, draft_model)

    def _once(self, key, make):
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]


def our_options(spec: str, base: GenerationOptions,
                target: str | None = None) -> tuple[GenerationOptions, str | None]:
    """The validated options one of our method strings chose over ``base``, and its draft model's
    alias (None for drafters without a model, or when the target's default draft model is meant:
    refused here when ``target`` is known to have none). Mistakes read ``method 'SPEC': ...``."""
    from specdec.models import default_draft_model

    head, args, pairs = _split(spec)
    entry = DRAFTERS.get("none" if head == "plain" else head)
    switches = {o.bench_key or o.name: o for o in _spec_options() if o.type is bool}
    words = [a for a in args if a not in switches]
    values = {a: "true" for a in args if a in switches} | pairs
    if len(words) > int(entry.needs_draft_model) or (
            entry.needs_draft_model and not words and target is not None and default_draft_model(target) is None):
        raise SpecdecError(f"method {spec!r}: write {entry.name}:ALIAS" if entry.needs_draft_model
                           else f"method {spec!r}: {entry.name} takes no model")
    try:
        options = option_forms.from_spec(values, base.with_(drafter=entry.name))
    except SpecdecError as exc:
        raise SpecdecError(f"method {spec!r}: {exc}") from None
    if not entry.drafts and options.tree:
        raise SpecdecError(f"method {spec!r}: plain decoding drafts nothing to branch")
    return options, (words[0] if words else None)


def check_specs(specs: list[str], backend: str, base: GenerationOptions, model: str | None = None) -> None:
    """Refuse malformed methods, peers of the other backend and peers not installed, before any
    model is loaded (with ``model``, also a drafter without ``:ALIAS`` on a target with no default
    draft model)."""
    for spec in specs:
        head, args, pairs = _split(spec)
        if head == "plain" or head in DRAFTERS:
            our_options(spec, base, model)
            continue
        entry = _peer(spec, head)
        _check_backend(spec, entry, backend)
        entry.parse(spec, args, dict(pairs), model)
        if entry.available is not None:
            entry.available()


def _peer(spec: str, head: str):
    if head not in PEERS:
        raise _unknown(spec)
    return PEERS.get(head)


def _check_backend(spec: str, entry, backend: str) -> None:
    if entry.backend is not None and entry.backend != backend:
        raise SpecdecError(f"method {spec!r} runs on --backend {entry.backend} (this run is {backend})")


def _split(spec: str) -> tuple[str, list[str], dict[str, str]]:
    try:
        return split(spec)
    except SpecdecError:
        raise _unknown(spec) from None


def _unknown(spec: str) -> SpecdecError:
    return SpecdecError(f"unknown method {spec!r}: use {', '.join(method_forms())}")
