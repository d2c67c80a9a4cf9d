"""Hugging Face transformers backend: a causal LM with a ``DynamicCache`` rolled back by ``crop``."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache, PreTrainedModel

from specdec.backends.base import Backend, check_truncate


class HFBackend(Backend):
    """One sequence on a transformers causal LM (any dtype; logits are returned as float32)."""

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        layer_types = getattr(model.config, "layer_types", None) or []
        # Sliding-window layers (Gemma 3) can only be cropped once they pass the window if they
        # recorded the rows they evicted; full-attention models need no recording.
        self._sliding = any("sliding" in str(t) for t in layer_types)
        self.reset()

    def reset(self) -> None:
        self.cache = DynamicCache(config=self.model.config)
        if self._sliding:
            self.cache.activate_past_recording()
        self._length = 0

    @property
    def length(self) -> int:
        return self._length

    def extend(self, tokens: Sequence[int], *, last_only: bool = False) -> torch.Tensor:
        if not tokens:
            raise ValueError("extend needs at least one token")
        ids = torch.tensor([list(tokens)], dtype=torch.long)
        with torch.inference_mode():
            # logits_to_keep=0 means "every position" in transformers.
            out = self.model(input_ids=ids, past_key_values=self.cache, use_cache=True,
                             logits_to_keep=1 if last_only else 0)
        self._length += len(tokens)
        if self._sliding:
            # With recording on, sliding layers keep every new row until the next crop; cropping by
            # nothing trims them back to the window so memory stays bounded.
            self.cache.crop(0)
        return out.logits[0].float()

    def truncate(self, length: int) -> None:
        check_truncate(length, self._length)
        if length < self._length:
            self.cache.crop(length - self._length)  # a negative count drops that many tokens
            self._length = length
