"""Terminal rendering of a generation's metrics (rich), always on stderr so that stdout carries
only the generated text."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from specdec.api import Output
from specdec.compare import Comparison, compare, forward_ceiling


def print_generation(out: Output, baseline: Output | None = None, *, drafter: str = "",
                     greedy: bool = True, console: Console | None = None,
                     comparison: Comparison | None = None, generation: Comparison | None = None) -> None:
    """A metrics table (and the comparison with plain decoding) on stderr.

    ``comparison`` is the speed-up measured over paired runs (``--compare``), ``generation`` the
    same after the prompt; without them one pair, ``out`` and ``baseline``, is all there is, and
    the line says so."""
    err = console or Console(stderr=True)
    table = Table(title=f"drafter: {drafter}", show_header=True, header_style="bold")
    table.add_column("metric")
    table.add_column("speculative" if baseline else "value", justify="right")
    if baseline:
        table.add_column("plain", justify="right")
    s, b = out.stats, baseline.stats if baseline else None
    rows = [
        ("new tokens", s.new_tokens, b and b.new_tokens),
        ("target forwards", s.target_forwards, b and b.target_forwards),
        ("drafted / accepted", f"{s.drafted} / {s.accepted}", b and "-"),
        ("acceptance rate", f"{s.acceptance_rate:.1%}", b and "-"),
        ("mean accepted length", f"{s.mean_accepted_length:.2f}", b and f"{b.mean_accepted_length:.2f}"),
        ("draft / verify s", f"{s.draft_s:.2f} / {s.verify_s:.2f}", b and f"- / {b.verify_s:.2f}"),
        ("wall s", f"{s.wall_s:.2f}", b and f"{b.wall_s:.2f}"),
        ("tokens/s", f"{s.tokens_per_s:.1f}", b and f"{b.tokens_per_s:.1f}"),
    ]
    if s.tree_nodes:
        rows.insert(3, ("tree nodes verified", s.tree_nodes, b and "-"))
    if s.draft_forwards:
        rows.insert(3, ("draft-model forwards", s.draft_forwards, b and "-"))
    if s.drafted_per_pos:
        rows.insert(4, ("acceptance by position", " ".join(f"{a:.0%}" for a in s.acceptance_per_pos[:8]), b and "-"))
    for name, value, base in rows:
        table.add_row(name, str(value), *([str(base)] if baseline else []))
    err.print(table)
    if baseline:
        err.print(comparison_lines(out, baseline, comparison, generation))


def comparison_lines(out: Output, baseline: Output, comparison: Comparison | None = None,
                     generation: Comparison | None = None) -> str:
    """The speed-up with its spread and verdict (end to end, and after the prompt when measured),
    whether the tokens match, and the counters that bound it (a speed-up needs fewer target
    forwards than plain decoding's)."""
    s, b = out.stats, baseline.stats
    if comparison is None:
        comparison = compare([max(b.wall_s, 1e-9)], [max(s.wall_s, 1e-9)],
                             forward_ceiling(b.new_tokens, b.target_forwards, s.new_tokens, s.target_forwards))
    line = f"speed-up over plain decoding: [bold]{comparison.describe()}[/bold]"
    same = out.token_ids == baseline.token_ids
    line += f"; identical tokens: {'yes' if same else '[red]NO[/red]'}"
    if generation is not None:
        line += f"\nafter the prompt (generation alone): [bold]{generation.describe()}[/bold]"
    counters = (f"target forwards: {s.target_forwards} speculative vs {b.target_forwards} plain for "
                f"{s.new_tokens} tokens; drafted {s.drafted}, accepted {s.accepted}")
    if comparison.ceiling is not None:
        counters += f": at most {comparison.ceiling:.2f}x"
    return line + "\n" + counters
