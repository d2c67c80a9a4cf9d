"""Always the same draft length: the classic speculative decoding of Leviathan et al. (2023)."""

from __future__ import annotations

from specdec.errors import SpecdecError
from specdec.policies.base import DraftPolicy
from specdec.registry import PolicyRequest, policy

DEFAULT_K = 4


class FixedK(DraftPolicy):
    """Always ask for the same number of draft tokens (``--num-draft``) and verify all of them."""

    def __init__(self, k: int) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise SpecdecError(f"the number of draft tokens must be a whole number >= 1, got {k}")
        self.k = k

    def max_k(self, price: float = 0.0) -> int:
        return self.k


@policy("fixed", f"always draft and verify exactly K tokens (default K: {DEFAULT_K})", order=20)
def _build_fixed(request: PolicyRequest) -> FixedK:
    return FixedK(DEFAULT_K if request.num_draft is None else request.num_draft)
