"""A tiny deterministic language model for tests: exactness is checkable in milliseconds.

Logits at a position depend only on the last ``order`` tokens, read from a seeded random table, so
every position is computed independently: a batched ``extend`` is bit-identical to one token at a
time, and the exact distribution of any continuation can be enumerated. Draft trees are scored by
conditioning each node on its ancestors.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec import tree as trees
from specdec.backends.base import Backend, check_extend, check_keep, check_truncate


class ToyLM:
    """An order-``order`` Markov model over ``vocab_size`` tokens with a seeded logit table."""

    def __init__(self, vocab_size: int = 16, order: int = 2, seed: int = 0, scale: float = 3.0,
                 table: torch.Tensor | None = None) -> None:
        self.vocab_size = vocab_size
        self.order = order
        if table is None:
            gen = torch.Generator().manual_seed(seed)
            table = torch.randn(vocab_size**order, vocab_size, generator=gen) * scale
        self.table = table  # [V**order, V]

    def perturbed(self, noise: float, seed: int) -> ToyLM:
        """A related model (a plausible drafter): the same table plus Gaussian noise."""
        gen = torch.Generator().manual_seed(seed)
        return ToyLM(self.vocab_size, self.order,
                     table=self.table + noise * torch.randn(self.table.shape, generator=gen))

    def logits(self, context: Sequence[int]) -> torch.Tensor:
        """Next-token logits ``[V]`` after ``context`` (positions before the start count as token 0)."""
        idx = 0
        for tok in list(context[-self.order:]) if self.order else []:
            idx = idx * self.vocab_size + tok
        return self.table[idx]

    def backend(self) -> ToyBackend:
        return ToyBackend(self)


class ToyBackend(Backend):
    """:class:`ToyLM` behind the backend protocol; the "cache" is the token list itself.

    After a tree ``extend`` the cache holds every node, as a real KV cache would, and only a
    ``truncate`` may follow (anything else would read siblings as if they were a sequence).
    """

    supports_tree = True

    def __init__(self, lm: ToyLM) -> None:
        self.lm = lm
        self.vocab_size = lm.vocab_size
        self.tokens: list[int] = []
        self._last: tuple[int, list[int] | None] = (0, None)  # start and tree of the last extend

    @property
    def length(self) -> int:
        return len(self.tokens)

    def extend(self, tokens: Sequence[int], *, last_only: bool = False,
               tree: Sequence[int] | None = None) -> torch.Tensor:
        check_extend(tokens, tree, self.supports_tree)
        if self._last[1] is not None:
            raise ValueError("a tree extend must be followed by truncate, not another extend")
        if any(not 0 <= t < self.vocab_size for t in tokens):
            raise ValueError(f"token id outside the toy vocabulary of {self.vocab_size}")
        start = len(self.tokens)
        prefix = self.tokens[:start]
        self.tokens.extend(tokens)
        self._last = (start, None if tree is None else list(tree))
        if tree is None:
            ends = [len(self.tokens)] if last_only else range(start + 1, len(self.tokens) + 1)
            return torch.stack([self.lm.logits(self.tokens[:end]) for end in ends])
        nodes = [len(tokens) - 1] if last_only else range(len(tokens))
        return torch.stack([self.lm.logits(prefix + [tokens[a] for a in trees.path_to(tree, i)]) for i in nodes])

    def truncate(self, length: int, keep: Sequence[int] | None = None) -> None:
        check_truncate(length, len(self.tokens))
        start, tree = self._last
        if keep is not None:
            check_keep(tree, start, length, keep)
            kept = [self.tokens[start + o] for o in keep]
            del self.tokens[length:]
            self.tokens.extend(kept)
        else:
            if tree is not None and length > start:
                check_keep(tree, start, start, list(range(length - start)))
            del self.tokens[length:]
        self._last = (len(self.tokens), None)
