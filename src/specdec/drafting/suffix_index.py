"""The suffix index that every drafter that looks text up drafts from: the context's n-grams and,
optionally, the earlier outputs a model remembers.

Prompt lookup (Saxena 2023; transformers' PromptLookupCandidateGenerator, vLLM's NgramProposer)
copies what followed the latest earlier occurrence of the context's last few tokens.
:class:`SuffixIndex` keeps every n-gram (n <= ``max_ngram``) of the context, so a draft token is
chosen from *all* earlier occurrences of the longest matching suffix (the most frequent
continuation, the latest on ties), and the occurrences with the longest match (up to
:data:`MAX_MATCH` tokens, compared backwards) are followed token by token, as a suffix tree's
deepest node would be (SuffixDecoding, Oliaro et al. 2024).

SuffixDecoding's global tree and llama.cpp's dynamic n-gram cache keep what a model wrote before,
so a server answering similar requests drafts from its earlier answers. :class:`NgramMemory` keeps
the earlier outputs whole (at most ``capacity`` tokens; the oldest output goes first) with an index
of their ``key``-grams, searched for the longest match the same way as the context. Optional
(``Model.enable_memory``, ``--memory``; a server keeps one per API key) and saved as JSON only
when asked.

Every token found carries :class:`NgramFeatures`, the evidence its acceptance estimate
(:func:`ngram_prior`, calibrated per :func:`ngram_bucket` by an
:class:`~specdec.drafting.acceptance.AcceptanceTable`) is read from.
"""

from __future__ import annotations

import bisect
import json
import math
import threading
from array import array
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

from specdec import options
from specdec.errors import SpecdecError
from specdec.files import write_atomic

# SuffixDecoding's evidence for how far a copy goes on: a match is measured back this far at most.
MAX_MATCH = 64
MAX_CANDIDATES = 256  # latest occurrences of a key n-gram whose match lengths are compared
BEYOND_PENALTY = 1.0  # log-odds lost per span of the context's match the draft has gone past

FORMAT = "specdec-memory"
VERSION = 2  # earlier outputs kept whole (version 1 kept n-gram counts)
DEFAULT_CAPACITY = 200_000  # tokens of earlier outputs (about 20 MB with the index)

# Where a copy continues: the tokens (the context, or a remembered output) and the position after the match.
Occurrence = tuple[Sequence[int], int]


class NgramFeatures(NamedTuple):
    """The evidence for one token found in the index, what its acceptance is estimated from."""

    match: int  # tokens before it that agree with the context (plus the draft so far), at most MAX_MATCH
    agreement: int  # percent of the matching occurrences that went on with this token
    count: int  # how many matching occurrences went on with it
    remembered: int  # 1 when found in earlier outputs (the memory), 0 in the context itself
    beyond: int  # past the context's longest match: 0 within it, 1 within twice its length, 2 further


def ngram_bucket(feats: NgramFeatures) -> tuple[int, int, int, int, int]:
    """The acceptance table's cell: match length (1-4, 5-7, 8-15, 16 and more), agreement
    (unanimous, a majority, less), count up to 3, remembered, beyond."""
    match = feats.match
    return (min(match, 4) if match < 5 else (5 if match < 8 else (6 if match < 16 else 7)),
            2 if feats.agreement == 100 else (1 if feats.agreement >= 50 else 0), min(feats.count, 3),
            feats.remembered, feats.beyond)


def ngram_prior(feats: NgramFeatures) -> float:
    """Prior P(accept): a logistic fit on 122k draft tokens of greedy Spec-Bench outputs (80 prompts x
    128 tokens, SmolLM2-135M-Instruct and Gemma-3-270M), refined online per bucket. A continuation
    remembered from another generation starts from the same guess, in buckets of its own."""
    z = (-4.222 + 1.289 * math.log(feats.match) + 2.079 * feats.agreement / 100
         + 1.584 * (feats.agreement == 100) + 1.24 * math.log(feats.count) - BEYOND_PENALTY * feats.beyond)
    return 1.0 / (1.0 + math.exp(-z))


def match_length(tokens: Sequence[int], end: int, tail: Sequence[int], known: int = 0) -> int:
    """How many tokens before ``end`` in ``tokens`` equal the last ones of ``tail``, at most
    :data:`MAX_MATCH`; the first ``known`` are taken as equal (the key n-gram that found them)."""
    n = known
    limit = min(MAX_MATCH, end, len(tail))
    while n < limit and tokens[end - 1 - n] == tail[-1 - n]:
        n += 1
    return n


def longest(occurrences: Iterable[Occurrence], tail: Sequence[int],
            known: int = 0) -> tuple[list[Occurrence], int]:
    """The occurrences whose match of ``tail`` is longest (in their order) and that length;
    ``([], 0)`` for none."""
    found: list[Occurrence] = []
    best = 0
    for tokens, end in occurrences:
        n = match_length(tokens, end, tail, known)
        if n > best:
            best, found = n, []
        if n == best:
            found.append((tokens, end))
    return found, best


def _beyond(position: int, start: int) -> int:
    """How far a draft token at ``position`` is past the context's match of length ``start``:
    0 within it, 1 within twice it, 2 further."""
    return 0 if position < start else (1 if position < 2 * start else 2)


class SuffixIndex:
    """The n-grams (``min_ngram``..``max_ngram`` tokens) of one context, kept in step with it, and
    optionally the earlier outputs of a :class:`NgramMemory`: which tokens followed where."""

    def __init__(self, max_ngram: int = 4, min_ngram: int = 1, memory: NgramMemory | None = None,
                 estimate: Callable[[NgramFeatures], float] = ngram_prior) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise SpecdecError(f"n-gram sizes need 1 <= min ({min_ngram}) <= max ({max_ngram})")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.memory = memory
        # Decides whether the memory's best candidate goes before the context's (the drafter's
        # calibrated table, so the order follows what was learned).
        self.estimate = estimate
        self.seq: list[int] = []  # the context indexed so far
        self._prompt_len = 0
        # n-gram -> positions right after each occurrence (where its continuation is)
        self._index: dict[tuple[int, ...], list[int]] = {}
        # (context length, its longest matches), found once per context
        self._matches: tuple[int, tuple[list[Occurrence], int, int]] | None = None

    def begin(self, prompt: Sequence[int]) -> None:
        """A new generation after ``prompt`` (indexed on the first :meth:`sync`)."""
        self._reset()
        self._prompt_len = len(prompt)

    def _reset(self) -> None:
        self.seq, self._index = [], {}
        self._matches = None

    def remember(self) -> None:
        """Give the memory, if any, the output of the generation that ends."""
        if self.memory is not None and len(self.seq) > self._prompt_len:
            # The output, with the prompt's last n-gram so that its first tokens have a context.
            self.memory.add(self.seq[max(0, self._prompt_len - self.max_ngram):])

    def sync(self, tokens: Sequence[int]) -> bool:
        """Index the tokens added since the last call; True where ``tokens`` does not extend the
        context indexed so far (it was rolled back or replaced), which is then indexed afresh."""
        seq = self.seq
        afresh = len(tokens) < len(seq) or list(tokens[:len(seq)]) != seq
        if afresh:
            self._reset()
            seq = self.seq
        for tok in tokens[len(seq):]:
            seq.append(tok)
            end = len(seq)
            for n in range(1, min(self.max_ngram, end) + 1):
                self._index.setdefault(tuple(seq[end - n:]), []).append(end)
        return afresh

    def guess(self, tokens: Sequence[int], after: Sequence[int], k: int) -> list[int]:
        """Up to ``k`` most frequent continuations of ``tokens`` + ``after``, from the index of
        ``tokens`` alone (a draft that changes every call is not indexed, so the index is never rebuilt)."""
        self.sync(tokens)
        draft = list(after)
        for _ in range(k):
            found = self.continuations(draft)
            if not found:
                break
            draft.append(found[0][0])
        return draft[len(after):]

    def continuations(self, draft: list[int], every_level: bool = False) -> list[tuple[int, NgramFeatures]]:
        """The tokens that followed the longest earlier match of context + ``draft``, most frequent
        first (the latest on ties), each with its features.

        ``every_level`` adds, from shorter matches, tokens the longest one never saw followed by
        (with that level's features, so their estimates come out lower); a tree branches on them.
        """
        seq = self.seq
        tail = (seq[-self.max_ngram:] + draft)[-self.max_ngram:]
        long_tail = (seq[-MAX_MATCH:] + draft)[-MAX_MATCH:]
        beyond = _beyond(len(draft), self.longest_matches()[1])
        out: list[tuple[int, NgramFeatures]] = []
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
                    match = n if n < self.max_ngram else match_length(seq, latest[token], long_tail)
                    agreement = counts[token] * 100 // len(ends)
                    out.append((token, NgramFeatures(match, agreement, counts[token], 0, beyond)))
            if not every_level:
                break
        if self.memory is not None:
            # Earlier outputs go first when their best candidate is likelier than the context's
            # (e.g. a 4-gram remembered vs a unigram match here), otherwise they only add branches.
            remembered = self._remembered(long_tail, seen, beyond)
            if remembered and (not out or self.estimate(remembered[0][1]) > self.estimate(out[0][1])):
                out = remembered + out
            elif every_level:
                out += remembered
        return out

    def longest_matches(self) -> tuple[list[Occurrence], int, int]:
        """The occurrences of the context's longest earlier match, in the context itself (at least
        ``min_ngram`` tokens) or in the memory of earlier outputs, whichever is longer (the
        context on ties); its length (at most :data:`MAX_MATCH`) and whether it is remembered
        (1, else 0). Found once per context."""
        if self._matches is None or self._matches[0] != len(self.seq):
            self._matches = (len(self.seq), self._find_longest_matches())
        return self._matches[1]

    def _find_longest_matches(self) -> tuple[list[Occurrence], int, int]:
        seq = self.seq
        group: list[Occurrence] = []
        best = 0
        for n in range(min(self.max_ngram, len(seq)), self.min_ngram - 1, -1):
            ends = [e for e in self._index.get(tuple(seq[-n:]), ()) if e < len(seq)][-MAX_CANDIDATES:]
            if not ends:
                continue
            if n < self.max_ngram:
                best, group = n, [(seq, e) for e in ends]
            else:
                # In code, a 4-gram's most frequent continuation is often another function's,
                # while the longest match is the stretch being copied.
                group, best = longest(((seq, e) for e in ends), seq[-MAX_MATCH:])
            break
        if self.memory is not None:
            remembered, n = self.memory.matches(seq[-MAX_MATCH:])
            if n > best:
                return remembered, n, 1
        return group, best, 0

    def follow(self, group: list[Occurrence], start: int, remembered: int,
               draft: list[int]) -> tuple[int, NgramFeatures, list[Occurrence]] | None:
        """The next draft token along ``group`` (occurrences matching the context plus ``draft``,
        first those of :meth:`longest_matches`, of length ``start``): the most frequent
        continuation, the latest on ties; its features; the occurrences that continue with it.
        None where every occurrence has ended."""
        seq, i = self.seq, len(draft)
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
        feats = NgramFeatures(min(start + i, MAX_MATCH), counts[token] * 100 // len(at), counts[token],
                              remembered, _beyond(i, start))
        return token, feats, [occ for tok, occ in at if tok == token]

    def _remembered(self, tail: list[int], seen: set[int], beyond: int = 0) -> list[tuple[int, NgramFeatures]]:
        """Continuations of ``tail`` in earlier generations (features flagged as remembered)."""
        found = self.memory.lookup(tail)
        if found is None:
            return []
        n, counts = found
        total = sum(counts.values())
        return [(token, NgramFeatures(n, counts[token] * 100 // total, counts[token], 1, beyond))
                for token in sorted(counts, key=counts.get, reverse=True) if token not in seen]


def _memory_file(path: str) -> str | None:
    where = Path(path)
    return None if where.parent.is_dir() and not where.is_dir() else "must be a file in an existing folder"


# A model option (set once per process, not per request): the n-gram drafters of every generation
# read and feed the same memory.
options.register([options.Option(
    "memory", str, None, "let the n-gram drafters also draft from earlier outputs kept in FILE (read if it "
                         "exists, written back at the end; bounded)", _memory_file, nullable=True, scope="model",
    metavar="FILE", server=False, bench=False)], owner=None)


class NgramMemory:
    """Earlier outputs (at most ``capacity`` tokens) and an index of their ``key``-grams; shared by threads."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY, key: int = 2) -> None:
        if capacity < 1 or key < 1:
            raise SpecdecError(f"memory needs a capacity >= 1 token and a key n-gram >= 1, got {capacity}, {key}")
        self.capacity = capacity
        self.key = key
        # Every output gets a base offset in one growing number line, so an index entry is one int
        # (base + position) and the oldest output's entries lead every list (eviction cuts fronts).
        self._bases: list[int] = []
        self._outputs: list[array] = []
        self._next = 0
        self._tokens = 0
        self._index: dict[tuple[int, ...], list[int]] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """Tokens remembered."""
        return self._tokens

    @property
    def outputs(self) -> int:
        """Outputs remembered."""
        return len(self._outputs)

    def add(self, tokens: Sequence[int]) -> None:
        """Remember an output (with a few tokens of its prompt before it, for its first tokens' context)."""
        tokens = array("i", tokens)
        if len(tokens) <= self.key:
            return
        if len(tokens) > self.capacity:
            tokens = tokens[-self.capacity:]
        with self._lock:
            base = self._next
            self._next += len(tokens) + 1
            self._bases.append(base)
            self._outputs.append(tokens)
            self._tokens += len(tokens)
            k = self.key
            for end in range(k, len(tokens)):
                self._index.setdefault(tuple(tokens[end - k:end]), []).append(base + end)
            while self._tokens > self.capacity:
                self._forget_oldest()

    def _forget_oldest(self) -> None:
        base, tokens = self._bases.pop(0), self._outputs.pop(0)
        self._tokens -= len(tokens)
        limit = base + len(tokens)
        k = self.key
        for end in range(k, len(tokens)):
            key = tuple(tokens[end - k:end])
            entries = self._index.get(key)
            if entries is None:
                continue
            del entries[:bisect.bisect_left(entries, limit)]
            if not entries:
                del self._index[key]

    def matches(self, tail: Sequence[int]) -> tuple[list[Occurrence], int]:
        """The remembered occurrences with the longest match of ``tail``'s end (at least ``key``
        tokens; at most :data:`MAX_MATCH`) and that length; ``([], 0)`` where nothing matches."""
        k = self.key
        if len(tail) < k:
            return [], 0
        with self._lock:
            entries = self._index.get(tuple(tail[-k:]))
            if not entries:
                return [], 0
            return longest(self._continued(entries[-MAX_CANDIDATES:]), tail, known=k)

    def _continued(self, entries: list[int]) -> Iterable[Occurrence]:
        """The occurrences at index ``entries`` that an output goes on after (something to copy)."""
        for entry in entries:
            at = bisect.bisect_right(self._bases, entry) - 1
            tokens, end = self._outputs[at], entry - self._bases[at]
            if end < len(tokens):
                yield tokens, end

    def lookup(self, tail: Sequence[int]) -> tuple[int, dict[int, int]] | None:
        """(match length, next-token counts) of the longest remembered match of ``tail``, if any."""
        found, n = self.matches(tail)
        if not found:
            return None
        counts: dict[int, int] = {}
        for tokens, end in found:
            counts[tokens[end]] = counts.get(tokens[end], 0) + 1
        return n, counts

    def save(self, path: str | Path) -> None:
        """Write the memory to ``path`` as JSON, whole or not at all: a save that fails (a full
        disk, an interrupt) leaves the previous file loadable and raises :class:`SpecdecError`."""
        with self._lock:  # a server saves while generations add
            entries = [list(tokens) for tokens in self._outputs]
        data = {"format": FORMAT, "version": VERSION, "key": self.key, "capacity": self.capacity, "entries": entries}
        try:
            write_atomic(path, json.dumps(data))
        except OSError as exc:
            raise SpecdecError(f"cannot save the memory to {path}: {exc.strerror or exc}") from None

    @classmethod
    def load(cls, path: str | Path, capacity: int | None = None) -> NgramMemory:
        """A memory saved by :meth:`save`; a missing file gives an empty one (it is created on save)."""
        path = Path(path)
        if not path.exists():
            return cls(capacity=capacity or DEFAULT_CAPACITY)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if data.get("format") != FORMAT or data.get("version") != VERSION:
                raise ValueError("not a specdec memory file of this version")
            memory = cls(capacity or int(data["capacity"]), int(data["key"]))
            for tokens in data["entries"]:
                memory.add([int(t) for t in tokens])
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
            raise SpecdecError(f"{path} is not a usable memory file ({exc}); delete it to start afresh") from None
        return memory
