"""Counters for one generation, and the JSON shape the CLI and benchmarks report."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class GenerationStats:
    """What one generation cost and how well drafting went.

    ``mean_accepted_length`` counts the target's own token, as vLLM and gpt-fast report it: plain
    decoding scores exactly 1.0, and a value of m means each target forward produced m tokens.
    """

    prompt_tokens: int = 0
    new_tokens: int = 0
    target_forwards: int = 0  # decoding forwards of the target (the prefill is not counted)
    draft_forwards: int = 0
    drafted: int = 0
    accepted: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)  # [i]: drafts accepted at position i
    prefill_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0
    wall_s: float = 0.0

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted (0.0 when nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        return self.new_tokens / self.target_forwards if self.target_forwards else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_s if self.wall_s > 0 else 0.0

    def record_acceptance(self, drafted: int, accepted: int) -> None:
        self.drafted += drafted
        self.accepted += accepted
        if len(self.accepted_per_pos) < drafted:
            self.accepted_per_pos.extend([0] * (drafted - len(self.accepted_per_pos)))
        for i in range(accepted):
            self.accepted_per_pos[i] += 1

    def to_dict(self) -> dict:
        """The ``stats`` object of ``specdec generate --json`` (keys are a public contract)."""
        return {
            "new_tokens": self.new_tokens,
            "target_forwards": self.target_forwards,
            "draft_forwards": self.draft_forwards,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": round(self.acceptance_rate, 4),
            "mean_accepted_length": round(self.mean_accepted_length, 4),
            "draft_s": round(self.draft_s, 4),
            "verify_s": round(self.verify_s, 4),
            "wall_s": round(self.wall_s, 4),
            "tokens_per_s": round(self.tokens_per_s, 3),
            "prompt_tokens": self.prompt_tokens,
            "prefill_s": round(self.prefill_s, 4),
        }
