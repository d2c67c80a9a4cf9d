"""Sampling: speculative decoding's output distribution equals the target's, and a seed gives the
same tokens with or without speculation.

Sequences of 3 tokens from a 4-token vocabulary have 64 outcomes whose exact probabilities are
enumerated from the toy target, so a chi-square test compares the sampled frequencies with them.
The same test rejects deliberately broken verifiers (for both verification rules), which shows it
has the power to fail.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

import specdec.engine
from conftest import ScriptDrafter, chi_square_pvalue, sequence_distribution
from specdec.backends.toy import ToyLM
from specdec.costs import CostModel
from specdec.drafters.model import ModelDrafter
from specdec.drafters.ngram import NgramDrafter
from specdec.drafters.recycle import RecycleDrafter
from specdec.engine import DecodeConfig, decode
from specdec.policies.adaptive import AdaptiveK
from specdec.policies.fixed import FixedK
from specdec.sampling import Noise, Sampler, SamplingParams, logits_to_probs
from specdec.types import Draft, Verdict
from specdec.verify import verify

V, LENGTH, SAMPLES = 4, 3, 6000
PROMPT = [0, 1, 0, 1, 2]  # repeats, so the n-gram drafter has something to propose
TARGET = ToyLM(V, 1, seed=21, scale=1.2)
DRAFT = ToyLM(V, 1, seed=99, scale=1.5)  # deliberately different: acceptance well below 1


def exact_distribution(params: SamplingParams) -> dict[tuple[int, ...], float]:
    return sequence_distribution(TARGET, PROMPT, LENGTH, params)


def sample_counts(params: SamplingParams, drafter_factory, k: int, mode: str = "coupled") -> tuple[Counter, float]:
    counts: Counter = Counter()
    drafted = accepted = 0
    for i in range(SAMPLES):
        cfg = DecodeConfig(max_new_tokens=LENGTH, verify=mode,
                           sampling=SamplingParams(params.temperature, params.top_k, params.top_p, seed=i))
        out = decode(TARGET.backend(), PROMPT, cfg, drafter_factory(), FixedK(k))
        counts[tuple(out.token_ids)] += 1
        drafted += out.stats.drafted
        accepted += out.stats.accepted
    return counts, accepted / max(drafted, 1)


PARAMS = [SamplingParams(1.0), SamplingParams(0.7, top_k=3), SamplingParams(1.3, top_p=0.8)]
DRAFTERS = {
    "model": lambda: ModelDrafter(DRAFT.backend()),
    "ngram": lambda: NgramDrafter(max_ngram=2, min_ngram=1),
    "none": lambda: None,
    "recycle-tree": lambda: RecycleDrafter(tree=True),
}
# The model drafter under both verifiers on every setting; plain and n-gram runs are, by the
# property test below, token-identical to coupled runs, so one setting each suffices for them.
CASES = [(p, d, m) for p in PARAMS for d, m in (("model", "coupled"), ("model", "rejection"))]
CASES += [(PARAMS[0], "none", "coupled"), (PARAMS[2], "ngram", "coupled"), (PARAMS[1], "ngram", "rejection"),
          (PARAMS[0], "recycle-tree", "rejection")]


@pytest.mark.parametrize("params, drafter, mode", CASES,
                         ids=[f"{d}-{m}-T{p.temperature}-k{p.top_k}-p{p.top_p}" for p, d, m in CASES])
def test_sampled_sequences_follow_the_target_distribution(params, drafter, mode):
    counts, acceptance = sample_counts(params, DRAFTERS[drafter], 2, mode)
    pvalue = chi_square_pvalue(counts, exact_distribution(params))
    assert pvalue > 1e-3, f"sampled distribution differs from the target's (p={pvalue:.2e})"
    if drafter != "none":
        assert 0.05 < acceptance < 0.95  # a real mix of accepted and rejected drafts was exercised


def _accept_everything(draft, logits, sampler, position, record=False):
    """Broken: keeps every draft token (the output follows the drafter)."""
    bonus = sampler.target_token(logits[-1], position + len(draft))
    return Verdict(draft.tokens + [bonus], len(draft), True)


def _resample_from_p(draft, logits, sampler, position, record=False):
    """Broken: after a rejection samples from p instead of the residual max(0, p - q)."""
    verdict = verify(draft, logits, sampler, position)
    if verdict.bonus or not draft.tokens:
        return verdict
    n = verdict.num_accepted
    redo = sampler.draw(sampler.probs(logits[n]), position + n, Noise.RESIDUAL)
    return Verdict(draft.tokens[:n] + [redo], n, False)



@pytest.mark.parametrize("broken, mode", [(_accept_everything, "coupled"), (_accept_everything, "rejection"),
                                          (_resample_from_p, "rejection"), ("unkeyed", "coupled")],
                         ids=["accept-all-coupled", "accept-all-rejection", "resample-p-rejection",
                              "unkeyed-noise-coupled"])
def test_the_distribution_test_catches_a_broken_verifier(monkeypatch, broken, mode):
    if broken == "unkeyed":
        original = Noise.exponential
        monkeypatch.setattr(Noise, "exponential", lambda self, s, pos, v: original(self, s, 0, v))
    else:
        monkeypatch.setattr(specdec.engine, "verify", broken)
    params = SamplingParams(1.0)
    counts, _ = sample_counts(params, DRAFTERS["model"], 2, mode)
    assert chi_square_pvalue(counts, exact_distribution(params)) < 1e-6


def test_first_token_marginal_equals_p_for_one_step_rejection():
    """Single-step check on a larger vocabulary: P(first output token) == p, estimated from many draws."""
    gen = torch.Generator().manual_seed(0)
    vocab, draws = 8, 20_000
    logits = torch.randn(2, vocab, generator=gen) * 1.5
    q = torch.softmax(torch.randn(1, vocab, generator=gen) * 1.5, -1)
    params = SamplingParams(1.0, seed=0)
    sampler = Sampler(params, "rejection")
    p = logits_to_probs(logits, params)
    counts = torch.zeros(vocab)
    for pos in range(draws):
        x = sampler.draft_token(q[0], pos)
        counts[verify(Draft([x], q), logits, sampler, pos).tokens[0]] += 1
    assert chisquare(counts.numpy(), (p[0] * draws).numpy()).pvalue > 1e-3


def test_a_seed_fixes_the_text_and_another_seed_changes_it():
    lm = ToyLM(16, 2, seed=4)
    cfg = DecodeConfig(max_new_tokens=20, sampling=SamplingParams(0.9, top_p=0.9, seed=1234))
    runs = [decode(lm.backend(), [1, 2], cfg, ModelDrafter(lm.perturbed(0.5, 1).backend()), FixedK(3)).token_ids
            for _ in range(2)]
    assert runs[0] == runs[1] == decode(lm.backend(), [1, 2], cfg).token_ids
    other = DecodeConfig(max_new_tokens=20, sampling=SamplingParams(0.9, top_p=0.9, seed=4321))
    assert decode(lm.backend(), [1, 2], other, None, FixedK(3)).token_ids != runs[0]


def test_rejection_mode_replays_its_own_configuration():
    lm = ToyLM(16, 2, seed=4)
    cfg = DecodeConfig(max_new_tokens=30, sampling=SamplingParams(1.0, seed=9), verify="rejection")
    runs = {tuple(decode(lm.backend(), [1, 2], cfg, ModelDrafter(lm.perturbed(1.0, 2).backend()),
                         FixedK(3)).token_ids) for _ in range(3)}
    assert len(runs) == 1


DRAFTER_KINDS = ["ngram", "recycle", "recycle-tree", "same-model", "noisy-model", "random-model", "oracle",
                 "anti-oracle"]


@settings(max_examples=120, deadline=None)
@given(
    vocab=st.integers(2, 10),
    order=st.integers(1, 2),
    lm_seed=st.integers(0, 1000),
    seed=st.integers(0, 2**64 - 1),
    temperature=st.sampled_from([0.3, 0.7, 1.0, 1.5]),
    top_k=st.sampled_from([0, 1, 2, 5]),
    top_p=st.sampled_from([1.0, 0.9, 0.5]),
    prompt=st.lists(st.integers(0, 9), min_size=1, max_size=8),
    k=st.integers(1, 6),
    max_new=st.integers(1, 25),
    eos=st.sets(st.integers(0, 9), max_size=1),
    kind=st.sampled_from(DRAFTER_KINDS),
    adaptive=st.booleans(),
)
def test_coupled_speculative_sampling_reproduces_plain_sampling(vocab, order, lm_seed, seed, temperature, top_k,
                                                                top_p, prompt, k, max_new, eos, kind, adaptive):
    lm = ToyLM(vocab, order, seed=lm_seed, scale=2.0)
    prompt = [t % vocab for t in prompt]
    cfg = DecodeConfig(max_new_tokens=max_new, sampling=SamplingParams(temperature, top_k, top_p, seed),
                       eos_token_ids=frozenset(e % vocab for e in eos))
    plain = decode(lm.backend(), prompt, cfg)
    drafter = {"ngram": lambda: NgramDrafter(),
               "recycle": lambda: RecycleDrafter(),
               "recycle-tree": lambda: RecycleDrafter(tree=True),
               "same-model": lambda: ModelDrafter(lm.backend()),
               "noisy-model": lambda: ModelDrafter(lm.perturbed(1.0, lm_seed).backend()),
               "random-model": lambda: ModelDrafter(ToyLM(vocab, order, seed=lm_seed + 1).backend()),
               "oracle": lambda: ScriptDrafter(prompt + plain.token_ids, vocab, right=True),
               "anti-oracle": lambda: ScriptDrafter(prompt + plain.token_ids, vocab, right=False)}[kind]()
    policy = AdaptiveK(CostModel({1: 1.0, 9: 2.0}), k) if adaptive else FixedK(k)
    spec = decode(lm.backend(), prompt, cfg, drafter, policy)
    assert spec.token_ids == plain.token_ids
    assert spec.finish_reason == plain.finish_reason
    if kind == "same-model":
        assert spec.stats.accepted == spec.stats.drafted  # the target's own noise: every draft survives
