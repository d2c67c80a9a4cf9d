"""scripts/replay_transcripts.py: recorded answers replayed through the real loop, priced on a curve."""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path

import pytest

from specdec.costs import CostModel

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "replay_transcripts.py"
CURVE = {1: 1.0, 2: 1.43, 3: 1.84, 4: 2.29, 6: 2.87, 8: 3.87, 16: 7.47, 32: 14.1, 64: 30.1}


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("replay_transcripts", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def _turns():
    rng = random.Random(0)
    code = [rng.randrange(50, 400) for _ in range(120)]
    # Answers that copy a stretch of the prompt, then write something new.
    return [{"qid": f"q{i}", "turn": 1, "prompt": code[i:] + [7, 8, 9],
             "output": code[i + 10:i + 90] + [rng.randrange(50, 400) for _ in range(30)]} for i in range(3)]


def test_replayed_answers_are_the_recorded_ones_and_a_copy_costs_fewer_forwards(script):
    curve = script.FixedCurve(CURVE)
    turns = _turns()
    plain = script.replay(turns, "plain", curve, 512, overhead=0.0)
    ngram = script.replay(turns, "ngram", curve, 512, overhead=0.0)
    oracle = script.replay(turns, "oracle", curve, 512, overhead=0.0)
    assert plain.tokens == ngram.tokens == oracle.tokens == sum(len(t["output"]) for t in turns)
    assert plain.forwards == plain.tokens and plain.seconds == pytest.approx(plain.tokens * 1.0, rel=1e-3)  # plus the loop's own microseconds
    assert oracle.forwards < ngram.forwards < plain.forwards
    assert oracle.seconds < ngram.seconds < plain.seconds


def test_the_fixed_curve_ignores_the_replays_instant_forwards(script):
    curve = script.FixedCurve(CURVE)
    curve.observe(1, 1e-6)
    curve.observe(8, 1e-6)
    assert curve.forward(1) == CostModel(CURVE).forward(1) and curve.forward(8) == CostModel(CURVE).forward(8)


def test_a_target_that_knows_the_answer_puts_its_token_first(script):
    target = script.KnownAnswer([5, 6, 7, 8, 9], 16, script.FixedCurve(CURVE))
    target.prefill([5, 6])
    assert target.extend([7, 3]).argmax(dim=-1).tolist() == [8, 9]
    target.truncate(3)
    assert target.extend([8], last_only=True).argmax(dim=-1).tolist() == [9]
