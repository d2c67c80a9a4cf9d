"""N-gram drafting from an index of the whole context (prompt lookup, grown up).

Prompt lookup (Saxena 2023; transformers' PromptLookupCandidateGenerator, vLLM's NgramProposer)
copies what followed the latest earlier occurrence of the context's last few tokens. This drafter
keeps an index of every n-gram (n <= ``max_ngram``) of the prompt and the output so far, so each
draft token is chosen from *all* earlier occurrences of the longest matching suffix (the most
frequent continuation, the latest on ties), token by token, like a suffix tree (SuffixDecoding,
Oliaro et al. 2024). Each token also gets an estimated acceptance probability from what predicts it
best: how long the match is and how unanimous the earlier continuations were, calibrated online by
:class:`AcceptanceTable`. No model is involved, so the draft is deterministic (one-hot q).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from specdec.drafters.acceptance import AcceptanceTable
from specdec.drafters.base import Drafter, StopDrafting
from specdec.errors import SpecdecError
from specdec.registry import DraftRequest, drafter
from specdec.types import Draft

MAX_MATCH = 32  # how far back a match is measured; longer ones predict no better


class NgramDrafter(Drafter):
    """Draft from the longest suffix (``min_ngram``..``max_ngram`` tokens) seen earlier in the context."""

    name = "ngram"

    def __init__(self, max_ngram: int = 4, min_ngram: int = 1, table: AcceptanceTable | None = None) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise SpecdecError(f"n-gram sizes need 1 <= min ({min_ngram}) <= max ({max_ngram})")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.table = table or AcceptanceTable(ngram_prior, ngram_bucket)
        self._seq: list[int] = []
        # n-gram -> positions right after each occurrence (where its continuation is)
        self._index: dict[tuple[int, ...], list[int]] = {}

    def begin(self, prompt, sampler) -> None:
        super().begin(prompt, sampler)
        self._seq, self._index = [], {}

    def propose(self, tokens: Sequence[int], k: int, stop: StopDrafting | None = None) -> Draft:
        self._sync(tokens)
        draft: list[int] = []
        confidence: list[float] = []
        features: list[tuple[int, int, int]] = []
        for _ in range(k):
            step = self._next(draft)
            if step is None:
                break
            token, feats = step
            draft.append(token)
            features.append(feats)
            confidence.append(self.table.estimate(feats))
        return Draft(draft, confidence=confidence, features=features)

    def observe(self, draft: Draft, num_accepted: int) -> None:
        if draft.features:
            self.table.update(draft.features, num_accepted)

    # -- index ------------------------------------------------------------------------------------
    def _sync(self, tokens: Sequence[int]) -> None:
        """Index the tokens added since the last call (rebuild if the context is not an extension)."""
        seq = self._seq
        if len(tokens) < len(seq) or list(tokens[:len(seq)]) != seq:
            self._seq, self._index = [], {}
            seq = self._seq
        for tok in tokens[len(seq):]:
            seq.append(tok)
            end = len(seq)
            for n in range(1, min(self.max_ngram, end) + 1):
                self._index.setdefault(tuple(seq[end - n:]), []).append(end)

    def _next(self, draft: list[int]) -> tuple[int, tuple[int, int, int]] | None:
        """The next draft token after context + ``draft``, with its features (match, agreement, count)."""
        seq = self._seq
        tail = (seq[-self.max_ngram:] + draft)[-self.max_ngram:]
        for n in range(min(self.max_ngram, len(tail)), self.min_ngram - 1, -1):
            ends = [e for e in self._index.get(tuple(tail[-n:]), ()) if e < len(seq)]
            if not ends:
                continue
            counts: dict[int, int] = {}
            latest: dict[int, int] = {}
            for e in ends:
                tok = seq[e]
                counts[tok] = counts.get(tok, 0) + 1
                latest[tok] = e
            token = max(counts, key=lambda t: (counts[t], latest[t]))
            match = n if n < self.max_ngram else self._match_length(latest[token], draft)
            agreement = counts[token] * 100 // len(ends)
            return token, (match, agreement, counts[token])
        return None

    def _match_length(self, end: int, draft: list[int]) -> int:
        """How many tokens before ``end`` equal the tokens before the current draft position."""
        seq, d = self._seq, len(draft)
        n = 0
        while n < MAX_MATCH and n < end:
            mine = draft[d - 1 - n] if n < d else seq[len(seq) - 1 - (n - d)]
            if mine != seq[end - 1 - n]:
                break
            n += 1
        return n


def ngram_bucket(feats: tuple[int, int, int]) -> tuple[int, int, int]:
    match, agreement, count = feats
    return (min(match, 4) if match < 5 else (5 if match < 8 else (6 if match < 16 else 7)),
            2 if agreement == 100 else (1 if agreement >= 50 else 0), min(count, 3))


def ngram_prior(feats: tuple[int, int, int]) -> float:
    """Prior P(accept): a logistic fit on 122k draft tokens of greedy Spec-Bench outputs (80 prompts x
    128 tokens, SmolLM2-135M-Instruct and Gemma-3-270M), refined online per bucket."""
    match, agreement, count = feats
    z = (-4.222 + 1.289 * math.log(match) + 2.079 * agreement / 100 + 1.584 * (agreement == 100)
         + 1.24 * math.log(count))
    return 1.0 / (1.0 + math.exp(-z))


@drafter("ngram", "prompt lookup from an index of every n-gram of the prompt and output (no model)", order=10)
def _build_ngram(request: DraftRequest) -> NgramDrafter:
    # One acceptance table per target model: what it learns carries over to later generations.
    table = request.target.shared("ngram-acceptance", lambda: AcceptanceTable(ngram_prior, ngram_bucket))
    return NgramDrafter(table=table)
