"""The two-stage top-k equals torch.topk on wide rows (any width, any k)."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec.topk import topk_indices


@settings(max_examples=40, deadline=None)
@given(width=st.one_of(st.integers(1, 5000), st.integers(4096, 70_000)), k=st.integers(1, 12), rows=st.integers(1, 3), seed=st.integers(0, 2**31))
def test_equals_torch_topk(width, k, rows, seed):
    logits = torch.randn(rows, width, generator=torch.Generator().manual_seed(seed))  # distinct values
    assert torch.equal(topk_indices(logits, k), logits.topk(min(k, width), dim=-1).indices)


def test_a_wide_row_with_its_maxima_in_one_block():
    logits = torch.zeros(1, 262_144)
    logits[0, 1000:1008] = torch.arange(8, 0, -1, dtype=torch.float32)  # all in block 3
    assert topk_indices(logits, 4).tolist() == [[1000, 1001, 1002, 1003]]
