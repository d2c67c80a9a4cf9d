"""A KV cache of fixed size that transformers models write into by slot, and the attention mask
that goes with it: what lets one captured CUDA graph serve every step of a sequence.

A forward writes its rows' keys and values at the slots it is given (``cache.slots``, a device
tensor the caller fills before the forward, inside a graph too) and attends over the whole
buffer through a mask built on the device from the same inputs, so nothing about a step is a
host-side shape: rolling back is forgetting how far the buffer is valid (stale slots are masked
until they are overwritten, gpt-fast's ``KVCache``), and keeping a tree's path moves its rows
into place (Medusa's ``KVCache.copy``). Slot i always holds position i, as a growing cache would,
so a row sees its keys at the same places whether or not a rejected draft passed through.
"""

from __future__ import annotations

import functools

import torch


def slot_cache(config, capacity: int, device: torch.device, dtype: torch.dtype):
    """A transformers ``Cache`` of ``capacity`` positions per layer, written at ``cache.slots``.

    ``cache.visible`` (None: the whole buffer) is how many leading slots an eager forward hands to
    attention: on a CPU that keeps a step's attention the shape a growing cache gives it."""
    layer_type = _types()[0]
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    cache = _types()[1](layers=[layer_type() for _ in range(config.num_hidden_layers)])
    for layer in cache.layers:
        layer.owner = cache
        # Ordinary tensors even when made under inference mode: they are written in and out of it.
        with torch.inference_mode(False):
            layer.keys = torch.zeros(1, heads, capacity, head_dim, device=device, dtype=dtype)
            layer.values = torch.zeros(1, heads, capacity, head_dim, device=device, dtype=dtype)
        if device.type == "cuda":  # a compiled step serves every capacity: one compile, not one per size
            torch._dynamo.maybe_mark_dynamic(layer.keys, 2)
            torch._dynamo.maybe_mark_dynamic(layer.values, 2)
    cache.slots = torch.zeros(0, dtype=torch.long, device=device)
    cache.visible = None
    cache.capacity = capacity
    return cache


def grown(cache, config, capacity: int, valid: int):
    """A cache of ``capacity`` slots holding the first ``valid`` slots of ``cache``."""
    layer = cache.layers[0]
    bigger = slot_cache(config, capacity, layer.keys.device, layer.keys.dtype)
    for old, new in zip(cache.layers, bigger.layers):
        new.keys[:, :, :valid] = old.keys[:, :, :valid]
        new.values[:, :, :valid] = old.values[:, :, :valid]
    return bigger


def move_rows(cache, source: torch.Tensor, target: torch.Tensor) -> None:
    """Copy every layer's keys and values at slots ``source`` to slots ``target`` (all read before
    any is written, so the two may overlap)."""
    for layer in cache.layers:
        layer.keys.index_copy_(2, target, layer.keys.index_select(2, source))
        layer.values.index_copy_(2, target, layer.values.index_select(2, source))


@functools.cache
def _types():
    # Built on first use: transformers is imported only by code that runs a model.
    from transformers.cache_utils import Cache, CacheLayerMixin

    class SlotLayer(CacheLayerMixin):
        """One layer's keys and values ``[1, heads, capacity, head_dim]``, allocated up front."""

        is_compileable = True
        is_sliding = False  # sliding windows are the mask's job: every position is kept

        def __init__(self) -> None:
            super().__init__()
            self.is_initialized = True
            self.owner = None

        def lazy_initialization(self, key_states, value_states) -> None:  # allocated by slot_cache
            pass

        def update(self, key_states, value_states, *args, **kwargs):
            slots = self.owner.slots
            self.keys.index_copy_(2, slots, key_states)
            self.values.index_copy_(2, slots, value_states)
            visible = self.owner.visible
            if visible is None:
                return self.keys, self.values
            return self.keys[:, :, :visible], self.values[:, :, :visible]

        def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
            return self.keys.shape[2], 0

        def get_seq_length(self) -> int:
            return 0  # positions are always given: nothing reads this to place a token

        def get_max_length(self) -> int:
            return self.keys.shape[2]

    class SlotCache(Cache):
        """The layers of one sequence; ``slots`` says where the next forward writes."""

    return SlotLayer, SlotCache


def attention_mask(slots: torch.Tensor, positions: torch.Tensor, block: torch.Tensor, width: int,
                   window: int = 0) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``[rows, width]`` bool (True = may attend) for rows written at ``slots`` ``[rows]`` at
    ``positions`` ``[rows]``: every slot before the first row's (the cached prefix), and of this
    forward's own rows those ``block`` ``[rows, rows]`` allows (causal for a chain, ancestors for a
    tree). With a sliding ``window``, also the mask of the sliding layers. Device ops only: a
    captured graph rebuilds it from its inputs at every replay."""
    keys = torch.arange(width, device=slots.device)
    rows = slots.shape[0]
    mask = (keys < slots[0]).unsqueeze(0).expand(rows, width).clone()
    mask.scatter_(1, slots.unsqueeze(0).expand(rows, rows), block)
    if not window:
        return mask, None
    # A cached key's position is its slot; this forward's own keys are at their rows' positions.
    key_positions = keys.scatter(0, slots, positions)
    near = (positions.unsqueeze(1) - key_positions.unsqueeze(0)) < window
    return mask, mask & near
