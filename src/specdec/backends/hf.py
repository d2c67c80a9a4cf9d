"""Hugging Face transformers backend: a causal LM with a ``DynamicCache`` rolled back by ``crop``."""

from __future__ import annotations

import sys
from collections.abc import Sequence

import torch

from specdec.backends.base import Backend, check_extend, check_truncate
from specdec.errors import SpecdecError
from specdec.registry import LoadedWeights, LoadRequest, backend

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class HFBackend(Backend):
    """One sequence on a transformers causal LM (any dtype; logits are returned as float32)."""

    def __init__(self, model) -> None:
        self.model = model
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self.max_length = getattr(model.config, "max_position_embeddings", None)
        layer_types = getattr(model.config, "layer_types", None) or []
        # Sliding-window layers (Gemma 3) past their window can only be rolled back if they kept
        # (recorded) the rows they would have evicted; full-attention models need no recording.
        self._window = getattr(model.config, "sliding_window", None) or 0
        self._sliding = self._window > 0 and any("sliding" in str(t) for t in layer_types)
        self.reset()

    def reset(self) -> None:
        from transformers import DynamicCache

        self.cache = DynamicCache(config=self.model.config)
        if self._sliding:
            self.cache.activate_past_recording()
        self.tokens: list[int] = []
        # Recorded sliding layers can undo only what was added since their last crop, which trims
        # them back to the window: rolling back below this floor needs a recompute.
        self._floor = 0

    @property
    def length(self) -> int:
        return len(self.tokens)

    def extend(self, tokens: Sequence[int], *, last_only: bool = False) -> torch.Tensor:
        check_extend(tokens)
        ids = torch.tensor([list(tokens)], dtype=torch.long)
        with torch.inference_mode():
            # logits_to_keep=0 means "every position" in transformers.
            out = self.model(input_ids=ids, past_key_values=self.cache, use_cache=True,
                             logits_to_keep=1 if last_only else 0)
        self.tokens.extend(tokens)
        return out.logits[0].float()

    def truncate(self, length: int) -> None:
        check_truncate(length, len(self.tokens))
        if not self.tokens:
            return  # nothing cached (the cache layers are not even initialised yet)
        if self._sliding and length < self._floor:
            kept = self.tokens[:length]
            self.reset()
            self.prefill(kept)
            return
        if length < len(self.tokens) or self._sliding:
            # A negative count drops that many tokens; for recorded sliding layers even crop(0)
            # matters: it trims the rows kept since the last crop, so memory stays bounded.
            self.cache.crop(length - len(self.tokens))
        del self.tokens[length:]
        if self._sliding and length >= self._window:
            self._floor = length


@backend("transformers", "PyTorch through Hugging Face transformers (float32, or bfloat16 on CPUs with "
                         "native bf16)", dtypes=tuple(DTYPES), order=0)
def load_transformers(request: LoadRequest) -> LoadedWeights:
    """Load the safetensors cache; fp32 models get this machine's tuned matmul kernels."""
    from transformers import AutoModelForCausalLM

    from specdec import kernels
    from specdec.cpu import has_native_bf16, machine_tag
    from specdec.models import no_progress_bars

    dtype = DTYPES[request.dtype]
    if dtype == torch.bfloat16 and not has_native_bf16():
        (request.report or _warn)("this CPU has no native bf16 (avx512_bf16 / amx_bf16): bfloat16 runs "
                                  "emulated and is likely slower than float32")
    try:
        with no_progress_bars():
            model = AutoModelForCausalLM.from_pretrained(request.resolved.hf_dir, dtype=dtype).eval()
    except (OSError, ValueError) as exc:
        raise SpecdecError(f"could not load model {request.resolved.name} from {request.resolved.hf_dir}: "
                           f"{exc}") from exc
    # bf16 kernels are already nearly flat in the row count (measured: Gemma 52-73 ms for 1-16
    # rows) and the rerouting did not help them, so only fp32 models are tuned.
    tune = request.tune_kernels and dtype == torch.float32
    if tune:
        key = f"{request.resolved.name}-{dtype}-{machine_tag()}"
        kernels.install(model, kernels.tuned(model, key))
    return LoadedWeights(lambda: HFBackend(model), f"{dtype}-{'tuned' if tune else 'stock'}", model)


def _warn(message: str) -> None:
    print(f"specdec: warning: {message}", file=sys.stderr, flush=True)
