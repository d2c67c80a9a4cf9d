"""Drafting with a smaller model that shares the target's tokenizer (Leviathan et al. 2023)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from specdec.backends.base import Backend
from specdec.drafters.acceptance import AcceptanceTable
from specdec.drafters.base import Drafter, StopDrafting
from specdec.errors import SpecdecError
from specdec.registry import DraftRequest, drafter
from specdec.text import different_vocabularies
from specdec.types import Draft, Verdict


class ModelDrafter(Drafter):
    """Runs a draft model autoregressively for up to k tokens on its own KV cache.

    The cache is kept in step with the context by token comparison: each ``propose`` rolls the
    draft cache back to the longest prefix it shares with the context and feeds the rest in one
    forward, so rejected drafts are undone and accepted ones are not recomputed.

    Tokens are drawn with the generation's sampler: with coupled verification the drafter uses
    the target's own per-position noise, so it proposes the target's sample whenever its
    distribution is close enough; with rejection sampling it draws independently and hands q over.

    Each token's confidence is the drafter's own probability for it, calibrated online; the
    ``stop`` callback (the policy's :meth:`~specdec.policies.base.DraftPolicy.stop_drafting`) can
    end the draft early, since a draft forward spent on a token that will be rejected is wasted.
    """

    name = "model"

    def __init__(self, backend: Backend, table: AcceptanceTable | None = None,
                 release: Callable[[Backend], None] | None = None) -> None:
        self.backend = backend
        self.table = table or AcceptanceTable(prior=lambda f: f[0] / 10 + 0.05, bucket=lambda f: f)
        self.cached: list[int] = []  # the tokens whose keys/values are in backend's cache
        self._release = release

    def begin(self, prompt: Sequence[int], sampler) -> None:
        super().begin(prompt, sampler)
        self.backend.reset()
        self.cached = []

    def propose(self, tokens: Sequence[int], k: int, stop: StopDrafting | None = None) -> Draft:
        limit = getattr(self.backend, "max_length", None)
        if limit is not None:
            k = min(k, limit - len(tokens))  # the draft model's own context ends here
        if k <= 0:
            return Draft([])
        tokens = list(tokens)
        keep = _common_prefix(self.cached, tokens, limit=len(tokens) - 1)
        self.backend.truncate(keep)
        logits = self.backend.extend(tokens[keep:], last_only=True)[-1]
        self.cached = list(tokens)  # a copy: drafted tokens are appended to it below
        sampler, want_q = self.sampler, not self.sampler.greedy and not self.sampler.coupled
        out: list[int] = []
        qs: list[torch.Tensor] = []
        probs: list[float] = []
        confidence: list[float] = []
        features: list[tuple[int]] = []
        forwards = 1
        for i in range(k):
            q = torch.softmax(logits.float(), -1) if sampler.greedy else sampler.probs(logits)
            tok = sampler.draft_token(q, len(tokens) + i)
            if want_q:
                qs.append(q)
            prob = float(q[tok])
            feats = (min(int(prob * 10), 9),)  # decile of the drafter's own probability
            out.append(tok)
            probs.append(prob)
            features.append(feats)
            confidence.append(self.table.estimate(feats))
            if i + 1 == k or (stop is not None and stop(confidence)):
                break
            logits = self.backend.extend([tok], last_only=True)[-1]
            self.cached.append(tok)
            forwards += 1
        return Draft(out, torch.stack(qs) if qs else None, forwards, confidence, features, probs)

    def observe(self, draft: Draft, verdict: Verdict) -> None:
        if draft.features:
            self.table.learn(draft, verdict)

    def close(self) -> None:
        if self._release is not None:
            self._release(self.backend)
            self._release = None


def _common_prefix(a: list[int], b: list[int], limit: int) -> int:
    n = 0
    stop = min(len(a), len(b), limit)
    while n < stop and a[n] == b[n]:
        n += 1
    return n


@drafter("model", "a smaller model with the same tokenizer (--draft-model)", needs_draft_model=True,
         same_vocabulary=True, order=20)
def _build_model(request: DraftRequest) -> ModelDrafter:
    target, draft = request.target, request.draft_model
    if draft is None:
        raise SpecdecError("the model drafter needs a draft model (--draft-model)")
    if not target.codec.same_vocabulary(draft.codec):
        raise SpecdecError(different_vocabularies(draft.name, target.name))
    table = draft.shared(f"model-acceptance-for-{target.name}",
                         lambda: AcceptanceTable(prior=lambda f: f[0] / 10 + 0.05, bucket=lambda f: f))
    backend = draft.pool.take()
    return ModelDrafter(backend, table, release=draft.pool.give)
