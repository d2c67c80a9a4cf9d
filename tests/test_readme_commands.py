"""Every ``specdec bench`` command the README and the documentation show runs from a fresh clone
as written: it parses,
its prompt set ships with specdec (no ``../shared`` path), it selects questions, and its methods
pass the checks made before any model loads. A peer that needs an optional build (``make
llama-peers``, ``make vllm``, ``make arctic-suffix``) may be refused, with the message that names
the make target."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from specdec import option_forms
from specdec.bench.methods import check_specs
from specdec.bench.questions import load_questions
from specdec.cli import build_parser
from specdec.commands.common import choose_backend
from specdec.errors import SpecdecError

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
OPTIONAL_BUILDS = ("make llama-peers", "make vllm", "make arctic-suffix")


def readme_commands(program: str) -> list[str]:
    """The README's and the docs' ``program ...`` lines inside ```bash blocks, continuation lines
    joined."""
    commands: list[str] = []
    blocks = [b for page in PAGES for b in re.findall(r"```bash\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.S)]
    for block in blocks:
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.split(" #")[0].strip()
            if line.startswith(program + " "):
                commands.append(line)
    return commands


BENCH = readme_commands("specdec bench")


def test_the_readme_shows_bench_commands():
    assert len(BENCH) >= 5, BENCH


@pytest.mark.parametrize("command", BENCH)
def test_a_readme_bench_command_runs_as_written(command):
    argv = shlex.split(command)[1:]
    args = build_parser().parse_args(argv)
    choose_backend(args)  # as the command does: --backend auto becomes the model's
    assert args.questions and "../shared" not in args.questions and not Path(args.questions).is_absolute()
    categories = [c.strip() for c in args.categories.split(",")] if args.categories else None
    # A how-to's own prompts file ("my-prompts.jsonl") is the reader's, not one that ships.
    if not args.questions.split(":")[-1].startswith("my-"):
        assert load_questions(args.questions, categories, args.limit)
    specs = [m.strip() for m in args.methods.split(",") if m.strip()]
    try:
        check_specs(specs, args.backend, option_forms.from_args(args), model=args.model)
    except SpecdecError as error:
        assert any(target in str(error) for target in OPTIONAL_BUILDS), str(error)
