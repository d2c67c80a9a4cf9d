"""Prompt lookup on literal token lists (in the style of vLLM's test_ngram.py)."""

from __future__ import annotations

import pytest

from specdec.drafters.ngram import NgramDrafter
from specdec.drafting.acceptance import AcceptanceTable, Hindsight
from specdec.drafting.suffix_index import ngram_bucket, ngram_prior
from specdec.errors import SpecdecError
from specdec.types import Verdict


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


def test_most_frequent_continuation_beats_the_latest():
    # [1] was followed by 2 twice and by 3 once (latest): the majority wins.
    assert propose([1, 2, 1, 2, 1, 3, 9, 1], 1, max_ngram=1) == [2]


def test_the_longest_match_beats_a_more_frequent_short_one():
    # "1 2 3 4" is followed by 8 twice, but the context's last six tokens match only the stretch
    # that went on with 5 6: a copy in progress (a suffix tree's deepest node), followed token by token.
    tokens = [1, 2, 3, 4, 8, 1, 2, 3, 4, 8, 9, 9, 1, 2, 3, 4, 5, 6, 7, 9, 9, 1, 2, 3, 4]
    assert propose(tokens, 4) == [5, 6, 7, 9]
    drafter = NgramDrafter()
    draft = drafter.propose(tokens, 4)
    assert [f.match for f in drafter.notes.get(draft)] == [6, 7, 8, 9]  # the match grows along the copy


def test_a_draft_past_the_context_s_match_is_believed_less():
    tokens = [7, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 1, 2, 3, 4]  # matched 4 tokens back
    drafter = NgramDrafter()
    draft = drafter.propose(tokens, 10)
    assert draft.tokens == [5, 6, 7, 8, 9, 10, 11, 12, 1, 2]
    assert [f.beyond for f in drafter.notes.get(draft)] == [0] * 4 + [1] * 4 + [2] * 2
    assert draft.confidence[3] > draft.confidence[4] > draft.confidence[8]


def test_confidence_grows_with_the_length_of_the_match():
    short_drafter, long_drafter = NgramDrafter(), NgramDrafter()
    short = short_drafter.propose([5, 6, 9, 8, 7, 6], 1)  # matches only "6"
    long = long_drafter.propose([1, 2, 3, 4, 5, 6, 9, 1, 2, 3, 4, 5, 6], 1)  # matches 6 tokens
    assert short.tokens == long.tokens == [9]
    assert short_drafter.notes.get(short)[0].match == 1 and long_drafter.notes.get(long)[0].match == 6
    assert long.confidence[0] > short.confidence[0] + 0.2


def test_verified_drafts_calibrate_the_confidence_online():
    drafter = NgramDrafter()
    tokens = [5, 6, 9, 8, 7, 6]
    before = drafter.propose(tokens, 1)
    for _ in range(50):
        drafter.propose(tokens, 1)
        drafter.verified(before, Verdict(before.tokens + [0], 1, True))  # always accepted
    assert drafter.propose(tokens, 1).confidence[0] > 0.9 > before.confidence[0]


def _declined_then_followed(table, context, followed):
    """One generation: a draft after ``context`` the policy declines, then plain steps that
    produce ``followed``; the first token's confidence after ``context`` before it."""
    drafter = NgramDrafter(table=table)
    drafter.begin(context, None)
    draft = drafter.propose(context, 3)
    drafter.verified(draft.truncated(0), Verdict([followed[0]], 0, False))  # declined: a plain step
    for i in range(1, len(followed) + 1):
        drafter.sync(context + followed[:i])  # the plain steps' tokens
    drafter.close()
    return draft.confidence[0]


def test_declined_drafts_are_judged_on_the_tokens_that_followed():
    """A table taught only by verified drafts never learns that the drafts it is too unsure to
    verify would have been kept: a declined chain is judged on the plain steps after it."""
    context = [5, 6, 9, 8, 7, 6]
    right = AcceptanceTable(ngram_prior, ngram_bucket)
    first = _declined_then_followed(right, context, [9, 8, 7])
    for _ in range(30):
        last = _declined_then_followed(right, context, [9, 8, 7])
    assert last > 0.85 > first
    assert sum(judged for _, judged in right.counts.values()) == 31 * 3
    wrong = AcceptanceTable(ngram_prior, ngram_bucket)
    for _ in range(30):
        last = _declined_then_followed(wrong, context, [4, 4, 4])
    assert last < 0.1 < first
    assert sum(judged for _, judged in wrong.counts.values()) == 30  # judged up to the first miss


def test_hindsight_waits_for_the_tokens_it_judges():
    table = AcceptanceTable(lambda f: 0.5, lambda f: f)
    hindsight = Hindsight(table)
    hindsight.declined(2, [7, 8, 9], ["a", "b", "c"])
    hindsight.judge([1, 2, 7, 8])  # not decided yet: the third token has not come
    assert table.counts == {}
    hindsight.judge([1, 2, 7, 8, 9])
    assert table.counts == {"a": [1, 1], "b": [1, 1], "c": [1, 1]}
    hindsight.declined(1, [5, 6], ["d", "e"])
    hindsight.judge([1, 4])  # missed at once: decided before its end
    assert table.counts["d"] == [0, 1] and "e" not in table.counts
    hindsight.declined(1, [5, 6], ["f", "g"])
    hindsight.judge([1, 5], final=True)  # the generation ended inside it: what it reached
    assert table.counts["f"] == [1, 1] and "g" not in table.counts


def test_index_follows_a_context_that_is_rolled_back():
    drafter = NgramDrafter()
    assert drafter.propose([1, 2, 3, 1, 2], 1).tokens == [3]
    assert drafter.propose([7, 8, 7], 1).tokens == [8]  # not an extension: re-indexed from scratch


def test_recycled_drafts_are_the_target_s_own_next_tokens():
    """On a first-order toy model the next token depends on the last one only, so after one pass
    the recycled top token is exactly greedy's next token: nearly every draft is accepted."""
    from specdec.backends.toy import ToyLM
    from specdec.drafters.recycle import RecycleDrafter
    from specdec.engine import DecodeConfig, decode
    from specdec.policies.fixed import FixedK

    lm = ToyLM(50, 1, seed=5, scale=3.0)
    drafter = RecycleDrafter()
    cfg = DecodeConfig(max_new_tokens=60)
    plain = decode(lm.backend(), [1, 2, 3], cfg)
    out = decode(lm.backend(), [1, 2, 3], cfg, drafter, FixedK(4))
    assert out.token_ids == plain.token_ids
    probs = lm.backend()
    for token, row in list(drafter.next.items())[:10]:
        probs.reset()
        assert row[0] == int(probs.extend([token])[-1].argmax())
    again = decode(lm.backend(), [1, 2, 3], cfg, drafter, FixedK(4))  # the table carries over
    assert again.token_ids == plain.token_ids
    assert again.stats.acceptance_rate > 0.9 and again.stats.mean_accepted_length > 3


def test_recycle_drafts_where_the_index_has_nothing_and_learns_per_source():
    from specdec.drafters.recycle import NGRAM, RECYCLED, RecycleDrafter
    from specdec.types import Verdict

    drafter = RecycleDrafter()
    drafter.begin([1, 2, 3, 1, 2], None)
    draft = drafter.propose([1, 2, 3, 1, 2], 3)  # nothing recycled yet: the index drafts 3, 1, 2
    assert draft.tokens == [3, 1, 2] and [f[0] for f in drafter.notes.get(draft)] == [NGRAM] * 3
    drafter.next.update({4: [7, 8], 7: [9]})
    draft = drafter.propose([1, 2, 3, 4], 3)  # 4 was never followed by anything: recycled 7, then 9
    assert draft.tokens == [7, 9] and drafter.notes.get(draft) == [(RECYCLED, (0, 0)), (RECYCLED, (0, 1))]
    ngram_before = {k: list(v) for k, v in drafter.ngram_table.counts.items()}
    drafter.verified(draft, Verdict([7, 5], 1, False))  # 7 accepted, 9 rejected
    assert drafter.acceptance.counts == {(0, 0): [1.0, 1.0], (0, 1): [0.0, 1.0]}
    assert drafter.ngram_table.counts == ngram_before
