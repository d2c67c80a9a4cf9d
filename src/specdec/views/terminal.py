"""The trace in the terminal (rich): text coloured by each token's fate, running counters, a step table.

``specdec generate --live`` draws it while generating (:class:`LiveView`); ``specdec replay``
draws a saved trace (:func:`replay`). Both go to stderr, so stdout keeps carrying only the text.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from specdec.stats import GenerationStats
from specdec.trace import Segment, estimated_speedup, segments, step_from_record

STYLES = {
    "accepted": "green",
    "rejected": "red strike",
    "unjudged": "red dim strike",
    "correction": "bold yellow",
    "bonus": "bold cyan",
    "plain": "",
}
LEGEND = (("accepted", "accepted draft"), ("rejected", "rejected draft"), ("correction", "target's correction"),
          ("bonus", "bonus token"), ("plain", "plain step"))


def legend() -> Text:
    out = Text()
    for fate, name in LEGEND:
        out.append("  ")
        out.append(f" {name} " if fate != "plain" else name, style=STYLES[fate] + (" reverse" if fate != "plain" else ""))
    return out


def visible(segment: Segment, one_line: bool = False) -> str:
    """Drafted tokens that never reached the text stay on one line (their newlines as ⏎); a newline
    that a coloured token put in the text gets a visible mark (↵), or its colour would not show."""
    if one_line or segment.fate in ("rejected", "unjudged"):
        return segment.text.replace("\n", "⏎") or ("∅" if segment.fate in ("rejected", "unjudged") else "")
    return segment.text if segment.fate == "plain" else segment.text.replace("\n", "↵\n")


def step_text(record: dict, show_rejected: bool = True, one_line: bool = False, marks: bool = False) -> Text:
    """One step's tokens, styled by fate (a tree's never-judged nodes are left out).

    ``marks`` writes the rejected drafts as ``~~text~~`` for output without colours (a pipe, a file).
    """
    out = Text()
    tree = record.get("parents") is not None
    run = ""  # consecutive rejected drafts, marked as one
    for seg in segments(record):
        dropped = seg.fate in ("rejected", "unjudged")
        if dropped and (not show_rejected or (tree and seg.fate == "unjudged")):
            continue
        if marks and dropped:
            run += visible(seg, one_line)
            continue
        if run:
            out.append(f"~~{run}~~")
            run = ""
        out.append(visible(seg, one_line), style=STYLES[seg.fate])
    if run:
        out.append(f"~~{run}~~")
    return out


def counters(stats: GenerationStats, plain_step_s: float | None = None, step: int | None = None) -> Text:
    """Acceptance rate, mean accepted length, tokens/s and the estimated speed-up, on one line."""
    spent = stats.draft_s + stats.verify_s
    parts = [f"step {step if step is not None else stats.target_forwards}",
             f"{stats.new_tokens} tokens",
             f"acceptance {stats.acceptance_rate:.0%} ({stats.accepted}/{stats.drafted})",
             f"mean accepted length {stats.mean_accepted_length:.2f}",
             f"{stats.new_tokens / spent:.1f} tok/s" if spent > 0 else "- tok/s"]
    speedup = estimated_speedup(stats, plain_step_s)
    if speedup is not None:
        parts.append(f"speed-up ≈ {speedup:.2f}x")
    return Text(" · ".join(parts), style="bold")


def step_table(records: Sequence[dict], marks: bool = False) -> Table:
    """One row per target forward: what was drafted, how it fared, and the time it took."""
    table = Table(show_header=True, header_style="bold", expand=False)
    for name, justify in (("step", "right"), ("pos", "right"), ("draft → fate", "left"), ("kept", "right"),
                          ("draft ms", "right"), ("verify ms", "right")):
        table.add_column(name, justify=justify)
    for i, record in enumerate(records):
        table.add_row(str(i), str(record["position"]), step_text(record, one_line=True, marks=marks), f"{len(record['emitted'])}",
                      f"{1e3 * record['draft_s']:.1f}", f"{1e3 * record['verify_s']:.1f}")
    return table


def tail(text: Text, console: Console, lines: int) -> Text:
    """The last ``lines`` lines of ``text`` as the console would wrap it (a live view grows at the bottom)."""
    wrapped = text.wrap(console, max(20, console.width))
    if len(wrapped) <= lines:
        return text
    return Text("\n").join(wrapped[-lines:])


class LiveView:
    """A live terminal view of a generation: feed it each step's record as the step ends."""

    def __init__(self, console: Console | None = None, plain_step_s: float | None = None,
                 title: str = "") -> None:
        self.console = console or Console(stderr=True)
        self.plain_step_s = plain_step_s
        self.title = title
        self.text = Text()
        self.stats = GenerationStats()
        self._started = time.perf_counter()
        self._live = Live(console=self.console, refresh_per_second=12, transient=True, auto_refresh=False)

    def __enter__(self) -> LiveView:
        self._live.__enter__()
        self._live.update(self.frame(), refresh=True)
        return self

    def __exit__(self, *exc) -> None:
        self._live.__exit__(*exc)
        # The live frame shows only the tail; leave the whole coloured text behind.
        self.console.print(self.frame(whole=True))

    def update(self, record: dict) -> None:
        """Take one step's record and redraw."""
        self.add(record)
        self._live.update(self.frame(), refresh=True)

    def add(self, record: dict) -> None:
        """Take one step's record without drawing."""
        self.stats.add_step(step_from_record(record))
        self.stats.wall_s = time.perf_counter() - self._started
        self.text.append_text(step_text(record))

    def frame(self, whole: bool = False) -> Group:
        """What the view shows: title, legend, the text (its tail unless ``whole``), counters."""
        body = self.text if whole else tail(self.text, self.console, max(3, self.console.height - 5))
        header = Text(self.title, style="bold") if self.title else Text()
        return Group(header, legend(), Text(), body, Text(), counters(self.stats, self.plain_step_s))


def replay(doc: dict, console: Console | None = None, steps: bool = False, delay: float = 0.0) -> None:
    """Render a saved trace: its settings, the coloured text, the counters, optionally a step table.

    With ``delay`` the steps are played back at that many seconds each, like the live view.
    """
    from specdec.trace import stats_of

    console = console or Console(stderr=True)
    title = describe(doc)
    if delay > 0:
        with LiveView(console, doc.get("plain_step_s"), title) as view:
            for record in doc["steps"]:
                view.update(record)
                time.sleep(delay)
        return
    marks = console.color_system is None  # no colours: strike-through would not show either
    text = Text()
    for record in doc["steps"]:
        text.append_text(step_text(record, marks=marks))
    console.print(Text(title, style="bold"))
    console.print(legend())
    console.print()
    console.print(text)
    console.print()
    console.print(counters(stats_of(doc), doc.get("plain_step_s")))
    if steps:
        console.print(step_table(doc["steps"], marks))


def describe(doc: dict) -> str:
    """One line naming the model, the drafter and the sampling of a trace."""
    settings = doc.get("settings") or {}
    parts = [f"{doc.get('model', '?')} ({doc.get('backend', '?')})"]
    drafter = settings.get("drafter")
    if drafter:
        parts.append(f"drafter {drafter}" + (f" ← {doc['draft_model']}" if doc.get("draft_model") else "")
                     + (" (tree)" if settings.get("tree") else ""))
    temperature = settings.get("temperature", 0)
    parts.append("greedy" if not temperature else f"T={temperature}" + (f", seed {doc['seed']}" if "seed" in doc else ""))
    return " · ".join(parts)
