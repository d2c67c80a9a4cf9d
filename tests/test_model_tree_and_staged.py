"""The model drafter's trees (top tokens, one draft forward per depth) and the staged drafter (the
draft model's own drafting sped up by the n-gram index): exact against plain decoding, the staged
draft equal to the model drafter's, in fewer draft-model forwards."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import chi_square_pvalue, sequence_distribution
from specdec.backends.toy import ToyLM
from specdec.drafters.model import ModelDrafter
from specdec.drafters.staged import StagedDrafter
from specdec.engine import DecodeConfig, decode
from specdec.policies.fixed import FixedK
from specdec.sampling import Sampler, SamplingParams


@settings(max_examples=80, deadline=None)
@given(
    vocab=st.integers(2, 12),
    order=st.integers(1, 3),
    lm_seed=st.integers(0, 10_000),
    noise=st.sampled_from([0.0, 0.5, 2.0]),
    prompt=st.lists(st.integers(0, 11), min_size=1, max_size=12),
    k=st.integers(1, 10),
    max_new=st.integers(1, 30),
    eos=st.sets(st.integers(0, 11), max_size=1),
    temperature=st.sampled_from([0.0, 0.0, 0.7, 1.2]),
    seed=st.integers(0, 2**64 - 1),
    kind=st.sampled_from(["tree", "staged"]),
)
def test_model_trees_and_staged_drafting_equal_plain_decoding(vocab, order, lm_seed, noise, prompt, k, max_new,
                                                              eos, temperature, seed, kind):
    lm = ToyLM(vocab, order, seed=lm_seed, scale=3.0)
    draft_lm = lm.perturbed(noise, lm_seed + 1)
    prompt = [t % vocab for t in prompt]
    cfg = DecodeConfig(max_new_tokens=max_new, eos_token_ids=frozenset(e % vocab for e in eos),
                       sampling=SamplingParams(temperature, seed=seed))
    drafter = (ModelDrafter(draft_lm.backend(), tree=True) if kind == "tree"
               else StagedDrafter(draft_lm.backend()))
    plain = decode(lm.backend(), prompt, cfg)
    spec = decode(lm.backend(), prompt, cfg, drafter, FixedK(k))
    assert spec.token_ids == plain.token_ids
    assert spec.finish_reason == plain.finish_reason


class Watched(ModelDrafter):
    """Keeps what verification made of each draft."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.seen = []

    def verified(self, draft, verdict, fed=(), logits=None) -> None:
        self.seen.append((draft, verdict, self.notes.get(draft)))
        super().verified(draft, verdict, fed, logits)


def test_the_model_drafter_branches_on_its_top_tokens():
    lm = ToyLM(12, 2, seed=3, scale=2.0)
    # Sampled text (greedy toy text soon cycles, where the first choice is always right) and a
    # noisy drafter: the target's sample is sometimes the drafter's second choice.
    cfg = DecodeConfig(max_new_tokens=60, sampling=SamplingParams(1.0, seed=1))
    plain = decode(lm.backend(), [1, 2], cfg)
    drafter = Watched(lm.perturbed(1.5, 4).backend(), tree=True)
    out = decode(lm.backend(), [1, 2], cfg, drafter, FixedK(6))
    assert out.token_ids == plain.token_ids
    tree_steps = [s for s in out.trace if s.parents is not None]
    assert tree_steps and out.stats.tree_nodes == sum(len(s.drafted) for s in tree_steps)
    # some accepted path went through a sibling (rank > 0: not the drafter's own first choice)
    assert any(features[n][1] > 0 for draft, verdict, features in drafter.seen if draft.is_tree
               for n in verdict.path)
    # one draft forward per depth (plus the one after the context), not one per node
    for s in tree_steps:
        depth = max(_depth(s.parents, i) for i in range(len(s.parents))) + 1
        assert s.draft_forwards <= depth + 1
    assert sum(s.draft_forwards for s in tree_steps) < sum(len(s.drafted) for s in tree_steps)


def _depth(parents, i):
    d = 0
    while parents[i] >= 0:
        i, d = parents[i], d + 1
    return d


# -- the distribution of sampled model trees (rejection sampling over i.i.d. siblings) ---------------
TARGET = ToyLM(4, 1, seed=11, scale=1.5)
DRAFT = TARGET.perturbed(0.7, 12)
PROMPT, LENGTH, SAMPLES = [1], 3, 3000


def _exact(params):
    return sequence_distribution(TARGET, PROMPT, LENGTH, params)


@pytest.mark.parametrize("verify", ["rejection", "coupled"])
def test_sampled_model_trees_follow_the_target_distribution(verify):
    params = SamplingParams(1.0)
    counts, nodes = Counter(), 0
    for i in range(SAMPLES):
        cfg = DecodeConfig(max_new_tokens=LENGTH, verify=verify, sampling=SamplingParams(1.0, seed=i))
        out = decode(TARGET.backend(), PROMPT, cfg, ModelDrafter(DRAFT.backend(), tree=True), FixedK(5))
        counts[tuple(out.token_ids)] += 1
        nodes += out.stats.tree_nodes
    assert nodes > SAMPLES  # trees were drafted and verified
    assert chi_square_pvalue(counts, _exact(params)) > 1e-3


# -- staged: the same draft, fewer draft-model forwards --------------------------------------------
@pytest.mark.parametrize("temperature", [0.0, 0.9])
@pytest.mark.parametrize("verify", ["coupled", "rejection"])
def test_the_staged_draft_is_the_model_drafters_draft(temperature, verify):
    lm = ToyLM(10, 2, seed=7)
    draft_lm = lm.perturbed(0.3, 8)
    context = [1, 2] + decode(lm.backend(), [1, 2], DecodeConfig(max_new_tokens=60)).token_ids
    sampler = Sampler(SamplingParams(temperature, seed=5), verify)
    model, staged = ModelDrafter(draft_lm.backend()), StagedDrafter(draft_lm.backend())
    model.begin(context[:2], sampler)
    staged.begin(context[:2], sampler)
    forwards = Counter()
    for end in range(2, len(context), 3):  # contexts that grow and contexts that shrink back
        for cut in (end, max(2, end - 5)):
            a, b = model.propose(context[:cut], 8), staged.propose(context[:cut], 8)
            assert a.tokens == b.tokens and a.probs == b.probs and a.confidence == b.confidence
            assert (a.q is None) == (b.q is None) and (a.q is None or bool((a.q == b.q).all()))
            # every guess the draft model agreed with saved one forward, and nothing else differs
            assert b.forwards == a.forwards - b.extra["guess_agreed"]
            forwards["model"] += a.forwards
            forwards["staged"] += b.forwards
            forwards["agreed"] += b.extra["guess_agreed"]
    # The toy model's greedy text cycles, so most guesses hit; sampled text repeats less, some still do.
    assert forwards["agreed"] > 0
    if temperature == 0:
        assert forwards["staged"] < 0.7 * forwards["model"]


def test_the_staged_drafter_drafts_chains_when_asked_for_trees():
    """Its inner n-gram speculation follows one chain: asked for a tree, it drafts chains (the
    target verifies chains), still the plain text."""
    lm = ToyLM(10, 2, seed=7)
    cfg = DecodeConfig(max_new_tokens=40, sampling=SamplingParams(0.9, seed=3))
    out = decode(lm.backend(), [1, 2], cfg, StagedDrafter(lm.perturbed(0.3, 8).backend(), tree=True), FixedK(6))
    assert out.token_ids == decode(lm.backend(), [1, 2], cfg).token_ids
    assert out.stats.drafted > 0 and out.stats.tree_nodes == 0
    assert all(s.parents is None for s in out.trace)


def test_staged_drafting_needs_fewer_draft_forwards_for_the_same_output():
    lm = ToyLM(10, 2, seed=7)
    cfg = DecodeConfig(max_new_tokens=80)
    runs = {name: decode(lm.backend(), [1, 2], cfg, make(lm.perturbed(0.3, 8).backend()), FixedK(6))
            for name, make in (("model", ModelDrafter), ("staged", StagedDrafter))}
    assert runs["model"].token_ids == runs["staged"].token_ids == decode(lm.backend(), [1, 2], cfg).token_ids
    per_token = {n: r.stats.draft_forwards / r.stats.drafted for n, r in runs.items()}
    assert per_token["staged"] < 0.7 * per_token["model"]
    assert sum(s.extra.get("guess_agreed", 0) for s in runs["staged"].trace) > 0
