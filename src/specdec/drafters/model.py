"""Drafting with a smaller model that shares the target's tokenizer (Leviathan et al. 2023)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec.backends.base import Backend
from specdec.drafters.acceptance import AcceptanceTable
from specdec.drafters.base import Drafter, StopDrafting
from specdec.sampling import logits_to_probs, sample
from specdec.types import Draft


class ModelDrafter(Drafter):
    """Runs a draft model autoregressively for up to k tokens on its own KV cache.

    The cache is kept in step with the context by token comparison: each ``propose`` rolls the
    draft cache back to the longest prefix it shares with the context and feeds the rest in one
    forward, so rejected drafts are undone and accepted ones are not recomputed.

    Each token's confidence is the drafter's own probability for it, calibrated online; the
    ``stop`` callback (the policy's :meth:`~specdec.policies.DraftPolicy.stop_drafting`) can end
    the draft early, since a draft forward spent on a token that will be rejected is wasted.
    """

    name = "model"

    def __init__(self, backend: Backend, table: AcceptanceTable | None = None) -> None:
        self.backend = backend
        self.table = table or AcceptanceTable(prior=lambda f: f[0] / 10 + 0.05, bucket=lambda f: f)
        self.cached: list[int] = []  # the tokens whose keys/values are in backend's cache

    def begin(self, prompt: Sequence[int], params, generator) -> None:
        super().begin(prompt, params, generator)
        self.backend.reset()
        self.cached = []

    def propose(self, tokens: Sequence[int], k: int, stop: StopDrafting | None = None) -> Draft:
        if k <= 0:
            return Draft([])
        tokens = list(tokens)
        keep = _common_prefix(self.cached, tokens, limit=len(tokens) - 1)
        self.backend.truncate(keep)
        logits = self.backend.extend(tokens[keep:], last_only=True)[-1]
        self.cached = tokens
        out: list[int] = []
        qs: list[torch.Tensor] = []
        confidence: list[float] = []
        features: list[tuple[int]] = []
        forwards = 1
        for i in range(k):
            if self.params.greedy:
                tok = int(logits.argmax())
                prob = float(torch.softmax(logits.float(), -1)[tok])
            else:
                q = logits_to_probs(logits, self.params)
                tok = sample(q, self.generator)
                qs.append(q)
                prob = float(q[tok])
            feats = (min(int(prob * 10), 9),)  # decile of the drafter's own probability
            out.append(tok)
            features.append(feats)
            confidence.append(self.table.estimate(feats))
            if i + 1 == k or (stop is not None and stop(confidence)):
                break
            logits = self.backend.extend([tok], last_only=True)[-1]
            self.cached.append(tok)
            forwards += 1
        return Draft(out, torch.stack(qs) if qs else None, forwards, confidence, features)

    def observe(self, draft: Draft, num_accepted: int) -> None:
        if draft.features:
            self.table.update(draft.features, num_accepted)


def _common_prefix(a: list[int], b: list[int], limit: int) -> int:
    n = 0
    stop = min(len(a), len(b), limit)
    while n < stop and a[n] == b[n]:
        n += 1
    return n
