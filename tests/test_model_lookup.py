"""The model drafter copies with the n-gram index where the context repeats itself: free drafts
instead of draft-model forwards, still exactly plain decoding's output; and a draft model whose
forwards cost as much as they save is not run at all."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from specdec.backends.toy import ToyLM
from specdec.costs import CostModel
from specdec.drafters.model import ModelDrafter
from specdec.drafters.ngram import NgramDrafter
from specdec.engine import DecodeConfig, decode
from specdec.policies.adaptive import AdaptiveK
from specdec.policies.fixed import FixedK
from specdec.sampling import SamplingParams


@settings(max_examples=60, deadline=None)
@given(
    vocab=st.integers(2, 12),
    order=st.integers(1, 3),
    lm_seed=st.integers(0, 10_000),
    prompt=st.lists(st.integers(0, 11), min_size=1, max_size=16),
    k=st.integers(1, 10),
    max_new=st.integers(1, 40),
    temperature=st.sampled_from([0.0, 0.0, 0.8]),
    verify=st.sampled_from(["coupled", "rejection"]),
    seed=st.integers(0, 2**64 - 1),
)
def test_copying_model_drafts_equal_plain_decoding(vocab, order, lm_seed, prompt, k, max_new, temperature, verify,
                                                   seed):
    """Greedy, and sampled with coupled verification: the same tokens (rejection sampling keeps
    the distribution, not the seed's text)."""
    if verify == "rejection":
        temperature = 0.0
    lm = ToyLM(vocab, order, seed=lm_seed, scale=3.0)
    prompt = [t % vocab for t in prompt]
    cfg = DecodeConfig(max_new_tokens=max_new, sampling=SamplingParams(temperature, seed=seed), verify=verify)
    drafter = ModelDrafter(lm.perturbed(0.5, lm_seed + 1).backend(), lookup=NgramDrafter())
    plain = decode(lm.backend(), prompt, cfg)
    assert decode(lm.backend(), prompt, cfg, drafter, FixedK(k)).token_ids == plain.token_ids


def _repeating_run(lookup: bool, token_cost: float):
    """Greedy text of a toy model cycles: after the first cycle the context repeats itself."""
    lm = ToyLM(10, 2, seed=7)
    curve = CostModel({1: 1.0, 2: 1.54, 4: 2.49, 8: 4.5})  # a verified row costs ~half a forward
    unit = CostModel({1: token_cost}) if token_cost else None
    drafter = ModelDrafter(lm.perturbed(0.3, 8).backend(), lookup=NgramDrafter() if lookup else None,
                           costs=(lambda: unit) if unit else None)
    cfg = DecodeConfig(max_new_tokens=80)
    return decode(lm.backend(), [1, 2], cfg, drafter, AdaptiveK(curve)), decode(lm.backend(), [1, 2], cfg)


def test_where_the_context_repeats_the_index_drafts_instead_of_the_model():
    copying, plain = _repeating_run(lookup=True, token_cost=0.1)
    modelling, _ = _repeating_run(lookup=False, token_cost=0.1)
    assert copying.token_ids == modelling.token_ids == plain.token_ids
    assert copying.stats.accepted > 0 and modelling.stats.accepted > 0
    assert copying.stats.draft_forwards < 0.5 * modelling.stats.draft_forwards


def test_a_draft_model_that_cannot_pay_is_never_run_but_copies_still_are():
    """A draft token priced at half a target forward, on a curve where a verified row costs half a
    forward too: no model draft length pays, so the draft model does not run once (its prompt
    included); the free copies of the repeating context still pay."""
    copying, plain = _repeating_run(lookup=True, token_cost=0.5)
    assert copying.token_ids == plain.token_ids
    assert copying.stats.draft_forwards == 0
    assert copying.stats.accepted > 20
    alone, _ = _repeating_run(lookup=False, token_cost=0.5)
    assert alone.stats.draft_forwards == 0 and alone.stats.drafted == 0
