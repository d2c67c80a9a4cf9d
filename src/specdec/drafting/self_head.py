"""The self drafter's small LM head: the target's head restricted to its most frequent tokens.

FR-Spec (Zhao et al. 2025): a head of the target's 16k likeliest tokens costs a sixteenth of
Gemma's 262k-row head. Its rows are the top tokens by the target's own predicted probability mass
over a small multilingual calibration text (ranked once per model and cached on disk), plus every
token met in prompts and outputs since (bounded).
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources

import torch

from specdec.backends.base import Backend
from specdec.cache import JsonCache
from specdec.context import DraftContext

HEAD_ROWS = 16384  # rows of the static draft head (FR-Spec's 16k-32k; 16k: 1/16 of Gemma's head)
EXTRA_ROWS = 8192  # tokens met in use that the static head missed
CALIBRATION_CHUNK = 128  # positions per forward when measuring token mass (bounds the logits' memory)


class DraftHead:
    """The target's LM head restricted to some of its rows: a static set plus tokens met in use."""

    def __init__(self, weight: torch.Tensor, ids: Sequence[int], softcap: float | None = None,
                 extra_capacity: int = EXTRA_ROWS) -> None:
        self.weight = weight.detach()
        self.ids = torch.tensor(list(dict.fromkeys(int(i) for i in ids)), dtype=torch.long)
        self.static = self.weight.index_select(0, self.ids).contiguous()
        self.extra_ids: list[int] = []
        self.extra = self.weight[:0]
        self.known = set(self.ids.tolist())
        self.softcap = softcap
        self.capacity = extra_capacity
        self._all_ids = self.ids

    def __len__(self) -> int:
        return len(self.known)

    def __contains__(self, token: int) -> bool:
        return token in self.known

    def add(self, tokens: Sequence[int]) -> None:
        """Give the head rows for ``tokens`` it lacks (up to its capacity for extra rows)."""
        new = [t for t in dict.fromkeys(tokens) if t not in self.known]
        new = new[:max(0, self.capacity - len(self.extra_ids))]
        if not new:
            return
        index = torch.tensor(new, dtype=torch.long)
        self.extra = torch.cat([self.extra, self.weight.index_select(0, index)])
        self.extra_ids.extend(new)
        self.known.update(new)
        self._all_ids = torch.cat([self.ids, torch.tensor(self.extra_ids, dtype=torch.long)])

    def logits(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(token ids, float32 logits) over the head's rows for one hidden state ``[H]``."""
        with torch.inference_mode():
            rows = self.static @ hidden
            if self.extra_ids:
                rows = torch.cat([rows, self.extra @ hidden])
        rows = rows.float()
        if self.softcap:
            rows = torch.tanh(rows / self.softcap) * self.softcap
        return self._all_ids, rows


def calibration_text() -> str:
    """The short multilingual text the head's rows are ranked on."""
    return resources.files("specdec.data").joinpath("head_calibration.txt").read_text(encoding="utf-8")


def rank_tokens(backend: Backend, ids: Sequence[int], limit: int = HEAD_ROWS) -> list[int]:
    """The ``limit`` tokens with the most predicted probability mass after the positions of
    ``ids`` (each position contributes the target's whole next-token distribution, so a short text
    ranks far more tokens than it contains), the text's own tokens counted once more each."""
    backend.reset()
    mass = torch.zeros(backend.vocab_size, dtype=torch.float64)
    try:
        for start in range(0, len(ids), CALIBRATION_CHUNK):
            logits = backend.extend(list(ids[start:start + CALIBRATION_CHUNK]))
            mass += torch.softmax(logits.double(), -1).sum(0)
    finally:
        backend.reset()
    mass.index_add_(0, torch.tensor(list(ids), dtype=torch.long), torch.ones(len(ids), dtype=torch.float64))
    return torch.argsort(mass, descending=True, stable=True)[:limit].tolist()


def head_for(target: DraftContext, backend: Backend, rows: int = HEAD_ROWS) -> DraftHead:
    """The draft head of ``rows`` rows for ``target``, cut from the LM head of ``backend`` (one of
    the target's, a :class:`~specdec.context.LayerAccess`); its rows are ranked once per model and
    size and cached."""
    text = calibration_text()
    key = f"{target.name}-{backend.vocab_size}-{len(text)}-{rows}"
    cache = JsonCache("draft-heads", key)
    ranked = cache.load(_parse_ids(backend.vocab_size))
    if ranked is None:
        ranked = rank_tokens(backend, target.codec.tokenizer(text)["input_ids"], rows)
        cache.store(ranked)
    ids = list(ranked) + sorted(target.eos)
    return DraftHead(backend.output_weight, ids, backend.logit_softcap)


def _parse_ids(vocab_size: int):
    def parse(raw) -> list[int]:
        ids = [int(i) for i in raw]
        if not ids or any(not 0 <= i < vocab_size for i in ids):
            raise ValueError("not a token ranking for this model")
        return ids
    return parse
