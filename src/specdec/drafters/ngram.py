"""Prompt-lookup drafting (Saxena 2023; transformers' PromptLookupCandidateGenerator, vLLM's
NgramProposer): find the latest earlier occurrence of the context's last n tokens and propose
what followed it. No model, so the draft is deterministic (one-hot q)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from specdec.drafters.base import Drafter
from specdec.errors import SpecdecError
from specdec.types import Draft


class NgramDrafter(Drafter):
    """Match the longest suffix of ``max_ngram``..``min_ngram`` tokens; copy its continuation."""

    name = "ngram"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise SpecdecError(f"n-gram sizes need 1 <= min ({min_ngram}) <= max ({max_ngram})")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram

    def propose(self, tokens: Sequence[int], k: int) -> Draft:
        match = self.find(tokens)
        if match is None or k <= 0:
            return Draft([])
        start, _ = match
        out: list[int] = []
        seq = list(tokens)
        # Reading on past the end of the context continues into the draft itself, which extends
        # periodic text (a repeated line, a list) by whole periods.
        for j in range(start, start + k):
            out.append(seq[j] if j < len(seq) else out[j - len(seq)])
        return Draft(out)

    def find(self, tokens: Sequence[int]) -> tuple[int, int] | None:
        """``(start of the continuation, n)`` for the longest matching suffix, latest occurrence."""
        arr = np.asarray(tokens, dtype=np.int64)
        for n in range(min(self.max_ngram, len(arr) - 1), self.min_ngram - 1, -1):
            windows = np.lib.stride_tricks.sliding_window_view(arr[:-1], n)
            hits = np.flatnonzero((windows == arr[-n:]).all(axis=1))
            if hits.size:
                return int(hits[-1]) + n, n
        return None
