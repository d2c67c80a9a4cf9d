"""``--cost-curve``: the target's forward time by number of new tokens, and the speed-up it allows.

Leviathan et al.'s expected speed-up for acceptance rate alpha, K draft tokens and drafter cost
ratio c is (1 - alpha^(K+1)) / ((1 - alpha)(K c + 1)); it assumes verifying K+1 tokens costs one
forward. On a CPU it does not, so the CPU-corrected bound divides by K c + T(K+1)/T(1) instead.
"""

from __future__ import annotations

from specdec.api import CALIBRATION_TEXT, Model
from specdec.costs import CostModel, measure_forward_costs

SIZES = (1, 2, 4, 8, 16, 32)


def measure(model: Model, repeats: int = 5) -> dict[int, float]:
    """Seconds per forward of K new tokens on a ~200-token cache."""
    context = (model.tokenizer(CALIBRATION_TEXT)["input_ids"] * 50)[:200]
    return measure_forward_costs(model.loaded.backend(), context, SIZES, repeats)


def expected_speedup(alpha: float, k: float, c: float, verify_ratio: float = 1.0) -> float:
    """Expected tokens per unit of plain-decoding time (alpha < 1; alpha = 1 gives K + 1 tokens)."""
    tokens = k + 1 if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)
    return tokens / (k * c + verify_ratio)


def bounds(curve: dict[int, float], stats: dict) -> dict | None:
    """Both bounds for one method's overall STATS (None for methods without drafting)."""
    alpha, k = stats.get("alpha"), stats.get("mean_draft_length")
    if alpha is None or not k:
        return None
    costs = CostModel(curve)
    c = stats.get("draft_s_per_step", 0.0) / k / costs.forward(1)
    return {"alpha": alpha, "K": round(k, 2), "c": round(c, 4),
            "leviathan_bound": round(expected_speedup(alpha, k, c), 3),
            "cpu_bound": round(expected_speedup(alpha, k, c, costs.forward(round(k) + 1) / costs.forward(1)), 3)}
