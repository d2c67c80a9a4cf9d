"""A tiny deterministic language model for tests: exactness is checkable in milliseconds.

Logits at a position depend only on the last ``order`` tokens, read from a seeded random table, so
every position is computed independently: a batched ``extend`` is bit-identical to one token at a
time, and the exact distribution of any continuation can be enumerated.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec.backends.base import Backend, check_extend, check_truncate


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
    """:class:`ToyLM` behind the backend protocol; the "cache" is the token list itself."""

    def __init__(self, lm: ToyLM) -> None:
        self.lm = lm
        self.vocab_size = lm.vocab_size
        self.tokens: list[int] = []

    @property
    def length(self) -> int:
        return len(self.tokens)

    def extend(self, tokens: Sequence[int], *, last_only: bool = False) -> torch.Tensor:
        check_extend(tokens)
        if any(not 0 <= t < self.vocab_size for t in tokens):
            raise ValueError(f"token id outside the toy vocabulary of {self.vocab_size}")
        start = len(self.tokens)
        self.tokens.extend(tokens)
        positions = [len(self.tokens)] if last_only else range(start + 1, len(self.tokens) + 1)
        return torch.stack([self.lm.logits(self.tokens[:end]) for end in positions])

    def truncate(self, length: int) -> None:
        check_truncate(length, len(self.tokens))
        del self.tokens[length:]
