"""scripts/ceilings.py record and replay: recorded answers replayed through the real loop, priced on a curve."""

from __future__ import annotations

import importlib.util
import json
import random
import sys
from pathlib import Path

import pytest

from specdec.costs import CALIBRATION_SIZES, SWITCH_KEY, CostModel

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "ceilings.py"
CURVE = {1: 1.0, 2: 1.43, 3: 1.84, 4: 2.29, 6: 2.87, 8: 3.87, 16: 7.47, 32: 14.1, 64: 30.1}


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("ceilings", SCRIPT)
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


def test_a_drafter_cut_in_hindsight_sits_between_its_policy_and_the_perfect_drafter(script):
    curve = script.FixedCurve(CURVE)
    turns = _turns()
    ngram = script.replay(turns, "ngram", curve, 512, overhead=0.0)
    cut = script.replay(turns, "ngram:cut=31", curve, 512, overhead=0.0)
    oracle = script.replay(turns, "oracle:k=31", curve, 512, overhead=0.0)
    assert cut.tokens == ngram.tokens  # checked identical to the recorded answers, like every replay
    assert oracle.seconds <= cut.seconds < ngram.seconds
    # The new stretch at each answer's end has nothing earlier to copy: the cut drafts nothing there.
    assert cut.forwards > oracle.forwards


def test_held_out_questions_are_skipped_by_id_whether_numbers_names_or_edit_tasks(script, tmp_path, capsys):
    turns = _turns()
    turns[0]["qid"], turns[1]["qid"] = 86, "HumanEval/16:rename"  # Spec-Bench's ids are numbers; an edit task's
    (tmp_path / "t.json").write_text(json.dumps({"turns": turns}))
    curve = script.FixedCurve(CURVE)
    sizes = {str(n): curve.forward(n) for n in CALIBRATION_SIZES}
    (tmp_path / "c.json").write_text(json.dumps({**sizes, SWITCH_KEY: 0.0}))
    script.main(["replay", str(tmp_path / "t.json"), "--costs", str(tmp_path / "c.json"), "--vocab-size", "512",
                 "--skip", "86,HumanEval/16", "--methods", "ngram"])
    plain = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("plain"))
    assert f"forwards {len(turns[2]['output']):6d}" in plain  # only the third question's answer was replayed
