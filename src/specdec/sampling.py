"""Sampling parameters, the logits -> probabilities transform, and seeded per-position sampling.

Rejection sampling is lossless only if the target's p and the drafter's q come out of the *same*
transform (temperature, then top-k, then top-p, as in transformers' logits processors), so both
sides call :func:`logits_to_probs` and nothing else.

Every random draw is keyed by (seed, stream, position): the token at sequence position i is
``argmax(p / E_i)`` with ``E_i`` i.i.d. Exp(1) noise from a generator seeded with (seed, i) (the
Gumbel-max trick written as an exponential race, as vLLM's sampler does). So the text depends only
on the seed and the model, never on how the tokens were drafted: plain decoding with a seed gives
the reference text and every speculative configuration reproduces it.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from specdec.options import check, check_fields, core, same_as

# Below this a temperature only sharpens logits that float32 already separates completely.
_MIN_TEMPERATURE = 1e-30


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen. ``temperature == 0`` means greedy (argmax).

    The engine's copy of the sampling options: their defaults and checks are the ones
    :class:`~specdec.options.GenerationOptions` declares (a bad value reads as it does in every
    front end), and :meth:`specdec.engine.DecodeConfig.of` builds one from validated options.
    """

    temperature: float = same_as("temperature")
    top_k: int = same_as("top_k")  # 0: no top-k cut
    top_p: float = same_as("top_p")  # 1.0: no nucleus cut
    seed: int | None = same_as("seed")

    def __post_init__(self) -> None:
        check_fields(self)  # the engine's own callers build these by hand

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def logits_to_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Turn logits ``[..., V]`` into the sampling distribution ``[..., V]`` (float32, rows sum to 1).

    Greedy parameters give a one-hot distribution on the argmax, which keeps the rejection-sampling
    code valid for temperature 0 too.
    """
    logits = logits.float()
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    # Shifting by the max first keeps a tiny temperature from turning logits into inf - inf = nan.
    logits = (logits - logits.amax(-1, keepdim=True)) / max(params.temperature, _MIN_TEMPERATURE)
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


class Noise:
    """Independent random numbers keyed by (seed, stream, position), cached for reuse.

    One generator per key (numpy's PCG64 through a SeedSequence, which mixes keys of any size), and
    the drafter and the verifier of the same position share one vector: a vector of a large
    vocabulary's size is worth drawing once.
    """

    TARGET, DRAFT, RESIDUAL, ACCEPT = range(4)

    def __init__(self, seed: int, cache_size: int = 48) -> None:
        self.seed = seed
        self._cache: OrderedDict[tuple[int, int, int], torch.Tensor] = OrderedDict()
        self._cache_size = cache_size

    def exponential(self, stream: int, position: int, vocab: int) -> torch.Tensor:
        """``[vocab]`` i.i.d. Exp(1) draws (float32, strictly positive)."""
        key = (stream, position, vocab)
        found = self._cache.get(key)
        if found is not None:
            self._cache.move_to_end(key)
            return found
        rng = np.random.Generator(np.random.PCG64([self.seed, stream, position]))
        noise = torch.from_numpy(rng.standard_exponential(vocab, dtype=np.float32)).clamp_min_(1e-30)
        self._cache[key] = noise
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return noise

    def uniform(self, stream: int, position: int, index: int = 0) -> float:
        """One U[0, 1) draw (``index`` tells apart several draws at one position, e.g. siblings)."""
        return float(np.random.Generator(np.random.PCG64([self.seed, stream, position, index])).random())


def argmax(row: torch.Tensor) -> int:
    """The index of the first maximum of a 1-D tensor (as ``torch.argmax``). numpy's SIMD argmax
    is several times faster than torch's on a CPU float32 row, which matters for a large
    vocabulary at every greedy step."""
    if _numpy_reads(row):
        return int(row.numpy().argmax())
    return int(row.argmax())


def _numpy_reads(logits: torch.Tensor) -> bool:
    """Whether numpy can take ``logits`` as they are (CPU float32, no autograd), for its argmax."""
    return logits.dtype == torch.float32 and logits.device.type == "cpu" and not logits.requires_grad


def random_seed() -> int:
    """A fresh 64-bit seed from the OS (for unseeded sampling; reported so it can be replayed)."""
    return int.from_bytes(os.urandom(8), "little")


VerifyMode = str  # one of specdec.options.VERIFY_MODES


class Sampler:
    """Chooses tokens for one generation: greedy argmax, or seeded draws keyed by position.

    ``verify="coupled"`` (the default) makes a model drafter draw with the target's own noise, so
    a draft token survives exactly when it equals the target's seeded sample; ``"rejection"``
    gives the drafter independent noise and verifies by rejection sampling (min(1, p/q)).
    """

    def __init__(self, params: SamplingParams, verify: VerifyMode = core("verify").default) -> None:
        check([core("verify")], {"verify": verify}.get)  # the option's own check and message
        self.params = params
        self.verify = verify
        self.seed = params.seed if params.seed is not None else random_seed()
        self.noise = Noise(self.seed)

    @property
    def greedy(self) -> bool:
        return self.params.greedy

    @property
    def coupled(self) -> bool:
        return self.verify == "coupled"

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """The sampling distribution for ``logits`` ``[..., V]``."""
        return logits_to_probs(logits, self.params)

    def target_token(self, logits: torch.Tensor, position: int) -> int:
        """The target's token at sequence ``position`` given its logits ``[V]`` there."""
        if self.greedy:
            return argmax(logits)
        return self.draw(self.probs(logits), position, Noise.TARGET)

    def draft_token(self, q: torch.Tensor, position: int) -> int:
        """A drafter's token from its distribution ``q`` ``[V]`` (argmax when greedy)."""
        if self.greedy:
            return argmax(q)
        return self.draw(q, position, Noise.TARGET if self.coupled else Noise.DRAFT)

    def target_tokens(self, logits: torch.Tensor, positions: Sequence[int]) -> list[int]:
        """The target's tokens for each row of ``logits`` ``[m, V]`` (row i at ``positions[i]``),
        read back in one transfer: on a GPU every ``int()`` waits for the device, so a step reads
        its verdict's inputs once instead of once per token. Each row goes through the same
        operations as :meth:`target_token` (a row's probabilities never depend on the others')."""
        if self.greedy:
            if _numpy_reads(logits):
                return logits.numpy().argmax(-1).tolist()  # as :func:`argmax`: numpy's is faster
            return logits.argmax(-1).tolist()
        vocab = logits.shape[-1]
        chosen = [torch.argmax(self.probs(row) / self.noise.exponential(Noise.TARGET, pos, vocab).to(row.device))
                  for row, pos in zip(logits, positions)]
        return torch.stack(chosen).tolist()

    def draw(self, probs: torch.Tensor, position: int, stream: int) -> int:
        """``argmax(probs / E)``: a draw from ``probs`` with the noise of (stream, position)."""
        noise = self.noise.exponential(stream, position, probs.shape[-1])
        return int(torch.argmax(probs / noise.to(probs.device)))
