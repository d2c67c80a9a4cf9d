"""The decoding loop: speculative decoding, with plain autoregressive decoding as its k = 0 case.

Invariant between steps: the target's cache holds every token but the last one, which is fed
together with the draft, so one forward of k+1 tokens yields logits for all k draft positions plus
the bonus position (gpt-fast's ``speculative_decode``, Leviathan et al. Algorithm 1).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

from specdec.backends.base import Backend
from specdec.drafters.base import Drafter, NoDrafter
from specdec.errors import SpecdecError
from specdec.policies import DraftPolicy, FixedK
from specdec.sampling import SamplingParams
from specdec.stats import GenerationStats
from specdec.types import Draft, StepTrace
from specdec.verify import verify

FinishReason = Literal["length", "eos", "stop"]


@dataclass(frozen=True)
class DecodeConfig:
    """Everything that decides *which* tokens come out (drafting only decides how fast)."""

    max_new_tokens: int = 64
    sampling: SamplingParams = SamplingParams()
    eos_token_ids: frozenset[int] = frozenset()
    # Called with the new tokens so far; True ends generation (stop strings live in the API layer,
    # which owns the tokenizer).
    stop: Callable[[list[int]], bool] | None = None

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise SpecdecError(f"max new tokens must be >= 1, got {self.max_new_tokens}")


@dataclass
class Generation:
    """The new tokens, why generation ended, and what it cost."""

    token_ids: list[int] = field(default_factory=list)
    finish_reason: FinishReason = "length"
    stats: GenerationStats = field(default_factory=GenerationStats)
    trace: list[StepTrace] = field(default_factory=list)


class DecodeRun:
    """One generation; iterate it to receive a :class:`StepTrace` per target forward (streaming),
    or call :meth:`run`. The result accumulates in :attr:`result`."""

    def __init__(self, target: Backend, prompt: Sequence[int], config: DecodeConfig,
                 drafter: Drafter | None = None, policy: DraftPolicy | None = None) -> None:
        if not prompt:
            raise SpecdecError("the prompt is empty: give at least one token")
        self.target = target
        self.prompt = list(prompt)
        self.config = config
        self.drafter = drafter or NoDrafter()
        self.policy = policy or FixedK(1)
        self.result = Generation()
        self.done = False

    def run(self) -> Generation:
        for _ in self:
            pass
        return self.result

    def __iter__(self) -> Iterator[StepTrace]:
        cfg, stats, out = self.config, self.result.stats, self.result.token_ids
        gen = cfg.sampling.generator()
        t_start = time.perf_counter()
        stats.prompt_tokens = len(self.prompt)
        self.target.reset()
        self.target.prefill(self.prompt[:-1])
        stats.prefill_s = time.perf_counter() - t_start
        self.drafter.begin(self.prompt, cfg.sampling, gen)
        tokens = list(self.prompt)
        done = False
        while not done:
            t0 = time.perf_counter()
            draft = self._draft(tokens, cfg.max_new_tokens - len(out))
            t1 = time.perf_counter()
            base = self.target.length  # == len(tokens) - 1
            logits = self.target.extend([tokens[-1], *draft.tokens])
            verdict = verify(draft, logits, cfg.sampling, gen)
            self.target.truncate(base + 1 + verdict.num_accepted)
            t2 = time.perf_counter()

            emitted: list[int] = []
            for tok in verdict.tokens:
                emitted.append(tok)
                out.append(tok)
                done = self._finished(tok)
                if done:
                    break
            tokens.extend(emitted)
            self.drafter.observe(draft, verdict.num_accepted)
            self.policy.observe(len(draft), verdict.num_accepted, t2 - t1)
            stats.target_forwards += 1
            stats.draft_forwards += draft.forwards
            stats.record_acceptance(len(draft), min(verdict.num_accepted, len(emitted)))
            stats.draft_s += t1 - t0
            stats.verify_s += t2 - t1
            kind = "bonus" if verdict.bonus else ("correction" if len(draft) else "plain")
            step = StepTrace(draft.tokens, verdict.num_accepted, emitted, kind, t1 - t0, t2 - t1)
            self.result.trace.append(step)
            stats.new_tokens = len(out)
            stats.wall_s = time.perf_counter() - t_start
            self.done = done
            yield step

    def _draft(self, tokens: list[int], remaining: int) -> Draft:
        # The target always adds one token of its own, so drafting past remaining - 1 is wasted.
        k = min(self.policy.max_k(), remaining - 1)
        if k <= 0:
            return Draft([])
        draft = self.drafter.propose(tokens, k, self.policy.stop_drafting).truncated(k)
        eos = self.config.eos_token_ids
        for i, tok in enumerate(draft.tokens):
            if tok in eos:  # nothing after an end-of-sequence token can be kept
                draft = draft.truncated(i + 1)
                break
        return draft.truncated(self.policy.choose(draft)) if draft.tokens else draft

    def _finished(self, token: int) -> bool:
        res = self.result
        if token in self.config.eos_token_ids:
            res.finish_reason = "eos"
        elif self.config.stop is not None and self.config.stop(res.token_ids):
            res.finish_reason = "stop"
        elif len(res.token_ids) >= self.config.max_new_tokens:
            res.finish_reason = "length"
        else:
            return False
        return True


def decode(target: Backend, prompt: Sequence[int], config: DecodeConfig,
           drafter: Drafter | None = None, policy: DraftPolicy | None = None) -> Generation:
    """Generate after ``prompt`` (token ids); without a drafter this is plain decoding."""
    return DecodeRun(target, prompt, config, drafter, policy).run()
