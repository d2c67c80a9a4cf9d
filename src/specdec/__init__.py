"""specdec: lossless speculative decoding for LLM text generation.

The public surface: :func:`load` a model, then :meth:`Model.generate`; or, below that, the engine
(:func:`decode`) with any :class:`Backend`, :class:`Drafter` and :class:`DraftPolicy`. Drafters,
policies and backends are registered by name in :mod:`specdec.registry`.

The names below are imported when first used: ``import specdec.models`` (what fetching a model
needs) then imports no PyTorch, so `make setup` downloads the models with the system's Python while
the environment with PyTorch is still being installed.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

# name -> the module that defines it
_EXPORTS = {
    "Model": "specdec.api", "Output": "specdec.api", "load": "specdec.api",
    "LoadOptions": "specdec.load_options", "ServeOptions": "specdec.load_options",
    "LoadedModel": "specdec.loaded", "load_model": "specdec.loaded",
    "DraftContext": "specdec.context", "LearnedSlot": "specdec.context",
    "GenerationOptions": "specdec.options", "Option": "specdec.options",
    "Backend": "specdec.backends.base",
    "Drafter": "specdec.drafters.base", "NoDrafter": "specdec.drafters.base",
    "ModelDrafter": "specdec.drafters.model", "NgramDrafter": "specdec.drafters.ngram",
    "DecodeConfig": "specdec.engine", "DecodeRun": "specdec.engine", "Generation": "specdec.engine",
    "decode": "specdec.engine",
    "SpecdecError": "specdec.errors",
    "AdaptiveK": "specdec.policies.adaptive", "DraftPolicy": "specdec.policies.base",
    "FixedK": "specdec.policies.fixed",
    "Sampler": "specdec.sampling", "SamplingParams": "specdec.sampling",
    "GenerationStats": "specdec.stats",
    "Draft": "specdec.types", "StepTrace": "specdec.types", "Verdict": "specdec.types",
}

if TYPE_CHECKING:
    from specdec.api import Model, Output, load
    from specdec.backends.base import Backend
    from specdec.context import DraftContext, LearnedSlot
    from specdec.drafters.base import Drafter, NoDrafter
    from specdec.drafters.model import ModelDrafter
    from specdec.drafters.ngram import NgramDrafter
    from specdec.engine import DecodeConfig, DecodeRun, Generation, decode
    from specdec.errors import SpecdecError
    from specdec.load_options import LoadOptions, ServeOptions
    from specdec.loaded import LoadedModel, load_model
    from specdec.options import GenerationOptions, Option
    from specdec.policies.adaptive import AdaptiveK
    from specdec.policies.base import DraftPolicy
    from specdec.policies.fixed import FixedK
    from specdec.sampling import Sampler, SamplingParams
    from specdec.stats import GenerationStats
    from specdec.types import Draft, StepTrace, Verdict


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'specdec' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # imported once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


try:
    __version__ = version("specdec")
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = sorted(_EXPORTS, key=str.lower)
