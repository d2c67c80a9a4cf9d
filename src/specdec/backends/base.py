"""The one seam between the decoding algorithm and a model: extend a KV cache, read logits, roll back.

Everything the algorithm asks of a model goes through :class:`Backend`; a new model runtime is one
new file implementing these members, registered with :func:`specdec.registry.backend`.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol, runtime_checkable

import torch

from specdec import tree as trees
from specdec.costs import CostModel, Costs
from specdec.policies.goodput import Offer


class Backend(ABC):
    """A model plus one sequence's KV cache.

    ``extend`` appends tokens after the cached ones and returns float32 logits for the new positions;
    ``truncate`` drops cached positions so that the next ``extend`` continues from a shorter prefix.
    Backends with ``supports_tree`` also score a draft *tree* in one ``extend`` (each node attends to
    the cache and its ancestors, at position cache length + depth) and keep one root-to-node path
    of it with ``truncate(length, keep=...)``; the engine falls back to chains elsewhere.
    Implementations are single-sequence and not thread-safe: make one per concurrent generation.
    Optional, for self-speculation: ``body(tokens)`` runs the layers ahead (no LM head) as pending
    rows that a following ``extend`` reuses, and ``head(hidden)`` is the LM head
    (:class:`specdec.backends.hf.HFBackend` has both; a drafter that needs them says so elsewhere).
    """

    vocab_size: int
    max_length: int | None = None  # the model's context in tokens (None: unbounded)
    supports_tree: bool = False
    # Nodes a tree extend may hold, its root included (None: any): a backend that runs every forward
    # in one padded shape verifies trees within it, where plain decoding runs too.
    max_tree: int | None = None
    # Its batch chooses every sequence's draft length together (extend_offer): the engine hands
    # it the whole draft with the policy's offer instead of cutting the draft itself.
    chooses_lengths: bool = False

    @property
    @abstractmethod
    def length(self) -> int:
        """Number of tokens currently in the cache."""

    @abstractmethod
    def extend(self, tokens: Sequence[int], *, last_only: bool = False,
               tree: Sequence[int] | None = None) -> torch.Tensor:
        """Append ``tokens`` and return logits ``[len(tokens), V]`` (``[1, V]`` with ``last_only``).

        Row i is the next-token distribution after ``tokens[i]``. ``last_only`` lets a drafter or a
        prefill skip the LM head on positions nobody reads (for a 262k vocabulary that head is most
        of the forward's cost). ``tree`` (parents over ``tokens``, -1 = follows the cache) makes
        each token see only the cache and its ancestors.
        """

    @abstractmethod
    def truncate(self, length: int, keep: Sequence[int] | None = None) -> None:
        """Roll back: keep only the first ``length`` cached tokens (``length <= self.length``).

        With ``keep`` (after a tree ``extend`` that started at ``length``): then append the rows at
        these offsets of that extend, which must form one path from its root.
        """

    def extend_offer(self, tokens: Sequence[int], offer: Offer) -> torch.Tensor:
        """Append the step's last token and a draft chain (``tokens``), of which the batch verifies
        the first i draft tokens, chosen with the other sequences' offers in the same forward
        (:func:`specdec.policies.goodput.choose_lengths` on the batch's cost); return the logits of
        the rows taken, ``[1 + i, V]``: the engine verifies the draft cut to them. Called only
        where :attr:`chooses_lengths` is set (a batched backend overrides it); this default takes
        everything offered."""
        return self.extend(tokens)

    def wants_offer(self) -> bool:
        """Whether the next step should draft and offer at all (asked once a step, before the
        drafter runs, where :attr:`chooses_lengths` is set): a batch that keeps declining a
        sequence's offers may pause them, since drafting and pricing a chain is work every other
        sequence in the tick waits for. This default always wants one."""
        return True

    def reset(self) -> None:
        """Forget the whole sequence."""
        self.truncate(0)

    def reserve(self, tokens: int, cancelled: threading.Event | None = None) -> None:
        """The sequence will hold up to ``tokens`` tokens (prompt and answer): a backend whose KV
        cache has a fixed size sizes it now, rather than growing it mid-generation; one that waits
        for memory here stops waiting once ``cancelled`` is set."""

    def prefill(self, tokens: Sequence[int]) -> int:
        """Fill the cache with ``tokens`` without needing their logits; return how many of them a
        backend took from the cache of an earlier prompt instead of computing them."""
        if tokens:
            self.extend(tokens, last_only=True)
        return 0

    def forward_costs(self, costs: CostModel) -> Costs:
        """What a forward of n new tokens costs *this sequence*, given the model's measured curve:
        the curve itself, unless the backend runs its forwards in a batch with other sequences'
        (then the marginal cost of its rows on top of theirs)."""
        return costs

    def idle(self) -> None:
        """The backend went back to its pool, or waits between bursts of forwards (a draft model
        between drafts): no batch should wait for it until it steps again."""

    @contextmanager
    def busy(self) -> Iterator[None]:
        """A burst of forwards (a draft): a backend whose forwards are batched with other
        sequences' lets its batches wait for this one while the block runs."""
        yield


def check_extend(tokens: Sequence[int], tree: Sequence[int] | None = None, supports_tree: bool = False) -> None:
    """Shared argument check for ``Backend.extend`` implementations."""
    if not tokens:
        raise ValueError("extend needs at least one token")
    if tree is not None:
        if not supports_tree:
            raise ValueError("this backend cannot score draft trees")
        if len(tree) != len(tokens):
            raise ValueError(f"the tree has {len(tree)} nodes for {len(tokens)} tokens")
        trees.check(tree)


def check_offer(tokens: Sequence[int], offer: Offer) -> None:
    """Shared argument check for ``Backend.extend_offer``: the offer is for these tokens (one
    step's row and its draft after it)."""
    if offer.rows != 1 or offer.most != len(tokens) - 1:
        raise ValueError(f"the offer is for {offer.rows} row(s) and {offer.most} draft tokens, "
                         f"the extend has 1 and {len(tokens) - 1}")


def check_truncate(length: int, current: int) -> None:
    """Shared argument check for ``Backend.truncate`` implementations."""
    if not 0 <= length <= current:
        raise ValueError(f"cannot truncate a cache of {current} tokens to {length}")


def check_keep(tree: Sequence[int] | None, start: int, length: int, keep: Sequence[int]) -> None:
    """``keep`` must be one path from the root of the last extend, which started at ``length``."""
    if start != length:
        raise ValueError(f"keep refers to the last extend, which started at {start}, not {length}")
    parents = tree if tree is not None else trees.chain(max(keep, default=-1) + 1)
    previous = -1
    for offset in keep:
        if not 0 <= offset < len(parents) or parents[offset] != previous:
            raise ValueError(f"kept offsets {list(keep)} are not a path from the root of the last extend")
        previous = offset


@runtime_checkable
class BatchedSequences(Protocol):
    """Sequences of one model stepped together (continuous batching): what a backend's
    ``LoadedWeights.batched(slots)`` returns, for a backend whose registry entry says ``batched``.

    Each :meth:`backend` is a :class:`Backend` of its own (its KV cache, its rollback), whose
    forwards wait for the other running sequences' and go into one forward with them; it prices its
    rows at their margin in the batch (:meth:`Backend.forward_costs`). ``costs`` gives the model's
    curve for the batch's forwards to refine (set by the loaded model); the counters say how much
    was batched."""

    slots: int
    costs: Callable[[], CostModel | None] | None
    ticks: int  # forwards run
    rows: int  # rows in them
    decode_s: float  # seconds in them

    def backend(self) -> Backend:
        """A sequence on a free slot (the model's pool keeps at most ``slots`` of them)."""
