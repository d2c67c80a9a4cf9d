"""Prompt lookup on literal token lists (in the style of vLLM's test_ngram.py)."""

from __future__ import annotations

import pytest

from specdec.drafters.ngram import NgramDrafter
from specdec.errors import SpecdecError


def propose(tokens, k, **kw):
    return NgramDrafter(**kw).propose(tokens, k).tokens


def test_copies_what_followed_the_suffix():
    assert propose([1, 2, 3, 4, 9, 1, 2, 3], 2) == [4, 9]


def test_prefers_the_longest_matching_suffix():
    # [3] alone last occurs before 7; the 2-gram [2, 3] occurs only before 4.
    assert propose([2, 3, 4, 5, 3, 7, 2, 3], 1, max_ngram=2) == [4]


def test_prefers_the_latest_occurrence():
    assert propose([1, 2, 5, 1, 2, 6, 1, 2], 1) == [6]  # not [5]


def test_no_match_proposes_nothing():
    assert propose([1, 2, 3, 4], 3) == []
    assert propose([7], 3) == []


def test_min_ngram_refuses_short_matches():
    assert propose([5, 1, 9, 8, 1], 2, min_ngram=2) == []
    assert propose([5, 1, 9, 8, 1], 2, min_ngram=1) == [9, 8]


def test_periodic_text_extends_by_whole_periods():
    assert propose([1, 2, 3, 1, 2, 3], 5) == [1, 2, 3, 1, 2]


def test_draft_is_deterministic():
    draft = NgramDrafter().propose([4, 5, 4], 3)
    assert draft.q is None and draft.forwards == 0


def test_bad_sizes_are_refused():
    with pytest.raises(SpecdecError):
        NgramDrafter(max_ngram=1, min_ngram=2)
    with pytest.raises(SpecdecError):
        NgramDrafter(max_ngram=3, min_ngram=0)
