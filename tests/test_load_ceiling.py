"""scripts/ceilings.py load: what drafting could gain under load at most, from a tick-cost fit."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "ceilings.py"


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("ceilings", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def test_the_fit_recovers_a_forwards_fixed_and_per_row_cost(script):
    # Layouts priced exactly at 30 ms a forward and 16 ms a row, two of them split into two forwards.
    forwards = {"1x1": [[1, 1]], "4x1": [[4, 4]], "4x1+3": [[4, 4], [3, 1]], "16x2": [[32, 16]],
                "8x1+4x3": [[8, 8], [12, 4]]}
    ms = {name: sum(30 + 16 * rows for rows, _ in fw) for name, fw in forwards.items()}
    a, b = script.fit_forward_costs({"ms": ms, "forwards": forwards})
    assert a == pytest.approx(30) and b == pytest.approx(16)


def test_the_ceiling_is_the_fixed_cost_the_accepted_tokens_save(script):
    # Alone (n=1) a token costs 30 + 10 = 40 ms; half the tokens cost 10 instead: 1 / (1 - 0.5 * 0.75).
    assert script.ceiling(0.5, 30, 10, 1) == pytest.approx(1.6)
    # At 4 a tick, a token costs 8 + 16 = 24 ms; each accepted one saves 8, its 0.2 rejected rows cost 3.2.
    assert script.ceiling(0.4, 32, 16, 4) == pytest.approx(1 / (1 - 0.4 * 8 / 24))
    assert script.ceiling(0.4, 32, 16, 4, 0.2) == pytest.approx(1 / (1 - 0.4 * 4.8 / 24))
    # Where the rejected rows cost more than the fixed part saved, drafting can only lose.
    assert script.ceiling(0.4, 32, 16, 16, 0.2) < 1.0
    assert script.ceiling(0.0, 32, 16, 4) == 1.0
    with pytest.raises(ValueError, match="share"):
        script.ceiling(1.5, 32, 16, 4)
    with pytest.raises(ValueError, match="costs"):
        script.ceiling(0.4, 32, 0, 4)


def test_the_noise_floor_compares_only_servers_that_drafted_nothing(script):
    lines = [
        {"server": "specdec", "clients": 1, "tokens_per_s": 26.0,
         "counts": {"accepted": 40, "drafted": 50, "generated": 100}},
        {"server": "specdec", "clients": 8, "tokens_per_s": 44.0, "tokens_per_s_by_pass": [42.0, 46.0],
         "counts": {"drafted": 0}},
        {"server": "specdec-plain", "clients": 8, "tokens_per_s": 40.0, "tokens_per_s_by_pass": [42.0, 38.0],
         "counts": {"drafted": 0}},
        {"server": "specdec-throughput", "clients": 8, "tokens_per_s": 60.0, "counts": {"drafted": 12}},
    ]
    floor = script.noise_floor(lines, 8)
    assert floor["servers"] == ["specdec", "specdec-plain"]
    assert floor["spread"] == pytest.approx(1.1) and floor["largest_pass_spread"] == pytest.approx(46 / 38, abs=1e-3)
    assert script.noise_floor(lines, 16) is None
    assert script.noise_floor(lines, 8, ("specdec-plain", "specdec-plain-twin")) is None  # no twin ran
    assert script.drafting_counts(lines, "specdec") == pytest.approx((0.4, 0.25))
