"""Counters for one generation, computed from its step records, and the JSON shapes the CLI and
the benchmark report (a benchmark sums its runs' stats with :meth:`GenerationStats.total`)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, fields

from specdec import tree as trees
from specdec.types import StepTrace


@dataclass
class GenerationStats:
    """What one generation cost and how well drafting went, summed from its steps.

    ``mean_accepted_length`` counts the target's own token, as vLLM and gpt-fast report it: plain
    decoding scores exactly 1.0, and a value of m means each target forward produced m tokens.
    ``accepted_per_pos[i]`` counts drafts accepted at draft position i, and ``drafted_per_pos[i]``
    steps that verified a token at position i (vLLM's ``num_accepted_tokens_per_pos``).
    """

    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens the target took from an earlier prompt's cache
    new_tokens: int = 0
    target_forwards: int = 0  # decoding forwards of the target (the prefill is not counted)
    draft_forwards: int = 0
    drafted: int = 0  # draft tokens verified (a tree's nodes included)
    tree_nodes: int = 0  # draft nodes verified in steps whose draft branched
    accepted: int = 0
    draft_steps: int = 0  # steps that verified at least one draft token
    rejecting_steps: int = 0  # steps that verified a draft and did not accept all of it
    bonus: int = 0  # target tokens earned because every draft token was accepted
    corrections: int = 0  # target tokens that replaced a rejected draft token
    accepted_per_pos: list[int] = field(default_factory=list)
    drafted_per_pos: list[int] = field(default_factory=list)
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

    def add_step(self, step: StepTrace) -> None:
        """Count one step's record (the only way numbers get in: one source of truth)."""
        drafted = len(step.drafted)
        self.target_forwards += step.target_forwards
        self.draft_forwards += step.draft_forwards
        self.new_tokens += len(step.emitted)
        self.drafted += drafted
        self.accepted += step.accepted
        self.draft_steps += drafted > 0
        self.rejecting_steps += step.accepted < drafted
        self.tree_nodes += drafted if step.parents is not None else 0
        if step.target_token is not None:
            self.bonus += step.kind == "bonus"
            self.corrections += step.kind == "correction"
        # Positions are depths: a tree verifies as many positions as its deepest branch.
        depth = drafted if step.parents is None else 1 + max(trees.depths(step.parents), default=-1)
        for counts, n in ((self.drafted_per_pos, depth), (self.accepted_per_pos, step.accepted)):
            # Both lists span every drafted position, so a position never accepted still shows as 0.
            if len(counts) < depth:
                counts.extend([0] * (depth - len(counts)))
            for i in range(n):
                counts[i] += 1
        self.draft_s += step.draft_s
        self.verify_s += step.verify_s

    @property
    def acceptance_per_pos(self) -> list[float]:
        """P(draft position i accepted | it was verified)."""
        return [a / d if d else 0.0 for a, d in zip(self.accepted_per_pos, self.drafted_per_pos)]

    @property
    def judged(self) -> int:
        """Draft tokens verification decided on: the accepted ones and the first rejected one of
        each step (the tokens after it are never judged)."""
        return self.accepted + self.rejecting_steps

    @property
    def alpha(self) -> float:
        """Per-token acceptance, Leviathan et al.'s alpha: accepted / judged (0.0 when none was)."""
        return self.accepted / self.judged if self.judged else 0.0

    @property
    def mean_draft_length(self) -> float:
        """Draft tokens verified per step that drafted (0.0 when none did)."""
        return self.drafted / self.draft_steps if self.draft_steps else 0.0

    @property
    def draft_s_per_step(self) -> float:
        return self.draft_s / self.draft_steps if self.draft_steps else 0.0

    @classmethod
    def total(cls, parts: Iterable[GenerationStats]) -> GenerationStats:
        """Several generations' stats summed (a benchmark's category): counters and seconds add,
        the per-position counts position by position."""
        out = cls()
        for part in parts:
            for f in fields(cls):
                mine, theirs = getattr(out, f.name), getattr(part, f.name)
                if isinstance(mine, list):
                    mine.extend([0] * (len(theirs) - len(mine)))
                    for i, x in enumerate(theirs):
                        mine[i] += x
                else:
                    setattr(out, f.name, mine + theirs)
        return out

    def bench_dict(self) -> dict:
        """The drafting numbers of a ``specdec bench`` results.json (keys are a public contract;
        None where a ratio has nothing to divide by)."""
        return {
            "mean_accepted_length": round(self.mean_accepted_length, 3) if self.target_forwards else None,
            "acceptance_rate": round(self.acceptance_rate, 4) if self.drafted else None,
            # For the cost-curve bound: per-token acceptance and the draft length of steps that drafted.
            "alpha": round(self.alpha, 4) if self.judged else None,
            "mean_draft_length": round(self.mean_draft_length, 3),
            "draft_s_per_step": self.draft_s_per_step,
            "accepted_per_pos": list(self.accepted_per_pos),
            "drafted_per_pos": list(self.drafted_per_pos),
            "acceptance_per_pos": [round(x, 4) for x in self.acceptance_per_pos],
            "draft_forwards": self.draft_forwards,
            "draft_forwards_per_accepted": (round(self.draft_forwards / self.accepted, 4) if self.accepted
                                            else None),
            "tree_nodes": self.tree_nodes,
        }

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
            "cached_tokens": self.cached_tokens,
            "prefill_s": round(self.prefill_s, 4),
            "draft_steps": self.draft_steps,
            "bonus_tokens": self.bonus,
            "correction_tokens": self.corrections,
            "accepted_per_pos": list(self.accepted_per_pos),
            "drafted_per_pos": list(self.drafted_per_pos),
            "tree_nodes": self.tree_nodes,
            "acceptance_per_pos": [round(x, 4) for x in self.acceptance_per_pos],
        }
