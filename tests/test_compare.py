"""The comparison arithmetic: paired timings -> median ratio, spread, verdict; and the bench's spread."""

from __future__ import annotations

import pytest

from specdec.compare import MIN_EFFECT, compare, forward_ceiling, median, quantile, spread, within_noise


def test_identical_timings_are_within_noise():
    c = compare([2.0, 2.1, 1.9], [2.0, 2.1, 1.9])
    assert c.speedup == 1.0 and (c.low, c.high) == (1.0, 1.0) and c.pairs == 3
    assert c.within_noise and c.verdict == "noise"
    assert c.describe() == "1.00x (1.00-1.00 over 3 pairs), within run-to-run noise"


def test_a_clear_2x_is_a_speedup():
    c = compare([2.0, 2.2, 1.8], [1.0, 1.05, 0.95], ceiling=3.0)
    assert c.speedup == pytest.approx(2.0) and c.verdict == "faster" and not c.within_noise
    assert c.describe() == "2.00x (1.89-2.10 over 3 pairs)"
    assert compare([1.0, 1.0], [2.0, 2.1]).verdict == "slower"


def test_a_spread_that_includes_one_is_noise_even_with_a_large_median():
    # Two pairs say faster, one says slower: the median alone would claim 1.25x.
    c = compare([1.25, 1.3, 0.9], [1.0, 1.0, 1.0])
    assert c.speedup == pytest.approx(1.25) and (c.low, c.high) == pytest.approx((0.9, 1.3))
    assert c.verdict == "noise"
    assert c.describe() == "1.25x (0.90-1.30 over 3 pairs), within run-to-run noise"


def test_a_small_effect_on_every_pair_is_still_noise():
    c = compare([1.01, 1.02, 1.015], [1.0, 1.0, 1.0])
    assert c.low > 1.0 and c.speedup - 1 < MIN_EFFECT and c.within_noise


def test_a_speedup_the_counters_cannot_explain_is_noise():
    """The demo's case: 160 tokens in 158 target forwards (2 accepted drafts) against plain's 160
    cannot be 1.28x faster, whatever the clock read."""
    ceiling = forward_ceiling(plain_tokens=160, plain_forwards=160, spec_tokens=160, spec_forwards=158)
    assert ceiling == pytest.approx(160 / 158)
    c = compare([4.1, 4.0, 4.2], [3.2, 3.1, 3.3], ceiling)
    assert c.speedup == pytest.approx(1.28, abs=0.01) and c.low > 1.0
    assert c.verdict == "beyond-counters" and c.within_noise
    assert c.describe().endswith("more than the 1.01x its target forwards allow: run-to-run noise")
    # The same timings with drafts that halved the forwards: a real speed-up.
    assert compare([4.1, 4.0, 4.2], [3.2, 3.1, 3.3], forward_ceiling(160, 160, 160, 80)).verdict == "faster"
    # A slowdown is never capped: drafting that costs time with nothing accepted is what it is.
    assert compare([1.0, 1.0, 1.0], [1.5, 1.6, 1.4], ceiling).verdict == "slower"


def test_one_pair_has_no_spread_and_says_so():
    c = compare([1.5], [1.0])
    assert c.describe() == "1.50x (over 1 pair)" and c.verdict == "faster"
    assert compare([1.01], [1.0]).describe() == "1.01x (over 1 pair), within run-to-run noise"


def test_json_fields():
    d = compare([2.0, 2.0], [1.0, 1.25], ceiling=2.5).to_dict()
    assert d == {"speedup": 1.8, "speedup_spread": [1.6, 2.0], "within_noise": False, "verdict": "faster",
                 "repeats": 2, "speedup_ceiling": 2.5}


def test_bad_timings_are_refused():
    with pytest.raises(ValueError, match="same number"):
        compare([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="same number"):
        compare([], [])
    with pytest.raises(ValueError, match="positive"):
        compare([1.0], [0.0])
    assert forward_ceiling(0, 0, 5, 3) is None


def test_order_statistics():
    assert median([3.0, 1.0, 2.0]) == 2.0 and median([4.0, 1.0, 2.0, 3.0]) == 2.5
    assert quantile([1.0, 2.0, 3.0, 4.0, 5.0], 0.25) == 2.0
    assert quantile([1.0, 2.0], 0.75) == 1.75 and quantile([7.0], 0.25) == 7.0
    assert within_noise(1.1, 0.95, 1.2) and within_noise(1.02, 1.01, 1.03) and not within_noise(1.1, 1.05, 1.2)


def test_bench_spread_of_per_question_speedups():
    assert spread([2.0, 2.0, 2.5, 2.0], 2.1) == {"speedup_spread": [2.0, 2.125], "within_noise": False}
    assert spread([0.5, 2.0, 0.5, 2.0], 0.8) == {"speedup_spread": [0.5, 2.0], "within_noise": True}
    assert spread([], 1.0) == {"speedup_spread": None, "within_noise": None}
