"""What a model is loaded with, and what a server is set up with: declared once, as generation
options are (:mod:`specdec.options`).

:data:`LOAD` (backend, dtype, exact kernels, CUDA graphs, device, threads, context) and :data:`SERVE` (slots,
max tokens, batching, whether clients share the index of earlier outputs) are :class:`~specdec.options.Option` specs; :class:`LoadOptions` and
:class:`ServeOptions` hold their validated values. :func:`specdec.load`, every command's flags
(:mod:`specdec.option_forms`), the server's settings and a Ray Serve config file's ``args``
(:mod:`specdec.server.settings`) all read them from here, so a default or a check is written once
and a mistake reads the same everywhere. Which backends offer which dtypes and devices is the
backends' own declaration (:class:`specdec.registry.BackendEntry`). :func:`draft_model_for` is the
one place that decides whether a drafter needs a draft model and which one it gets.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from specdec.errors import OptionError, SpecdecError
from specdec.options import Option, at_least

DEFAULT_BACKEND = "transformers"


def _backends() -> list[str]:
    from specdec.registry import BACKENDS

    return BACKENDS.names()


def _dtypes() -> list[str]:
    from specdec.registry import BACKENDS

    return sorted({d for e in BACKENDS for d in e.dtypes})


def _device_form(device: str) -> str | None:
    from specdec.devices import form_problem

    return form_problem(device)


LOAD: tuple[Option, ...] = (
    Option("backend", str, DEFAULT_BACKEND, "what runs the model", choices=_backends, scope="load"),
    Option("dtype", str, "float32", "the weights' dtype (on the backends that offer several)", choices=_dtypes,
           scope="load"),
    Option("exact", bool, None, "batch-invariant kernels, so speculative output equals plain decoding's token for "
                                "token even at near-ties (llama.cpp: on by default where its build allows it; "
                                "--no-exact runs its fastest kernels)", nullable=True, scope="load"),
    Option("graphs", bool, None, "on a GPU, a static KV cache and every decoding forward replayed from a captured CUDA "
                                 "graph, its kernels compiled (default: on with --device cuda; --no-graphs runs eager "
                                 "PyTorch; on a CPU the static cache without capture)", nullable=True, scope="load"),
    Option("device", str, "cpu", "where the model runs: cpu, cuda, cuda:N (a GPU, on the transformers backend) or "
                                 "auto (the first GPU if there is one)", _device_form, metavar="DEVICE", scope="load"),
    Option("threads", int, None, "CPU threads a forward uses (default: every core)", at_least(1), nullable=True,
           metavar="N", scope="load"),
    Option("context", int, None, "KV cache tokens per sequence, prompt and answer (default: the model's "
                                 "training context, at most 8192 on llama.cpp)", at_least(16), nullable=True,
           metavar="N", scope="load"),
)

SERVE: tuple[Option, ...] = (
    Option("slots", int, 4, "generations in progress at once, each with its own KV cache; more wait in line",
           at_least(1), metavar="N", scope="serve"),
    Option("max_tokens", int, 256, "new tokens for a request that gives no max_tokens", at_least(1), metavar="N",
           scope="serve"),
    Option("batch", bool, None, "continuous batching: the running generations' steps go into one forward (default: "
                                "on where the backend can, llama.cpp; with exact kernels no answer changes)",
           nullable=True, scope="serve"),
    Option("shared_index", bool, False, "let every client draft from every other client's outputs (the --memory "
                                        "index, SuffixDecoding's global tree); by default each API key has its own "
                                        "and a request without a key only its own text, since how fast an answer "
                                        "comes tells whether someone else wrote the same text", scope="serve"),
    Option("index_tokens", int, 200_000, "tokens of earlier outputs each index keeps for the n-gram drafters to "
                                         "copy (one per API key, or one with --shared-index; the oldest output goes "
                                         "first; about 100 bytes a token; 0: no index of earlier outputs)",
           at_least(0), metavar="N", scope="serve"),
)

Spell = Callable[[str], str]  # a setting as a front end names it (--max-tokens, max_tokens)


def _spec(specs: tuple[Option, ...], name: str) -> Option:
    return next(o for o in specs if o.name == name)


def _checked(specs: tuple[Option, ...], values: Mapping[str, Any], spell: Spell) -> None:
    for option in specs:
        wrong = option.problem(values[option.name])
        if wrong:
            raise OptionError(wrong.replace(option.name, spell(option.name), 1), option.name)


@dataclass(frozen=True)
class LoadOptions:
    """How a model is loaded (:data:`LOAD`); the defaults are the specs'."""

    backend: str = _spec(LOAD, "backend").default
    dtype: str = _spec(LOAD, "dtype").default
    exact: bool | None = _spec(LOAD, "exact").default
    graphs: bool | None = _spec(LOAD, "graphs").default
    device: str = _spec(LOAD, "device").default
    threads: int | None = _spec(LOAD, "threads").default
    context: int | None = _spec(LOAD, "context").default

    @classmethod
    def of(cls, values: Mapping[str, Any] | None = None, spell: Spell = str) -> LoadOptions:
        """From ``values`` by name (None: the default); unknown names are refused. Not validated."""
        values = {k: v for k, v in dict(values or {}).items() if v is not None}
        names = [f.name for f in fields(cls)]
        for name in values:
            if name not in names:
                raise SpecdecError(f"unknown load option {spell(name)!r}: use one of "
                                   f"{', '.join(spell(n) for n in names)}")
        return cls(**values)

    def validate(self, spell: Spell = str) -> LoadOptions:
        """Each value against its spec, then what the chosen backend offers; ``self`` when all is fine."""
        from specdec import devices
        from specdec.registry import BACKENDS

        _checked(LOAD, asdict(self), spell)
        entry = BACKENDS.get(self.backend)
        if self.dtype not in entry.dtypes:
            raise OptionError(f"{spell('dtype')} {self.dtype} is not available on the {self.backend} backend: use "
                              f"{', '.join(entry.dtypes)}", "dtype")
        try:
            kind = devices.kind(self.device)  # a GPU that is not there is refused here
        except SpecdecError as exc:
            raise OptionError(str(exc).replace("device", spell("device"), 1), "device") from None
        if kind not in entry.devices:
            raise OptionError(f"{spell('device')} {self.device} is not available on the {self.backend} backend: it "
                              f"runs on {', '.join(entry.devices)}", "device")
        return self

    def to_dict(self) -> dict[str, Any]:
        """The keywords of :func:`specdec.load`."""
        return asdict(self)


@dataclass(frozen=True)
class ServeOptions:
    """How a server is set up (:data:`SERVE`); the defaults are the specs'."""

    slots: int = _spec(SERVE, "slots").default
    max_tokens: int = _spec(SERVE, "max_tokens").default
    batch: bool | None = _spec(SERVE, "batch").default
    shared_index: bool = _spec(SERVE, "shared_index").default
    index_tokens: int = _spec(SERVE, "index_tokens").default

    def validate(self, spell: Spell = str) -> ServeOptions:
        _checked(SERVE, asdict(self), spell)
        return self


def draft_model_for(drafter: str, given: str | None, target: str | None, spell: Spell = str) -> str | None:
    """The draft model a generation with ``drafter`` loads: ``given``, or the ``target`` alias's
    default draft model when the drafter runs one and none was given; None when it runs none. A
    drafter that needs one and gets none, or a draft model given to a drafter that runs none, is
    refused here, as the front end spells ``draft_model`` (``--draft-model``, ``draft_model``)."""
    from specdec.models import default_draft_model
    from specdec.registry import DRAFTERS

    entry = DRAFTERS.get(drafter)
    if not entry.needs_draft_model:
        if given:
            raise SpecdecError(f"{spell('draft_model')} is only used with a drafter that runs a model "
                               f"({', '.join(e.name for e in DRAFTERS if e.needs_draft_model)})")
        return None
    if given:
        return given
    default = default_draft_model(target) if target else None
    if default is None:
        raise SpecdecError(f"{spell('drafter')} {drafter} needs {spell('draft_model')} ({target or 'the model'} "
                           "names no default draft model)")
    return default
