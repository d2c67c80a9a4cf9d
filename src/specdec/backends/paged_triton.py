"""The Triton kernels of :mod:`specdec.backends.paged_attention` (imported only where Triton is).

Top-level functions, so that ``torch.compile`` can compile them in its worker processes (a kernel
made inside a function cannot be found there). Two launches a layer: :func:`split_kernel`, one
program per (sequence, key-value head, split of ``SPLIT_SIZE`` keys), walks the held pages of its
split with an online softmax; :func:`combine_kernel`, one program per (sequence, key-value head,
block of query rows, block of dimensions), sums the splits in order by their softmax statistics
and writes the output in the layout transformers wants (``[B, R, heads, d]``). Splits past a
sequence's length are neither computed nor read.
"""

from __future__ import annotations

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
    if lo >= end:  # past what the sequence holds: nothing to read, and the combine reads nothing here
        return

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


@triton.jit
def combine_kernel(ACC, TOP, TOTAL, START, OUT, splits, sob, sor, soh,
                   KV_HEADS: tl.constexpr, GROUP: tl.constexpr, R: tl.constexpr, D: tl.constexpr,
                   M: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, SPLIT_SIZE: tl.constexpr,
                   UNROLL: tl.constexpr):
    pid = tl.program_id(0)
    block = tl.program_id(1)
    part = tl.program_id(2)
    b = pid // KV_HEADS
    h = pid % KV_HEADS
    # The splits the sequence holds keys in, in order (the others were not written): the same sums
    # whatever capacity the table has, so the cost follows the sequence's length.
    used = (tl.load(START + b).to(tl.int32) + R + SPLIT_SIZE - 1) // SPLIT_SIZE
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    real = rows < GROUP * R
    dims = part * BLOCK_D + tl.arange(0, BLOCK_D)
    base = (b * KV_HEADS + h) * splits
    # Splits in order, UNROLL at a time: the unrolled loads do not wait on one another, where a loop
    # of one split a pass waits a memory latency per split (32 of them for the 1.5B after 2,000
    # tokens, where an H200 measured the step 1.37x the short one's with that loop). A split past
    # ``used`` adds exactly nothing (its share is exp(-inf) = 0, times loads of 0), so every sum is
    # the one-split loop's, bit for bit.
    best = tl.full([BLOCK_M], float("-inf"), tl.float32)
    zero = tl.zeros([BLOCK_M], tl.int32)
    for first in range(0, used, UNROLL):
        for j in tl.static_range(UNROLL):
            held = real & (zero + first + j < used)
            best = tl.maximum(best, tl.load(TOP + (base + first + j) * M + rows, mask=held, other=float("-inf")))
    safe = tl.where(best == float("-inf"), 0.0, best)
    num = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    den = tl.zeros([BLOCK_M], tl.float32)
    for first in range(0, used, UNROLL):
        for j in tl.static_range(UNROLL):
            at = base + first + j
            held = real & (zero + first + j < used)
            share = tl.exp(tl.load(TOP + at * M + rows, mask=held, other=float("-inf")) - safe)
            den += share * tl.load(TOTAL + at * M + rows, mask=held, other=0.0)
            num += share[:, None] * tl.load(ACC + at * M * D + rows[:, None] * D + dims[None, :],
                                            mask=held[:, None], other=0.0)
    out = num / tl.maximum(den, 1e-30)[:, None]
    g = rows // R
    r = rows % R
    tl.store(OUT + b * sob + r[:, None] * sor + (h * GROUP + g)[:, None] * soh + dims[None, :],
             out.to(OUT.dtype.element_ty), mask=real[:, None])
