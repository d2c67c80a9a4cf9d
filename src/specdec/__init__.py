"""specdec: lossless speculative decoding for LLM text generation.

The public surface: :func:`load` a model, then :meth:`Model.generate`; or, below that, the engine
(:func:`decode`) with any :class:`Backend`, :class:`Drafter` and :class:`DraftPolicy`. Drafters,
policies and backends are registered by name in :mod:`specdec.registry`.
"""

from importlib.metadata import PackageNotFoundError, version

from specdec.api import Model, Output, load
from specdec.load_options import LoadOptions, ServeOptions
from specdec.loaded import LoadedModel, load_model
from specdec.context import DraftContext, LearnedSlot
from specdec.options import GenerationOptions, Option
from specdec.backends.base import Backend
from specdec.drafters.base import Drafter, NoDrafter
from specdec.drafters.model import ModelDrafter
from specdec.drafters.ngram import NgramDrafter
from specdec.engine import DecodeConfig, DecodeRun, Generation, decode
from specdec.errors import SpecdecError
from specdec.policies.adaptive import AdaptiveK
from specdec.policies.base import DraftPolicy
from specdec.policies.fixed import FixedK
from specdec.sampling import Sampler, SamplingParams
from specdec.stats import GenerationStats
from specdec.types import Draft, StepTrace, Verdict

try:
    __version__ = version("specdec")
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "AdaptiveK", "Backend", "decode", "DecodeConfig", "DecodeRun", "Draft", "DraftContext", "Drafter",
    "DraftPolicy", "FixedK", "Generation", "GenerationOptions", "GenerationStats", "LearnedSlot", "load",
    "load_model", "LoadedModel", "LoadOptions", "Model", "ModelDrafter", "ServeOptions", "NgramDrafter", "NoDrafter", "Option", "Output", "Sampler", "SamplingParams",
    "SpecdecError", "StepTrace", "Verdict",
]
