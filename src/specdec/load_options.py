"""What a model is loaded with, and what a server is set up with: declared once, as generation
options are (:mod:`specdec.options`).

Each field of :class:`LoadOptions` (backend, dtype, exact kernels, CUDA graphs, device, threads,
context) and :class:`ServeOptions` (slots, max tokens, batching, whether clients share the index of
earlier outputs) declares its option; :data:`LOAD` and :data:`SERVE` are the
:class:`~specdec.options.Option` specs read from them. :func:`specdec.load`, every command's flags
(:mod:`specdec.option_forms`), the server's settings and a Ray Serve config file's ``args``
(:mod:`specdec.server.settings`) all read them from here, so a default or a check is written once
and a mistake reads the same everywhere. Which backends offer which dtypes and devices is the
backends' own declaration (:class:`specdec.registry.BackendEntry`). :func:`backend_for` is the one
place that decides which backend runs a model when none is named (:data:`AUTO`), and
:func:`draft_model_for` the one that decides whether a drafter needs a draft model and which one it
gets.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

from specdec.errors import OptionError, SpecdecError
from specdec.options import Option, Spell, at_least, check_fields, core, declare, options_of

AUTO = "auto"  # the backend that runs the model exactly and fastest here (backend_for)
DEFAULT_BACKEND = AUTO
# What AUTO picks: llama.cpp runs a GGUF itself (several times faster than fp32 PyTorch on a CPU,
# with exact kernels); transformers runs a transformers folder, and every model on a GPU.
GGUF_BACKEND, HF_BACKEND = "llamacpp", "transformers"
AUTO_HELP = ("llama.cpp with exact kernels for a GGUF alias or file, transformers for a transformers folder, a "
             "GPU --device or a --dtype llama.cpp does not offer; the choice is printed")


def _backends() -> list[str]:
    from specdec.registry import BACKENDS

    return [AUTO, *BACKENDS.names()]


def llamacpp_installed() -> bool:
    """Whether llama-cpp-python (the optional ``specdec[llamacpp]`` extra) can be imported; it is not
    imported here (that takes a second and initialises the library)."""
    return importlib.util.find_spec("llama_cpp") is not None


def is_transformers_folder(model: str) -> bool:
    """Whether ``model`` names a folder (a transformers model) rather than an alias or a ``.gguf`` file."""
    from specdec.models import ALIASES

    return model not in ALIASES and Path(model).expanduser().is_dir()


def backend_for(model: str, backend: str = AUTO, device: str = "cpu", dtype: str = "float32",
                spell: Spell = str) -> str:
    """The backend that loads ``model`` (an alias, a ``.gguf`` path or a transformers folder) on
    ``device`` in ``dtype``: ``backend`` itself when one is named (refused where it cannot run the
    model), and for :data:`AUTO` the one that runs it exactly and fastest here: transformers on a
    GPU (its static KV cache with CUDA graphs), in a dtype llama.cpp does not offer, and for a
    transformers folder; llama.cpp (exact kernels) for a GGUF alias or file, or transformers where
    llama-cpp-python is not installed. ``device`` is checked first (:meth:`LoadOptions.validate`)."""
    from specdec import devices
    from specdec.registry import BACKENDS

    folder = is_transformers_folder(model)
    if backend != AUTO:
        if BACKENDS.get(backend).reads_gguf and folder:
            raise OptionError(f"{spell('backend')} {backend} runs a GGUF file (an alias or a .gguf path), and "
                              f"{model} is a transformers folder: use {spell('backend')} {HF_BACKEND}", "backend")
        return backend
    gguf = BACKENDS.get(GGUF_BACKEND)
    runs_here = devices.kind(device) in gguf.devices and dtype in gguf.dtypes and llamacpp_installed()
    return GGUF_BACKEND if runs_here and not folder else HF_BACKEND


def _dtypes() -> list[str]:
    from specdec.registry import BACKENDS

    return sorted({d for e in BACKENDS for d in e.dtypes})


def _device_form(device: str) -> str | None:
    from specdec.devices import form_problem

    return form_problem(device)


@dataclass(frozen=True)
class LoadOptions:
    """How a model is loaded; each field declares its option (default, check, help, flag)."""

    SCOPE: ClassVar[str] = "load"

    backend: str = declare(DEFAULT_BACKEND, f"what runs the model ({AUTO}: {AUTO_HELP})", choices=_backends)
    dtype: str = declare("float32", "the weights' dtype (on the backends that offer several)", choices=_dtypes)
    exact: bool | None = declare(None, "batch-invariant kernels, so speculative output equals plain decoding's token "
                                       "for token even at near-ties (llama.cpp: on by default where its build allows "
                                       "it; --no-exact runs its fastest kernels)")
    graphs: bool | None = declare(None, "on a GPU, a static KV cache and every decoding forward replayed from a "
                                        "captured CUDA graph, its kernels compiled (default: on with --device cuda; "
                                        "--no-graphs runs eager PyTorch; on a CPU the static cache without capture)")
    device: str = declare("cpu", "where the model runs: cpu, cuda, cuda:N (a GPU, on the transformers backend) or "
                                 "auto (the first GPU if there is one)", _device_form, metavar="DEVICE")
    threads: int | None = declare(None, "CPU threads a forward uses (default: every core it may use)", at_least(1), metavar="N")
    context: int | None = declare(None, "KV cache tokens per sequence, prompt and answer (default: the model's "
                                        "training context, at most 8192 on llama.cpp)", at_least(16), metavar="N")

    @classmethod
    def of(cls, values: Mapping[str, Any] | None = None, spell: Spell = str) -> LoadOptions:
        """From ``values`` by name (None: the default); unknown names are refused. Not validated."""
        values = {k: v for k, v in dict(values or {}).items() if v is not None}
        names = [o.name for o in LOAD]
        for name in values:
            if name not in names:
                raise SpecdecError(f"unknown load option {spell(name)!r}: use one of "
                                   f"{', '.join(spell(n) for n in names)}")
        return cls(**values)

    def validate(self, spell: Spell = str) -> LoadOptions:
        """Each value against its option, then what the chosen backend offers (once it is chosen:
        :meth:`for_model`); ``self`` when all is fine."""
        from specdec import devices
        from specdec.registry import BACKENDS

        check_fields(self, spell)
        try:
            kind = devices.kind(self.device)  # a GPU that is not there is refused here
        except SpecdecError as exc:
            raise OptionError(str(exc).replace("device", spell("device"), 1), "device") from None
        if self.backend == AUTO:
            return self
        entry = BACKENDS.get(self.backend)
        if self.dtype not in entry.dtypes:
            raise OptionError(f"{spell('dtype')} {self.dtype} is not available on the {self.backend} backend: use "
                              f"{', '.join(entry.dtypes)}", "dtype")
        if kind not in entry.devices:
            raise OptionError(f"{spell('device')} {self.device} is not available on the {self.backend} backend: it "
                              f"runs on {', '.join(entry.devices)}", "device")
        return self

    def for_model(self, model: str, spell: Spell = str) -> LoadOptions:
        """These options for loading ``model``, validated, with the backend chosen (:func:`backend_for`)
        where it is :data:`AUTO`; a named backend that cannot run ``model`` is refused."""
        self.validate(spell)
        chosen = backend_for(model, self.backend, self.device, self.dtype, spell)
        return replace(self, backend=chosen).validate(spell)

    def to_dict(self) -> dict[str, Any]:
        """The keywords of :func:`specdec.load`."""
        return asdict(self)


@dataclass(frozen=True)
class ServeOptions:
    """How a server is set up; each field declares its option (default, check, help, flag).
    :class:`specdec.server.settings.ServeConfig` is these and what a server is given besides."""

    SCOPE: ClassVar[str] = "serve"

    slots: int = declare(4, "generations in progress at once, each with its own KV cache; more wait in line",
                         at_least(1), metavar="N")
    # A cap on every request's max_new_tokens (OpenAI's max_tokens, hence its name): what
    # max_new_tokens accepts, it accepts.
    max_tokens: int | None = declare(None, "the most new tokens any request gets (default: no cap; a request "
                                           "without max_tokens runs until the model stops or its context is full, "
                                           "as OpenAI's API and llama-server do)", core("max_new_tokens").check,
                                     metavar="N")
    batch: bool | None = declare(None, "continuous batching: the running generations' steps go into one forward "
                                       "(default: on where the backend can, llama.cpp; with exact kernels no answer "
                                       "changes)")
    kv_memory: str | None = declare(None, "the GPU server's KV cache and its forwards' scratch (logits, "
                                          "attention, activations; prompts prefilled in chunks that fit): bytes "
                                          "(8GiB, 512MiB) or a fraction of the GPU's memory (0.3), the cache "
                                          "allocated once; a request that does not fit waits "
                                          "(default: what the slots can use, at most half the memory free after "
                                          "loading)", metavar="SIZE")
    max_delay_share: float = declare(0.03, "with batching on llama.cpp: other requests' drafts may add at most "
                                           "this share of a request's own decoding time to it (every sequence in a "
                                           "tick waits for the tick's draft rows); higher trades the requests that "
                                           "draft little's latency for tokens per second, inf: the batch's best "
                                           "expected tokens per second alone, 0: no draft beside other requests",
                                     at_least(0.0), metavar="X")
    max_tick_stretch: float = declare(math.inf, "with batching on llama.cpp: no tick's drafts make it longer than "
                                                "this many times the tick without them, whatever the requests in "
                                                "it may still be delayed (--max-delay-share)",
                                      at_least(1.0), metavar="X")
    shared_index: bool = declare(False, "let every client draft from every other client's outputs (the --memory "
                                        "index, SuffixDecoding's global tree); by default each API key has its own "
                                        "and a request without a key only its own text, since how fast an answer "
                                        "comes tells whether someone else wrote the same text")
    index_tokens: int = declare(200_000, "tokens of earlier outputs each index keeps for the n-gram drafters to "
                                         "copy (one per API key, or one with --shared-index; the oldest output "
                                         "goes first; about 100 bytes a token; 0: no index of earlier outputs)",
                                at_least(0), metavar="N")

    def validate(self, spell: Spell = str) -> ServeOptions:
        """Each value against its option; ``self`` when all is fine."""
        check_fields(self, spell)
        return self


LOAD: tuple[Option, ...] = options_of(LoadOptions)
SERVE: tuple[Option, ...] = options_of(ServeOptions)


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
