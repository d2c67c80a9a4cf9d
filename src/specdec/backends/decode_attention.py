"""Attention for a decoding step over a static KV cache: a few query rows against a long buffer of
keys, split into chunks that run in parallel and are combined by their softmax statistics
(flash-decoding, Dao et al. 2023), written in plain PyTorch ops for ``torch.compile`` to fuse.

A fused attention kernel parallelises over heads and blocks of queries: with 16 rows and a handful
of heads that is a dozen thread blocks, each walking the whole buffer, so a step's cost grows
with the buffer (on an H200, 2.1x for the 1.5B after a 2,000-token prompt). Here the heads that
share a key-value head are folded into rows (no repeated keys), the scores are one matmul over
the buffer, and the weighted sum of values is one batched matmul per chunk.

Every row's result depends only on that row and the buffer, never on the other rows, so a padded
forward stays exact; it is another rounding than PyTorch's SDPA, so a sequence runs all of its
decoding steps with one or the other (prompts are prefilled with SDPA either way).
"""

from __future__ import annotations

import functools

import torch

NAME = "specdec_split"  # its name in transformers' attention registry
CHUNK = 256  # keys per chunk (a static cache's capacity is a power of two from 256)


def split_kv_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                       softcap: float | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: ``query`` ``[b, heads, rows, d]``, ``key`` and
    ``value`` ``[b, kv_heads, width, d]``, ``attention_mask`` bool ``[b | 1, 1, rows, width]``
    (True = may attend); returns ``[b, rows, heads, d]``."""
    b, heads, rows, dim = query.shape
    kv_heads, width = key.shape[1], key.shape[2]
    group = heads // kv_heads
    chunk = CHUNK if width % CHUNK == 0 else width
    chunks = width // chunk
    scale = dim ** -0.5 if scaling is None else scaling
    q = query.reshape(b, kv_heads, group * rows, dim)  # the heads of one key-value head, as rows
    wide = torch.promote_types(query.dtype, torch.float32)  # softmax in float32 at least
    scores = torch.matmul(q, key.transpose(2, 3)).to(wide) * scale  # [b, kv_heads, group*rows, width]
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    if attention_mask is not None:
        allowed = attention_mask if attention_mask.dtype == torch.bool else attention_mask == 0
        allowed = allowed.unsqueeze(2).expand(-1, -1, group, -1, -1).reshape(allowed.shape[0], 1, group * rows, width)
        scores = scores.masked_fill(~allowed, float("-inf"))
    scores = scores.view(b, kv_heads, group * rows, chunks, chunk)
    top = scores.amax(-1)  # [b, kv_heads, group*rows, chunks]; -inf where a chunk has nothing visible
    safe = torch.where(torch.isinf(top), torch.zeros_like(top), top)
    weights = torch.exp(scores - safe.unsqueeze(-1))
    totals = weights.sum(-1)
    parts = torch.matmul(weights.permute(0, 1, 3, 2, 4).to(value.dtype),
                         value.view(b, kv_heads, chunks, chunk, dim))  # [b, kv_heads, chunks, group*rows, d]
    share = torch.exp(top - top.amax(-1, keepdim=True))  # 0 for a chunk with nothing visible
    out = (parts.to(wide) * share.permute(0, 1, 3, 2).unsqueeze(-1)).sum(2) / (totals * share).sum(-1, keepdim=True)
    out = out.view(b, heads, rows, dim).transpose(1, 2).contiguous()
    return out.to(query.dtype), None


@functools.cache
def registered() -> str:
    """Register :func:`split_kv_attention` with transformers (once); its name."""
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, split_kv_attention)
    return NAME
