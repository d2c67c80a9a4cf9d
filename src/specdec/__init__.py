"""specdec: lossless speculative decoding for LLM text generation.

The public surface: :func:`load` a model, then :meth:`Model.generate`; or, below that, the engine
(:func:`decode`) with any :class:`Backend`, :class:`Drafter` and :class:`DraftPolicy`.
"""

from specdec.api import Model, Output, load
from specdec.backends.base import Backend
from specdec.engine import DecodeConfig, DecodeRun, Generation, decode
from specdec.drafters.base import Drafter, NoDrafter
from specdec.drafters.model import ModelDrafter
from specdec.drafters.ngram import NgramDrafter
from specdec.errors import SpecdecError
from specdec.policies import DraftPolicy, FixedK
from specdec.sampling import SamplingParams
from specdec.stats import GenerationStats
from specdec.types import Draft, StepTrace, Verdict

__all__ = [
    "Backend", "DecodeConfig", "DecodeRun", "Draft", "DraftPolicy", "Drafter", "FixedK", "Generation",
    "GenerationStats", "Model", "ModelDrafter", "NgramDrafter", "NoDrafter", "Output", "SamplingParams",
    "SpecdecError", "StepTrace", "Verdict", "decode", "load",
]
