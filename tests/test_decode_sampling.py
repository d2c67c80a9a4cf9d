"""Sampling: speculative decoding's output distribution equals the target's.

Sequences of 3 tokens from a 4-token vocabulary have 64 outcomes whose exact probabilities are
enumerated from the toy target, so a chi-square test compares the sampled frequencies with them.
The same test rejects deliberately broken verifiers, which shows it has the power to fail.
"""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
import torch
from scipy.stats import chisquare

import specdec.engine
from specdec.backends.toy import ToyLM
from specdec.engine import DecodeConfig, decode
from specdec.drafters.model import ModelDrafter
from specdec.drafters.ngram import NgramDrafter
from specdec.policies import FixedK
from specdec.sampling import SamplingParams, logits_to_probs, sample
from specdec.types import Verdict
from specdec.verify import verify

V, LENGTH, SAMPLES = 4, 3, 6000
PROMPT = [0, 1, 0, 1, 2]  # repeats, so the n-gram drafter has something to propose
TARGET = ToyLM(V, 1, seed=21, scale=1.2)
DRAFT = ToyLM(V, 1, seed=99, scale=1.5)  # deliberately different: acceptance well below 1


def exact_distribution(params: SamplingParams) -> dict[tuple[int, ...], float]:
    dist = {}
    for seq in itertools.product(range(V), repeat=LENGTH):
        ctx, prob = list(PROMPT), 1.0
        for tok in seq:
            prob *= float(logits_to_probs(TARGET.logits(ctx), params)[tok])
            ctx.append(tok)
        dist[seq] = prob
    return dist


def sample_counts(params: SamplingParams, drafter_factory, k: int) -> tuple[Counter, float]:
    counts: Counter = Counter()
    drafted = accepted = 0
    for i in range(SAMPLES):
        cfg = DecodeConfig(max_new_tokens=LENGTH,
                           sampling=SamplingParams(params.temperature, params.top_k, params.top_p, seed=i))
        out = decode(TARGET.backend(), PROMPT, cfg, drafter_factory(), FixedK(k))
        counts[tuple(out.token_ids)] += 1
        drafted += out.stats.drafted
        accepted += out.stats.accepted
    return counts, accepted / max(drafted, 1)


def chi_square_pvalue(counts: Counter, dist: dict) -> float:
    observed, expected = [], []
    rare_obs = rare_exp = 0.0
    for seq, prob in dist.items():
        if prob * SAMPLES < 5:  # pool the rare outcomes so the chi-square approximation holds
            rare_obs += counts.get(seq, 0)
            rare_exp += prob * SAMPLES
        else:
            observed.append(counts.get(seq, 0))
            expected.append(prob * SAMPLES)
    if rare_exp > 0:
        observed.append(rare_obs)
        expected.append(rare_exp)
    scale = sum(observed) / sum(expected)
    return float(chisquare(observed, [e * scale for e in expected]).pvalue)


PARAMS = [SamplingParams(1.0), SamplingParams(0.7, top_k=3), SamplingParams(1.3, top_p=0.8)]
DRAFTERS = {
    "model": lambda: ModelDrafter(DRAFT.backend()),
    "ngram": lambda: NgramDrafter(max_ngram=2, min_ngram=1),
    "none": lambda: None,
}


@pytest.mark.parametrize("params", PARAMS, ids=lambda p: f"T{p.temperature}-k{p.top_k}-p{p.top_p}")
@pytest.mark.parametrize("drafter", DRAFTERS)
def test_sampled_sequences_follow_the_target_distribution(params, drafter):
    k = 2
    counts, acceptance = sample_counts(params, DRAFTERS[drafter], k)
    pvalue = chi_square_pvalue(counts, exact_distribution(params))
    assert pvalue > 1e-3, f"sampled distribution differs from the target's (p={pvalue:.2e})"
    if drafter != "none":
        assert 0.05 < acceptance < 0.95  # a real mix of accepted and rejected drafts was exercised


def _accept_everything(draft, logits, params, generator):
    """Broken: keeps every draft token (the output follows the drafter)."""
    p = logits_to_probs(logits, params)
    return Verdict(draft.tokens + [sample(p[-1], generator)], len(draft), True)


def _resample_from_p(draft, logits, params, generator):
    """Broken: after a rejection samples from p instead of the residual max(0, p - q)."""
    verdict = verify(draft, logits, params, generator)
    if verdict.bonus or not draft.tokens:
        return verdict
    n = verdict.num_accepted
    p = logits_to_probs(logits, params)
    return Verdict(draft.tokens[:n] + [sample(p[n], generator)], n, False)


@pytest.mark.parametrize("broken", [_accept_everything, _resample_from_p])
def test_the_distribution_test_catches_a_broken_verifier(monkeypatch, broken):
    monkeypatch.setattr(specdec.engine, "verify", broken)
    params = SamplingParams(1.0)
    counts, _ = sample_counts(params, DRAFTERS["model"], 2)
    assert chi_square_pvalue(counts, exact_distribution(params)) < 1e-6


def test_first_token_marginal_equals_p_for_one_step_verification():
    """Single-step check on a larger vocabulary: P(first output token) == p, estimated from many draws."""
    gen = torch.Generator().manual_seed(0)
    vocab, draws = 8, 40_000
    logits = torch.randn(2, vocab, generator=gen) * 1.5
    q = torch.softmax(torch.randn(1, vocab, generator=gen) * 1.5, -1)
    params = SamplingParams(1.0)
    p = logits_to_probs(logits, params)
    counts = torch.zeros(vocab)
    from specdec.types import Draft

    for _ in range(draws):
        x = sample(q[0], gen)
        counts[verify(Draft([x], q), logits, params, gen).tokens[0]] += 1
    assert chisquare(counts.numpy(), (p[0] * draws).numpy()).pvalue > 1e-3


def test_seeded_sampling_is_deterministic():
    cfg = DecodeConfig(max_new_tokens=20, sampling=SamplingParams(0.9, top_p=0.9, seed=1234))
    lm = ToyLM(16, 2, seed=4)
    runs = [decode(lm.backend(), [1, 2], cfg, ModelDrafter(lm.perturbed(0.5, 1).backend()), FixedK(3)).token_ids
            for _ in range(2)]
    assert runs[0] == runs[1]
    other = DecodeConfig(max_new_tokens=20, sampling=SamplingParams(0.9, top_p=0.9, seed=4321))
    assert decode(lm.backend(), [1, 2], other, None, FixedK(3)).token_ids != runs[0]
