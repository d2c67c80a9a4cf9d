"""Sampling parameters and the logits -> probabilities transform shared by target and drafter.

Rejection sampling is lossless only if the target's p and the drafter's q come out of the *same*
transform (temperature, then top-k, then top-p, as in transformers' logits processors), so both
sides call :func:`logits_to_probs` and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.errors import SpecdecError


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen. ``temperature == 0`` means greedy (argmax)."""

    temperature: float = 0.0
    top_k: int = 0  # 0: no top-k cut
    top_p: float = 1.0  # 1.0: no nucleus cut
    seed: int | None = None

    def __post_init__(self) -> None:
        if not self.temperature >= 0:  # also rejects NaN
            raise SpecdecError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise SpecdecError(f"top-k must be >= 0 (0 disables it), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise SpecdecError(f"top-p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def generator(self) -> torch.Generator:
        """A CPU generator seeded from ``seed`` (or from the OS when no seed is given)."""
        gen = torch.Generator()
        if self.seed is None:
            gen.seed()
        else:
            gen.manual_seed(self.seed)
        return gen


def logits_to_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Turn logits ``[..., V]`` into the sampling distribution ``[..., V]`` (float32, rows sum to 1).

    Greedy parameters give a one-hot distribution on the argmax, which keeps the rejection-sampling
    code valid for temperature 0 too.
    """
    logits = logits.float()
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    logits = logits / params.temperature
    if 0 < params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(-1)
        # Drop a token when the tokens ranked above it already hold top_p of the mass; the most
        # likely token is never dropped.
        drop_sorted = (sorted_probs.cumsum(-1) - sorted_probs) >= params.top_p
        drop_sorted[..., 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(-1)


def sample(probs: torch.Tensor, generator: torch.Generator) -> int:
    """Draw one token id from a single distribution ``[V]``."""
    return int(torch.multinomial(probs, 1, generator=generator).item())
