"""Verification on literal cases: greedy match, one-hot drafts, residual sampling."""

from __future__ import annotations

import pytest
import torch

from specdec.sampling import SamplingParams
from specdec.types import Draft
from specdec.verify import verify, verify_greedy


def onehot_logits(ids: list[int], vocab: int = 6) -> torch.Tensor:
    """Logits whose argmax at row i is ids[i]."""
    return torch.nn.functional.one_hot(torch.tensor(ids), vocab).float() * 5


def test_greedy_keeps_the_matching_prefix_then_the_correction():
    v = verify_greedy([3, 4, 5], onehot_logits([3, 4, 1, 2]))
    assert (v.tokens, v.num_accepted, v.bonus) == ([3, 4, 1], 2, False)


def test_greedy_all_accepted_gets_the_bonus_token():
    v = verify_greedy([3, 4], onehot_logits([3, 4, 0]))
    assert (v.tokens, v.num_accepted, v.bonus) == ([3, 4, 0], 2, True)


def test_greedy_first_token_wrong():
    v = verify_greedy([1, 4], onehot_logits([3, 4, 0]))
    assert (v.tokens, v.num_accepted, v.bonus) == ([3], 0, False)


def test_empty_draft_is_a_plain_step():
    v = verify(Draft([]), onehot_logits([2]), SamplingParams())
    assert (v.tokens, v.num_accepted, v.bonus) == ([2], 0, False)


def test_logit_rows_must_match_the_draft():
    with pytest.raises(ValueError, match="expected 3 rows"):
        verify(Draft([1, 2]), onehot_logits([1, 2]), SamplingParams())


def test_sampling_rejects_a_token_the_target_cannot_produce():
    gen = torch.Generator().manual_seed(0)
    logits = torch.tensor([[0.0, 0.0, -float("inf")], [0.0, 0.0, 0.0]])
    for _ in range(50):
        v = verify(Draft([2]), logits, SamplingParams(1.0), gen)
        assert v.num_accepted == 0 and v.tokens[0] in (0, 1)


def test_sampling_always_accepts_when_p_equals_q():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 7, generator=gen)
    params = SamplingParams(0.8)
    q = torch.softmax(logits[:3] / 0.8, -1)
    for _ in range(50):
        draft = [int(torch.multinomial(q[i], 1, generator=gen)) for i in range(3)]
        v = verify(Draft(draft, q), logits, params, gen)
        assert v.num_accepted == 3 and v.bonus


def test_one_hot_draft_residual_excludes_the_rejected_token():
    gen = torch.Generator().manual_seed(1)
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2], [1.0, 1.0, 1.0]]))
    seen = set()
    for _ in range(300):
        v = verify(Draft([0]), logits, SamplingParams(1.0), gen)
        if v.num_accepted == 0:
            seen.add(v.tokens[0])
    assert seen == {1, 2}  # after rejecting token 0 (p=0.5, q=1) only 1 and 2 can follow


def test_draft_q_with_a_differently_padded_vocabulary():
    gen = torch.Generator().manual_seed(2)
    logits = torch.zeros(2, 6)
    q = torch.tensor([[0.5, 0.5, 0.0, 0.0]])  # drafter vocabulary of 4, target of 6
    v = verify(Draft([1], q), logits, SamplingParams(1.0), gen)
    assert v.tokens[-1] in range(6)


def test_sampling_needs_a_generator():
    with pytest.raises(ValueError, match="Generator"):
        verify(Draft([1]), torch.zeros(2, 4), SamplingParams(1.0))
