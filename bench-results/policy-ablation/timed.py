"""One timed run of the adaptive policy before and after its simplification, on the same prompts:
the policy before (intermediate/, whose Tuning defaults are the earlier policy's behaviour) is
registered as ``adaptive-before`` beside today's ``adaptive``, then ``specdec bench`` runs with the
arguments given, e.g.

    python bench-results/policy-ablation/timed.py --model qwen2.5-coder-1.5b --backend llamacpp \
        --questions humaneval-edit:bench-results/heldout-inputs/humaneval-p8-15.jsonl --limit 8 \
        --max-new-tokens 400 --methods plain,ngram,ngram:policy=adaptive-before --out OUT

Since commit 9e5bc04 the engine hands the drafter's price to ``max_k``; the earlier policy asked the
drafter itself, so here it plans no priced draft: compare it with free drafters (price 0, as the
n-gram drafter) only, as the runs in timed-runs/ do.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _load(name: str, source: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__file__ = str(HERE / "intermediate" / f"{name}.py")
    sys.modules[name] = module
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    return module


def register_before() -> None:
    """``adaptive-before``: the earlier policy, under its own module names."""
    import specdec.registry  # noqa: F401  (the registries exist before the policy registers)

    _load("adaptive_parts_before", (HERE / "intermediate" / "adaptive_parts.py").read_text())
    source = (HERE / "intermediate" / "adaptive.py").read_text()
    source = source.replace("specdec.policies.adaptive_parts", "adaptive_parts_before")
    source = source.replace('@policy("adaptive",', '@policy("adaptive-before",')
    _load("adaptive_before", source)


if __name__ == "__main__":
    register_before()
    from specdec.cli import main

    sys.exit(main(["bench", *sys.argv[1:]]))
