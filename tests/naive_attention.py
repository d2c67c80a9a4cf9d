"""The attention the paged kernels must agree with, written the plainest way: the CPU reference
(tests/test_gpu_batch.py) and the Triton kernels (tests/test_paged_triton.py) are held to it."""

from __future__ import annotations

import torch


def naive_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, meta, scale: float,
                    window: int = 0) -> torch.Tensor:
    """Row by row in float64: the slots before start, the block's own rows, softmax, weighted values.

    ``keys`` and ``values`` are a pool ``[pages, PAGE, kv_heads, d]`` read through ``meta.table``
    (gathered here by plain indexing, not by the code under test); the result is
    ``[B, rows, heads, d]`` in float64."""
    b, heads, rows, dim = q.shape
    kv_heads = keys.shape[2]
    out = torch.zeros(b, rows, heads, dim, dtype=torch.float64)
    for s in range(b):
        k = keys[meta.table[s]].reshape(-1, kv_heads, dim).double()
        v = values[meta.table[s]].reshape(-1, kv_heads, dim).double()
        start = int(meta.start[s])
        for r in range(rows):
            slots = list(range(start)) + [start + c for c in range(rows) if meta.block[s, r, c]]
            key_pos = [j if j < start else int(meta.positions[s, j - start]) for j in slots]
            if window:
                slots = [j for j, p in zip(slots, key_pos) if int(meta.positions[s, r]) - p < window]
            for h in range(heads):
                kh = h // (heads // kv_heads)
                scores = (k[slots, kh] @ q[s, h, r].double()) * scale
                out[s, r, h] = torch.softmax(scores, 0) @ v[slots, kh]
    return out
