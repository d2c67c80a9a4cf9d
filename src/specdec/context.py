"""What a drafter may use: :class:`DraftContext`, instead of the whole model.

A drafter is built from a :class:`specdec.registry.DraftRequest`: the target's context, the draft
model's (for drafters that run one) and the generation's options. A context holds the model's
text codec, its end-of-sequence ids, its pool of per-sequence backends, its cost curve, named
learned state (:class:`LearnedSlot`) and, when enabled, the memory of earlier outputs. Whether the
backend can run the layers without the LM head (self-speculation) is a declared capability
(:class:`LayerAccess`), not an attribute looked up by name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, runtime_checkable

if TYPE_CHECKING:
    import torch

    from specdec.costs import CostModel
    from specdec.drafting.suffix_index import NgramMemory
    from specdec.pool import BackendPool
    from specdec.text import TextCodec

T = TypeVar("T")


@dataclass(frozen=True)
class LearnedSlot(Generic[T]):
    """A named piece of state a drafter learns across a model's generations (an acceptance table,
    a recycled next-token table, a self-draft head), made by ``make`` on first use.

    Declare it once at module level in the drafter's file; :meth:`Learned.get` returns the same
    object for every generation of the model, typed.
    """

    key: str
    make: Callable[[], T]

    def named(self, suffix: str) -> LearnedSlot[T]:
        """The same kind of state, kept apart per ``suffix`` (e.g. per target model)."""
        return LearnedSlot(f"{self.key}-{suffix}", self.make)


class Learned:
    """A model's learned state, by slot. A benchmark swaps it whole per method (and restores a
    snapshot per repeat), so no method drafts from what another learned."""

    def __init__(self, values: dict[str, Any] | None = None) -> None:
        self._values: dict[str, Any] = dict(values or {})

    def get(self, slot: LearnedSlot[T], make: Callable[[], T] | None = None) -> T:
        """The slot's state (made on first use, by ``make`` when the state needs arguments)."""
        if slot.key not in self._values:
            self._values[slot.key] = (make or slot.make)()
        return self._values[slot.key]

    def items(self):
        return self._values.items()

    def __contains__(self, key: object) -> bool:
        return key in self._values

    def __len__(self) -> int:
        return len(self._values)


@runtime_checkable
class LayerAccess(Protocol):
    """A backend that can run the target's layers without its LM head and the head alone
    (transformers): what self-speculation needs. llama.cpp computes the full output head for every
    row it returns and exposes no hidden states, so it does not offer this."""

    def body(self, tokens: Sequence[int]) -> torch.Tensor:
        """Run ``tokens`` through the layers into the KV cache (pending); their hidden states."""

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """The full LM head over hidden states ``[n, H]``: logits ``[n, V]``."""

    @property
    def output_weight(self) -> torch.Tensor:
        """The LM head's weight ``[V, H]`` (a restricted head is rows of it)."""

    @property
    def logit_softcap(self) -> float | None:
        """Final logit soft-capping (Gemma), or None."""


@dataclass
class DraftContext:
    """What a drafter may depend on, for one model (the target, or a draft model)."""

    name: str  # the model's name (keys caches and learned state)
    codec: TextCodec
    eos: frozenset[int]
    pool: BackendPool  # per-sequence backends on this model's weights (lease one, give it back)
    costs: Callable[[], CostModel]  # the forward cost curve, measured on first call
    learned: Learned
    logit_width: Callable[[], int]  # logits per position (may exceed the tokenizer's vocabulary)
    memory: NgramMemory | None = None  # earlier outputs, when the model has memory enabled
    backend_name: str = ""
    layer_access: bool = False  # whether its backends are LayerAccess (can self-speculate)
    # What a drafter learns of the text itself (an index of earlier outputs), kept per tenant where
    # the server isolates them (specdec.loaded.LoadedModel.tenant_state); None: ``learned``.
    private: Learned | None = None
    device: str = "cpu"  # where the model runs (cpu, cuda:0)

    def state(self, slot: LearnedSlot[T], make: Callable[[], T] | None = None) -> T:
        """Shorthand for ``self.learned.get(slot, make)``."""
        return self.learned.get(slot, make)

    def text_state(self, slot: LearnedSlot[T], make: Callable[[], T] | None = None) -> T:
        """State made of the generated text itself (an index of earlier outputs): this tenant's
        own where tenants are kept apart, else the model's learned state."""
        return (self.private if self.private is not None else self.learned).get(slot, make)
