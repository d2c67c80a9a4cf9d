"""The decoding loop: speculative decoding, with plain autoregressive decoding as its k = 0 case.

Invariant between steps: the target's cache holds every token but the last one, which is fed
together with the draft, so one forward of k+1 tokens yields logits for all k draft positions plus
the bonus position (gpt-fast's ``speculative_decode``, Leviathan et al. Algorithm 1).
"""

from __future__ import annotations

import numbers
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch

from specdec import constraints
from specdec import tree as trees
from specdec.backends.base import Backend
from specdec.constraints import Constraint, ForcedRun
from specdec.drafters.base import Drafter, NoDrafter
from specdec.errors import SpecdecError
from specdec.options import GenerationOptions, check_fields, copy_into, same_as
from specdec.policies.base import DraftPolicy
from specdec.policies.fixed import FixedK
from specdec.policies.goodput import Offer
from specdec.sampling import Sampler, SamplingParams, VerifyMode
from specdec.stats import GenerationStats
from specdec.types import Draft, StepTrace, Verdict
from specdec.verify import verify

FinishReason = Literal["length", "eos", "stop"]
GRAMMAR = "grammar"  # the source of a draft of a constraint's forced tokens (Draft.extra)
NO_RUN = ForcedRun([], [])


@dataclass(frozen=True)
class DecodeConfig:
    """Everything that decides *which* tokens come out (drafting only decides how fast).

    ``max_new_tokens``, ``sampling`` and ``verify`` are the generation options'
    (:class:`~specdec.options.GenerationOptions` declares their defaults and checks once; a bad
    value reads as it does in every front end); :meth:`of` builds a config from validated options.
    ``verify`` chooses how sampled drafts are checked (see :mod:`specdec.verify`): ``coupled``
    reproduces plain decoding's text for a seed whatever the drafter; both are lossless.
    """

    max_new_tokens: int = same_as("max_new_tokens")
    sampling: SamplingParams = SamplingParams()
    eos_token_ids: frozenset[int] = frozenset()
    # Called with the new tokens so far; True ends generation (stop strings live in the API layer,
    # which owns the tokenizer).
    stop: Callable[[list[int]], bool] | None = None
    verify: VerifyMode = same_as("verify")
    record: bool = False  # fill the steps' probabilities (p, q, min(1, p/q)) for a trace
    # Each new token's log-probability under the target (its logits, masked where a constraint
    # is set) and, when n > 0, the n likeliest tokens' there; None: not kept.
    logprobs: int | None = None

    def __post_init__(self) -> None:
        check_fields(self)  # the engine's own callers build configs by hand

    @classmethod
    def of(cls, options: GenerationOptions, eos_token_ids: frozenset[int] = frozenset(),
           stop: Callable[[list[int]], bool] | None = None, record: bool = False,
           logprobs: int | None = None) -> DecodeConfig:
        """The config of a generation with (validated) ``options``."""
        return copy_into(cls, options, sampling=copy_into(SamplingParams, options), eos_token_ids=eos_token_ids,
                         stop=stop, record=record, logprobs=logprobs)


@dataclass
class Generation:
    """The new tokens, why generation ended, and what it cost."""

    token_ids: list[int] = field(default_factory=list)
    finish_reason: FinishReason = "length"
    stats: GenerationStats = field(default_factory=GenerationStats)
    trace: list[StepTrace] = field(default_factory=list)
    seed: int | None = None  # the seed sampling used (drawn from the OS when none was given)
    logprobs: list[TokenLogprob] = field(default_factory=list)  # one per new token, when the config asks


@dataclass(frozen=True)
class TokenLogprob:
    """A new token's log-probability under the target, and the likeliest tokens' at its position
    (as many as asked, best first)."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def token_logprobs(logits: torch.Tensor, rows: Sequence[int], tokens: Sequence[int], top: int) -> list[TokenLogprob]:
    """Each of ``tokens``' log-probability in its row of ``logits``, with the ``top`` likeliest."""
    out = []
    for row, token in zip(rows, tokens):
        logp = torch.log_softmax(logits[row].float(), -1)
        best = torch.topk(logp, top) if top else None
        pairs = tuple(zip(best.indices.tolist(), best.values.tolist())) if best is not None else ()
        out.append(TokenLogprob(int(token), float(logp[token]), pairs))
    return out


class DecodeRun:
    """One generation; iterate it once to receive a :class:`StepTrace` per target forward
    (streaming), or call :meth:`run`. The result accumulates in :attr:`result`.

    ``release`` is called with the target backend when the run ends (finished, failed, or its
    iterator closed), and the drafter is closed then too. ``options`` are the generation options
    the run was made from, kept for its readers (stop strings for the text); the engine itself
    reads only ``config``.
    """

    def __init__(self, target: Backend, prompt: Sequence[int], config: DecodeConfig,
                 drafter: Drafter | None = None, policy: DraftPolicy | None = None,
                 release: Callable[[Backend], None] | None = None,
                 options: GenerationOptions | None = None, constraint: Constraint | None = None) -> None:
        self.prompt = check_token_ids(prompt, target.vocab_size)
        limit = target.max_length
        if limit is not None and len(self.prompt) + config.max_new_tokens > limit:
            raise SpecdecError(
                f"the prompt ({len(self.prompt)} tokens) plus max new tokens ({config.max_new_tokens}) exceed "
                f"the model's context of {limit} tokens: shorten the prompt or ask for fewer tokens")
        self.target = target
        self.config = config
        self.drafter = drafter or NoDrafter()
        self.policy = policy or FixedK(1)
        self.sampler = Sampler(config.sampling, config.verify)
        self.result = Generation(seed=None if config.sampling.greedy else self.sampler.seed)
        self.done = False
        self.cancelled = threading.Event()  # set by cancel(): a client that left
        self.options = options
        # The grammar the answer must follow (specdec.constraints): the target's logits are masked
        # to it at every position, drafts are cut where it forbids them, and its forced tokens are
        # drafts of their own.
        self.constraint = constraint
        self._release = release
        self._started = False
        self._closed = False
        self._iterator: Iterator[StepTrace] | None = None
        self._own: tuple[int, Draft] | None = None  # the drafter's part of a joined draft: (offset, its draft)
        self._likely = LikelyRate()

    def run(self) -> Generation:
        """Run to the end (or return the result of a run that already ended)."""
        if not self._started:
            for _ in self:
                pass
        elif not self.done:
            raise SpecdecError("this generation was already started (as a stream, or a run that failed) "
                               "and did not finish: start a new one")
        return self.result

    def __iter__(self) -> Iterator[StepTrace]:
        if self._started:
            raise SpecdecError("a DecodeRun can be iterated only once; its result is in .result")
        self._started = True
        self._iterator = self._iterate()
        return self._iterator

    def _iterate(self) -> Iterator[StepTrace]:
        try:
            yield from self._steps()
        finally:
            self._finish()

    def cancel(self) -> None:
        """Tell a step waiting for memory (the target's :meth:`~Backend.reserve`) to stop waiting:
        safe from any thread; the run then fails with a :class:`SpecdecError`."""
        self.cancelled.set()

    def close(self) -> None:
        """End the generation where it is: its drafter is closed and its backend released, also
        when it was never iterated (a server's client that left before the first step). Not while
        another thread is computing one of its steps."""
        if self._iterator is not None:
            self._iterator.close()  # runs the iteration's clean-up if its steps began
        self._started = True
        self._finish()

    def _finish(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.drafter.close()
        if self._release is not None:
            self._release(self.target)
            self._release = None

    def _steps(self) -> Iterator[StepTrace]:
        cfg, stats, out = self.config, self.result.stats, self.result.token_ids
        t_start = time.perf_counter()
        stats.prompt_tokens = len(self.prompt)
        self.target.reset()
        self.target.reserve(len(self.prompt) + cfg.max_new_tokens, self.cancelled)
        self.policy.begin(self.target)
        stats.cached_tokens = self.target.prefill(self.prompt[:-1])
        stats.prefill_s = time.perf_counter() - t_start
        self.drafter.begin(self.prompt, self.sampler, self.target)
        self.drafter.reserve(len(self.prompt) + cfg.max_new_tokens, self.cancelled)
        tokens = list(self.prompt)
        while not self.done:
            end = self._grammar_end()
            if end is not None:  # all the masked distribution is on it: known without a forward
                step = StepTrace(len(out), [], 0, [end], "plain", 0.0, 0.0, extra={"source": GRAMMAR},
                                 target_forwards=0)
                out.append(end)
                self.done = self._finished(end)
                self.constraint.consume([end])
                self._keep(step, t_start)
                yield step
                continue
            t0 = time.perf_counter()
            draft, offer = self._draft(tokens, cfg.max_new_tokens - len(out))
            t1 = time.perf_counter()
            base = self.target.length  # == len(tokens) - 1
            masks = self.constraint.masks(draft.tokens) if self.constraint is not None else None
            if offer is not None:  # the batch chooses how much of the draft to verify
                logits = self.target.extend_offer([tokens[-1], *draft.tokens], offer)
                taken = logits.shape[0] - 1
                self.policy.taken(draft, taken)
                draft = draft.truncated(taken)
            elif draft.is_tree:  # row 0 is the root (the last token); node i is row i + 1
                logits = self.target.extend([tokens[-1], *draft.tokens], tree=[-1, *(p + 1 for p in draft.parents)])
            else:
                logits = self.target.extend([tokens[-1], *draft.tokens])
            if masks is not None:
                logits = constraints.apply(logits, masks)
            verdict = verify(draft, logits, self.sampler, len(tokens), record=cfg.record)
            extra = _as_cut(draft)
            if "likely" in extra:
                self._likely.learn(*extra["likely"], verdict.num_accepted)
            if draft.is_tree:
                self.target.truncate(base, keep=[0, *(i + 1 for i in verdict.path)])
            else:
                self.target.truncate(base + 1 + verdict.num_accepted)
            t2 = time.perf_counter()
            # What the drafter learns from the verification is drafting work: timed as such.
            self._teach(draft, verdict, tokens[-1], logits)
            t3 = time.perf_counter()

            position = len(out)
            emitted: list[int] = []
            for tok in verdict.tokens:
                emitted.append(tok)
                out.append(tok)
                if self._finished(tok):
                    self.done = True
                    break
            tokens.extend(emitted)
            if cfg.logprobs is not None:  # row 0 predicts the first new token, node i's row the next
                path = verdict.path if draft.is_tree else list(range(len(emitted) - 1))
                rows = [0, *(p + 1 for p in path)][:len(emitted)]
                self.result.logprobs.extend(token_logprobs(logits, rows, emitted, cfg.logprobs))
            if self.constraint is not None:
                self.constraint.consume(emitted)
            # A draft that priced its own verification was not a plain forward of its length: no
            # point on the forward-cost curve.
            timed = t2 - t1 if draft.verify_cost is None else 0.0
            self.policy.observe(len(draft), verdict.num_accepted, timed)
            kind = "bonus" if verdict.bonus else ("correction" if len(draft) else "plain")
            step = StepTrace(position, draft.tokens, min(verdict.num_accepted, len(emitted)), emitted, kind,
                             (t1 - t0) + (t3 - t2), t2 - t1, proposed=draft.proposed or 0, draft_forwards=draft.forwards,
                             confidence=draft.confidence, draft_probs=draft.probs,
                             target_probs=verdict.target_probs, accept_probs=verdict.accept_probs,
                             parents=draft.parents if draft.is_tree else None,
                             path=verdict.path if draft.is_tree else None, extra=extra)
            self._keep(step, t_start)
            yield step

    def _keep(self, step: StepTrace, t_start: float) -> None:
        """A step into the result: its trace, and the stats counted from it."""
        self.result.trace.append(step)
        self.result.stats.add_step(step)
        self.result.stats.wall_s = time.perf_counter() - t_start

    def _grammar_end(self) -> int | None:
        """The end of sequence a finished grammar leaves as the only token, which a speculative run
        emits without a forward (plain decoding, the baseline, takes its forward; so does a run
        that reports log-probabilities); None where there is none."""
        if self.constraint is None or not self.drafter.drafts or self.config.logprobs is not None:
            return None
        token = self.constraint.only_token()
        return token if token in self.config.eos_token_ids else None

    def _draft(self, tokens: list[int], remaining: int) -> tuple[Draft, Offer | None]:
        """The draft to verify, and, where the target's batch chooses the draft lengths of all its
        sequences together, the policy's offer of it (the draft uncut); else the policy's cut."""
        self._own = None
        if self.target.chooses_lengths and not self.target.wants_offer():
            return Draft([]), None
        # The target always adds one token of its own, so drafting past remaining - 1 is wasted.
        # The policy weighs what a drafted token costs here (the drafter's price) against what
        # verification saves.
        # Plain decoding stays the baseline: one masked step a token, no grammar drafts either.
        run = self._forced(()) if self.constraint is not None and self.drafter.drafts else NO_RUN
        price = 0.0 if run.certain else self.drafter.token_cost(tokens)
        # A run opens the draft where it has certain tokens, or likely ones before a free drafter
        # (a priced one drafts first, and the run follows its chain).
        opens = bool(run.certain) or (bool(run.likely) and not price)
        most = self.policy.max_k(0.0 if opens else price)
        k = min(most, remaining - 1)
        if k <= 0:
            return Draft([]), None
        if opens:  # known without a model: the target's masked choice there is these tokens' or none
            draft = self._after_forced(tokens, run, k)
        else:
            draft = self.drafter.propose(tokens, k, self.policy.stop_drafting)
            draft = fit(draft, most, remaining - 1, self.config.eos_token_ids)
        if draft.is_tree and (not self.target.supports_tree or self.constraint is not None):
            draft = draft.subset(best_path(draft))  # a grammar's state follows one path: chains only
        elif draft.is_tree and self.target.max_tree is not None:
            draft = draft.truncated(self.target.max_tree - 1)  # nodes are best-first: a prefix is a tree
        # Never verify what the grammar forbids, where verification keeps a token by the target's
        # choice, which never is a forbidden token. A draft drawn at random and checked by rejection
        # sampling keeps its forbidden token: rejected there (p = 0), the target's token comes from
        # the residual max(0, p - q), where cutting the draft would draw it from p.
        if self.constraint is not None and not opens and (self.sampler.greedy or self.sampler.coupled
                                                           or draft.q is None):
            allowed = self.constraint.allowed_prefix(draft.tokens)
            draft = draft.truncated(allowed)
            if draft.tokens and allowed == len(draft.tokens) and len(draft) < k:
                draft = self._then_forced(draft, k)
        if not draft.tokens:
            return draft, None
        if self.target.chooses_lengths and not draft.is_tree:
            offer = self.policy.offer(draft)
            if offer is not None:
                return draft, offer
        return draft.truncated(self.policy.choose(draft)), None

    # -- a grammar's forced tokens and the drafter's in one draft ------------------------------------
    # Where the grammar forces a run (a JSON object's next key), a free drafter goes on after it;
    # where the drafter's chain ends in a place the grammar forces, the run follows it: a step
    # verifies value, key and value together. Only a chain the drafter made without sampling (q None) joins
    # them: its tokens are kept by the target's choice, as the forced ones are, and nothing of it
    # is priced by a curve of its own. The drafter is told about its own part alone (``_own``).

    def _forced(self, after: Sequence[int]) -> ForcedRun:
        run = self.constraint.forced(after)
        chain = [*run.certain, *run.likely]
        if not chain:
            return run
        n = self.constraint.allowed_prefix([*after, *chain]) - len(after)  # as the mask sees them
        return ForcedRun(run.certain[:n], run.likely[:max(0, n - len(run.certain))])

    def _run_draft(self, run: ForcedRun, room: int, offset: int) -> tuple[list[int], list[float], dict]:
        """At most ``room`` tokens of ``run``: the tokens, their confidence (1 for certain ones, the
        likely ones' running rate) and their spans in a draft where they start at ``offset``."""
        chain = [*run.certain, *run.likely][:room]
        certain = min(len(run.certain), len(chain))
        spans = {}
        if certain:
            spans["certain"] = [offset, offset + certain]
        if len(chain) > certain:
            spans["likely"] = [offset + certain, offset + len(chain)]
        return chain, [1.0] * certain + [self._likely.rate] * (len(chain) - certain), spans

    def _after_forced(self, tokens: list[int], forced: ForcedRun, k: int) -> Draft:
        """The forced run (at most ``k``), then what the drafter proposes after it, as the grammar allows."""
        run, confidence, spans = self._run_draft(forced, k, 0)
        extra = {"source": GRAMMAR, **spans}
        grammar = Draft(run, confidence=confidence, extra=extra)
        room = k - len(run)
        # A drafter that pays for its tokens (a model's forwards) is priced by the policy before it
        # drafts (max_k), which a forced step skips: only a free one goes on after the run.
        if room <= 0 or any(t in self.config.eos_token_ids for t in run) or self.drafter.token_cost([*tokens, *run]):
            return grammar
        stop = self.policy.stop_drafting
        mine = self.drafter.propose([*tokens, *run], room, lambda confidence: stop([*grammar.confidence, *confidence]))
        mine = fit(mine, room, room, self.config.eos_token_ids)
        if not self._joins(mine):
            return grammar  # the drafter hears of a plain step after it (see _teach)
        mine = mine.truncated(self.constraint.allowed_prefix([*run, *mine.tokens]) - len(run))
        if not mine.tokens:
            return grammar
        self._own = (len(run), mine)
        return _joined(grammar, mine, extra)

    def _then_forced(self, draft: Draft, k: int) -> Draft:
        """The drafter's chain ``draft`` (every token allowed), then the run the grammar forces after it."""
        if not self._joins(draft) or any(t in self.config.eos_token_ids for t in draft.tokens):
            return draft
        run, confidence, spans = self._run_draft(self._forced(draft.tokens), k - len(draft), len(draft))
        if not run:
            return draft
        self._own = (0, draft)
        return _joined(draft, Draft(run, confidence=confidence), {**(draft.extra or {}), **spans})

    def _teach(self, draft: Draft, verdict: Verdict, last: int, logits: torch.Tensor) -> None:
        """Tell the drafter what became of its own proposal: its part of a joined draft as a draft
        of its own after the tokens before it; a plain step where none of its tokens was verified."""
        if self._own is None:
            if (draft.extra or {}).get("source") == GRAMMAR:  # none of the drafter's: it saw a plain step
                self.drafter.verified(Draft([]), verdict, [last], logits[:1])
            else:
                self.drafter.verified(draft, verdict, [last, *draft.tokens], logits)
            return
        offset, mine = self._own
        mine = mine.truncated(max(0, len(draft) - offset))  # as the policy cut the joined draft
        if not mine.tokens or verdict.num_accepted < offset:
            self.drafter.verified(Draft([]), verdict, [last], logits[:1])
            return
        n, accepted = len(mine), verdict.num_accepted - offset
        kept = Verdict(verdict.tokens[offset:offset + min(n, accepted) + 1], min(n, accepted), accepted >= n)
        fed = [last, *draft.tokens][offset:offset + n + 1]
        self.drafter.verified(mine, kept, fed, logits[offset:offset + n + 1])

    @staticmethod
    def _joins(draft: Draft) -> bool:
        return (bool(draft.tokens) and not draft.is_tree and draft.q is None and draft.confidence is not None
                and draft.verify_cost is None)

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


def fit(draft: Draft, nodes: int, depth: int, eos: frozenset[int]) -> Draft:
    """At most ``nodes`` nodes, none deeper than ``depth``, and nothing after an end-of-sequence
    token (a chain is cut there; a tree loses that node's descendants)."""
    draft = draft.truncated(nodes)
    parents = draft.parents if draft.parents is not None else trees.chain(len(draft))
    depth_of = trees.depths(parents)
    too_deep = {i for i, d in enumerate(depth_of) if d > depth}
    after_eos = {i for i, p in enumerate(parents) if p >= 0 and draft.tokens[p] in eos}
    if not too_deep and not after_eos:
        return draft
    return draft.subset(trees.closed_under_ancestors(parents, too_deep | after_eos))


def best_path(draft: Draft) -> list[int]:
    """The root-to-leaf path with the most expected accepted tokens (by the drafter's confidence),
    for backends that verify chains only."""
    parents = draft.parents if draft.parents is not None else trees.chain(len(draft))
    if draft.q is not None:
        # Children drawn at random: choosing among them by what they drew would bias the draft.
        # Follow the first child down instead (a plain draw from q at every depth).
        return trees.first_children(parents)
    survive = trees.path_probabilities(parents, draft.confidence or [1.0] * len(draft))
    best = max(trees.leaves(parents), key=lambda leaf: sum(survive[i] for i in trees.path_to(parents, leaf)),
               default=-1)
    return trees.path_to(parents, best)


def check_token_ids(ids: Sequence[int], vocab_size: int) -> list[int]:
    """``ids`` as a list of token ids, or a clear error (empty, not whole numbers, out of range)."""
    if isinstance(ids, (str, bytes)):
        raise SpecdecError("token ids must be a list of whole numbers, not text")
    try:
        ids = list(ids)
    except TypeError:  # None, a number, ...: say what a prompt may be rather than what failed
        kind = type(ids).__name__
        raise SpecdecError(f"the prompt must be text or a list of token ids, got {kind}") from None
    if not ids:
        raise SpecdecError("the prompt is empty: give at least one token")
    for tok in ids:
        if isinstance(tok, bool) or not isinstance(tok, numbers.Integral):
            raise SpecdecError(f"token ids must be whole numbers, got {tok!r}")
        if not 0 <= tok < vocab_size:
            raise SpecdecError(f"token id {tok} is outside the vocabulary (0..{vocab_size - 1})")
    return [int(t) for t in ids]


def decode(target: Backend, prompt: Sequence[int], config: DecodeConfig,
           drafter: Drafter | None = None, policy: DraftPolicy | None = None) -> Generation:
    """Generate after ``prompt`` (token ids); without a drafter this is plain decoding."""
    return DecodeRun(target, prompt, config, drafter, policy).run()


def _joined(first: Draft, then: Draft, extra: dict) -> Draft:
    """Two chains one after the other (neither sampled: no q), as one draft."""
    probs = None if first.probs is None or then.probs is None else [*first.probs, *then.probs]
    return Draft([*first.tokens, *then.tokens], None, first.forwards + then.forwards,
                 [*first.confidence, *then.confidence], probs, (first.proposed or 0) + (then.proposed or 0),
                 extra=extra)


def _as_cut(draft: Draft) -> dict:
    """The trace's details of a draft the policy may have cut: its grammar tokens' spans within it."""
    extra = dict(draft.extra or {})
    for key in ("certain", "likely"):
        if key in extra:
            start, stop = extra[key]
            stop = min(stop, len(draft))
            if stop > start:
                extra[key] = [start, stop]
            else:
                del extra[key]
    return extra


class LikelyRate:
    """How often the target kept the grammar's likely tokens in this generation (the forced text's
    canonical tokenization past the certain tokens), from a prior of 4 kept of 5: what the policy
    prices them at. Measured on Qwen2.5-Coder's JSON answers: ` "` after a key is kept nearly
    always, ` [` before a list of objects or strings rarely (the model writes ` [{"`, ` ["`)."""

    def __init__(self, kept: float = 4.0, tried: float = 5.0) -> None:
        self.kept, self.tried = kept, tried

    @property
    def rate(self) -> float:
        return self.kept / self.tried

    def learn(self, start: int, stop: int, accepted: int) -> None:
        """Tokens ``start``..``stop`` of a draft were likely ones, and ``accepted`` draft tokens were kept."""
        if accepted >= start:
            self.kept += min(stop, accepted) - start
            self.tried += min(stop, accepted + 1) - start
