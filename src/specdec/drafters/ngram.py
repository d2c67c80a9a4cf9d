"""N-gram drafting from an index of the whole context (prompt lookup, grown up).

Prompt lookup (Saxena 2023; transformers' PromptLookupCandidateGenerator, vLLM's NgramProposer)
copies what followed the latest earlier occurrence of the context's last few tokens. This drafter
keeps an index of every n-gram (n <= ``max_ngram``) of the prompt and the output so far, so each
draft token is chosen from *all* earlier occurrences of the longest matching suffix (the most
frequent continuation, the latest on ties), token by token, like a suffix tree (SuffixDecoding,
Oliaro et al. 2024). Each token also gets an estimated acceptance probability from what predicts it
best: how long the match is and how unanimous the earlier continuations were, calibrated online by
:class:`AcceptanceTable`. No model is involved, so the draft is deterministic (one-hot q).

With ``tree=True`` the draft branches where earlier continuations disagree: each node's children
are the distinct continuations of its longest matching suffix, and the tree grows best-first by
estimated path probability (SuffixDecoding's speculation tree), so any prefix of its nodes is the
best tree of that size and the policy can keep the size that pays.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from specdec.context import LearnedSlot
from specdec.drafting.acceptance import AcceptanceTable, Hindsight
from specdec.drafters.base import Drafter, StopDrafting
from specdec.drafting.grow import best_first_tree
from specdec.drafting.memory import MAX_MATCH, NgramMemory, Occurrence
from specdec.errors import SpecdecError
from specdec.registry import DraftRequest, drafter
from specdec.types import Draft, Verdict

MAX_CANDIDATES = 256  # latest occurrences of a context's n-gram whose match lengths are compared
BEYOND_PENALTY = 1.0  # log-odds lost per span of the context's match the draft has gone past
WIDTH = 3  # most children a tree node gets (the most frequent continuations)


class NgramDrafter(Drafter):
    """Draft from the longest suffix (``min_ngram``..``max_ngram`` tokens) seen earlier in the context."""

    name = "ngram"

    def __init__(self, max_ngram: int = 4, min_ngram: int = 1, table: AcceptanceTable | None = None,
                 tree: bool = False, memory: NgramMemory | None = None) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise SpecdecError(f"n-gram sizes need 1 <= min ({min_ngram}) <= max ({max_ngram})")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.tree = tree
        self.table = table or AcceptanceTable(ngram_prior, ngram_bucket)
        self.memory = memory  # earlier generations' continuations, used where they beat this context's
        # Declined chains are judged on the tokens that followed them (the table learns what it
        # would never have verified); the last chain proposed, until the policy's verdict on it.
        self.hindsight = Hindsight(self.table)
        self._proposal: tuple[int, list[int], list] | None = None
        self._prompt_len = 0
        self._seq: list[int] = []
        # n-gram -> positions right after each occurrence (where its continuation is)
        self._index: dict[tuple[int, ...], list[int]] = {}
        self._matches: tuple[int, tuple[list[Occurrence], int, int]] | None = None  # (context length, its longest matches)

    def begin(self, prompt, sampler) -> None:
        super().begin(prompt, sampler)
        self._seq, self._index = [], {}
        self._matches = None
        self._prompt_len = len(prompt)
        self.hindsight.clear()
        self._proposal = None

    def close(self) -> None:
        self.hindsight.judge(self._seq, final=True)
        self.hindsight.clear()
        if self.memory is not None and len(self._seq) > self._prompt_len:
            # The output, with the prompt's last n-gram so that its first tokens have a context.
            self.memory.add(self._seq[max(0, self._prompt_len - self.max_ngram):])

    def propose(self, tokens: Sequence[int], k: int, stop: StopDrafting | None = None) -> Draft:
        self.sync(tokens)
        self._proposal = None
        if self.tree:
            return self._propose_tree(k)
        draft, features, confidence = [], [], []
        # The occurrences with the context's longest match are followed token by token (a suffix
        # tree's deepest node): in code, a 4-gram's most frequent continuation is often another
        # function's, while the longest match is the stretch being copied.
        group, start, remembered = self._longest_matches()
        # Token by token, so that drafting stops where the policy says the chain no longer pays
        # (most steps on a CPU); a walk of the index is a few dictionary lookups a token.
        while len(draft) < k:
            followed = self._follow(group, start, remembered, draft) if group else None
            if followed is not None:
                token, feats, group = followed
            else:
                group = []
                found = self.continuations(draft)
                if not found:
                    break
                token, feats = found[0]
            draft.append(token)
            features.append(feats)
            confidence.append(self.table.estimate(feats))
            if stop is not None and stop(confidence):
                break
        self._proposal = (len(self._seq), draft, features)
        return Draft(draft, confidence=confidence, features=features)

    def guess(self, tokens: Sequence[int], after: Sequence[int], k: int) -> list[int]:
        """Up to ``k`` tokens to follow ``tokens`` + ``after``, from the index of ``tokens`` alone
        (a draft that changes every call is not indexed, so the index is never rebuilt)."""
        self.sync(tokens)
        return self._chain(list(after), k)[0][len(after):]

    def _chain(self, draft: list[int], k: int) -> tuple[list[int], list[tuple[int, int, int]]]:
        """Extend ``draft`` by up to ``k`` most frequent continuations; the new tokens' features."""
        features: list[tuple[int, int, int]] = []
        for _ in range(k):
            found = self.continuations(draft)
            if not found:
                break
            token, feats = found[0]
            draft = draft + [token]
            features.append(feats)
        return draft, features

    def _propose_tree(self, k: int) -> Draft:
        """Grow a tree best-first by path probability over the distinct continuations of each node."""
        return best_first_tree(self.expand, k, WIDTH)

    def expand(self, path: list[int]) -> list[tuple[int, float, tuple[int, int, int]]]:
        """Candidates to follow context + ``path``: every level's continuations, best estimate first."""
        found = [(token, self.table.estimate(feats), feats) for token, feats in self.continuations(path, every_level=True)]
        return sorted(found, key=lambda c: c[1], reverse=True)

    def observe(self, draft: Draft, verdict: Verdict) -> None:
        if draft.features:
            self.table.learn(draft, verdict)
        elif not len(draft) and self._proposal is not None:
            self.hindsight.declined(*self._proposal)
        self._proposal = None

    # -- index ------------------------------------------------------------------------------------
    def sync(self, tokens: Sequence[int]) -> None:
        """Index the tokens added since the last call (rebuild if the context is not an extension)."""
        seq = self._seq
        if len(tokens) < len(seq) or list(tokens[:len(seq)]) != seq:
            self._seq, self._index = [], {}
            self._matches = None
            self.hindsight.clear()
            seq = self._seq
        for tok in tokens[len(seq):]:
            seq.append(tok)
            end = len(seq)
            for n in range(1, min(self.max_ngram, end) + 1):
                self._index.setdefault(tuple(seq[end - n:]), []).append(end)
        self.hindsight.judge(seq)

    def continuations(self, draft: list[int], every_level: bool = False) -> list[tuple[int, tuple[int, int, int]]]:
        """The tokens that followed the longest earlier match of context + ``draft``, most frequent
        first (the latest on ties), each with its features (match, agreement, count).

        ``every_level`` adds, from shorter matches, tokens the longest one never saw followed by
        (with that level's features, so their estimates come out lower); a tree branches on them.
        """
        seq = self._seq
        tail = (seq[-self.max_ngram:] + draft)[-self.max_ngram:]
        beyond = _beyond(len(draft), self._longest_matches()[1])
        out: list[tuple[int, tuple[int, ...]]] = []
        seen: set[int] = set()
        for n in range(min(self.max_ngram, len(tail)), self.min_ngram - 1, -1):
            ends = [e for e in self._index.get(tuple(tail[-n:]), ()) if e < len(seq)]
            if not ends:
                continue
            counts: dict[int, int] = {}
            latest: dict[int, int] = {}
            for e in ends:
                tok = seq[e]
                counts[tok] = counts.get(tok, 0) + 1
                latest[tok] = e
            for token in sorted(counts, key=lambda t: (counts[t], latest[t]), reverse=True):
                if token not in seen:
                    seen.add(token)
                    match = n if n < self.max_ngram else self._match_length(latest[token], draft)
                    out.append((token, (match, counts[token] * 100 // len(ends), counts[token], 0, beyond)))
            if not every_level:
                break
        if self.memory is not None:
            # Earlier outputs go first when their best candidate is likelier than the context's
            # (e.g. a 4-gram remembered vs a unigram match here), otherwise they only add branches.
            remembered = self._remembered((seq[-MAX_MATCH:] + draft)[-MAX_MATCH:], seen, beyond)
            if remembered and (not out or self.table.estimate(remembered[0][1]) > self.table.estimate(out[0][1])):
                out = remembered + out
            elif every_level:
                out += remembered
        return out

    def _longest_matches(self) -> tuple[list[Occurrence], int, int]:
        """The occurrences of the context's longest earlier match, in the context itself (at least
        ``min_ngram`` tokens) or in the memory of earlier outputs, whichever is longer (the
        context on ties); its length (at most MAX_MATCH: SuffixDecoding's evidence for how far a
        copy goes on) and whether it is remembered. Found once per context."""
        if self._matches is None or self._matches[0] != len(self._seq):
            self._matches = (len(self._seq), self._find_longest_matches())
        return self._matches[1]

    def _find_longest_matches(self) -> tuple[list[Occurrence], int, int]:
        seq = self._seq
        group: list[Occurrence] = []
        best = 0
        for n in range(min(self.max_ngram, len(seq)), self.min_ngram - 1, -1):
            ends = [e for e in self._index.get(tuple(seq[-n:]), ()) if e < len(seq)][-MAX_CANDIDATES:]
            if not ends:
                continue
            if n < self.max_ngram:
                best, group = n, [(seq, e) for e in ends]
            else:
                lengths = [self._match_length(e, []) for e in ends]
                best = max(lengths)
                group = [(seq, e) for e, m in zip(ends, lengths) if m == best]
            break
        if self.memory is not None:
            remembered, n = self.memory.matches(seq[-MAX_MATCH:])
            if n > best:
                return remembered, n, 1
        return group, best, 0

    def _follow(self, group: list[Occurrence], start: int, remembered: int,
                draft: list[int]) -> tuple[int, tuple[int, ...], list[Occurrence]] | None:
        """The next draft token along ``group`` (occurrences matching the context plus ``draft``):
        the most frequent continuation, the latest on ties; its features; the occurrences that
        continue with it. None where every occurrence has ended."""
        seq, i = self._seq, len(draft)
        at: list[tuple[int, Occurrence]] = []
        for src, e in group:
            if e + i < len(src):
                at.append((src[e + i], (src, e)))
            elif src is seq:  # running into the context's own end (a repeating pattern): the draft continues it
                at.append((draft[e + i - len(seq)], (src, e)))
        if not at:
            return None
        counts: dict[int, int] = {}
        for tok, _ in at:
            counts[tok] = counts.get(tok, 0) + 1
        # The latest occurrence's on ties (a group lists the oldest first).
        top = max(counts.values())
        token = next(tok for tok, _ in reversed(at) if counts[tok] == top)
        beyond = _beyond(i, start)
        feats = (min(start + i, MAX_MATCH), counts[token] * 100 // len(at), counts[token], remembered, beyond)
        return token, feats, [occ for tok, occ in at if tok == token]

    def _remembered(self, tail: list[int], seen: set[int], beyond: int = 0) -> list[tuple[int, tuple[int, ...]]]:
        """Continuations of ``tail`` in earlier generations (features flagged as remembered)."""
        found = self.memory.lookup(tail)
        if found is None:
            return []
        n, counts = found
        total = sum(counts.values())
        return [(token, (n, counts[token] * 100 // total, counts[token], 1, beyond))
                for token in sorted(counts, key=counts.get, reverse=True) if token not in seen]

    def _match_length(self, end: int, draft: list[int]) -> int:
        """How many tokens before ``end`` equal the tokens before the current draft position."""
        seq, d = self._seq, len(draft)
        n = 0
        while n < MAX_MATCH and n < end:
            mine = draft[d - 1 - n] if n < d else seq[len(seq) - 1 - (n - d)]
            if mine != seq[end - 1 - n]:
                break
            n += 1
        return n


def _beyond(position: int, start: int) -> int:
    """How far a draft token at ``position`` is past the context's match of length ``start``:
    0 within it, 1 within twice it, 2 further."""
    return 0 if position < start else (1 if position < 2 * start else 2)


def ngram_bucket(feats: tuple[int, ...]) -> tuple[int, int, int, int, int]:
    match, agreement, count = feats[:3]
    remembered = feats[3] if len(feats) > 3 else 0
    beyond = feats[4] if len(feats) > 4 else 0
    return (min(match, 4) if match < 5 else (5 if match < 8 else (6 if match < 16 else 7)),
            2 if agreement == 100 else (1 if agreement >= 50 else 0), min(count, 3), remembered, beyond)


def ngram_prior(feats: tuple[int, ...]) -> float:
    """Prior P(accept): a logistic fit on 122k draft tokens of greedy Spec-Bench outputs (80 prompts x
    128 tokens, SmolLM2-135M-Instruct and Gemma-3-270M), refined online per bucket. A continuation
    remembered from another generation starts from the same guess, in buckets of its own."""
    match, agreement, count = feats[:3]
    z = (-4.222 + 1.289 * math.log(match) + 2.079 * agreement / 100 + 1.584 * (agreement == 100)
         + 1.24 * math.log(count) - BEYOND_PENALTY * (feats[4] if len(feats) > 4 else 0))
    return 1.0 / (1.0 + math.exp(-z))


@drafter("ngram", "prompt lookup from an index of every n-gram of the prompt and output (no model); "
                  "with --tree it branches where earlier continuations disagree", order=10)
def _build_ngram(request: DraftRequest) -> NgramDrafter:
    return NgramDrafter(table=request.target.state(NGRAM_ACCEPTANCE), tree=request.tree, memory=request.target.memory)


# The target model's n-gram acceptance table: what it learns carries over to later generations.
NGRAM_ACCEPTANCE: LearnedSlot[AcceptanceTable] = LearnedSlot(
    "ngram-acceptance", lambda: AcceptanceTable(ngram_prior, ngram_bucket))
