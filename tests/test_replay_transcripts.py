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


def test_the_one_client_prediction_keeps_the_prompts_time_and_divides_the_steps(script):
    # 100 s of which 20 s are prompts: steps twice as fast leave 20 + 40 s.
    assert script.predicted_ratio(100.0, 20.0, 2.0) == pytest.approx(100 / 60)
    assert script.predicted_ratio(100.0, 0.0, 1.3) == pytest.approx(1.3)
    assert script.predicted_ratio(100.0, 20.0, 1.0) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="prompt_s"):
        script.predicted_ratio(100.0, 120.0, 2.0)


def test_single_predicts_each_method_beside_the_load_tests_measured_ratio(script, tmp_path):
    turns = _turns()
    (tmp_path / "t.json").write_text(json.dumps({"turns": turns}))
    curve = script.FixedCurve(CURVE)
    sizes = {str(n): curve.forward(n) for n in CALIBRATION_SIZES}
    (tmp_path / "c.json").write_text(json.dumps({**sizes, SWITCH_KEY: 0.0}))
    lines = [{"run": "scripts/loadtest_servers.sh", "commit": "abc"},
             {"server": "specdec-plain", "clients": 1, "wall_s": 100.0, "tokens_per_s": 10.0, "tokens": 1000,
              "ttfts_s": [5.0, 15.0], "outside_ms_per_tick": 0.0},
             {"server": "specdec", "clients": 1, "wall_s": 80.0, "tokens_per_s": 12.5, "tokens": 1000,
              "ttfts_s": [5.0, 15.0], "outside_ms_per_tick": 0.0},
             {"server": "specdec", "clients": 4, "wall_s": 30.0, "tokens_per_s": 33.0}]
    (tmp_path / "l.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    script.main(["single", str(tmp_path / "t.json"), "--costs", str(tmp_path / "c.json"), "--vocab-size", "512",
                 "--loadtest", str(tmp_path / "l.jsonl"), "--out", str(tmp_path / "out.json")])
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["prompt_s"] == 20.0 and out["prompt_share"] == 0.2 and out["loadtest_commit"] == "abc"
    assert out["measured_1_client"] == {"server": "specdec", "over": "specdec-plain", "ratio": 1.25}
    methods = out["methods"]
    assert set(methods) == {"ngram", "ngram:cut=32", "oracle"}
    for m in methods.values():  # each prediction is its replayed steps' speed-up with the prompts' time kept
        expected = script.predicted_ratio(100.0, 20.0, m["step_speedup"])
        assert m["predicted_1_client"] == pytest.approx(expected, abs=2e-3)
    # The copies make every method faster than plain, and none faster than the oracle.
    assert 1.0 < methods["ngram"]["step_speedup"] <= methods["ngram:cut=32"]["step_speedup"] + 1e-9
    assert methods["ngram:cut=32"]["step_speedup"] <= methods["oracle"]["step_speedup"] + 1e-9
    lines[1]["clients"] = 2  # no plain server at 1 client: said, not a traceback
    (tmp_path / "l.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    with pytest.raises(SystemExit, match="specdec-plain at 1 client"):
        script.main(["single", str(tmp_path / "t.json"), "--costs", str(tmp_path / "c.json"), "--vocab-size",
                     "512", "--loadtest", str(tmp_path / "l.jsonl")])

