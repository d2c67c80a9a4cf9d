"""The draft lengths of a batch chosen together: every sequence's length in one tick is picked to
maximise the tick's expected tokens per second (goodput), "nobody drafts" included (SmartSpec, Liu
et al. 2024; TurboSpec).

A sequence alone drafts while its expected gain beats its own step's cost. In a batch every row it
adds lengthens the tick for every other sequence in it, so the batch chooses: each sequence makes
an :class:`Offer` (the expected tokens of its step if the first i nodes of its draft are verified,
from its policy's calibrated confidence), the backend says what a tick of given rows per sequence
costs (a :data:`TickCost`: llama.cpp splits unequal rows into several forwards, a GPU's padded
graph costs the same whatever the rows), and :func:`choose_lengths` returns every sequence's
length. With one sequence whose tick costs its own step, it is the adaptive policy's choice
(:meth:`specdec.policies.adaptive.AdaptiveK.choose` calls it so).

Pure and backend-agnostic: nothing here knows a model, a thread or a backend.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

TickCost = Callable[[Sequence[int]], float]
"""Seconds of a tick whose sequences put in these rows (one number per sequence, in the order of
the offers): the whole tick, shared by all of them."""


@dataclass(frozen=True)
class Offer:
    """What one sequence puts in a tick: ``rows`` rows it needs whatever is chosen (the last token
    of a step, a prompt chunk) and up to ``most`` draft nodes after them.

    ``gains[i]`` is the tokens the step is expected to yield if its first i draft nodes are verified
    (``gains[0]``: without any; a step yields its target's own token, 1, a prompt chunk 0). Draft
    nodes come parents first, so every prefix is a draft; the expected accepted tokens of a prefix
    are the sum of its nodes' path probabilities. ``spent``: seconds this step already spent
    drafting (a draft model's forwards), counted in its time as the single-stream policy counts it.
    """

    gains: tuple[float, ...] = (1.0,)
    rows: int = 1
    spent: float = 0.0

    def __post_init__(self) -> None:
        if not self.gains:
            raise ValueError("an offer needs the gain of its step without a draft (gains[0])")
        if any(not math.isfinite(g) or g < 0 for g in self.gains):
            raise ValueError(f"an offer's gains must be finite and >= 0, got {list(self.gains)}")
        if isinstance(self.rows, bool) or not isinstance(self.rows, int) or self.rows < 0:
            raise ValueError(f"an offer's rows must be a whole number >= 0, got {self.rows!r}")
        if not (math.isfinite(self.spent) and self.spent >= 0):
            raise ValueError(f"an offer's spent seconds must be finite and >= 0, got {self.spent}")

    @property
    def most(self) -> int:
        """Draft nodes on offer."""
        return len(self.gains) - 1

    @classmethod
    def of(cls, survival: Sequence[float], spent: float = 0.0) -> Offer:
        """A step's offer from its draft nodes' path probabilities (P(node and its ancestors are
        accepted)): gains[i] = 1 + the first i of them, summed in order."""
        gains, expected = [1.0], 1.0
        for p in survival:
            expected += p
            gains.append(expected)
        return cls(tuple(gains), 1, spent)


def goodput(offers: Sequence[Offer], lengths: Sequence[int], cost: TickCost) -> float:
    """Expected tokens per second of a tick in which each offer verifies ``lengths`` draft nodes."""
    if len(lengths) != len(offers):
        raise ValueError(f"{len(lengths)} lengths for {len(offers)} offers")
    tokens = sum(o.gains[n] for o, n in zip(offers, lengths))
    seconds = sum(o.spent for o in offers) + cost([o.rows + n for o, n in zip(offers, lengths)])
    return _rate(tokens, seconds)


def choose_lengths(offers: Sequence[Offer], cost: TickCost, margin: float = 1.0,
                   stretch: float = math.inf) -> list[int]:
    """Each offer's number of draft nodes to verify: the lengths with the best :func:`goodput`,
    searched from nobody drafting by moves, each the one that raises goodput most, until none
    does. A move sets one sequence's length, or sets every sequence that has that many nodes on
    offer to one length (a batch whose forwards are cheapest when its sequences put in equal rows,
    as llama.cpp slices them, gains there what no one sequence gains alone). Ties go to the first
    move found: the lower sequence, the shorter length, one sequence before all.

    With one offer that is the best length outright, the shortest of equals, as the single-stream
    policy picks it. A cost need not be smooth: a length whose rows make the tick cheaper (a
    kernel's sweet spot, an equal split of the batch) is found like any other; ``math.inf`` rules
    a combination out. Work: the lengths tried (every one alone; in a batch each up to 16, then a
    coarse grid) times the moves made, one cost call each.

    Rows that yield no token this tick (a prompt's chunk: ``gains[0] == 0``) are paid whatever is
    chosen, so the rate drafts must beat is the one of the tick's steps without them: a tick
    made slow by a prompt is no reason to add a draft that pays less than decoding does.

    ``margin``: the lengths found are kept only if their goodput is at least this many times
    nobody drafting's (else nobody drafts): a batch's cost is an estimate, and a draft that only
    breaks even lengthens the tick of every sequence in it. ``stretch``: no choice makes the
    tick longer than this many times the tick of nobody drafting (every sequence in it waits for
    the tick: a draft may raise the batch's tokens per second and still make the others' answers
    later; a batch whose cost does not grow with its rows, as a GPU's padded graph, never meets it).
    """
    if not margin >= 1.0:
        raise ValueError(f"the margin drafting must beat nobody drafting by is at least 1, got {margin}")
    if not stretch >= 1.0:
        raise ValueError(f"a tick may stretch to at least its own length (1), got {stretch}")
    lengths = [0] * len(offers)
    tokens = sum(o.gains[0] for o in offers)
    spent = sum(o.spent for o in offers)
    plain_s = cost([o.rows for o in offers])
    # What the tick pays for rows that yield nothing this tick, taken out of every rate compared.
    fixed = 0.0
    if any(o.gains[0] == 0 and o.rows for o in offers) and any(o.gains[0] > 0 for o in offers):
        fixed = max(0.0, plain_s - cost([o.rows if o.gains[0] > 0 else 0 for o in offers]))
    limit = stretch * plain_s

    def rate(tokens: float, seconds: float) -> float:
        if seconds > limit:
            return -math.inf
        if fixed:  # the steps' own time, plus what the drafts add (a learned curve need not be
            # monotone: rows that seem to make a prompt's tick cheaper are priced at nothing)
            seconds = plain_s - fixed + max(0.0, seconds - plain_s)
        return _rate(tokens, spent + seconds)

    best = plain = rate(tokens, plain_s)
    longest = max((o.most for o in offers), default=0)
    if limit < math.inf and not _any_fits(offers, cost, limit):
        return lengths
    candidates = [_lengths(o.most, every=len(offers) == 1) for o in offers]
    while True:
        move: list[int] | None = None
        rows = [o.rows + n for o, n in zip(offers, lengths)]
        for s, offer in enumerate(offers):
            now, held = lengths[s], rows[s]
            others = tokens - offer.gains[now]
            for n in candidates[s]:
                if n == now:
                    continue
                rows[s] = offer.rows + n
                r = rate(others + offer.gains[n], cost(rows))
                if r > best:
                    best, move = r, lengths[:s] + [n] + lengths[s + 1:]
            rows[s] = held
        if len(offers) > 1:
            for n in _lengths(longest, every=False)[1:]:
                level = [n if o.most >= n else now for o, now in zip(offers, lengths)]
                if level == lengths:
                    continue
                gained = sum(o.gains[m] for o, m in zip(offers, level))
                r = rate(gained, cost([o.rows + m for o, m in zip(offers, level)]))
                if r > best:
                    best, move = r, level
        if move is None:
            return lengths if margin == 1.0 or best >= margin * plain else [0] * len(offers)
        lengths = move
        tokens = sum(o.gains[m] for o, m in zip(offers, lengths))


def _any_fits(offers: Sequence[Offer], cost: TickCost, limit: float) -> bool:
    """Whether one draft node more, of one sequence or of every sequence, keeps the tick within
    ``limit`` seconds: where none does, no longer draft does either (a tick's cost grows with
    its rows), and a batch of many sequences is spared the search."""
    rows = [o.rows for o in offers]
    for s, offer in enumerate(offers):
        if offer.most:
            rows[s] += 1
            if cost(rows) <= limit:
                return True
            rows[s] -= 1
    return cost([o.rows + (1 if o.most else 0) for o in offers]) <= limit


EVERY_UP_TO = 16  # in a batch, lengths past this are tried on a coarser grid (and the whole offer)
COARSE = (24, 32, 48, 64, 96, 128)


def _lengths(most: int, every: bool) -> list[int]:
    """The lengths a search tries for an offer of ``most`` nodes: all of them for a sequence alone
    (its choice must be the best outright); in a batch each up to ``EVERY_UP_TO``, then a coarse
    grid and ``most`` itself (a cost curve is measured at those sizes and interpolated between)."""
    if every or most <= EVERY_UP_TO:
        return list(range(most + 1))
    return list(range(EVERY_UP_TO + 1)) + [n for n in COARSE if EVERY_UP_TO < n < most] + [most]


def _rate(tokens: float, seconds: float) -> float:
    if math.isnan(seconds) or seconds == math.inf:  # a combination the cost rules out
        return -math.inf
    if seconds <= 0:
        raise ValueError(f"a tick must cost some time, the cost gave {seconds}")
    return tokens / seconds


SURE_NODES = 64  # the longest sure draft drafts_can_pay tries for each sequence


def drafts_can_pay(sequences: int, cost: TickCost, margin: float = 1.0) -> bool:
    """Whether any draft could pay in a tick of ``sequences`` sequences stepping one row each,
    even if every drafted token were kept: :func:`choose_lengths` on offers of sure tokens (up
    to :data:`SURE_NODES` each). Where it finds no length for any of them, no real offer (whose
    tokens are at best as likely) gets one either, so a sequence in such a batch need not draft
    at all: on a 2-core CPU, where each row adds a good share of a forward, that holds from about
    8 sequences on; on a GPU, where rows are nearly free, never."""
    sure = Offer(tuple(float(1 + i) for i in range(SURE_NODES + 1)))
    return any(choose_lengths([sure] * sequences, cost, margin))


PAUSE_AFTER = 2  # offers declined in a row, in ticks shared with others, before a pause
MAX_PAUSE = 16  # the longest pause, in steps


@dataclass
class OfferPause:
    """When a sequence stops offering drafts to a batch that keeps declining them.

    Drafting and pricing a chain is work every other sequence in a lockstep tick waits for (on a
    CPU, Python between the ticks, serialized by the GIL): at load, a sequence whose offers the
    batch will not take must step as cheaply as plain decoding. After :data:`PAUSE_AFTER` offers
    in a row that shared ticks declined, it takes 1, 2, 4, ... up to :data:`MAX_PAUSE` steps
    without drafting; an offer taken (or declined alone, which is the single-stream decision)
    ends the streak.
    """

    declined: int = 0  # offers declined in a row by shared ticks
    left: int = 0  # steps still to take without offering

    def wants_offer(self) -> bool:
        """Whether this step drafts and offers (a paused one counts down)."""
        if self.left > 0:
            self.left -= 1
            return False
        return True

    def answered(self, taken: int, shared: bool) -> None:
        """The batch verified ``taken`` of an offer's nodes, in a tick ``shared`` with others."""
        if taken == 0 and shared:
            self.declined += 1
            if self.declined >= PAUSE_AFTER:
                self.left = min(MAX_PAUSE, 2 ** min(self.declined - PAUSE_AFTER, MAX_PAUSE.bit_length()))
        else:
            self.declined = 0


DELAY_SHARE = 0.03  # the share of its own ticks' time others' drafts may add to a sequence's
GRANT_TICKS = 32  # a sequence starts with the allowance of this many ticks


@dataclass
class DelayBudget:
    """How much other sequences' drafts may delay each sequence of a lockstep batch.

    Every sequence in a tick waits for all of its rows, so a draft that raises the batch's tokens
    per second still makes the answers that draft little later (on a CPU, where a tick's cost
    grows with its rows). A cap on each tick's stretch either forbids the long confident drafts
    that pay most or lets them lengthen one answer's every tick; this caps what each answer pays
    in all: a sequence banks ``share`` of every tick it is in (``grant`` ticks' worth to start
    with), and pays, when others' drafts stretch a tick it drafted nothing in, the stretch (in
    that tick's own length without drafts). A tick may stretch by what every sequence in it has
    banked, so none waits longer than ``share`` of its ticks plus the grant. Units are ticks,
    each the tick's own length without drafts: no clock and no cost curve involved.

    ``share=math.inf`` sets no bound (the batch's tokens per second alone); ``0`` forbids any
    draft in a tick shared with others.
    """

    share: float = DELAY_SHARE
    grant: float = GRANT_TICKS
    left: dict[int, float] = field(default_factory=dict)  # sequence -> ticks of delay it may still take

    def __post_init__(self) -> None:
        if not self.share >= 0:
            raise ValueError(f"a delay share is at least 0, got {self.share}")
        if not (math.isfinite(self.grant) and self.grant >= 0):
            raise ValueError(f"a delay grant is a finite number of ticks >= 0, got {self.grant}")

    def start(self, seq: int) -> None:
        """A new generation on ``seq``: its allowance starts at the grant."""
        self.left[seq] = self.share * self.grant if math.isfinite(self.share) else math.inf

    def drop(self, seq: int) -> None:
        self.left.pop(seq, None)

    def stretch(self, seqs: Iterable[int]) -> float:
        """The most a tick of these sequences may stretch, times its length without drafts."""
        if math.isinf(self.share):
            return math.inf
        return 1.0 + max(0.0, min((self.left.get(s, 0.0) for s in seqs), default=math.inf))

    def settle(self, seqs: Sequence[int], drafted: Sequence[int], stretch: float) -> None:
        """A tick of ``seqs`` ran, ``drafted[i]`` draft rows verified for ``seqs[i]``, and took
        ``stretch`` times its length without drafts: each banks its share, and each that drafted
        nothing pays the stretch."""
        if math.isinf(self.share):
            return
        delay = max(0.0, stretch - 1.0)
        for seq, n in zip(seqs, drafted):
            left = self.left.get(seq, 0.0) + self.share
            self.left[seq] = left - delay if n == 0 else left
