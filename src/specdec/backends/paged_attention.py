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
SPLIT = 256  # keys per program (a multiple of PAGE)
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
    """The same as :func:`reference_attention`, reading only the held pages (see the module)."""
    if softcap:
        raise SpecdecError("the paged Triton kernel has no attention soft-capping (Gemma 2): "
                           "SPECDEC_PAGED_KERNEL=reference")
    triton = _triton()
    kernel = _kernel()
    b, heads, rows, dim = query.shape
    keys_, skp, skt, skh, kv_heads, _ = _keys_view(keys, meta.layout)
    _, svp, svt, svh, _, _ = _keys_view(values, meta.layout)
    group = heads // kv_heads
    m = max(16, triton.next_power_of_2(group * rows))
    pages = meta.table.shape[1]
    splits = -(-pages * PAGE // SPLIT)
    acc = torch.empty(b, kv_heads, splits, m, dim, device=query.device, dtype=torch.float32)
    top = torch.empty(b, kv_heads, splits, m, device=query.device, dtype=torch.float32)
    total = torch.empty_like(top)
    q = query.contiguous()
    block = meta.block.to(torch.int8).contiguous()
    kernel[(b * kv_heads, splits)](
        q, keys_, values, meta.table, meta.start, block, meta.positions, acc, top, total,
        q.stride(0), q.stride(1), q.stride(2), skp, skt, skh, svp, svt, svh, meta.table.stride(0),
        meta.positions.stride(0), scale, window,
        KV_HEADS=kv_heads, GROUP=group, R=rows, D=dim, M=m, PAGE_SIZE=PAGE, SPLIT_SIZE=SPLIT, WINDOW=bool(window))
    best = top.amax(2, keepdim=True)
    best = torch.where(torch.isinf(best), torch.zeros_like(best), best)
    share = torch.exp(top - best)  # 0 for a split with nothing visible
    out = (acc * share.unsqueeze(-1)).sum(2) / (total * share).sum(2).clamp_min(1e-30).unsqueeze(-1)
    out = out[:, :, :group * rows].reshape(b, kv_heads, group, rows, dim).reshape(b, heads, rows, dim)
    return out.transpose(1, 2).to(query.dtype)


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
    run = triton_attention if specdec_paged.kernel == "triton" else reference_attention
    return run(query, key, value, specdec_paged, scale, window, softcap), None


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


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def split_kernel(Q, K, V, TABLE, START, BLOCK, POS, ACC, TOP, TOTAL,
                     sqb, sqh, sqr, skp, skt, skh, svp, svt, svh, stb, spb, scale, window,
                     KV_HEADS: tl.constexpr, GROUP: tl.constexpr, R: tl.constexpr, D: tl.constexpr,
                     M: tl.constexpr, PAGE_SIZE: tl.constexpr, SPLIT_SIZE: tl.constexpr, WINDOW: tl.constexpr):
        pid = tl.program_id(0)
        split = tl.program_id(1)
        splits = tl.num_programs(1)
        b = pid // KV_HEADS
        h = pid % KV_HEADS
        start = tl.load(START + b).to(tl.int32)
        end = start + R
        lo = split * SPLIT_SIZE
        hi = tl.minimum(lo + SPLIT_SIZE, end)

        rows = tl.arange(0, M)
        real = rows < GROUP * R
        g = rows // R
        r = rows % R
        dims = tl.arange(0, D)
        q = tl.load(Q + b * sqb + (h * GROUP + g)[:, None] * sqh + r[:, None] * sqr + dims[None, :],
                    mask=real[:, None], other=0.0)
        pos = tl.load(POS + b * spb + r, mask=real, other=0)

        top = tl.full([M], float("-inf"), tl.float32)
        total = tl.zeros([M], tl.float32)
        acc = tl.zeros([M, D], tl.float32)
        offs = tl.arange(0, PAGE_SIZE)
        for first in range(lo, hi, PAGE_SIZE):
            page = tl.load(TABLE + b * stb + first // PAGE_SIZE).to(tl.int64)
            k = tl.load(K + page * skp + offs[:, None] * skt + h * skh + dims[None, :])
            v = tl.load(V + page * svp + offs[:, None] * svt + h * svh + dims[None, :])
            s = tl.dot(q, tl.trans(k)).to(tl.float32) * scale  # [M, PAGE]
            slot = first + offs
            col = slot - start
            mine = (col >= 0) & (col < R)
            seen = tl.load(BLOCK + b * R * R + r[:, None] * R + col[None, :],
                           mask=real[:, None] & mine[None, :], other=0)
            allowed = (slot[None, :] < start) | (seen != 0)
            if WINDOW:
                key_pos = tl.load(POS + b * spb + col, mask=mine, other=0)
                key_pos = tl.where(mine, key_pos, slot)
                allowed = allowed & ((pos[:, None] - key_pos[None, :]) < window)
            allowed = allowed & real[:, None]
            s = tl.where(allowed, s, float("-inf"))
            new_top = tl.maximum(top, tl.max(s, 1))
            safe = tl.where(new_top == float("-inf"), 0.0, new_top)
            p = tl.exp(s - safe[:, None])
            alpha = tl.exp(top - safe)
            total = total * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v).to(tl.float32)
            top = new_top
        at = (b * KV_HEADS + h) * splits + split
        tl.store(TOP + at * M + rows, top)
        tl.store(TOTAL + at * M + rows, total)
        tl.store(ACC + at * M * D + rows[:, None] * D + dims[None, :], acc)

    return split_kernel
