"""Self-speculation: the target's own layers drafting through a small head, verified by the full one.

The drafter writes ahead into the target's KV cache; these tests check that the backend's pending
rows are reused exactly or dropped, that output equals plain decoding (greedy and seeded sampling,
with heads small enough that the target's token is often missing from them), that rejection
sampling with such a head keeps the target's distribution, and that backends without hidden
states are refused clearly.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import chi_square_pvalue
from specdec.backends.hf import HFBackend
from specdec.backends.toy import ToyLM
from specdec.costs import CostModel
from specdec.drafters.combined import CombinedDrafter
from specdec.drafters.recycle import RecycleDrafter
from specdec.drafting.self_head import DraftHead, head_for, rank_tokens
from specdec.drafters.self_spec import SelfDrafter, self_table
from specdec.drafting.self_timing import Measured
from specdec.engine import DecodeConfig, decode
from specdec.errors import SpecdecError
from specdec.policies.adaptive import AdaptiveK
from specdec.policies.fixed import FixedK
from specdec.sampling import SamplingParams, logits_to_probs


def self_drafter(model, rows: list[int], helper: bool = False) -> SelfDrafter:
    """A self drafter whose layer passes look nearly free, so that it drafts whenever it can
    (``helper``: combined with the free sources)."""
    measured = Measured.start(1e-3)
    measured.body.value = measured.small.value = 1e-9
    head = DraftHead(model.get_output_embeddings().weight, rows)
    if helper:
        return CombinedDrafter(head, self_table(), measured, free=RecycleDrafter())
    return SelfDrafter(head, self_table(), measured)


# -- the backend's pending rows ---------------------------------------------------------------
@pytest.mark.parametrize("which", ["tiny_llama", "tiny_gemma3"])
def test_pending_rows_are_reused_or_dropped_exactly(which, request):
    """A walk of drafts: one backend runs them ahead with ``body`` (as the self drafter does), its
    twin feeds them in the extend; logits agree (float64) and both keep the same tokens."""
    model = request.getfixturevalue(which)
    ahead, fed = HFBackend(model), HFBackend(model)
    rng = random.Random(1)
    context = [rng.randrange(96) for _ in range(4)]
    ahead.prefill(context)
    fed.prefill(context)
    for _ in range(30):  # the tiny Gemma's window is 6: the walk crosses it many times
        last = rng.randrange(96)
        draft = [rng.randrange(96) for _ in range(rng.randint(0, 4))]
        ahead_of = [last, *draft[:-1]]
        if rng.random() < 0.3:  # ran further than verification will ask (a draft cut at an EOS)
            ahead_of = [last, *draft, rng.randrange(96)]
        for tok in ahead_of:
            ahead.body([tok])
        assert ahead.length == len(context), "pending rows must not count as cached"
        if rng.random() < 0.3 and draft:  # verification of another draft: the pending rows go
            draft = [(draft[0] + 1) % 96, *draft[1:]]
        got, want = ahead.extend([last, *draft]), fed.extend([last, *draft])
        torch.testing.assert_close(got, want, rtol=0, atol=1e-9)
        keep = len(context) + rng.randint(1, 1 + len(draft))
        ahead.truncate(keep)
        fed.truncate(keep)
        context = (context + [last, *draft])[:keep]
        assert ahead.tokens == fed.tokens == context


def test_truncate_and_tree_extend_drop_pending_rows(tiny_llama):
    backend = HFBackend(tiny_llama)
    backend.prefill([3, 4, 5])
    backend.body([6, 7])
    assert backend.pending == [6, 7] and backend.length == 3
    backend.truncate(2)
    assert backend.tokens == [3, 4] and backend.pending == []
    backend.body([9])
    rows = backend.extend([1, 2, 8], tree=[-1, 0, 0])  # a tree cannot reuse a chain's pending rows
    fresh = HFBackend(tiny_llama)
    fresh.prefill([3, 4])
    torch.testing.assert_close(rows, fresh.extend([1, 2, 8], tree=[-1, 0, 0]), rtol=0, atol=1e-9)


def test_head_matches_the_models_own_logits(tiny_gemma3):
    backend = HFBackend(tiny_gemma3)
    hidden = backend.body([5, 6, 7])
    fresh = HFBackend(tiny_gemma3)
    torch.testing.assert_close(backend.head(hidden), fresh.extend([5, 6, 7]), rtol=0, atol=1e-9)


# -- exactness ----------------------------------------------------------------------------------
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), rows=st.integers(2, 96), k=st.integers(1, 6),
       temperature=st.sampled_from([0.0, 0.6, 1.0, 1.4]), top_k=st.sampled_from([0, 5]),
       top_p=st.sampled_from([1.0, 0.9]), adaptive=st.booleans(), helper=st.booleans(),
       which=st.sampled_from(["tiny_llama", "tiny_gemma3"]), verify=st.sampled_from(["coupled", "rejection"]))
def test_self_speculation_gives_plain_decodings_tokens(seed, rows, k, temperature, top_k, top_p, adaptive, helper,
                                                       which, verify, request):
    """Greedy and seeded sampling (coupled): the same token ids as plain decoding, whatever the
    head's size (with few rows the target's token is often outside it), alone or combined with the
    free sources (``combined``). Greedy holds for both verifiers."""
    if verify == "rejection":
        temperature = 0.0
    model = request.getfixturevalue(which)
    rng = random.Random(seed)
    prompt = [rng.randrange(96) for _ in range(rng.randint(1, 10))]
    prompt = prompt + prompt[:rng.randint(0, len(prompt))]  # a repeat gives the n-gram index matches
    cfg = DecodeConfig(max_new_tokens=20, sampling=SamplingParams(temperature, top_k, top_p, seed=seed),
                       eos_token_ids=frozenset({2}), verify=verify)
    plain = decode(HFBackend(model), prompt, cfg)
    ids = rng.sample(range(96), rows)
    policy = AdaptiveK(CostModel({1: 1.0, 2: 1.1, 4: 1.3, 8: 2.0}), k) if adaptive else FixedK(k)
    drafter = self_drafter(model, ids, helper)
    spec = decode(HFBackend(model), prompt, cfg, drafter, policy)
    assert spec.token_ids == plain.token_ids
    assert spec.finish_reason == plain.finish_reason


def test_a_full_head_drafts_the_targets_greedy_tokens(tiny_llama):
    """With every row in the head, the draft's greedy choice is the target's: all accepted."""
    cfg = DecodeConfig(max_new_tokens=30)
    out = decode(HFBackend(tiny_llama), [5, 9, 11], cfg, self_drafter(tiny_llama, list(range(96))), FixedK(4))
    assert out.stats.drafted > 20 and out.stats.accepted == out.stats.drafted
    assert out.stats.target_forwards < 30 / 3


def test_a_self_draft_is_verified_whole_where_the_cost_curve_would_cut_it(tiny_llama):
    """A self draft's layer passes already ran: it prices its verification (the full head alone),
    so the adaptive policy verifies it whole on a curve where a forward of 2 rows costs 2.5 of one,
    and the engine teaches that curve nothing from such steps."""
    from specdec.types import Draft

    steep = CostModel({1: 1.0, 2: 2.5, 3: 3.75, 4: 5.0})
    policy = AdaptiveK(steep, 4)
    assert policy.choose(Draft([1, 2, 3], confidence=[0.9] * 3)) == 0
    assert policy.choose(Draft([1, 2, 3], confidence=[0.9] * 3, verify_cost=lambda n: 0.5)) == 3
    out = decode(HFBackend(tiny_llama), [5, 9, 11], DecodeConfig(max_new_tokens=30),
                 self_drafter(tiny_llama, list(range(96))), policy)
    drafted = [s for s in out.trace if s.proposed]
    assert len(drafted) > 3 and all(len(s.drafted) == s.proposed for s in drafted)
    assert steep.observations <= len(out.trace) - len(drafted)


def test_the_head_learns_tokens_it_meets(tiny_llama):
    drafter = self_drafter(tiny_llama, [0, 1])
    out = decode(HFBackend(tiny_llama), [5, 9, 11], DecodeConfig(max_new_tokens=12), drafter, FixedK(3))
    assert {5, 9, 11} | set(out.token_ids[:-1]) <= drafter.head.known


def test_draft_head_logits_are_the_full_heads_rows_and_capacity_holds(tiny_llama):
    weight = tiny_llama.get_output_embeddings().weight
    head = DraftHead(weight, [7, 3, 3, 50], extra_capacity=2)
    assert len(head) == 3
    head.add([3, 8, 9, 10])
    assert head.extra_ids == [8, 9] and 10 not in head
    hidden = torch.randn(weight.shape[1], dtype=weight.dtype)
    ids, logits = head.logits(hidden)
    assert ids.tolist() == [7, 3, 50, 8, 9]
    torch.testing.assert_close(logits, (weight @ hidden).float()[ids], rtol=0, atol=1e-6)


# -- distribution (rejection sampling with a partial head) -------------------------------------
@pytest.fixture(scope="module")
def four_token_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(3)
    cfg = LlamaConfig(vocab_size=4, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    model = LlamaForCausalLM(cfg).to(torch.float64).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(6.0)  # a peaked target, so a two-row head often misses
    return model


def _exact(model, prompt: list[int], length: int, params: SamplingParams) -> dict:
    import itertools

    dist = {}
    for seq in itertools.product(range(4), repeat=length):
        backend, prob = HFBackend(model), 1.0
        logits = backend.extend(prompt)[-1]
        for tok in seq:
            prob *= float(logits_to_probs(logits, params)[tok])
            logits = backend.extend([tok])[-1]
        dist[seq] = prob
    return dist


@pytest.mark.parametrize("broken,helper", [(False, False), (False, True), (True, False)])
def test_rejection_sampling_with_a_partial_head_keeps_the_targets_distribution(four_token_llama, broken, helper,
                                                                             monkeypatch):
    """Rejection mode hands q (zero outside the head's two rows) to verification; the sampled
    3-token sequences follow the target's exact distribution. Negative control: a drafter that
    claims a uniform q it did not draw from is caught."""
    params, prompt, samples = SamplingParams(1.0), [1, 2, 1, 2, 3, 1], 2500
    if broken:
        real = SelfDrafter._draw

        def lying(self, hidden, position, want_q):
            tok, prob, q = real(self, hidden, position, want_q)
            return tok, prob, torch.full_like(q, 0.25)
        monkeypatch.setattr(SelfDrafter, "_draw", lying)
    counts: Counter = Counter()
    drafted = 0
    for i in range(samples):
        cfg = DecodeConfig(max_new_tokens=3, verify="rejection",
                           sampling=SamplingParams(params.temperature, seed=i))
        out = decode(HFBackend(four_token_llama), prompt, cfg, self_drafter(four_token_llama, [0, 3], helper), FixedK(2))
        counts[tuple(out.token_ids)] += 1
        drafted += out.stats.drafted
    assert drafted > samples  # the draft really ran
    pvalue = chi_square_pvalue(counts, _exact(four_token_llama, prompt, 3, params))
    assert (pvalue < 1e-6) if broken else (pvalue > 1e-3)


# -- what the head is made of, and where self-speculation is impossible ------------------------
def test_rank_tokens_puts_the_predicted_mass_first(tiny_llama):
    backend = HFBackend(tiny_llama)
    ids = [5, 6, 7, 5, 6, 7, 5, 6]
    ranked = rank_tokens(backend, ids, limit=96)
    assert sorted(ranked) == list(range(96)) and backend.length == 0
    mass = torch.softmax(HFBackend(tiny_llama).extend(ids).double(), -1).sum(0)
    for tok in ids:  # each occurrence counts once more
        mass[tok] += 1
    assert ranked[0] == int(mass.argmax()) and ranked[-1] == int(mass.argmin())


def test_head_ranking_is_cached_per_model(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    with tiny.loaded.pool.lease() as backend:
        first = head_for(tiny.loaded.draft_context(), backend, rows=40)
    assert list((tmp_path / "draft-heads").glob("*.json"))
    with tiny.loaded.pool.lease() as backend:
        monkeypatch.setattr("specdec.drafting.self_head.rank_tokens", lambda *a, **k: pytest.fail("re-ranked"))
        second = head_for(tiny.loaded.draft_context(), backend, rows=40)
    assert first.ids.tolist() == second.ids.tolist()
    assert set(tiny.eos_token_ids) <= first.known


@pytest.mark.parametrize("name", ["self", "combined"])
def test_self_drafters_through_the_api_match_plain(tiny, name):
    prompt = "the quick brown fox jumps over the lazy dog. the quick brown"
    plain = tiny.generate(prompt, max_new_tokens=24, drafter="none")
    spec = tiny.generate(prompt, max_new_tokens=24, drafter=name)
    assert spec.token_ids == plain.token_ids
    assert spec.stats.draft_forwards + spec.stats.drafted > 0  # it drafted through the layers or the index


def test_backends_without_hidden_states_are_refused_clearly():
    drafter = SelfDrafter(DraftHead(torch.zeros(8, 4), [0, 1]), self_table(), Measured.start(1e-3))
    with pytest.raises(SpecdecError, match="transformers"):
        decode(ToyLM(8, 1).backend(), [1, 2], DecodeConfig(max_new_tokens=4), drafter, FixedK(2))


@pytest.mark.parametrize("name", ["self", "combined"])
def test_self_drafters_on_llamacpp_are_refused_with_the_reason(name):
    from types import SimpleNamespace

    from specdec.registry import DRAFTERS, DraftRequest

    target = SimpleNamespace(layer_access=False, backend_name="llamacpp")
    with pytest.raises(SpecdecError, match="llama.cpp computes the full output head"):
        DRAFTERS.get(name).build(DraftRequest(target))


# -- the drafter's own option: the head's size --------------------------------------------------
@pytest.mark.parametrize("name", ["self", "combined"])
def test_head_rows_reaches_the_drafter(tiny, name, tmp_path, monkeypatch):
    """``head_rows`` (declared in the self drafter's file) sizes the head; each size learns its own."""
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    small = tiny.drafter(name, options=tiny.options(drafter=name, head_rows=256))
    default = tiny.drafter(name, options=tiny.options(drafter=name))
    assert len(small.head.ids) == 256 + len(tiny.eos_token_ids)
    assert len(default.head.ids) > len(small.head.ids)
    assert tiny.drafter(name, options=tiny.options(drafter=name, head_rows=256)).head is small.head
    prompt = "the quick brown fox jumps over the lazy dog. the quick brown"
    out = tiny.generate(prompt, max_new_tokens=12, drafter=name, head_rows=256)
    assert out.token_ids == tiny.generate(prompt, max_new_tokens=12, drafter="none").token_ids


def test_a_bad_head_size_is_refused_with_the_options_message(tiny):
    with pytest.raises(SpecdecError, match=r"head_rows must be >= 256, got 10"):
        tiny.generate("hello", max_new_tokens=4, drafter="self", head_rows=10)
    with pytest.raises(SpecdecError, match=r"head_rows must be a whole number"):
        tiny.generate("hello", max_new_tokens=4, drafter="self", head_rows="many")


def test_head_rows_is_a_generate_flag(capsys):
    from specdec.cli import main

    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    assert "--head-rows" in capsys.readouterr().out
