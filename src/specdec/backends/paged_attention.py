"""Decoding attention that reads only the key slots each sequence holds: a step's cost follows the
sequence's length, not its buffer's capacity.

A decoding forward gives every sequence ``R`` rows written at consecutive slots ``start ..
start + R - 1``; a row sees every cached slot before ``start`` and those of the forward's own rows
its ``block`` allows (causal for a chain, ancestors for a tree). Keys live in pages of
:data:`PAGE` slots, found through a page table (a static cache is the table ``0, 1, 2, ...`` over
its one buffer), so one kernel serves a server's shared pool (:mod:`specdec.backends.kv_pool`)
and a single sequence's static cache (:mod:`specdec.backends.hf_static`).

Two implementations of the same arithmetic:

* :func:`triton_attention` (CUDA, the default there): one program per (sequence, key-value head,
  split of :data:`SPLIT` keys) walks the held pages of its split only, with an online softmax
  (flash-decoding, Dao et al. 2023); the splits are combined by their softmax statistics. Query
  heads that share a key-value head are rows of one program, so keys are read once per group.
* :func:`reference_attention` (PyTorch ops; CPUs and tests): every slot of the table gathered and
  masked, the same result up to rounding.

Both are batch-invariant: a row's result depends on its sequence's keys and length alone, never
on which other sequences share the forward (the split boundaries are fixed multiples of
:data:`SPLIT` and the splits are summed in a fixed order), so batching cannot change a token. A
process uses one of them for every decoding step (:func:`choice`), or rounding could part two
runs of the same request.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch

from specdec.errors import SpecdecError

NAME = "specdec_paged"  # its name in transformers' attention registry
PAGE = 64  # slots per page
# Keys per program (a multiple of PAGE): one page, so a long sequence's keys spread over many
# programs (a few key-value heads would otherwise leave most of a GPU idle after a long prompt).
SPLIT = 64
KERNELS = ("triton", "reference")


@dataclass
class PagedMeta:
    """What a decoding forward's attention reads besides queries and keys, all device tensors that a
    captured graph's inputs hold: ``table`` ``[B, pages]`` (each sequence's pages, in order),
    ``start`` ``[B]`` (slots held before this forward), ``block`` ``[B, R, R]`` (which of the
    forward's rows a row sees), ``positions`` ``[B, R]`` (each row's position, for sliding windows).
    ``layout``: ``"pool"`` for a pool ``[pages, PAGE, kv_heads, d]`` (:mod:`kv_pool`), ``"static"``
    for one sequence's buffer ``[1, kv_heads, capacity, d]``."""

    table: torch.Tensor
    start: torch.Tensor
    block: torch.Tensor
    positions: torch.Tensor
    layout: str = "pool"
    kernel: str = "reference"


def choice(device: torch.device) -> str:
    """The kernel of every decoding step in this process: ``SPECDEC_PAGED_KERNEL`` if set, else
    Triton on CUDA (when it imports) and the reference elsewhere. Decided once per process."""
    return _choice(device.type)


@functools.cache
def _choice(kind: str) -> str:
    wanted = os.environ.get("SPECDEC_PAGED_KERNEL")
    if wanted is not None and wanted not in KERNELS:
        raise SpecdecError(f"SPECDEC_PAGED_KERNEL must be one of {', '.join(KERNELS)}, got {wanted!r}")
    if wanted == "triton" or (wanted is None and kind == "cuda"):
        if _triton() is None:
            if wanted == "triton":
                raise SpecdecError("SPECDEC_PAGED_KERNEL=triton, but Triton does not import here")
            return "reference"
        return "triton"
    return "reference"


def _keys_view(keys: torch.Tensor, layout: str) -> tuple[torch.Tensor, int, int, int, int, int]:
    """``keys`` with (page, slot-in-page, head) strides and its kv heads and head dim."""
    if layout == "pool":  # [pages, PAGE, kv_heads, d]
        return keys, keys.stride(0), keys.stride(1), keys.stride(2), keys.shape[2], keys.shape[3]
    # one sequence's [1, kv_heads, capacity, d]: page p starts at slot p * PAGE
    return keys, PAGE * keys.stride(2), keys.stride(2), keys.stride(1), keys.shape[1], keys.shape[3]


def gathered(keys: torch.Tensor, table: torch.Tensor, layout: str) -> torch.Tensor:
    """``[B, kv_heads, pages * PAGE, d]``: each sequence's slots in order, read through ``table``."""
    if layout == "pool":
        b, pages = table.shape
        picked = keys[table.reshape(-1)]  # [B * pages, PAGE, kv_heads, d]
        return picked.view(b, pages * PAGE, keys.shape[2], keys.shape[3]).transpose(1, 2)
    width = table.shape[1] * PAGE
    return keys[:, :, :width].expand(table.shape[0], -1, -1, -1)


def visible(meta: PagedMeta, width: int, window: int = 0) -> torch.Tensor:
    """``[B, R, width]`` bool: which slots each row may attend (device ops only)."""
    start, block, positions = meta.start, meta.block.bool(), meta.positions
    b, rows = positions.shape
    keys = torch.arange(width, device=start.device)
    cached = keys.view(1, 1, -1) < start.view(-1, 1, 1)  # [B, 1, width]
    offset = keys.view(1, -1) - start.view(-1, 1)  # [B, width]: the forward's row at this slot
    own = (offset >= 0) & (offset < rows)
    index = offset.clamp(0, rows - 1).view(b, 1, width).expand(b, rows, width)
    mine = torch.gather(block, 2, index) & own.view(b, 1, width)
    allowed = cached.expand(b, rows, width) | mine
    if window:
        key_positions = torch.where(own, torch.gather(positions, 1, offset.clamp(0, rows - 1)), keys.view(1, -1))
        allowed = allowed & ((positions.view(b, rows, 1) - key_positions.view(b, 1, width)) < window)
    return allowed


def reference_attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, meta: PagedMeta,
                        scale: float, window: int = 0, softcap: float | None = None) -> torch.Tensor:
    """``query`` ``[B, heads, R, d]`` against every slot of the table, masked; ``[B, R, heads, d]``."""
    k, v = gathered(keys, meta.table, meta.layout), gathered(values, meta.table, meta.layout)
    b, heads, rows, dim = query.shape
    kv_heads, width = k.shape[1], k.shape[2]
    group = heads // kv_heads
    q = query.reshape(b, kv_heads, group * rows, dim)
    wide = torch.promote_types(query.dtype, torch.float32)
    scores = torch.matmul(q, k.transpose(2, 3)).to(wide) * scale  # [B, kv_heads, group*R, width]
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    allowed = visible(meta, width, window)  # [B, R, width]
    allowed = allowed.unsqueeze(1).unsqueeze(1).expand(b, 1, group, rows, width).reshape(b, 1, group * rows, width)
    scores = scores.masked_fill(~allowed, float("-inf"))
    top = scores.amax(-1, keepdim=True)
    top = torch.where(torch.isinf(top), torch.zeros_like(top), top)
    weights = torch.exp(scores - top)
    total = weights.sum(-1, keepdim=True)
    out = torch.matmul(weights.to(v.dtype), v).to(wide) / total.clamp_min(torch.finfo(wide).tiny)
    return out.view(b, heads, rows, dim).transpose(1, 2).to(query.dtype)


def triton_attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, meta: PagedMeta,
                     scale: float, window: int = 0, softcap: float | None = None) -> torch.Tensor:
    """The same as :func:`reference_attention`, reading only the held pages (see the module):
    :mod:`specdec.backends.paged_triton`'s two kernels."""
    if softcap:
        raise SpecdecError("the paged Triton kernel has no attention soft-capping (Gemma 2): "
                           "SPECDEC_PAGED_KERNEL=reference")
    from specdec.backends import paged_triton

    b, heads, rows, dim = query.shape
    keys_, skp, skt, skh, kv_heads, _ = _keys_view(keys, meta.layout)
    _, svp, svt, svh, _, _ = _keys_view(values, meta.layout)
    group = heads // kv_heads
    m = max(16, 1 << (group * rows - 1).bit_length())
    splits = -(-meta.table.shape[1] * PAGE // SPLIT)
    acc = torch.empty(b, kv_heads, splits, m, dim, device=query.device, dtype=torch.float32)
    top = torch.empty(b, kv_heads, splits, m, device=query.device, dtype=torch.float32)
    total = torch.empty_like(top)
    q = query.contiguous()
    block = meta.block.to(torch.int8).contiguous()
    big = m * dim >= 128 * 128  # the accumulator's registers: more warps, or it spills
    paged_triton.split_kernel[(b * kv_heads, splits)](
        q, keys_, values, meta.table, meta.start, block, meta.positions, acc, top, total,
        q.stride(0), q.stride(1), q.stride(2), skp, skt, skh, svp, svt, svh, meta.table.stride(0),
        meta.positions.stride(0), scale, window,
        KV_HEADS=kv_heads, GROUP=group, R=rows, D=dim, M=m, PAGE_SIZE=PAGE, SPLIT_SIZE=SPLIT, WINDOW=bool(window),
        num_warps=8 if big else 4)
    out = torch.empty(b, rows, heads, dim, device=query.device, dtype=query.dtype)
    # Small blocks: more programs share a long sequence's splits (6 would read the 1.5B's 4 MB a layer
    # after 2,000 tokens); the blocks change which program sums an element, never how.
    block_m, block_d = 16, min(64, dim)
    paged_triton.combine_kernel[(b * kv_heads, -(-group * rows // block_m), dim // block_d)](
        acc, top, total, meta.start, out, splits, out.stride(0), out.stride(1), out.stride(2),
        KV_HEADS=kv_heads, GROUP=group, R=rows, D=dim, M=m, BLOCK_M=block_m, BLOCK_D=block_d, SPLIT_SIZE=SPLIT,
        UNROLL=8, num_warps=4)
    return out


def paged_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                    softcap: float | None = None, sliding_window: int | None = None,
                    specdec_paged: PagedMeta | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature; ``key`` and ``value`` are the whole buffer the
    cache returned (a pool or a static cache), ``specdec_paged`` says where each sequence's slots
    are. ``attention_mask`` is not read: the mask is :func:`visible`'s."""
    if specdec_paged is None:
        raise SpecdecError("paged attention needs the forward's PagedMeta (specdec_paged=...)")
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    window = int(sliding_window or 0)
    meta = specdec_paged
    if meta.kernel == "triton":
        if softcap:
            raise SpecdecError("the paged Triton kernel has no attention soft-capping (Gemma 2): "
                               "SPECDEC_PAGED_KERNEL=reference")
        return _triton_op(query, key, value, meta.table, meta.start, meta.block, meta.positions, float(scale), window,
                          meta.layout), None
    return reference_attention(query, key, value, meta, scale, window, softcap), None


# The Triton kernels as one opaque operator: torch.compile fuses everything around it and calls it
# as it is (a graph captures its launches), rather than compiling user kernels itself.
@torch.library.custom_op("specdec::paged_attention", mutates_args=())
def _triton_op(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, table: torch.Tensor,
               start: torch.Tensor, block: torch.Tensor, positions: torch.Tensor, scale: float, window: int,
               layout: str) -> torch.Tensor:
    return triton_attention(query, keys, values, PagedMeta(table, start, block, positions, layout, "triton"),
                            scale, window)


@_triton_op.register_fake
def _(query, keys, values, table, start, block, positions, scale, window, layout):
    b, heads, rows, dim = query.shape
    return query.new_empty(b, rows, heads, dim)


@functools.cache
def registered() -> str:
    """Register :func:`paged_attention` with transformers (once); its name."""
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, paged_attention)
    return NAME


@functools.cache
def _triton():
    try:
        import triton
    except ImportError:
        return None
    return triton
