"""``specdec replay FILE.json``: render a saved trace in the terminal."""

from __future__ import annotations

import argparse

NAME = "replay"
ORDER = 3


def add_parser(sub) -> None:
    rep = sub.add_parser(NAME, help="render a saved trace (specdec generate --trace FILE.json) in the terminal",
                         description="Render a trace saved by specdec generate --trace FILE.json: the text coloured "
                                     "by each token's fate, the counters, and optionally every step.")
    rep.add_argument("trace", help="a trace file written by specdec generate --trace FILE.json")
    rep.add_argument("--steps", action="store_true", help="also print one table row per target forward")
    rep.add_argument("--delay", type=float, default=0.0, metavar="S",
                     help="play the steps back live, S seconds each (default: draw the result at once)")


def run(args: argparse.Namespace) -> int:
    from specdec.errors import SpecdecError
    from specdec.trace import load
    from specdec.views.terminal import replay

    if not 0 <= args.delay <= 10:
        raise SpecdecError(f"--delay must be between 0 and 10 seconds, got {args.delay}")
    replay(load(args.trace), steps=args.steps, delay=args.delay)
    return 0
