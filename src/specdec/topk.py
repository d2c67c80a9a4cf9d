"""The k largest entries of wide rows (a 262k-token vocabulary) in a tenth of ``torch.topk``'s time.

Two stages: the rows are cut into blocks, the k blocks with the largest maxima are kept, and the
top k is taken among their entries. Exact: each of a row's k largest entries lies in a block whose
maximum is at least the k-th largest value, and at most k blocks can have such a maximum.
"""

from __future__ import annotations

import torch

BLOCK = 256
MIN_WIDTH = 16 * BLOCK  # below this a plain topk is as fast


def topk_indices(rows: torch.Tensor, k: int) -> torch.Tensor:
    """Indices ``[n, k]`` of each row's ``k`` largest entries, largest first (``rows``: ``[n, V]``)."""
    n, width = rows.shape
    k = min(k, width)
    if width < MIN_WIDTH or k * BLOCK >= width:
        return rows.topk(k, dim=-1).indices
    pad = -width % BLOCK
    if pad:
        rows = torch.nn.functional.pad(rows, (0, pad), value=float("-inf"))
    blocks = rows.reshape(n, -1, BLOCK)
    best = blocks.amax(-1).topk(k, dim=-1).indices  # [n, k] block numbers
    candidates = torch.gather(blocks, 1, best[..., None].expand(-1, -1, BLOCK)).reshape(n, -1)
    order = candidates.topk(k, dim=-1).indices  # positions among the kept blocks' entries
    return best.gather(1, order // BLOCK) * BLOCK + order % BLOCK
