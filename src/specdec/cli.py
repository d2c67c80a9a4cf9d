"""``specdec generate | bench | ...``: the command line. Bad input ends with one ``error: ...`` line on
stderr and exit code 2, never a traceback (set SPECDEC_DEBUG=1 to see one for internal errors).

Each subcommand is one module of :mod:`specdec.commands`, found by scanning the package.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys
from collections.abc import Sequence

from specdec.errors import SpecdecError

EXIT_ERROR = 2


def _commands() -> dict[str, object]:
    import specdec.commands as package

    found = {}
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"specdec.commands.{info.name}")
        if hasattr(module, "NAME"):
            found[module.NAME] = module
    return dict(sorted(found.items(), key=lambda kv: getattr(kv[1], "ORDER", 50)))


def build_parser() -> argparse.ArgumentParser:
    from specdec.commands.common import Parser

    parser = Parser(prog="specdec", description="Lossless speculative decoding for LLM generation.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for module in _commands().values():
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return _commands()[args.command].run(args)
    except SpecdecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug, not bad input: still one line unless asked for more
        if os.environ.get("SPECDEC_DEBUG"):
            raise
        print(f"error: internal error ({type(exc).__name__}: {exc}); rerun with SPECDEC_DEBUG=1 for details",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
