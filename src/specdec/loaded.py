"""What a load made: a model's weights behind its backend, its text, its cost curve and what grows
with use (:class:`LoadedModel`), the side of a model that :class:`specdec.api.Model`, the
generation front, runs on.

:func:`load_model` resolves an alias, ``.gguf`` file or transformers folder, reads its tokenizer
and end-of-sequence ids, asks the chosen backend's registry entry (chosen for the model when the
options leave it ``auto``, saying so in one line) to load the weights
(:class:`specdec.registry.BackendEntry`: what it can do is declared there) and wraps what it
returned. The server, the bench and the commands that need more than ``generate`` (batching, the
memory, learned state, a sequence's backend) use the loaded model directly.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from specdec.backends.base import Backend, BatchedSequences
from specdec.constraints import Grammar, Spec, grammar_tokenizer
from specdec.context import DraftContext, Learned
from specdec.costs import CostModel, calibrated
from specdec.devices import device_tag
from specdec.drafting.suffix_index import DEFAULT_CAPACITY, NgramMemory
from specdec.errors import SpecdecError
from specdec.load_options import AUTO, HF_BACKEND, LoadOptions, llamacpp_installed
from specdec.models import Reporter, gguf_end_ids, needs_weights_folder, no_progress_bars, resolve, stderr_reporter
from specdec.policies.goodput import DELAY_SHARE, DelayBudget
from specdec.pool import BackendPool
from specdec.registry import BACKENDS, BackendEntry, LoadRequest
from specdec.text import TextCodec

MAX_TENANTS = 256  # tenants whose index of earlier outputs is kept (the least recently seen go first)
OWN_TEXT = ""  # the tenant of a request that names none: it drafts from nothing but its own text

CALIBRATION_TEXT = ("The quick brown fox jumps over the lazy dog. Speculative decoding drafts tokens and "
                    "the target model verifies them in one forward pass. ")


def load_model(name: str, options: LoadOptions | Mapping[str, Any] | None = None,
               report: Reporter | None = None) -> LoadedModel:
    """Load ``name`` (alias, ``.gguf`` path or transformers folder) with ``options``
    (:class:`~specdec.load_options.LoadOptions` or its fields by name; validated here). Where they
    leave the backend ``auto``, it is chosen for the model (:func:`specdec.load_options.backend_for`)
    and ``report`` gets one line naming it and its kernels (:attr:`LoadedModel.choice`)."""
    chosen = options if isinstance(options, LoadOptions) else LoadOptions.of(options)
    automatic = chosen.backend == AUTO
    chosen = chosen.for_model(name)
    entry = BACKENDS.get(chosen.backend)
    resolved = resolve(name, report, need_hf=needs_weights_folder(chosen.backend))
    tokenizer, eos = _load_tokenizer(resolved)
    weights = entry.load(LoadRequest(resolved, chosen, report, tune_kernels=True))
    loaded = LoadedModel(resolved.name, tokenizer, weights.make_backend, eos=eos, entry=entry, options=chosen,
                         cost_key=weights.cost_key, hf_model=weights.hf_model, exact=weights.exact,
                         batched=weights.batched, forget_prompts=weights.forget_prompts, device=weights.device,
                         kernels=weights.kernels)
    if automatic:
        line = loaded.choice
        if chosen.backend == HF_BACKEND and resolved.gguf is not None and not llamacpp_installed():
            line += "; pip install 'specdec[llamacpp]' runs this GGUF on llama.cpp, several times faster"
        (report or stderr_reporter)(line)
    if resolved.draft is not None:
        loaded.set_default_draft_model(resolved.draft, chosen, report)
    return loaded


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


@dataclass
class Held:
    """What a model generated with inside :meth:`LoadedModel.learning_as`, as it ended."""

    learned: Learned
    costs: CostModel | None


class LoadedModel:
    """A loaded model: per-sequence backends over its weights (pooled, or stepped together once
    :meth:`enable_batching` ran), its text codec and end ids, its cost curve (measured once per
    machine), its default draft model, the memory of earlier outputs and what drafters learned."""

    def __init__(self, name: str, tokenizer, make_backend: Callable[[], Backend], *,
                 eos: frozenset[int] = frozenset(), entry: BackendEntry | None = None,
                 options: LoadOptions | None = None, cost_key: str = "", hf_model=None, exact: bool = False,
                 batched: Callable[[int], BatchedSequences] | None = None,
                 forget_prompts: Callable[[], None] | None = None, device: str = "cpu", kernels: str = "") -> None:
        self.name = name
        self.device = device  # where the weights are (cpu, cuda:0): the cost curve is measured there
        # Without options (a model made outside load_model): its backend's, or transformers'.
        self.options = options or LoadOptions(backend=entry.name if entry is not None else HF_BACKEND)
        self.entry = entry  # what the backend can do (None: a backend made outside the registry)
        self.exact = exact  # batch-invariant kernels: speculation cannot part from plain decoding
        self.kernels = kernels  # what computes the logits, in words (LoadedWeights.kernels)
        self.codec = TextCodec(tokenizer, name)
        self.pool = BackendPool(make_backend)
        self.eos_token_ids = eos
        self.cost_key = cost_key
        self.hf_model = hf_model
        self.kernel_tuning = None  # set by specdec.Model.from_hf(tune_kernels=True): .undo() restores
        self.memory: NgramMemory | None = None  # earlier outputs for the n-gram drafters (enable_memory)
        self.batched: BatchedSequences | None = None  # once enable_batching ran
        self.learned = Learned()  # what drafters learned on this model, by slot (see learning_as)
        self._batched_factory = batched
        self._forget_prompts = forget_prompts
        self._costs: CostModel | None = None
        self._costs_lock = threading.Lock()  # the server's threads: one calibration, not one each
        self._logit_width: int | None = None
        self._default_draft: tuple[str, LoadOptions, Reporter | None] | None = None
        self._default_draft_model: LoadedModel | None = None
        self._default_draft_lock = threading.Lock()
        self._tenants: OrderedDict[str, tuple[NgramMemory | None, Learned]] = OrderedDict()
        self._tenants_lock = threading.Lock()
        self._grammar_tokenizer = None  # llguidance's view of the tokenizer (built on first use, ~1 s)
        self._grammar_lock = threading.Lock()

    def grammar(self, spec: Spec) -> Grammar:
        """``spec`` compiled for this model's tokenizer (a :class:`SpecdecError` with the grammar
        engine's message if it cannot be)."""
        with self._grammar_lock:
            if self._grammar_tokenizer is None:
                self._grammar_tokenizer = grammar_tokenizer(self.tokenizer, self.logit_width, self.eos_token_ids)
        return Grammar(spec, self._grammar_tokenizer)

    @property
    def backend_name(self) -> str:
        return self.options.backend

    @property
    def choice(self) -> str:
        """The model, its backend and its kernels in one line: "qwen2.5-coder-1.5b on llama.cpp (exact,
        patched multi-row kernels)"."""
        shown = self.entry.shown if self.entry is not None else self.backend_name
        return f"{self.name} on {shown}" + (f" ({self.kernels})" if self.kernels else "")

    @property
    def tokenizer(self):
        return self.codec.tokenizer

    # -- sequences --------------------------------------------------------------------------------
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

    @property
    def can_batch(self) -> bool:
        """Whether this model's backend can step several generations in one forward."""
        return self._batched_factory is not None

    def enable_batching(self, slots: int, kv_memory: str | None = None, max_tick_stretch: float | None = None,
                        max_delay_share: float | None = None) -> None:
        """Run up to ``slots`` concurrent generations' forwards as one batch (continuous batching:
        a generation joins and leaves between steps). The batch chooses every generation's draft
        length together, where a tick's cost grows with its rows (llama.cpp) others' drafts adding
        at most ``max_delay_share`` of a generation's decoding time to it
        (:class:`~specdec.policies.goodput.DelayBudget`) and making no tick more than
        ``max_tick_stretch`` times as long as without them. With exact kernels batching does not
        change any generation's tokens."""
        if self._batched_factory is None:
            raise SpecdecError(f"the {self.backend_name} backend cannot batch several sequences in one forward "
                               f"here (batching runs on llama.cpp, and on transformers with --device cuda; "
                               f"or serve without batching)")
        if kv_memory is not None and not self.device.startswith("cuda"):
            raise SpecdecError("--kv-memory sizes the GPU server's KV pool: it needs --device cuda")
        shared = self._batched_factory(slots) if kv_memory is None else self._batched_factory(slots, kv_memory)
        shared.costs = lambda: self._costs  # ticks refine the curve once it was measured
        if not hasattr(shared, "budget"):
            # A GPU batch runs one padded shape whatever its rows: no draft delays the others there,
            # so the options that bound those delays would do nothing.
            given = [name for name, value, default in (("--max-tick-stretch", max_tick_stretch, math.inf),
                                                       ("--max-delay-share", max_delay_share, DELAY_SHARE))
                     if value is not None and value != default]
            if given:
                raise SpecdecError(f"{' and '.join(given)} bound{'s' if len(given) == 1 else ''} the delays of "
                                   f"llama.cpp's batched ticks; the GPU batch runs one padded shape whatever its "
                                   f"rows, so no draft delays another request there: leave "
                                   f"{'it' if len(given) == 1 else 'them'} out")
        else:
            if max_tick_stretch is not None:
                shared.max_stretch = max_tick_stretch
            if max_delay_share is not None:
                shared.budget = DelayBudget(max_delay_share)
        self.batched = shared
        # The lowest free sequence first: llama.cpp puts only consecutive sequence ids in one slice
        # of a batch, so running sequences 0, 2, 4 cost three forwards where 0, 1, 2 cost one.
        self.pool = BackendPool(shared.backend, max_idle=slots, order=lambda backend: backend.slot)

    def forget_prompts(self) -> None:
        """Drop the caches of earlier prompts kept for reuse (llama.cpp with exact kernels), so that
        the next generation computes its whole prompt, as a first request would."""
        if self._forget_prompts is not None:
            self._forget_prompts()

    # -- what drafters use --------------------------------------------------------------------------
    def enable_memory(self, path: str | None = None, capacity: int = DEFAULT_CAPACITY) -> NgramMemory:
        """Let the n-gram drafters draft from this model's earlier outputs too (bounded to
        ``capacity`` tokens of outputs, the oldest forgotten first); with ``path``, start from a saved memory (save it with
        ``model.memory.save(path)``)."""
        self.memory = NgramMemory.load(path, capacity) if path else NgramMemory(capacity=capacity)
        return self.memory

    def tenant_state(self, tenant: str | None) -> tuple[NgramMemory | None, Learned | None]:
        """The index of earlier outputs (the memory) and the text state a generation of ``tenant``
        drafts from and adds to. ``None``: the model's own (one user, or a server whose clients
        share them). :data:`OWN_TEXT`: none (a fresh state that nothing else sees). Any other name:
        that tenant's own, bounded like the model's memory, for the :data:`MAX_TENANTS` tenants seen
        most recently. Acceptance statistics and cost curves stay the model's: they hold no text."""
        if tenant is None:
            return self.memory, None
        if tenant == OWN_TEXT:
            return None, Learned()
        with self._tenants_lock:
            found = self._tenants.get(tenant)
            if found is None:
                memory = None
                if self.memory is not None:
                    memory = NgramMemory(self.memory.capacity, self.memory.key)
                found = self._tenants[tenant] = (memory, Learned())
                while len(self._tenants) > MAX_TENANTS:
                    self._tenants.popitem(last=False)
            else:
                self._tenants.move_to_end(tenant)
            return found

    def draft_context(self, tenant: str | None = None) -> DraftContext:
        """What a drafter may use of this model (see :class:`specdec.context.DraftContext`), for a
        generation of ``tenant`` (see :meth:`tenant_state`)."""
        if self.entry is not None:
            layer_access = self.entry.layer_access
        else:  # a model wrapped by hand: ask a sequence
            from specdec.context import LayerAccess

            with self.pool.lease() as backend:
                layer_access = isinstance(backend, LayerAccess)

        def logit_width() -> int:
            return self.logit_width

        memory, private = self.tenant_state(tenant)
        return DraftContext(self.name, self.codec, self.eos_token_ids, self.pool, self.cost_model, self.learned,
                            logit_width, memory, self.backend_name, layer_access, private, self.device)

    def use_costs(self, costs: CostModel | None) -> CostModel | None:
        """Put ``costs`` in place of this model's cost curve (None: measure or load it on next use);
        the one it replaces. A benchmark gives each method its own copy, refined by its own runs."""
        with self._costs_lock:
            before, self._costs = self._costs, costs
        return before

    @contextmanager
    def learning_as(self, learned: Learned, costs: CostModel | None) -> Iterator[Held]:
        """Generate with ``learned`` and the cost curve ``costs`` (None: measured or loaded on first
        use) in place of this model's own, which are put back after. A benchmark runs each method
        on its own: a table primed by another method's pass over the same question would be a
        second pass, not an unseen prompt. Yields them as they end (learned into, the curve refined
        or measured meanwhile)."""
        before = self.learned, self.use_costs(costs)
        self.learned, held = learned, Held(learned, costs)
        try:
            yield held
        finally:
            held.costs = self.use_costs(before[1])
            self.learned = before[0]

    def cost_model(self) -> CostModel:
        """This model's forward cost by number of new tokens (measured once per machine, cached)."""
        if self._costs is None:
            with self._costs_lock:
                if self._costs is None:
                    key = f"{self.name}-{self.backend_name}-{self.cost_key}-{device_tag(self.device)}"
                    context = (self.codec.tokenizer(CALIBRATION_TEXT)["input_ids"] * 50)[:200]
                    with self.pool.lease() as backend:
                        self._costs = calibrated(key, backend, context)
        return self._costs

    # -- the default draft model ------------------------------------------------------------------
    def set_default_draft_model(self, name: str | None, options: LoadOptions | None = None,
                                report: Reporter | None = None) -> None:
        """Name the model that drafts for this one when a drafter needs a draft model and none is
        given (loaded with ``options``, by default this model's, on first use); ``None`` removes
        the default. :func:`load_model` sets it from the alias."""
        with self._default_draft_lock:
            self._default_draft = (name, options or self.options, report) if name is not None else None
            self._default_draft_model = None

    @property
    def default_draft_name(self) -> str | None:
        """The name of this model's default draft model (None when it has none)."""
        return self._default_draft[0] if self._default_draft is not None else None

    def default_draft_model(self) -> LoadedModel | None:
        """This model's default draft model, loaded once (on first use, with the same load options)
        and kept, batched where this model batches; None when the model names none."""
        with self._default_draft_lock:  # concurrent first generations load it once
            if self._default_draft is not None and self._default_draft_model is None:
                name, options, report = self._default_draft
                self._default_draft_model = load_model(name, options, report)
            draft = self._default_draft_model
            # Batched as a server's --draft-model is, where this model batches: one forward a tick
            # for every request's draft, not a backend (and a graph) per sequence.
            if draft is not None and self.batched is not None and draft.can_batch and draft.batched is None:
                draft.enable_batching(self.batched.slots)
            return draft
