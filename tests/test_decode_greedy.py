"""Greedy speculative decoding returns exactly the tokens of plain greedy decoding, for every drafter."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import ScriptDrafter, plain_tokens
from specdec.backends.toy import ToyLM
from specdec.engine import DecodeConfig, decode
from specdec.drafters.model import ModelDrafter
from specdec.drafters.ngram import NgramDrafter
from specdec.drafters.recycle import RecycleDrafter
from specdec.costs import CostModel
from specdec.policies.adaptive import AdaptiveK
from specdec.policies.fixed import FixedK

DRAFTER_KINDS = ["ngram", "ngram1", "recycle", "recycle-tree", "same-model", "noisy-model", "random-model", "oracle",
                 "anti-oracle"]


def make_drafter(kind: str, lm: ToyLM, reference: list[int], seed: int):
    if kind == "ngram":
        return NgramDrafter()
    if kind == "ngram1":
        return NgramDrafter(max_ngram=1, min_ngram=1)
    if kind.startswith("recycle"):
        return RecycleDrafter(tree=kind == "recycle-tree")
    if kind == "same-model":
        return ModelDrafter(lm.backend())
    if kind == "noisy-model":
        return ModelDrafter(lm.perturbed(1.0, seed).backend())
    if kind == "random-model":
        return ModelDrafter(ToyLM(lm.vocab_size, lm.order, seed=seed + 1000).backend())
    return ScriptDrafter(reference, lm.vocab_size, right=kind == "oracle")


@settings(max_examples=150, deadline=None)
@given(
    vocab=st.integers(2, 12),
    order=st.integers(1, 3),
    seed=st.integers(0, 10_000),
    scale=st.sampled_from([0.5, 2.0, 6.0]),
    prompt=st.lists(st.integers(0, 11), min_size=1, max_size=12),
    k=st.integers(1, 8),
    max_new=st.integers(1, 40),
    eos=st.sets(st.integers(0, 11), max_size=2),
    kind=st.sampled_from(DRAFTER_KINDS),
    adaptive=st.booleans(),
    slope=st.floats(0.0, 1.0),
)
def test_greedy_equals_plain(vocab, order, seed, scale, prompt, k, max_new, eos, kind, adaptive, slope):
    lm = ToyLM(vocab, order, seed=seed, scale=scale)
    prompt = [t % vocab for t in prompt]
    cfg = DecodeConfig(max_new_tokens=max_new, eos_token_ids=frozenset(e % vocab for e in eos))
    plain = decode(lm.backend(), prompt, cfg)
    drafter = make_drafter(kind, lm, prompt + plain.token_ids, seed)
    policy = AdaptiveK(CostModel({1: 1.0, 9: 1.0 + 8 * slope}), k) if adaptive else FixedK(k)
    spec = decode(lm.backend(), prompt, cfg, drafter, policy)
    assert spec.token_ids == plain.token_ids
    assert spec.finish_reason == plain.finish_reason
    assert len(spec.token_ids) <= max_new
    assert spec.stats.new_tokens == len(spec.token_ids)
    assert spec.stats.accepted <= spec.stats.drafted


@pytest.mark.parametrize("k", range(1, 9))
def test_oracle_accepts_everything_and_anti_oracle_nothing(k):
    lm = ToyLM(16, 2, seed=3, scale=1.0)
    prompt, cfg = [1, 2, 3], DecodeConfig(max_new_tokens=37)
    plain = plain_tokens(lm, prompt, cfg)
    assert len(plain) == 37  # no EOS configured: runs to the limit

    right = decode(lm.backend(), prompt, cfg, ScriptDrafter(prompt + plain, 16, True), FixedK(k))
    assert right.token_ids == plain
    assert right.stats.accepted == right.stats.drafted > 0
    # Every step but the last keeps k drafts plus the bonus; the last is cut to fit the limit.
    assert right.stats.target_forwards == -(-37 // (k + 1))
    assert all(s.kind == "bonus" for s in right.trace[:-1])

    wrong = decode(lm.backend(), prompt, cfg, ScriptDrafter(prompt + plain, 16, False), FixedK(k))
    assert wrong.token_ids == plain
    assert wrong.stats.accepted == 0
    assert wrong.stats.target_forwards == 37
    # The last token is the only one left to generate, so it is a plain step without a draft.
    assert [s.kind for s in wrong.trace] == ["correction"] * 36 + ["plain"]


def test_same_model_drafter_accepts_every_token():
    lm = ToyLM(32, 2, seed=5)
    cfg = DecodeConfig(max_new_tokens=30)
    spec = decode(lm.backend(), [4, 5], cfg, ModelDrafter(lm.backend()), FixedK(4))
    assert spec.token_ids == plain_tokens(lm, [4, 5], cfg)
    assert spec.stats.acceptance_rate == 1.0
    assert spec.stats.mean_accepted_length == 5.0


@pytest.mark.parametrize("k", [1, 3, 8])
def test_eos_inside_a_draft_stops_exactly_where_plain_does(k):
    lm = ToyLM(16, 2, seed=11, scale=2.0)
    prompt = [3, 1]
    reference = plain_tokens(lm, prompt, DecodeConfig(max_new_tokens=30))
    eos = reference[5]  # an EOS token that an always-right draft will run past
    cfg = DecodeConfig(max_new_tokens=30, eos_token_ids=frozenset({eos}))
    plain = decode(lm.backend(), prompt, cfg)
    assert plain.finish_reason == "eos" and plain.token_ids[-1] == eos
    spec = decode(lm.backend(), prompt, cfg, ScriptDrafter(prompt + reference, 16), FixedK(k))
    assert spec.token_ids == plain.token_ids
    assert spec.finish_reason == "eos"
    # The draft is cut at the EOS: nothing past it is ever sent to the target.
    assert sum(len(s.drafted) for s in spec.trace) <= len(plain.token_ids)


def test_stop_callback_ends_generation_at_the_same_token():
    lm = ToyLM(16, 2, seed=2, scale=1.0)
    prompt = [7]
    reference = plain_tokens(lm, prompt, DecodeConfig(max_new_tokens=40))
    target = reference[:9]
    cfg = DecodeConfig(max_new_tokens=40, stop=lambda ids: ids[-3:] == target[-3:])
    plain = decode(lm.backend(), prompt, cfg)
    spec = decode(lm.backend(), prompt, cfg, ScriptDrafter(prompt + reference, 16), FixedK(6))
    assert plain.finish_reason == spec.finish_reason == "stop"
    assert spec.token_ids == plain.token_ids
    assert plain.token_ids[-3:] == target[-3:]


def test_plain_decoding_is_argmax_of_a_fresh_forward():
    lm = ToyLM(10, 2, seed=9)
    prompt = [1, 2]
    out = decode(lm.backend(), prompt, DecodeConfig(max_new_tokens=12)).token_ids
    seq = list(prompt)
    for tok in out:
        assert tok == int(lm.logits(seq).argmax())
        seq.append(tok)


def test_adaptive_policy_stops_an_unsure_model_drafter_early():
    lm = ToyLM(16, 2, seed=1, scale=0.3)  # flat distributions: the drafter is never sure
    drafter = ModelDrafter(ToyLM(16, 2, seed=77, scale=0.3).backend())
    cfg = DecodeConfig(max_new_tokens=30)
    spec = decode(lm.backend(), [1, 2], cfg, drafter, AdaptiveK(CostModel({1: 1.0, 9: 1.0}), 8))
    assert spec.token_ids == plain_tokens(lm, [1, 2], cfg)
    assert spec.stats.draft_forwards < 8 * spec.stats.target_forwards / 2


def test_adaptive_policy_takes_plain_steps_when_drafts_do_not_pay():
    lm = ToyLM(16, 2, seed=4, scale=1.0)
    prompt = [1, 2, 3]
    plain = plain_tokens(lm, prompt, DecodeConfig(max_new_tokens=30))
    wrong = ScriptDrafter(prompt + plain, 16, right=False)
    steep = CostModel({1: 1.0, 2: 1.9, 9: 8.0})  # every verified token costs almost a forward
    spec = decode(lm.backend(), prompt, DecodeConfig(max_new_tokens=30), wrong, AdaptiveK(steep, 8))
    assert spec.token_ids == plain
    assert spec.stats.drafted < 10  # it learns quickly that nothing is accepted
