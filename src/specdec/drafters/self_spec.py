"""Self-speculation: the target drafts for itself through a small LM head over its own layers.

A forward of Gemma-3-270M is two halves: the 18 layers (~43 ms here in fp32) and the 262k-row LM
head (~40 ms). Plain decoding pays both for every token. This drafter runs the target's own layers
on the token it is about to propose from (:meth:`specdec.backends.hf.HFBackend.body`, into the
target's own KV cache) and reads the hidden state through a head of the target's most frequent
tokens only (FR-Spec, Zhao et al. 2025: 16k rows cost a sixteenth of the full head). Those layer
passes are exactly the ones plain decoding would make for the accepted tokens, so verification of
the whole draft is just the full head over the pending hidden states in one batched matmul: the
saving is the full head for every accepted token but one. Output is unchanged: the target still
judges every token over its whole vocabulary.

Where the target's next token lies in the small head, the draft's greedy choice over it *is* the
target's (same hidden state, same rows), so acceptance is the head's coverage of the text. The head
is the top tokens by the target's own predicted probability mass over a small multilingual
calibration text (cached per model), plus every token met in prompts and outputs since (learned
per model, bounded).

Each extra draft token costs one more pass through the layers that is wasted if it is rejected,
so the draft ends where its estimated survival no longer pays for that risk on the measured
costs (see :meth:`SelfDrafter._worth`).

Backends that cannot run the layers without the head (llama.cpp computes the full output head for
every row it returns and exposes no hidden states) cannot self-speculate; the drafter says so.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources

import torch

from specdec import tree as trees
from specdec.backends.base import Backend
from specdec.cache import JsonCache
from specdec.costs import CostModel, Ema
from specdec.drafters.acceptance import AcceptanceTable
from specdec.drafters.base import Drafter, StopDrafting
from specdec.drafters.grow import best_chain
from specdec.drafters.model import DraftTokens, decile
from specdec.drafters.recycle import RecycleDrafter, build_recycle
from specdec.errors import SpecdecError
from specdec.registry import DraftRequest, drafter
from specdec.types import Draft, Verdict

HEAD_ROWS = 16384  # rows of the static draft head (FR-Spec's 16k-32k; 16k: 1/16 of Gemma's head)
EXTRA_ROWS = 8192  # tokens met in use that the static head missed
CALIBRATION_CHUNK = 128  # positions per forward when measuring token mass (bounds the logits' memory)


class DraftHead:
    """The target's LM head restricted to some of its rows: a static set plus tokens met in use."""

    def __init__(self, weight: torch.Tensor, ids: Sequence[int], softcap: float | None = None,
                 extra_capacity: int = EXTRA_ROWS) -> None:
        self.weight = weight.detach()
        self.ids = torch.tensor(list(dict.fromkeys(int(i) for i in ids)), dtype=torch.long)
        self.static = self.weight.index_select(0, self.ids).contiguous()
        self.extra_ids: list[int] = []
        self.extra = self.weight[:0]
        self.known = set(self.ids.tolist())
        self.softcap = softcap
        self.capacity = extra_capacity
        self._all_ids = self.ids

    def __len__(self) -> int:
        return len(self.known)

    def __contains__(self, token: int) -> bool:
        return token in self.known

    def add(self, tokens: Sequence[int]) -> None:
        """Give the head rows for ``tokens`` it lacks (up to its capacity for extra rows)."""
        new = [t for t in dict.fromkeys(tokens) if t not in self.known]
        new = new[:max(0, self.capacity - len(self.extra_ids))]
        if not new:
            return
        index = torch.tensor(new, dtype=torch.long)
        self.extra = torch.cat([self.extra, self.weight.index_select(0, index)])
        self.extra_ids.extend(new)
        self.known.update(new)
        self._all_ids = torch.cat([self.ids, torch.tensor(self.extra_ids, dtype=torch.long)])

    def logits(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(token ids, float32 logits) over the head's rows for one hidden state ``[H]``."""
        with torch.inference_mode():
            rows = self.static @ hidden
            if self.extra_ids:
                rows = torch.cat([rows, self.extra @ hidden])
        rows = rows.float()
        if self.softcap:
            rows = torch.tanh(rows / self.softcap) * self.softcap
        return self._all_ids, rows


def calibration_text() -> str:
    return resources.files("specdec.data").joinpath("head_calibration.txt").read_text(encoding="utf-8")


def rank_tokens(backend: Backend, ids: Sequence[int], limit: int = HEAD_ROWS) -> list[int]:
    """The ``limit`` tokens with the most predicted probability mass after the positions of
    ``ids`` (each position contributes the target's whole next-token distribution, so a short text
    ranks far more tokens than it contains), the text's own tokens counted once more each."""
    backend.reset()
    mass = torch.zeros(backend.vocab_size, dtype=torch.float64)
    try:
        for start in range(0, len(ids), CALIBRATION_CHUNK):
            logits = backend.extend(list(ids[start:start + CALIBRATION_CHUNK]))
            mass += torch.softmax(logits.double(), -1).sum(0)
    finally:
        backend.reset()
    mass.index_add_(0, torch.tensor(list(ids), dtype=torch.long), torch.ones(len(ids), dtype=torch.float64))
    return torch.argsort(mass, descending=True, stable=True)[:limit].tolist()


def head_for(target, backend: Backend, rows: int = HEAD_ROWS) -> DraftHead:
    """The draft head for ``target`` (a :class:`specdec.api.Model`), its rows ranked once per
    model and cached."""
    text = calibration_text()
    key = f"{target.name}-{backend.vocab_size}-{len(text)}-{rows}"
    cache = JsonCache("draft-heads", key)
    ranked = cache.load(_parse_ids(backend.vocab_size))
    if ranked is None:
        ranked = rank_tokens(backend, target.codec.tokenizer(text)["input_ids"], rows)
        cache.store(ranked)
    hf_model = backend.model
    ids = list(ranked) + sorted(target.eos_token_ids)
    return DraftHead(hf_model.get_output_embeddings().weight, ids,
                     getattr(hf_model.config, "final_logit_softcapping", None))


def _parse_ids(vocab_size: int):
    def parse(raw) -> list[int]:
        ids = [int(i) for i in raw]
        if not ids or any(not 0 <= i < vocab_size for i in ids):
            raise ValueError("not a token ranking for this model")
        return ids
    return parse


GREEDY = -1  # the feature of every greedy self-draft token


def self_table() -> AcceptanceTable:
    """Acceptance of self-drafted tokens by the decile of the small head's probability for its
    token. Greedy: the head's argmax *is* the target's whenever the target's token lies in the
    head, whatever its probability, so every decile starts at 0.9 (the head's coverage) and learns
    where coverage is worse (a flat small-head distribution often means the target's token lies
    outside it). Sampling: from the decile itself, as for a draft model."""
    return AcceptanceTable(prior=lambda f: 0.9 if f[0] == GREEDY else f[0] / 10 + 0.05, bucket=lambda f: f)


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


SELF = "self"


class SelfDrafter(Drafter):
    """Drafts with the target's own layers and a small LM head (see the module's docstring).

    With a ``helper`` (the token-recycling drafter: n-gram index + recycled table; ``combined``)
    each step first weighs the free sources' own draft: taken whole when its best prefix costs less
    per expected token on the target's cost curve than steps drafted through the layers have cost
    per token (measured wall time). Otherwise the draft goes through the layers, and at each
    position where the free sources agree with the small head or are likelier, their chain ends
    the draft if it pays. Free tokens were not run ahead through the layers; verification runs them
    in one batched pass, which costs far less per token than one pass each.
    """

    name = SELF

    def __init__(self, head: DraftHead, table: AcceptanceTable, measured: Measured,
                 helper: RecycleDrafter | None = None) -> None:
        self.head = head
        self.table = table
        self.helper = helper
        self.m = measured
        self.target: Backend | None = None
        self._seen = 0
        self._step: list = [None, 0.0, 0]  # the last step's kind, start time and emitted tokens

    def attach(self, target: Backend) -> None:
        if not callable(getattr(target, "body", None)):
            raise SpecdecError(no_body_message(type(target).__name__))
        self.target = target

    def begin(self, prompt: Sequence[int], sampler) -> None:
        super().begin(prompt, sampler)
        self.head.add(prompt)
        self._seen = len(prompt)
        if self.helper is not None:
            self.helper.begin(prompt, sampler)

    def close(self) -> None:
        if self.helper is not None:
            self.helper.close()

    def see(self, fed: Sequence[int], logits: torch.Tensor) -> None:
        if self.helper is not None:
            self.helper.see(fed, logits)

    def propose(self, tokens: Sequence[int], k: int, stop: StopDrafting | None = None) -> Draft:
        if self.target is None:
            raise SpecdecError("the self drafter drafts with the target's own layers: attach the target first")
        self._time_step()
        self.head.add(tokens[self._seen:])  # what the context holds is likely to come again
        self._seen = len(tokens)
        want_q = not self.sampler.greedy and not self.sampler.coupled
        if self.helper is not None:
            # Decided before any layer pass: a free chain is verified in one forward with the
            # last token, which a pass run ahead for it would split in two. (This also brings the
            # n-gram index up to date for the per-position look-ups below.)
            free = self._free_draft(tokens, k, stop, want_q)
            if free is not None:
                return free
        out = DraftTokens(want_q)
        hidden = self._body(tokens[-1])
        forwards, survival = 1, 1.0
        for i in range(k):
            t0 = time.perf_counter()
            tok, prob, q = self._draw(hidden, len(tokens) + i, want_q)
            self.m.small.add(time.perf_counter() - t0)
            feats = (GREEDY, decile(prob)) if self.sampler.greedy else (decile(prob),)
            estimate = self.table.estimate(feats)
            free = self.helper.expand(out.tokens, tokens[-1]) if self.helper is not None else []
            # The free sources take over where they are likelier, or agree with the head, and their
            # chain pays for its verified rows (then it goes on without a layer pass per token).
            if free and (free[0][0] == tok or free[0][1] > estimate) and self._free_tail(out, tokens, k, stop, want_q):
                break
            if not self._worth(survival * estimate):
                break
            survival *= estimate
            out.append(tok, prob, estimate, (SELF, feats), q)
            if i + 1 == k or (stop is not None and stop(out.confidence)):
                break
            hidden = self._body(tok)
            forwards += 1
        return out.draft(forwards, prefed=True)

    def _time_step(self) -> None:
        """Close the timing of the previous step (drafting + verification) and open this one's."""
        now = time.perf_counter()
        kind, started, emitted = self._step
        if kind == SELF and emitted:
            self.m.self_token.add((now - started) / emitted)
        self._step = [SELF, now, 0]

    def _free_draft(self, tokens: Sequence[int], k: int, stop: StopDrafting | None, want_q: bool) -> Draft | None:
        """The free sources' draft (a tree with ``--tree``) as the whole draft, when its best
        prefix costs less per expected token (one batched forward: a row each) than drafting
        token by token through the layers does on average; None otherwise. The draft-length
        policy may still cut it."""
        draft = self.helper.propose(tokens, k, stop)
        if not draft.tokens:
            return None
        parents = draft.parents if draft.parents is not None else trees.chain(len(draft))
        expected, best = 1.0, float("inf")
        for n, reach in enumerate(trees.path_probabilities(parents, draft.confidence), start=1):
            expected += reach
            best = min(best, self.m.forward(n + 1) / expected)
        if best >= self.m.self_token.value:
            return None
        self._step[0] = "free"
        if want_q:
            draft.q = one_hot(draft.tokens, self.target.vocab_size)
        return draft

    def _free_tail(self, out: DraftTokens, tokens: Sequence[int], k: int, stop: StopDrafting | None,
                   want_q: bool) -> bool:
        """End the draft with the free sources' chain (no layer passes until verification) if it
        pays: its expected accepted tokens would each have cost a layer pass, its tokens cost a
        batched row each and ending the step here costs one more full head. False: not taken."""
        tail = best_chain(lambda path: self.helper.expand(out.tokens + path, tokens[-1]), k - len(out.tokens))
        expected = sum(trees.path_probabilities(trees.chain(len(tail)), tail.confidence))
        # The tail's rows and the full head: about a forward of its length.
        if expected * (self.m.body.value + self.m.small.value) <= self.m.forward(len(tail)):
            return False
        for tok, estimate, feats in zip(tail.tokens, tail.confidence, tail.features):
            out.append(tok, 1.0, estimate, feats, one_hot(tok, self.target.vocab_size) if want_q else None)
            if stop is not None and stop(out.confidence):
                break
        return True

    def _body(self, token: int) -> torch.Tensor:
        t0 = time.perf_counter()
        hidden = self.target.body([token])[-1]
        self.m.body.add(time.perf_counter() - t0)
        return hidden

    def _draw(self, hidden: torch.Tensor, position: int, want_q: bool) -> tuple[int, float, torch.Tensor | None]:
        """The drafted token, its probability under the draft, and the full distribution when
        rejection sampling needs it."""
        ids, logits = self.head.logits(hidden)
        if self.sampler.greedy:
            best = int(logits.argmax())
            return int(ids[best]), float(torch.softmax(logits, -1)[best]), None
        # Sampling: the small head's logits in a full-vocabulary row (-inf elsewhere), through the
        # same temperature / top-k / top-p as the target; coupled mode draws with its noise.
        full = torch.full((self.target.vocab_size,), float("-inf"))
        full[ids] = logits
        q = self.sampler.probs(full)
        tok = self.sampler.draft_token(q, position)
        return tok, float(q[tok]), q if want_q else None

    def _worth(self, survival: float) -> bool:
        """Whether a draft token reached with probability ``survival`` pays for its layer pass.

        Per emitted token a step costs (emitted x layer pass + overhead) / emitted, with overhead
        = full head + rejected drafts' layer passes + small heads. One more draft token adds
        ``survival`` expected tokens and ``small head + (1 - survival) x layer pass`` expected
        overhead; it pays when that lowers the ratio overhead / emitted.
        """
        added = self.m.small.value + (1.0 - survival) * self.m.body.value
        return survival * self.m.overhead.value > self.m.per_step.value * added

    def observe(self, draft: Draft, verdict: Verdict) -> None:
        """Each judged token teaches the table of the source that proposed it."""
        self._step[2] = len(verdict.tokens)
        if self._step[0] != SELF:  # the free sources' own draft (maybe a tree)
            self.helper.observe(draft, verdict)
            return
        for i in range(min(len(draft), verdict.num_accepted + 1)):
            source, feats = draft.features[i]
            if source == SELF:
                self.table.record(feats, i < verdict.num_accepted)
            else:
                self.helper.record(source, feats, i < verdict.num_accepted)
        wasted = sum(1 for i in range(verdict.num_accepted, len(draft)) if draft.features[i][0] == SELF)
        self.m.per_step.add(len(verdict.tokens))
        self.m.overhead.add(self.m.head + wasted * self.m.body.value + len(draft) * self.m.small.value)


def one_hot(tokens, vocab_size: int) -> torch.Tensor:
    """Rejection sampling's q for deterministic draft tokens (free sources' tokens)."""
    return torch.nn.functional.one_hot(torch.tensor(tokens), vocab_size).float()


def no_body_message(backend: str) -> str:
    return (f"the self drafter needs a backend that can run the target's layers without its LM head "
            f"(transformers); {backend} cannot: llama.cpp computes the full output head for every "
            f"row it returns and exposes no hidden states, so neither can the head be cut nor layers "
            f"skipped there (use --backend transformers, or --drafter ngram / recycle)")


def head_seconds(backend: Backend) -> float:
    """The full LM head's time for one row on this machine (best of three)."""
    hidden = torch.zeros(backend.model.config.hidden_size, dtype=backend.model.dtype)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        backend.head(hidden[None])
        best = min(best, time.perf_counter() - t0)
    return best


def _shared(target) -> tuple[DraftHead, AcceptanceTable, Measured]:
    """The draft head, acceptance table and measurements of ``target``, kept across generations."""
    if target.hf_model is None:
        raise SpecdecError(no_body_message(f"the {target.backend_name} backend"))

    def build() -> tuple[DraftHead, Measured]:
        costs = target.cost_model()
        with target.pool.lease() as backend:
            return head_for(target, backend), Measured.start(head_seconds(backend), costs)
    head, measured = target.shared("self-draft-head", build)
    return head, target.shared("self-acceptance", self_table), measured


@drafter("self", "the target drafts for itself: its own layers (sharing its KV cache) read through a "
                 f"{HEAD_ROWS // 1024}k-row head of its most frequent tokens; verifying costs only the "
                 "full LM head (transformers backend)", order=35)
def _build_self(request: DraftRequest) -> Drafter:
    return SelfDrafter(*_shared(request.target))


@drafter("combined", "per step, the n-gram index and recycled table (free, verified in one batched pass; "
                     "with --tree a tree) where they pay more than drafting through the target's own "
                     "layers (self), which takes over where they are weak (transformers backend)", order=36)
def _build_combined(request: DraftRequest) -> Drafter:
    return SelfDrafter(*_shared(request.target), helper=build_recycle(request.target, request.tree))
