"""The temperature / top-k / top-p transform and parameter validation."""

from __future__ import annotations

import pytest
import torch

from specdec.errors import SpecdecError
from specdec.sampling import SamplingParams, logits_to_probs


def test_greedy_is_one_hot_on_the_argmax():
    p = logits_to_probs(torch.tensor([[0.1, 2.0, -1.0]]), SamplingParams())
    assert p.tolist() == [[0.0, 1.0, 0.0]]


def test_temperature_divides_logits():
    logits = torch.tensor([1.0, 2.0, 3.0])
    p = logits_to_probs(logits, SamplingParams(temperature=2.0))
    assert torch.allclose(p, torch.softmax(logits / 2, -1))


def test_top_k_keeps_k_tokens():
    p = logits_to_probs(torch.tensor([1.0, 4.0, 3.0, 2.0]), SamplingParams(1.0, top_k=2))
    assert (p > 0).tolist() == [False, True, True, False]
    assert p.sum().item() == pytest.approx(1.0)


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    p = logits_to_probs(probs.log(), SamplingParams(1.0, top_p=0.8))
    assert (p > 0).tolist() == [True, True, False, False]  # 0.5 + 0.3 reaches 0.8
    p = logits_to_probs(probs.log(), SamplingParams(1.0, top_p=0.81))
    assert (p > 0).tolist() == [True, True, True, False]
    p = logits_to_probs(probs.log(), SamplingParams(1.0, top_p=0.01))
    assert (p > 0).tolist() == [True, False, False, False]  # the top token always stays


def test_transform_is_row_wise_on_batches():
    logits = torch.randn(5, 11)
    params = SamplingParams(0.7, top_k=5, top_p=0.9)
    batched = logits_to_probs(logits, params)
    for i in range(5):
        assert torch.allclose(batched[i], logits_to_probs(logits[i], params))


@pytest.mark.parametrize("kwargs, message", [
    (dict(temperature=-0.1), "temperature"),
    (dict(temperature=float("nan")), "temperature"),
    (dict(top_k=-1), "top_k"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
])
def test_bad_parameters_are_refused(kwargs, message):
    with pytest.raises(SpecdecError, match=message):
        SamplingParams(**kwargs)
