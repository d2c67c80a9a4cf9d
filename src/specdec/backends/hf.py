"""Hugging Face transformers backend: a causal LM with a ``DynamicCache`` rolled back by ``crop``
(loaded by :mod:`specdec.backends.hf_load`; on a GPU its static-cache form, :mod:`specdec.backends.hf_static`)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec import tree as trees
from specdec.backends.base import Backend, check_extend, check_keep, check_truncate

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Rows of every forward on a GPU with exact on: one shape for every forward, so each row's result
# does not depend on how many rows came with it (a GPU picks its matmul kernel by shape). Where a
# forward is memory-bound, 16 rows cost about what 1 does.
PAD_ROWS = 16


class HFBackend(Backend):
    """One sequence on a transformers causal LM (any dtype; logits are returned as float32).

    Draft trees are scored with a custom 4-D attention mask (each node sees the cache and its
    ancestors; Gemma 3's sliding layers get their own mask, windowed by position) and position ids
    by depth; keeping a path then compacts every layer's keys and values to the accepted rows.
    The mask follows the attention implementation's convention: boolean (True = attend) for SDPA,
    additive float (0 or the dtype's minimum) for eager. Handing a boolean mask to eager attention
    would add 0/1 to the scores and mask nothing.
    """

    MASK_STYLES = {"sdpa": "bool", "eager": "additive"}

    def __init__(self, model, pad_rows: int = 0) -> None:
        self.model = model
        self.device = model.device
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self.max_length = getattr(model.config, "max_position_embeddings", None)
        self._layer_types = list(getattr(model.config, "layer_types", None) or [])
        # Sliding-window layers (Gemma 3) past their window can only be rolled back if they kept
        # (recorded) the rows they would have evicted; full-attention models need no recording.
        self._window = getattr(model.config, "sliding_window", None) or 0
        self._sliding = self._window > 0 and any("sliding" in str(t) for t in self._layer_types)
        self._mask_style = self.MASK_STYLES.get(getattr(model.config, "_attn_implementation", None) or "sdpa")
        self.supports_tree = self._mask_style is not None and set(self._layer_types) <= {
            "full_attention", "sliding_attention"}
        # Padding crops the pad rows right after each forward, which recorded sliding layers cannot
        # take back (see reset): models with sliding layers run unpadded.
        self.pad_rows = 0 if self._sliding else pad_rows
        # A tree wider than the padded shape would run in a shape plain decoding never runs.
        self.max_tree = self.pad_rows or None
        self._unpadded = False  # set while a prefill runs (see prefill)
        self.reset()

    def reset(self) -> None:
        from transformers import DynamicCache

        self.cache = DynamicCache(config=self.model.config)
        if self._sliding:
            self.cache.activate_past_recording()
        self.tokens: list[int] = []  # every token in the cache, the pending ones included
        # Self-speculation (``body``) runs tokens through the layers ahead of verification; their
        # final hidden states wait here until an extend asks for exactly those tokens.
        self._pending = torch.zeros(0, 0)
        # Recorded sliding layers can undo only what was added since their last crop, which trims
        # them back to the window: rolling back below this floor needs a recompute.
        self._floor = 0
        self._last: tuple[int, list[int] | None] = (0, None)  # start and tree of the last extend

    @property
    def length(self) -> int:
        return len(self.tokens) - len(self._pending)

    @property
    def pending(self) -> list[int]:
        """Tokens run through the layers by :meth:`body` and not yet claimed by an extend."""
        return self.tokens[self.length:]

    def body(self, tokens: Sequence[int]) -> torch.Tensor:
        """Run ``tokens`` through the layers (no LM head) after the cache, pending ones included;
        returns their final hidden states ``[n, H]``.

        For self-speculation: the drafter reads these states through a small head, and a later
        ``extend`` that starts with the same tokens reuses them, so verifying them costs only the
        full LM head. They are computed one chain at a time exactly as plain decoding would.
        """
        check_extend(tokens)
        if self._last[1] is not None:
            raise ValueError("a tree extend must be followed by truncate, not body")
        hidden = self._forward_body(list(tokens))
        self._pending = torch.cat([self._pending, hidden]) if len(self._pending) else hidden
        return hidden

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """The full LM head (with the model's final soft-capping, if any) over hidden states."""
        with torch.inference_mode():
            logits = self.model.get_output_embeddings()(hidden).float()
        cap = self.logit_softcap
        return torch.tanh(logits / cap) * cap if cap else logits

    @property
    def output_weight(self) -> torch.Tensor:
        """The LM head's weight ``[V, H]`` (:class:`specdec.context.LayerAccess`)."""
        return self.model.get_output_embeddings().weight

    @property
    def logit_softcap(self) -> float | None:
        return getattr(self.model.config, "final_logit_softcapping", None)

    def _forward_body(self, tokens: list[int]) -> torch.Tensor:
        ids = torch.tensor([tokens], dtype=torch.long, device=self.device)
        with torch.inference_mode():
            out = self.model.get_decoder()(input_ids=ids, past_key_values=self.cache, use_cache=True)
        self.tokens.extend(tokens)
        return out.last_hidden_state[0]

    def _claim_pending(self, tokens: Sequence[int]) -> torch.Tensor | None:
        """The hidden states of the pending tokens that ``tokens`` starts with; the other pending
        tokens are dropped from the cache. ``None`` when nothing was pending."""
        if not len(self._pending):
            return None
        pending = self.pending
        n = 0
        while n < min(len(pending), len(tokens)) and pending[n] == tokens[n]:
            n += 1
        claimed = self._pending[:n]
        self._drop_pending(len(pending) - n)
        return claimed

    def _drop_pending(self, count: int) -> None:
        if count:
            self.cache.crop(-count)
            del self.tokens[-count:]
            if self._sliding and len(self.tokens) >= self._window:
                self._floor = len(self.tokens)  # that crop trimmed the recorded rows (see reset)
        self._pending = torch.zeros(0, 0)

    def extend(self, tokens: Sequence[int], *, last_only: bool = False,
               tree: Sequence[int] | None = None) -> torch.Tensor:
        check_extend(tokens, tree, self.supports_tree)
        if self._last[1] is not None:
            raise ValueError("a tree extend must be followed by truncate, not another extend")
        claimed = self._claim_pending(tokens if tree is None else [])
        if claimed is not None and len(claimed):
            return self._extend_claimed(list(tokens), claimed, last_only)
        start = len(self.tokens)
        if self.pad_rows and not self._unpadded:
            logits = self._padded_forward(list(tokens), tree)
            logits = logits[-1:] if last_only else logits
        else:
            logits = self._forward(list(tokens), start, last_only, tree)
        self.tokens.extend(tokens)
        self._last = (start, None if tree is None else list(tree))
        return logits.float()

    def _forward(self, tokens: list[int], start: int, last_only: bool, tree: Sequence[int] | None) -> torch.Tensor:
        ids = torch.tensor([tokens], dtype=torch.long, device=self.device)
        extra = {} if tree is None else self._tree_inputs(start, list(tree))
        with torch.inference_mode():
            # logits_to_keep=0 means "every position" in transformers.
            out = self.model(input_ids=ids, past_key_values=self.cache, use_cache=True,
                             logits_to_keep=1 if last_only else 0, **extra)
        return out.logits[0]

    def _padded_forward(self, tokens: list[int], tree: Sequence[int] | None) -> torch.Tensor:
        """Forwards of exactly ``pad_rows`` rows: a chain in blocks (each block sees the ones before
        it through the cache, as consecutive forwards do), filled with pad rows that no real row
        attends to (after it causally, or beside the tree as roots of their own) and cropped from
        the cache at once. A tree longer than a block goes in one forward of the next multiple of
        it: a shape plain decoding never runs, so its rows may round differently."""
        pad, out = self.pad_rows, []
        blocks = [tokens[i:i + pad] for i in range(0, len(tokens), pad)] if tree is None else [tokens]
        start = len(self.tokens)
        for block in blocks:
            fill = -len(block) % pad
            padded_tree = None if tree is None else list(tree) + [-1] * fill
            logits = self._forward(block + [block[-1]] * fill, start, False, padded_tree)
            if fill:
                self.cache.crop(-fill)
            out.append(logits[:len(block)])
            start += len(block)
        return torch.cat(out) if len(out) > 1 else out[0]

    def prefill(self, tokens: Sequence[int]) -> int:
        # A prompt runs in one forward, padded or not: plain and speculative decoding prefill the
        # same prompt the same way, and blocks of pad_rows would make a long prompt slow.
        self._unpadded = True
        try:
            return super().prefill(tokens)
        finally:
            self._unpadded = False

    def _extend_claimed(self, tokens: list[int], claimed: torch.Tensor, last_only: bool) -> torch.Tensor:
        """Extend whose first tokens' hidden states are already computed: the layers run only on
        the rest, and the full head on all of them at once."""
        start = len(self.tokens) - len(claimed)
        rest = tokens[len(claimed):]
        hidden = torch.cat([claimed, self._forward_body(rest)]) if rest else claimed
        self._last = (start, None)
        return self.head(hidden[-1:] if last_only else hidden)

    def _tree_inputs(self, start: int, tree: list[int]) -> dict:
        """``position_ids`` by depth and the attention mask(s) for scoring ``tree`` after ``start`` tokens."""
        n = len(tree)
        positions = torch.tensor([start + d - 1 for d in trees.depths(tree)])
        ancestors = trees.ancestor_mask(tree)
        full = torch.cat([torch.ones(n, start, dtype=torch.bool), ancestors], dim=1)
        masks = {"full_attention": full}
        if self._sliding:
            # A sliding layer returns its cached rows from kv_offset on (the last window - 1 once
            # full), then the new rows; a node at position P sees keys at positions > P - window.
            full_layer = start >= self._window
            offset = start - self._window + 1 if full_layer else 0
            cached = torch.arange(offset, start)
            visible = (positions[:, None] - cached[None, :]) < self._window
            # The window holds for ancestors too: a branch deeper than it forgets its own start.
            near = (positions[:, None] - positions[None, :]) < self._window
            masks["sliding_attention"] = torch.cat([visible, ancestors & near], dim=1)
        masks = {kind: self._mask_format(m.to(self.device)) for kind, m in masks.items()}
        mask = masks if self._layer_types and len(masks) > 1 else masks["full_attention"]
        return {"attention_mask": mask, "position_ids": positions[None, :].to(self.device)}

    def _mask_format(self, allowed: torch.Tensor) -> torch.Tensor:
        """``[n, kv]`` bool (True = may attend) as the attention implementation wants it, ``[1, 1, n, kv]``."""
        if self._mask_style == "bool":
            return allowed[None, None]
        dtype = self.model.dtype
        return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed, torch.finfo(dtype).min)[None, None]

    def truncate(self, length: int, keep: Sequence[int] | None = None) -> None:
        check_truncate(length, self.length)
        self._pending = torch.zeros(0, 0)  # its rows go with the crop below (one crop: see reset)
        start, tree = self._last
        self._last = (start, None)
        if keep is not None:
            check_keep(tree, start, length, keep)
            self._keep_rows(start, list(keep))
            return
        if tree is not None and length > start:
            check_keep(tree, start, start, list(range(length - start)))
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

    def _keep_rows(self, start: int, keep: list[int]) -> None:
        """Compact every layer to the cached prefix plus the kept rows of the last (tree) extend."""
        added = len(self.tokens) - start
        for layer in self.cache.layers:
            rows = layer.keys.shape[-2]
            index = torch.tensor(list(range(rows - added)) + [rows - added + o for o in keep], device=layer.keys.device)
            layer.keys = layer.keys.index_select(-2, index)
            layer.values = layer.values.index_select(-2, index)
            if hasattr(layer, "cumulative_length"):
                layer.cumulative_length -= added - len(keep)
        self.tokens[start:] = [self.tokens[start + o] for o in keep]
        if self._sliding:
            self.cache.crop(0)  # trims the recorded sliding rows back to the window
            if len(self.tokens) >= self._window:
                self._floor = len(self.tokens)
