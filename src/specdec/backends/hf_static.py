"""transformers on a static KV cache, every decoding forward replayed from a captured CUDA graph.

The same sequence semantics as :class:`specdec.backends.hf.HFBackend` (chains, trees, rollback,
self-speculation's pending rows), with a cache of fixed size written by slot
(:mod:`specdec.backends.static_cache`), so that a step is: fill one small pinned buffer (tokens,
positions, slots, which rows see which), copy it over, replay the graph of that many rows
(:mod:`specdec.backends.cuda_graphs`), read the logits. With exact on, every forward has the one
padded shape, so one graph per sequence serves plain decoding and verification alike. Prompts are
prefilled eagerly (their length varies), in chunks, the same way for plain and speculative runs.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence

import numpy as np
import torch

from specdec import tree as trees
from specdec.backends import paged_attention
from specdec.backends.base import check_keep, check_truncate
from specdec.backends.cuda_graphs import Replay, compiled
from specdec.backends.decode_attention import registered
from specdec.backends.hf import HFBackend
from specdec.backends.static_cache import attention_mask, grown, move_rows, slot_cache
from specdec.errors import SpecdecError

MIN_CAPACITY = 256  # capacities are powers of two from here: few graphs, attention at most twice the need
PREFILL_CHUNK = 1024  # prompt rows per eager forward (its mask is rows x capacity)
# Graph sizes of unpadded (--no-exact) forwards: n rows run in the next one. A GPU's forward is
# memory-bound, so 2 to 16 rows cost about what 16 do: only a lone row (a plain step, a draft
# model's step) pays for a shape of its own, and each size is one more compile.
BUCKETS = (1, 16, 32, 64)
ATTENTION = ("sdpa", "split", "paged")


class StaticModel:
    """What the sequences of one model share: the step function (compiled once on a GPU), how the
    model wants its mask, and the attention its decoding steps run: ``sdpa`` (the model's own over
    the whole buffer), ``split`` (:mod:`specdec.backends.decode_attention`) or ``paged``
    (:mod:`specdec.backends.paged_attention`: only the slots the sequence holds); default:
    ``SPECDEC_ATTENTION``, else paged on a GPU where Triton imports and sdpa elsewhere. Prompts are
    prefilled with the model's own attention either way."""

    def __init__(self, model, compile: bool | None = None, attention: str | None = None) -> None:
        self.model = model
        config = model.config
        self.window = getattr(config, "sliding_window", None) or 0
        self.layer_types = list(getattr(config, "layer_types", None) or [])
        self.sliding = self.window > 0 and any("sliding" in str(t) for t in self.layer_types)
        self.additive = getattr(config, "_attn_implementation", None) == "eager"
        self.attention = attention or os.environ.get("SPECDEC_ATTENTION") or _default_attention(model.device)
        if self.attention not in ATTENTION:
            raise SpecdecError(f"SPECDEC_ATTENTION must be one of {', '.join(ATTENTION)}, got {self.attention!r}")
        self.kernel = paged_attention.choice(model.device)
        self.step = compiled(self.forward, model.device, compile)
        self.paged_step = compiled(self.paged_forward, model.device, compile)

    def decode(self, cache, ids: torch.Tensor, positions: torch.Tensor, block: torch.Tensor) -> torch.Tensor:
        """:meth:`forward` (compiled) as a decoding step runs it: with the step's attention."""
        if self.attention == "sdpa":
            return self.step(cache, ids, positions, block)
        config = self.model.config
        before = config._attn_implementation
        # read by every layer at call time (and at capture)
        config._attn_implementation = registered() if self.attention == "split" else paged_attention.registered()
        try:
            if self.attention == "paged":
                return self.paged_step(cache, ids, positions, block)
            return self.step(cache, ids, positions, block)
        finally:
            config._attn_implementation = before

    def paged_forward(self, cache, ids: torch.Tensor, positions: torch.Tensor, block: torch.Tensor) -> torch.Tensor:
        """:meth:`forward` with :mod:`paged_attention` reading the buffer as pages in order, only as
        far as the sequence holds (its first slot is the cached length; no mask over the buffer)."""
        table = torch.arange(cache.layers[0].keys.shape[2] // paged_attention.PAGE, device=ids.device)[None]
        meta = paged_attention.PagedMeta(table, cache.slots[:1], block.bool()[None], positions, "static", self.kernel)
        placeholder = torch.ones(1, 1, 1, 1, dtype=torch.bool, device=ids.device)
        mask = ({"full_attention": placeholder, "sliding_attention": placeholder} if self.sliding else placeholder)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                         use_cache=True, specdec_paged=meta)
        return out.logits[0].float()

    def forward(self, cache, ids: torch.Tensor, positions: torch.Tensor, block: torch.Tensor,
                last: int = 0) -> torch.Tensor:
        """Float32 logits ``[rows, V]`` (``[last, V]``: of the last rows only) of ``ids``
        ``[1, rows]`` at ``positions`` ``[1, rows]``, written at ``cache.slots``, each row seeing
        the cache before the first slot and the rows ``block`` ``[rows, rows]`` allows."""
        mask = self.masks(cache, positions[0], block)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                         use_cache=True, logits_to_keep=last)
        return out.logits[0].float()

    def body(self, cache, ids: torch.Tensor, positions: torch.Tensor, block: torch.Tensor,
             last: int = 0) -> torch.Tensor:
        """The final hidden states ``[rows, H]`` (no LM head), written into the cache like :meth:`forward`."""
        mask = self.masks(cache, positions[0], block)
        out = self.model.get_decoder()(input_ids=ids, attention_mask=mask, position_ids=positions,
                                       past_key_values=cache, use_cache=True)
        return out.last_hidden_state[0]

    def masks(self, cache, positions: torch.Tensor, block: torch.Tensor):
        width = cache.visible if cache.visible is not None else cache.layers[0].keys.shape[2]
        full, sliding = attention_mask(cache.slots, positions, block.bool(), width, self.window if self.sliding else 0)
        if sliding is None:
            return self._format(full)
        return {"full_attention": self._format(full), "sliding_attention": self._format(sliding)}

    def _format(self, allowed: torch.Tensor) -> torch.Tensor:
        """``[1, 1, rows, width]``: bool for SDPA; 0 / the dtype's minimum for eager attention (which
        adds the mask to its scores: a bool mask there would mask nothing)."""
        if not self.additive:
            return allowed[None, None]
        dtype = self.model.dtype
        return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(
            ~allowed, torch.finfo(dtype).min)[None, None]


def _default_attention(device: torch.device) -> str:
    return "paged" if paged_attention.choice(device) == "triton" else "sdpa"


class _Graph:
    """The static buffers and the replay of one forward size."""

    def __init__(self, backend: HFStaticBackend, rows: int) -> None:
        device = backend.device
        size = 3 * rows + rows * rows
        pinned = device.type == "cuda"
        self.host = torch.zeros(size, dtype=torch.long, pin_memory=pinned)
        self.array = self.host.numpy()
        self.inputs = torch.zeros(size, dtype=torch.long, device=device)
        self.ids = self.inputs[:rows].view(1, rows)
        self.positions = self.inputs[rows:2 * rows].view(1, rows)
        self.slots = self.inputs[2 * rows:3 * rows]
        self.block = self.inputs[3 * rows:].view(rows, rows)
        self.copied = torch.cuda.Event() if pinned else None
        self.rows = rows
        cache, shared = backend.cache, backend.shared

        # Captured on the first replay, after its inputs were filled: the warm-up runs write the
        # slots that step writes anyway.
        def step() -> torch.Tensor:
            cache.slots = self.slots
            return shared.decode(cache, self.ids, self.positions, self.block)

        self.replay = Replay(step, device)

    def fill(self, ids, positions, slots, block) -> None:
        rows, a = self.rows, self.array
        if self.copied is not None:
            self.copied.synchronize()  # the last copy out of this pinned buffer has left it
        a[:rows] = ids
        a[rows:2 * rows] = positions
        a[2 * rows:3 * rows] = slots
        a[3 * rows:] = block.reshape(-1)
        self.inputs.copy_(self.host, non_blocking=True)
        if self.copied is not None:
            self.copied.record()


class HFStaticBackend(HFBackend):
    """One sequence on a transformers causal LM over a static KV cache (see the module's docstring).

    ``pad_rows`` as for :class:`HFBackend`; unpadded forwards run in the graph of the next size in
    :data:`BUCKETS`. ``attend_used`` (CPU tests) hands attention only the slots in use, as a
    growing cache would, instead of the whole buffer a graph needs; the rest is the same code.
    """

    def __init__(self, model, pad_rows: int = 0, shared: StaticModel | None = None, attend_used: bool = False) -> None:
        self.shared = shared or StaticModel(model, compile=False)
        self.attend_used = attend_used
        self.cache = None
        self._graphs: dict[int, _Graph] = {}
        self._tril: dict[int, np.ndarray] = {}
        super().__init__(model, pad_rows)
        self.pad_rows = pad_rows  # every position stays in the cache: sliding layers pad too
        self.max_tree = pad_rows or None

    # -- capacity ---------------------------------------------------------------------------------
    def reserve(self, tokens: int, cancelled: threading.Event | None = None) -> None:
        self._ensure(tokens + max(self.pad_rows, BUCKETS[-1]))

    def _ensure(self, end: int, valid: int | None = None) -> None:
        """Room for slots up to ``end``: a cache twice as large (graphs recaptured) when there is
        not, holding the first ``valid`` slots (default: the sequence's; a forward in blocks has
        written more than its tokens say)."""
        if self.cache is not None and end <= self.cache.capacity:
            return
        capacity = max(MIN_CAPACITY, 1 << (end - 1).bit_length())
        config, dtype = self.model.config, self.model.dtype
        if self.cache is None:
            self.cache = slot_cache(config, capacity, self.device, dtype)
        else:
            self.cache = grown(self.cache, config, capacity, len(self.tokens) if valid is None else valid)
        self._graphs = {}

    def reset(self) -> None:
        self.tokens: list[int] = []
        self._pending = torch.zeros(0, 0)
        self._floor = 0
        self._last: tuple[int, list[int] | None] = (0, None)

    # -- forwards ---------------------------------------------------------------------------------
    def _forward(self, tokens: list[int], start: int, last_only: bool, tree: Sequence[int] | None) -> torch.Tensor:
        if self._unpadded:  # a prompt
            logits = self._eager(tokens, start, tree, self.shared.forward, last_only)
        else:
            rows = next((b for b in BUCKETS if b >= len(tokens)), -(-len(tokens) // BUCKETS[-1]) * BUCKETS[-1])
            logits = self._graphed(tokens, start, tree, rows)
        return logits[-1:] if last_only else logits

    def _padded_forward(self, tokens: list[int], tree: Sequence[int] | None) -> torch.Tensor:
        pad, start = self.pad_rows, len(self.tokens)
        if tree is not None:
            return self._graphed(tokens, start, tree, -(-len(tokens) // pad) * pad)
        out = []
        for i in range(0, len(tokens), pad):
            out.append(self._graphed(tokens[i:i + pad], start + i, None, pad))
        return torch.cat(out) if len(out) > 1 else out[0]

    def _graphed(self, tokens: list[int], start: int, tree: Sequence[int] | None, rows: int) -> torch.Tensor:
        """Logits ``[n, V]`` of ``tokens`` after ``start`` cached ones, from the graph of ``rows``
        rows: the rest are pad rows that no real row sees (after them causally, or roots of their
        own beside a tree), left in slots that the next forward overwrites."""
        n = len(tokens)
        self._ensure(start + rows, valid=start)
        graph = self._graphs.get(rows)
        if graph is None:
            graph = self._graphs[rows] = _Graph(self, rows)
        ids = np.full(rows, tokens[-1], dtype=np.int64)
        ids[:n] = tokens
        slots = np.arange(start, start + rows)
        if tree is None:
            positions, block = slots, self._causal(rows)
        else:
            padded = list(tree) + [-1] * (rows - n)
            positions = start - 1 + np.asarray(trees.depths(padded))
            block = trees.ancestor_mask(padded).numpy()
        graph.fill(ids, positions, slots, block)
        self.cache.visible = start + rows if self.attend_used else None
        return graph.replay()[:n].clone()

    def _causal(self, rows: int) -> np.ndarray:
        if rows not in self._tril:
            self._tril[rows] = np.tril(np.ones((rows, rows), dtype=np.int64))
        return self._tril[rows]

    def _eager(self, tokens: list[int], start: int, tree: Sequence[int] | None, run, last_only: bool = False):
        """``run`` (logits or hidden states) over ``tokens`` without a graph, in chunks of
        :data:`PREFILL_CHUNK` rows for a chain (a tree in one)."""
        self._ensure(start + len(tokens), valid=start)
        chunk = len(tokens) if tree is not None else PREFILL_CHUNK
        out = []
        for i in range(0, len(tokens), chunk):
            part, at = tokens[i:i + chunk], start + i
            n = len(part)
            slots = torch.arange(at, at + n, device=self.device)
            if tree is None:
                positions, block = slots, torch.ones(n, n, dtype=torch.bool, device=self.device).tril()
            else:
                positions = at - 1 + torch.tensor(trees.depths(list(tree)), device=self.device)
                block = trees.ancestor_mask(list(tree)).to(self.device)
            self.cache.slots = slots
            self.cache.visible = at + n if self.attend_used else None
            with torch.inference_mode():
                ids = torch.tensor([part], dtype=torch.long, device=self.device)
                # A prompt's logits are read at its last row only: the LM head of a long prompt's
                # every row would be most of its memory.
                result = run(self.cache, ids, positions[None], block, 1 if last_only else 0)
            out.append(result[-1:] if last_only else result)
        return out[-1] if last_only else torch.cat(out) if len(out) > 1 else out[0]

    def _forward_body(self, tokens: list[int]) -> torch.Tensor:
        hidden = self._eager(tokens, len(self.tokens), None, self.shared.body)
        self.tokens.extend(tokens)
        return hidden

    # -- rollback ---------------------------------------------------------------------------------
    def _drop_pending(self, count: int) -> None:
        if count:
            del self.tokens[-count:]
        self._pending = torch.zeros(0, 0)

    def truncate(self, length: int, keep: Sequence[int] | None = None) -> None:
        check_truncate(length, self.length)
        self._pending = torch.zeros(0, 0)
        start, tree = self._last
        self._last = (start, None)
        if keep is not None:
            check_keep(tree, start, length, keep)
            self._keep_rows(start, list(keep))
            return
        if tree is not None and length > start:
            check_keep(tree, start, start, list(range(length - start)))
        del self.tokens[length:]  # the slots past it are masked until overwritten

    def _keep_rows(self, start: int, keep: list[int]) -> None:
        moved = [(start + o, start + i) for i, o in enumerate(keep) if o != i]
        if moved:
            source, target = (torch.tensor(x, device=self.device) for x in zip(*moved))
            with torch.inference_mode():
                move_rows(self.cache, source, target)
        self.tokens[start:] = [self.tokens[start + o] for o in keep]
