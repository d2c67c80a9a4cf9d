"""What the self drafter decides by: its measured times, learned across one model's generations.

Each extra self-drafted token costs one more pass through the target's layers, wasted if it is
rejected; whether it pays (and, for ``combined``, whether the free sources' draft pays more) is
decided on these running averages (:class:`specdec.costs.Ema`) rather than on fixed ratios.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from specdec.context import LayerAccess
from specdec.costs import CostModel, Ema


@dataclass
class Measured:
    """What the self drafter decides by (seconds, and tokens per step), learned across one
    model's generations: the full LM head for one row, one pass through the layers, the small
    head, per step the tokens emitted and the cost that does not scale with them (full head,
    rejected drafts' layer passes, small heads), and the wall time per emitted token of steps
    drafted through the layers."""

    head: float
    body: Ema
    small: Ema
    per_step: Ema
    overhead: Ema
    self_token: Ema
    costs: CostModel | None = None  # the target's forward cost curve, refined online by the engine

    @classmethod
    def start(cls, head: float, costs: CostModel | None = None) -> Measured:
        return cls(head, Ema(head), Ema(head / 16), Ema(1.5), Ema(head), Ema(head + head / 3), costs)

    def forward(self, rows: int) -> float:
        """Seconds for a verification forward of ``rows`` new tokens."""
        if self.costs is not None:
            return self.costs.forward(rows)
        return self.body.value * (1 + 0.2 * (rows - 1)) + self.head


@dataclass
class StepClock:
    """Times whole steps (drafting, verification and the engine's bookkeeping: from one
    ``propose`` to the next) and teaches ``per_token`` the wall time per emitted token of those
    drafted through the layers."""

    per_token: Ema
    through_layers: bool = False  # whether the open step drafts through the layers
    started: float = 0.0
    emitted: int = 0  # tokens the open step emitted (set once it is verified)

    def next_step(self) -> None:
        """Close the previous step's timing and open this one's (through the layers unless
        :meth:`not_through_layers` says otherwise)."""
        now = time.perf_counter()
        if self.through_layers and self.emitted:
            self.per_token.add((now - self.started) / self.emitted)
        self.through_layers, self.started, self.emitted = True, now, 0

    def not_through_layers(self) -> None:
        """The open step's draft came from elsewhere: its time says nothing of layer drafting."""
        self.through_layers = False


def head_seconds(backend: LayerAccess) -> float:
    """The full LM head's time for one row on this machine (best of three)."""
    weight = backend.output_weight
    hidden = torch.zeros(weight.shape[1], dtype=weight.dtype)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        backend.head(hidden[None])
        best = min(best, time.perf_counter() - t0)
    return best
