"""Registries of drafters, draft-length policies and backends, each declared in its own file.

A module in ``specdec/drafters``, ``specdec/policies`` or ``specdec/backends`` registers what it
defines with a decorator; the registry imports every module of its package the first time it is
read, so adding a drafter, policy or backend is one new file. The CLI's choices and help, the API's
names and ``specdec bench``'s methods are all read from here (vLLM's proposer registry, HF's
``_get_candidate_generator`` written as a table).
"""

from __future__ import annotations

import importlib
import pkgutil
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Generic, TypeVar

from specdec.errors import SpecdecError

E = TypeVar("E")


class Registry(Generic[E]):
    """Named entries of one kind, discovered from the modules of ``package``."""

    def __init__(self, kind: str, package: str) -> None:
        self.kind = kind
        self.package = package
        self._entries: dict[str, E] = {}
        self._discovered = False
        # Threads that read the registry first at once (generations started together) wait for
        # one discovery; its own imports reading the registry see what is registered so far.
        self._lock = threading.RLock()
        self._discovering = False

    def add(self, name: str, entry: E) -> None:
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is registered twice")
        self._entries[name] = entry

    def remove(self, name: str) -> None:
        """Forget ``name`` (tests that register an entry of their own clean up with it)."""
        self._entries.pop(name, None)

    def get(self, name: str) -> E:
        """The entry called ``name``; a clear error listing the choices otherwise."""
        self._discover()
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise SpecdecError(f"unknown {self.kind} {name!r}: use one of {', '.join(self.names())}") from None

    def names(self) -> list[str]:
        self._discover()
        return sorted(self._entries, key=lambda n: (getattr(self._entries[n], "order", 50), n))

    def __iter__(self) -> Iterator[E]:
        return iter([self._entries[n] for n in self.names()])

    def __contains__(self, name: object) -> bool:
        self._discover()
        return name in self._entries

    def _discover(self) -> None:
        if self._discovered:
            return
        with self._lock:
            if self._discovered or self._discovering:
                return
            self._discovering = True
            try:
                self._import_all()
            finally:
                self._discovering = False
            self._discovered = True

    def _import_all(self) -> None:
        pkg = importlib.import_module(self.package)
        for info in pkgutil.iter_modules(pkg.__path__):
            try:
                importlib.import_module(f"{self.package}.{info.name}")
            except ModuleNotFoundError as error:
                # A helper module for an optional accelerator (the paged attention's Triton kernels)
                # imports its library at the top and registers nothing: without the library it is
                # not there, and the registry still is. specdec's own modules must always import.
                if (error.name or "").split(".")[0] == "specdec":
                    raise


# -- drafters -----------------------------------------------------------------------------------
class Unchosen:
    """The options of a request that chose none (a drafter built directly, as tests do): no tree,
    and each drafter-declared option at its declared default. Generations pass their
    :class:`specdec.options.GenerationOptions` instead (that module reads this one, not the reverse)."""

    tree = False

    def __getitem__(self, name: str) -> Any:
        for entry in DRAFTERS:
            for option in entry.options:
                if option.name == name:
                    return option.default
        raise SpecdecError(f"unknown drafter option {name!r}")


@dataclass
class DraftRequest:
    """What a drafter may be built from: the target's :class:`~specdec.context.DraftContext`, the
    draft model's (for drafters that run one) and the generation's options (its own declared
    options included: ``request.options["name"]``)."""

    target: Any  # specdec.context.DraftContext
    draft: Any | None = None  # specdec.context.DraftContext
    options: Any = field(default_factory=Unchosen)  # specdec.options.GenerationOptions

    @property
    def tree(self) -> bool:
        return bool(self.options.tree)


@dataclass(frozen=True)
class DrafterEntry:
    name: str
    help: str
    build: Callable[[DraftRequest], Any]  # -> specdec.drafters.base.Drafter
    needs_draft_model: bool = False
    order: int = 50
    # The draft model must share the target's vocabulary (the CLI checks this before loading).
    same_vocabulary: bool = False
    # The drafter's own options (specdec.options.Option, ``owner`` = this drafter): their one home;
    # specdec.options reads them from here.
    options: tuple = ()
    # Raises SpecdecError (saying how to get it) where an optional build the drafter needs is
    # missing; None: always available.
    available: Callable[[], Any] | None = None
    # False for plain decoding (it never proposes): a bench offers it as ``plain``, and a tree or a
    # draft-length policy means nothing with it.
    drafts: bool = True

    def missing(self) -> str | None:
        """Why this drafter cannot run on this machine (its optional build is absent); None if it can."""
        if self.available is None:
            return None
        try:
            self.available()
        except SpecdecError as exc:
            return str(exc)
        return None


DRAFTERS: Registry[DrafterEntry] = Registry("drafter", "specdec.drafters")


def drafter(name: str, help: str, *, needs_draft_model: bool = False, same_vocabulary: bool = False,
            order: int = 50, options: Sequence[Any] = (), available: Callable[[], Any] | None = None,
            drafts: bool = True):
    """Register the decorated ``build(request) -> Drafter`` function under ``name``; ``options``
    (:class:`specdec.options.Option`) are the drafter's own, offered by every front end;
    ``available()`` raises where an optional build the drafter needs is missing; ``drafts=False``
    for plain decoding."""
    def register(build: Callable[[DraftRequest], Any]):
        own = tuple(replace(o, owner=name) for o in options)
        DRAFTERS.add(name, DrafterEntry(name, help, build, needs_draft_model, order, same_vocabulary, own,
                                        available, drafts))
        return build
    return register


# -- draft-length policies ----------------------------------------------------------------------
@dataclass
class PolicyRequest:
    """What a policy may be built from: the (lazily measured) cost curve and the user's K."""

    costs: Callable[[], Any]  # -> specdec.costs.CostModel, measured on first call
    num_draft: int | None = None


@dataclass(frozen=True)
class PolicyEntry:
    name: str
    help: str
    build: Callable[[PolicyRequest], Any]  # -> specdec.policies.base.DraftPolicy
    order: int = 50
    # It reads the target's measured cost curve (``PolicyRequest.costs``): a server measures the
    # curve before its first request rather than during it.
    uses_costs: bool = False


POLICIES: Registry[PolicyEntry] = Registry("policy", "specdec.policies")


def policy(name: str, help: str, *, order: int = 50, uses_costs: bool = False):
    """Register the decorated ``build(request) -> DraftPolicy`` function under ``name``;
    ``uses_costs`` where it reads the measured cost curve."""
    def register(build: Callable[[PolicyRequest], Any]):
        POLICIES.add(name, PolicyEntry(name, help, build, order, uses_costs))
        return build
    return register


# -- backends -----------------------------------------------------------------------------------
@dataclass
class LoadRequest:
    """A model to load: where its files are, how (:class:`specdec.load_options.LoadOptions`,
    validated against this backend's entry), where progress goes."""

    resolved: Any  # specdec.models.ResolvedModel
    options: Any  # specdec.load_options.LoadOptions, validated
    report: Callable[[str], None] | None = None
    tune_kernels: bool = True

    @property
    def dtype(self) -> str:
        return self.options.dtype

    @property
    def exact(self) -> bool | None:
        """Batch-invariant kernels (a k-token forward equals k one-token forwards bit for bit); None:
        the backend's default. Backends without such a mode ignore it."""
        return self.options.exact


@dataclass
class LoadedWeights:
    """What a backend's loader returns: a factory of per-sequence backends over shared weights."""

    make_backend: Callable[[], Any]  # -> specdec.backends.base.Backend
    cost_key: str  # what the forward cost depends on besides the machine (model, dtype, kernels)
    hf_model: Any = None  # the transformers model, when there is one
    exact: bool = False  # guaranteed: a forward's logits per row do not depend on the batch shape
    # slots -> a specdec.backends.base.BatchedSequences whose ``backend()`` sequences step in one
    # forward (continuous batching); None: the backend runs each sequence's forwards on its own.
    batched: Callable[[int], Any] | None = None
    # Forget the caches of earlier prompts the weights keep for reuse (a benchmark's cold start).
    forget_prompts: Callable[[], None] | None = None
    device: str = "cpu"  # where the weights are (a full name: cpu, cuda:0): the cost curve is keyed by it
    # What computes the logits, in words, for the line a load prints when it chose the backend itself
    # ("exact, patched multi-row kernels").
    kernels: str = ""


@dataclass(frozen=True)
class BackendEntry:
    """A backend as it registered, with what it can do: the dtypes and devices it loads on, whether
    it reads a GGUF itself (else a transformers folder, converted once from the GGUF), whether it
    batches several sequences in one forward (``LoadedWeights.batched``) and whether its sequences
    give layer access (:class:`specdec.context.LayerAccess`, for self-speculation)."""

    name: str
    help: str
    load: Callable[[LoadRequest], LoadedWeights]
    dtypes: tuple[str, ...] = ("float32",)
    devices: tuple[str, ...] = ("cpu",)  # device kinds (specdec.devices.KINDS): cpu, cuda
    reads_gguf: bool = False
    batched: bool = False
    layer_access: bool = False
    order: int = 50
    title: str = ""  # its name in prose ("llama.cpp"); "": ``name``

    @property
    def shown(self) -> str:
        return self.title or self.name


BACKENDS: Registry[BackendEntry] = Registry("backend", "specdec.backends")


def backend(name: str, help: str, *, dtypes: tuple[str, ...] = ("float32",), devices: tuple[str, ...] = ("cpu",),
            reads_gguf: bool = False, batched: bool = False, layer_access: bool = False, order: int = 50,
            title: str = ""):
    """Register the decorated ``load(request) -> LoadedWeights`` function under ``name``, with what
    the backend can do (:class:`BackendEntry`); ``title``: its name in prose."""
    def register(load: Callable[[LoadRequest], LoadedWeights]):
        BACKENDS.add(name, BackendEntry(name, help, load, dtypes, devices, reads_gguf, batched, layer_access, order,
                                        title))
        return load
    return register
