"""What every benchmark method is (ours and the peers'): a :class:`Method` that generates and a
:class:`RunResult` of one run, and which plain method each family is measured against. The
methods themselves live in :mod:`specdec.bench.methods` and the peers' own modules, which import
this one (never the reverse)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from specdec.stats import GenerationStats

BASELINES = {"ours": "plain", "hf": "hf-plain", "llamacpp": "llamacpp-plain", "vllm": "vllm-plain",
             "llama-server": "llama-server-plain"}


@dataclass
class RunResult:
    """One method on one question.

    ``stats`` are our generation's own counters (:class:`specdec.stats.GenerationStats`; None for
    the peers, which do not expose them); ``peer_forwards`` the target forwards a peer made,
    counted by a hook where its library allows one (or from its own counters), ``peer_drafted`` /
    ``peer_accepted`` its draft tokens where it reports them.

    ``gen_s`` is the generation time after the prompt (None where unknown) and ``gen_tokens`` the
    tokens made in it, so that ``gen_tokens / gen_s`` is a generation rate that leaves the prompt
    out. Ours: ``wall_s - prefill_s`` of our stats and every new token (the target's prompt left
    out, except its last token, whose forward yields the first new token; a draft model's own
    prompt is inside). llama.cpp's (``llama-server-*``, ``llamacpp-*``): from the first new token
    to the last and the tokens after the first, its ``predicted_per_second``.
    """

    token_ids: list[int]
    wall_s: float
    stats: GenerationStats | None = None
    peer_forwards: int | None = None
    gen_s: float | None = None
    gen_tokens: int | None = None
    peer_drafted: int | None = None
    peer_accepted: int | None = None

    @property
    def target_forwards(self) -> int | None:
        return self.stats.target_forwards if self.stats is not None else self.peer_forwards


class Method(ABC):
    """A way to generate: ``run`` returns the new token ids and the wall time of the call."""

    name: str
    family: str  # "ours", "hf" or "llamacpp": which plain method is its baseline

    @property
    def baseline(self) -> str:
        return BASELINES[self.family]

    @abstractmethod
    def run(self, prompt_ids: list[int], max_new_tokens: int, seed: int | None) -> RunResult:
        """Generate after ``prompt_ids``; only the generation call itself is timed."""
