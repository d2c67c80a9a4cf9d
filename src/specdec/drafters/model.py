"""Drafting with a smaller model that shares the target's tokenizer (Leviathan et al. 2023)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch

from specdec.backends.base import Backend
from specdec.costs import CostModel
from specdec.drafting.acceptance import AcceptanceTable
from specdec.drafters.base import Drafter, StopDrafting
from specdec.drafting.draft_model import (LOOKUP_ACCEPTANCE, bridged, draft_backend, draft_costs,
                                          model_table)
from specdec.drafting.draft_tokens import DraftTokens, decile
from specdec.drafting.grow import MAX_TREE_NODES
from specdec.drafting.notes import Notes
from specdec.drafters.ngram import NgramDrafter
from specdec.options import Option
from specdec.registry import DraftRequest, drafter
from specdec.sampling import Sampler
from specdec.types import Draft, Verdict

WIDTH = 3  # most children a tree node gets (the drafter's top tokens)
LOOKUP_MIN = 0.5  # the n-gram index drafts instead of the model when its first token is this likely
MIN_PATH = 0.02  # nodes less likely than this to be reached are not worth a verified row


class ModelDrafter(Drafter):
    """Runs a draft model autoregressively for up to k tokens on its own KV cache.

    The cache is kept in step with the context by token comparison: each ``propose`` rolls the
    draft cache back to the longest prefix it shares with the context and feeds the rest in one
    forward, so rejected drafts are undone and accepted ones are not recomputed.

    Tokens are drawn with the generation's sampler: with coupled verification the drafter uses
    the target's own per-position noise, so it proposes the target's sample whenever its
    distribution is close enough; with rejection sampling it draws independently and hands q over.

    Each token's confidence is the drafter's own probability for it, calibrated online; the
    ``stop`` callback (the policy's :meth:`~specdec.policies.base.DraftPolicy.stop_drafting`) can
    end the draft early, since a draft forward spent on a token that will be rejected is wasted.

    With ``tree=True`` (and a draft backend that scores trees) the draft branches on the
    drafter's top tokens: its own draw first, then the next most likely ones (in rejection mode,
    siblings drawn i.i.d. from q, as SpecInfer's verification requires). The tree grows a depth
    at a time, one batched draft forward per depth over the tree so far, keeping the nodes whose
    estimated path probability is highest.
    """

    name = "model"

    def __init__(self, backend: Backend, table: AcceptanceTable | None = None,
                 release: Callable[[Backend], None] | None = None, tree: bool = False,
                 costs: Callable[[], CostModel] | None = None, lookup: NgramDrafter | None = None) -> None:
        self.backend = backend
        self.table = table or model_table()
        # The draft model's own forward-cost curve (measured once per machine, then refined by the
        # forwards timed here): what a drafted token costs, for the policy to weigh.
        self.costs = costs
        self.cached: list[int] = []  # the tokens whose keys/values are in backend's cache
        self.tree = tree and backend.supports_tree
        self._release = release
        self._siblings: torch.Generator | None = None
        # [V] bool: the only tokens it may draft (a vocabulary bridge's intersection), or None.
        self.allowed: torch.Tensor | None = None
        # The n-gram index of the context: where it repeats itself, its drafts come free.
        self.lookup = lookup
        self._copied = False  # whether the last draft came from the index
        self.notes = Notes()  # each drafted node's features, until its verdict teaches the table

    def token_cost(self, tokens: Sequence[int] = ()) -> float:
        if self.lookup is not None and tokens and self._copies(tokens):
            return 0.0
        if self.costs is None:
            return 0.0
        # In a server whose draft model steps every request's drafts together, a token costs this
        # sequence's row on top of the others' (the curve itself when it drafts alone).
        return self.backend.forward_costs(self.costs()).forward(1)

    def _copies(self, tokens: Sequence[int]) -> bool:
        """Whether the n-gram index has a likely continuation here (the context repeats itself)."""
        self.lookup.sync(tokens)
        found = self.lookup.index.continuations([])
        return bool(found) and self.lookup.table.estimate(found[0][1]) >= LOOKUP_MIN

    def begin(self, prompt: Sequence[int], sampler: Sampler, target: Backend | None = None) -> None:
        super().begin(prompt, sampler, target)
        self.notes.clear()
        self.backend.reset()
        self.backend.idle()  # batched with other requests' drafts: only while it drafts (propose)
        self.cached = []
        self._siblings = torch.Generator().manual_seed(sampler.seed % 2**63)
        self._copied = False
        if self.lookup is not None:
            self.lookup.begin(prompt, sampler)

    def reserve(self, tokens: int, cancelled=None) -> None:
        limit = getattr(self.backend, "max_length", None)  # the draft model's own context ends there
        # A GPU batch's pages (a static cache's size), all at once, as the target's.
        self.backend.reserve(tokens if limit is None else min(tokens, limit), cancelled)
        if self.lookup is not None:
            self.lookup.reserve(tokens, cancelled)

    def _budget(self, tokens: Sequence[int], k: int) -> int:
        limit = getattr(self.backend, "max_length", None)
        return k if limit is None else min(k, limit - len(tokens))  # the draft model's own context ends there

    def _sync(self, tokens: list[int]) -> torch.Tensor:
        """Bring the cache to ``tokens`` (reusing the common prefix); the logits after them."""
        keep = _common_prefix(self.cached, tokens, limit=len(tokens) - 1)
        self.backend.truncate(keep)
        if keep == 0 and len(tokens) > 1:
            # The prompt goes in as the target's does (prefill, then the last token): a backend may
            # fill a prompt on other kernels than it decodes with, and a draft model with the
            # target's own weights must then hold the target's cache bit for bit, or a near-tie
            # drafts another token than the target will choose.
            self.backend.prefill(tokens[:-1])
            keep = len(tokens) - 1
        logits = self._forward(tokens[keep:])
        self.cached = list(tokens)
        return logits

    def _forward(self, tokens: Sequence[int]) -> torch.Tensor:
        """The draft model's logits after ``tokens`` (fed in one forward), timed for its curve."""
        t0 = time.perf_counter()
        logits = self.backend.extend(tokens, last_only=True)[-1]
        if self.costs is not None:
            self.costs().observe(len(tokens), time.perf_counter() - t0, after=1)
        return logits

    def _q(self, logits: torch.Tensor) -> torch.Tensor:
        q = torch.softmax(logits.float(), -1) if self.sampler.greedy else self.sampler.probs(logits)
        if self.allowed is not None:
            q = q * self.allowed[:q.shape[-1]]
            total = q.sum()
            q = q / total if total > 0 else self.allowed[:q.shape[-1]] / self.allowed.sum()
        return q

    def _new_draft(self) -> DraftTokens:
        return DraftTokens(want_q=not self.sampler.greedy and not self.sampler.coupled)

    def propose(self, tokens: Sequence[int], k: int, stop: StopDrafting | None = None) -> Draft:
        k = self._budget(tokens, k)
        if k <= 0:
            return Draft([])
        tokens = list(tokens)
        self._copied = self.lookup is not None and self._copies(tokens)
        if self._copied:
            # Where the context repeats itself the index drafts for free what the draft model
            # would spend a forward a token on (and is right about as often, copying code).
            return self.lookup.propose(tokens, k, stop)
        with self.backend.busy():
            logits = self._sync(tokens)
            if self.tree:
                return self._propose_tree(tokens, k, logits)
            return self._propose_chain(tokens, k, logits, stop)

    def _propose_chain(self, tokens: list[int], k: int, logits: torch.Tensor, stop: StopDrafting | None) -> Draft:
        out = self._new_draft()
        forwards = 1
        for i in range(k):
            q = self._q(logits)
            tok = self.sampler.draft_token(q, len(tokens) + i)
            out.add(tok, q, (decile(q[tok]),), self.table)
            if i + 1 == k or (stop is not None and stop(out.confidence)):
                break
            logits = self._forward([tok])
            self.cached.append(tok)
            forwards += 1
        return self.notes.keep(out.draft(forwards), out.features)

    def _propose_tree(self, tokens: list[int], k: int, logits: torch.Tensor) -> Draft:
        k = min(k, MAX_TREE_NODES)
        out = self._new_draft()
        parents: list[int] = []
        reach: list[float] = []  # estimated probability that verification reaches each node
        depth_of: list[int] = []
        frontier = [(-1, logits)]  # (node, the drafter's logits after it)
        forwards = 1
        while frontier and len(out.tokens) < k:
            candidates = []
            for node, row in frontier:
                q = self._q(row)
                depth = 0 if node < 0 else depth_of[node] + 1
                base = 1.0 if node < 0 else reach[node]
                top = decile(q.max())
                for rank, tok in enumerate(self._children(q, len(tokens) + depth)):
                    # Siblings drawn at random must be kept, ordered and sized by what does not depend
                    # on which tokens came out (SpecInfer's rule assumes i.i.d. children): there, a
                    # node is scored by its rank and the distribution it came from, not its token.
                    feats = (top if out.want_q else decile(q[tok]), min(rank, 1))
                    candidates.append((base * self.table.estimate(feats), node, tok, q, feats, depth))
            candidates.sort(key=lambda c: -c[0])
            added = []
            for path_prob, node, tok, q, feats, depth in candidates:
                if len(out.tokens) == k or path_prob < MIN_PATH:
                    break
                out.add(tok, q, feats, self.table)
                parents.append(node)
                reach.append(path_prob)
                depth_of.append(depth)
                added.append(len(out.tokens) - 1)
            if not added or len(out.tokens) == k:
                break
            # One forward over the whole tree so far: each node sees the context and its ancestors.
            rows = self.backend.extend(out.tokens, tree=parents)
            self.backend.truncate(len(tokens))
            forwards += 1
            frontier = [(i, rows[i]) for i in added]
        if not out.tokens:
            return Draft([])
        # Best first (a node is never likelier than its parent, so parents stay first): any prefix
        # of the nodes is then the best tree of its size for the policy to cut.
        order = sorted(range(len(parents)), key=lambda i: (-reach[i], depth_of[i], i))
        return self.notes.keep(out.draft(forwards, parents).subset(order), [out.features[i] for i in order])

    def _children(self, q: torch.Tensor, position: int) -> list[int]:
        """The drafter's own draw, then its next most likely tokens (rejection mode: i.i.d. draws)."""
        first = self.sampler.draft_token(q, position)
        if self.sampler.greedy or self.sampler.coupled:
            top = torch.topk(q, min(WIDTH + 1, q.shape[-1]))
            others = [t for t, v in zip(top.indices.tolist(), top.values.tolist()) if t != first and v > 0]
            return [first] + others[:WIDTH - 1]
        more = torch.multinomial(q, WIDTH - 1, replacement=True, generator=self._siblings).tolist()
        return [first] + more

    def verified(self, draft: Draft, verdict: Verdict, fed: Sequence[int] = (),
                 logits: torch.Tensor | None = None) -> None:
        """The verdict teaches the table of whichever drafted: the index or the model."""
        if self._copied:
            self.lookup.verified(draft, verdict, fed, logits)
            return
        features = self.notes.take(draft)
        if features:
            self.table.learn(draft, features, verdict)

    def close(self) -> None:
        if self.lookup is not None:
            self.lookup.close()
        if self._release is not None:
            self._release(self.backend)
            self._release = None


def _common_prefix(a: list[int], b: list[int], limit: int) -> int:
    n = 0
    stop = min(len(a), len(b), limit)
    while n < stop and a[n] == b[n]:
        n += 1
    return n


LOOKUP_OPTION = Option(
    "lookup", bool, True,
    "let the model drafter copy from the context with the n-gram index where the context repeats itself "
    "(free drafts; the draft model runs only where no copy is likely, and only where its forwards pay)")


@drafter("model", "a smaller model (--draft-model; another tokenizer is bridged through text); with --tree "
                  "it branches on the drafter's top tokens", needs_draft_model=True, order=20,
         options=[LOOKUP_OPTION])
def _build_model(request: DraftRequest) -> Drafter:
    backend, table, release = draft_backend(request)
    same = request.target.codec.same_vocabulary(request.draft.codec)
    # The index works in the draft model's tokens: with another vocabulary it drafts through the
    # bridge like the model does.
    table_slot = LOOKUP_ACCEPTANCE.named(f"for-{request.target.name}")
    lookup = NgramDrafter(table=request.draft.state(table_slot)) if request.options["lookup"] else None
    return bridged(request, ModelDrafter(backend, table, release=release, tree=request.tree and same,
                                         costs=draft_costs(request), lookup=lookup))
