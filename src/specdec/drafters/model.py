"""Drafting with a smaller model that shares the target's tokenizer (Leviathan et al. 2023)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec.backends.base import Backend
from specdec.drafters.base import Drafter
from specdec.sampling import logits_to_probs, sample
from specdec.types import Draft


class ModelDrafter(Drafter):
    """Runs a draft model autoregressively for k tokens on its own KV cache.

    The cache is kept in step with the context by token comparison: each ``propose`` rolls the
    draft cache back to the longest prefix it shares with the context and feeds the rest in one
    forward, so rejected drafts are undone and accepted ones are not recomputed.
    """

    name = "model"

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.cached: list[int] = []  # the tokens whose keys/values are in backend's cache

    def begin(self, prompt: Sequence[int], params, generator) -> None:
        super().begin(prompt, params, generator)
        self.backend.reset()
        self.cached = []

    def propose(self, tokens: Sequence[int], k: int) -> Draft:
        if k <= 0:
            return Draft([])
        tokens = list(tokens)
        keep = _common_prefix(self.cached, tokens, limit=len(tokens) - 1)
        self.backend.truncate(keep)
        logits = self.backend.extend(tokens[keep:], last_only=True)[-1]
        self.cached = tokens
        out: list[int] = []
        qs: list[torch.Tensor] = []
        for i in range(k):
            if self.params.greedy:
                tok = int(logits.argmax())
            else:
                q = logits_to_probs(logits, self.params)
                tok = sample(q, self.generator)
                qs.append(q)
            out.append(tok)
            if i + 1 < k:
                logits = self.backend.extend([tok], last_only=True)[-1]
                self.cached.append(tok)
        return Draft(out, torch.stack(qs) if qs else None, forwards=k)


def _common_prefix(a: list[int], b: list[int], limit: int) -> int:
    n = 0
    stop = min(len(a), len(b), limit)
    while n < stop and a[n] == b[n]:
        n += 1
    return n
