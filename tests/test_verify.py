"""Verification on literal cases: greedy match, the target's seeded choice, rejection sampling."""

from __future__ import annotations

import pytest
import torch

from specdec.sampling import Noise, Sampler, SamplingParams
from specdec.types import Draft
from specdec.verify import verify, verify_by_choice


def onehot_logits(ids: list[int], vocab: int = 6) -> torch.Tensor:
    """Logits whose argmax at row i is ids[i]."""
    return torch.nn.functional.one_hot(torch.tensor(ids), vocab).float() * 5


GREEDY = Sampler(SamplingParams())


def greedy(tokens, logits):
    return verify(Draft(tokens), logits, GREEDY, position=0)


def test_greedy_keeps_the_matching_prefix_then_the_correction():
    v = greedy([3, 4, 5], onehot_logits([3, 4, 1, 2]))
    assert (v.tokens, v.num_accepted, v.bonus) == ([3, 4, 1], 2, False)


def test_greedy_all_accepted_gets_the_bonus_token():
    v = greedy([3, 4], onehot_logits([3, 4, 0]))
    assert (v.tokens, v.num_accepted, v.bonus) == ([3, 4, 0], 2, True)


def test_greedy_first_token_wrong():
    v = greedy([1, 4], onehot_logits([3, 4, 0]))
    assert (v.tokens, v.num_accepted, v.bonus) == ([3], 0, False)


def test_empty_draft_is_a_plain_step():
    v = greedy([], onehot_logits([2]))
    assert (v.tokens, v.num_accepted, v.bonus) == ([2], 0, False)


def test_choice_is_asked_only_up_to_the_first_disagreement():
    asked = []
    v = verify_by_choice([5, 6, 7, 8], lambda j: asked.append(j) or [5, 9, 7, 8, 1][j])
    assert v.tokens == [5, 9] and asked == [0, 1]


def test_logit_rows_must_match_the_draft():
    with pytest.raises(ValueError, match="expected 3 rows"):
        greedy([1, 2], onehot_logits([1, 2]))


def test_seeded_target_token_depends_only_on_seed_position_and_p():
    logits = torch.randn(50)
    a, b = Sampler(SamplingParams(1.0, seed=3)), Sampler(SamplingParams(1.0, seed=3), verify="rejection")
    assert [a.target_token(logits, i) for i in range(40)] == [b.target_token(logits, i) for i in range(40)]
    other = Sampler(SamplingParams(1.0, seed=4))
    assert [a.target_token(logits, i) for i in range(40)] != [other.target_token(logits, i) for i in range(40)]


def test_coupled_drafts_share_the_target_noise_and_rejection_drafts_do_not():
    q = torch.softmax(torch.randn(30), -1)
    coupled, rejection = Sampler(SamplingParams(1.0, seed=1)), Sampler(SamplingParams(1.0, seed=1), "rejection")
    same = [coupled.draft_token(q, i) == coupled.draw(q, i, Noise.TARGET) for i in range(30)]
    indep = [rejection.draft_token(q, i) == rejection.draw(q, i, Noise.TARGET) for i in range(30)]
    assert all(same) and not all(indep)


def test_sampling_rejects_a_token_the_target_cannot_produce():
    logits = torch.tensor([[0.0, 0.0, -float("inf")], [0.0, 0.0, 0.0]])
    for mode in ("coupled", "rejection"):
        sampler = Sampler(SamplingParams(1.0, seed=0), mode)
        q = torch.tensor([[0.0, 0.0, 1.0]])
        for pos in range(50):
            v = verify(Draft([2], q if mode == "rejection" else None), logits, sampler, pos)
            assert v.num_accepted == 0 and v.tokens[0] in (0, 1)


def test_rejection_always_accepts_when_p_equals_q():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 7, generator=gen)
    sampler = Sampler(SamplingParams(0.8, seed=0), "rejection")
    q = torch.softmax(logits[:3] / 0.8, -1)
    for pos in range(0, 150, 3):
        draft = [sampler.draft_token(q[i], pos + i) for i in range(3)]
        v = verify(Draft(draft, q), logits, sampler, pos)
        assert v.num_accepted == 3 and v.bonus


def test_one_hot_draft_residual_excludes_the_rejected_token():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2], [1.0, 1.0, 1.0]]))
    for mode in ("coupled", "rejection"):
        sampler = Sampler(SamplingParams(1.0, seed=1), mode)
        seen = set()
        for pos in range(300):
            v = verify(Draft([0]), logits, sampler, pos)
            if v.num_accepted == 0:
                seen.add(v.tokens[0])
        assert seen == {1, 2}  # after rejecting token 0 (p=0.5, q=1) only 1 and 2 can follow


def test_q_in_another_vocabulary_fails_loudly():
    """A drafter whose q is not in the target's vocabulary must not be silently padded or cut."""
    q = torch.tensor([[0.5, 0.5, 0.0, 0.0]])  # drafter vocabulary of 4, target of 6
    with pytest.raises(ValueError, match="target's vocabulary"):
        verify(Draft([1], q), torch.zeros(2, 6), Sampler(SamplingParams(1.0, seed=0), "rejection"), 0)


def test_recorded_probabilities_describe_each_judged_token():
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8], [0.3, 0.3, 0.4]]))
    v = verify(Draft([0, 1], probs=[0.9, 0.5]), logits, GREEDY, 0, record=True)
    assert v.num_accepted == 1  # 0 is the argmax of row 0, 1 is not of row 1
    assert v.target_probs == pytest.approx([0.7, 0.1], abs=1e-6)
    assert v.accept_probs == pytest.approx([0.7 / 0.9, 0.1 / 0.5], abs=1e-6)
