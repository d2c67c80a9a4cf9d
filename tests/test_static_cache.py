"""The static-cache path a GPU runs (:mod:`specdec.backends.hf_static`), checked on the CPU: the same
buffers, masks and rollback as under CUDA graphs, every step called instead of replayed.

It must hold the same keys and values at the same places as the growing cache: with attention
handed only the slots in use it gives today's logits bit for bit, chains and trees, under rollback;
over the whole buffer (what a graph needs) a twin walk shows rollback forgets every draft, and
every drafter gives plain decoding's tokens."""

from __future__ import annotations

import random

import pytest
import torch

import specdec
from conftest import twin_rollback_walk
from specdec import tree as trees
from specdec.backends import cuda_graphs
from specdec.backends.hf import HFBackend
from specdec.backends.hf_static import BUCKETS, MIN_CAPACITY, HFStaticBackend, StaticModel
from specdec.drafters.model import ModelDrafter
from specdec.drafters.ngram import NgramDrafter
from specdec.engine import DecodeConfig, decode
from specdec.errors import SpecdecError
from specdec.policies.fixed import FixedK
from specdec.registry import DRAFTERS

PROMPT = "the quick brown fox jumps over the lazy dog and the quick brown fox"


def _walk(a, b, seed: int, steps: int = 30, vocab: int = 96, trees_too: bool = True) -> int:
    """Extends of random chains and trees on ``a`` and ``b``, each followed by a rollback (a chain
    cut anywhere, a tree's random root-to-node path kept); asserts every extend's logits are
    bit-identical. Returns how many tree extends it compared."""
    rng = random.Random(seed)
    for backend in (a, b):
        backend.prefill(list(range(3, 40)))
    tree_steps = 0
    for step in range(steps):
        chunk = [rng.randrange(3, vocab) for _ in range(rng.randint(1, 6))]
        tree = None
        if trees_too and rng.random() < 0.4:
            tree = [-1] + [rng.randrange(-1, i) for i in range(len(chunk) - 1)]
            tree_steps += 1
        got, want = a.extend(chunk, tree=tree), b.extend(chunk, tree=tree)
        assert torch.equal(got, want), f"step {step}: max diff {(got - want).abs().max()}"
        base = a.length - len(chunk)
        if tree is not None:
            node, path = rng.randrange(len(chunk)), []
            while node >= 0:
                path.append(node)
                node = tree[node]
            for backend in (a, b):
                backend.truncate(base, keep=path[::-1])
        else:
            keep = rng.randint(base, a.length)
            for backend in (a, b):
                backend.truncate(keep)
        assert a.length == b.length
    return tree_steps


# -- the same cache as the growing one ------------------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 1])
def test_static_slots_in_use_give_the_growing_caches_logits_bit_for_bit(tiny_llama, seed):
    """Padded to one shape (what exact runs), float32 as a GPU's bf16 would not forgive: the static
    cache holds every key where the growing cache holds it, through chains, trees and rollbacks."""
    model = tiny_llama.float()
    try:
        static = HFStaticBackend(model, pad_rows=16, attend_used=True)
        assert _walk(static, HFBackend(model, pad_rows=16), seed) > 0
    finally:
        tiny_llama.double()


@pytest.mark.parametrize("pad", [0, 16])
def test_the_whole_buffer_in_float64_gives_the_growing_caches_logits(tiny_llama, pad):
    """Attention over the whole buffer, as a graph runs it: the stale and empty slots it masks add
    exactly nothing (float64, where the reduction order cannot show)."""
    assert _walk(HFStaticBackend(tiny_llama, pad_rows=pad), HFBackend(tiny_llama, pad_rows=pad), seed=2) > 0


def test_sliding_layers_keep_every_position_and_pad_like_the_others(tiny_gemma3):
    """Gemma 3's sliding window is the mask's job here (every position stays in the buffer), so a
    rollback across the window needs no recompute and the sequence pads to one shape too."""
    static = HFStaticBackend(tiny_gemma3, pad_rows=16)
    assert static.pad_rows == 16 and HFBackend(tiny_gemma3, pad_rows=16).pad_rows == 0
    assert _walk(static, HFBackend(tiny_gemma3), seed=3, steps=40) > 0  # windows of 6: crossed many times


def test_rollback_forgets_every_draft_over_the_whole_buffer(tiny_llama):
    model = tiny_llama.float()
    try:
        assert twin_rollback_walk(lambda: HFStaticBackend(model, pad_rows=16), 96, seed=7, steps=30) == 30
    finally:
        tiny_llama.double()


def test_a_kept_path_moves_into_the_slots_of_its_positions(tiny_llama):
    backend = HFStaticBackend(tiny_llama, pad_rows=8)
    backend.extend([1, 5, 9, 5])
    parents = [-1, -1, 0, 0, 2]
    backend.extend([11, 12, 13, 14, 15], tree=parents)
    backend.truncate(4, keep=trees.path_to(parents, 4))  # nodes 0, 2, 4: rows 4, 6, 8 -> slots 4, 5, 6
    fresh = HFStaticBackend(tiny_llama, pad_rows=8)
    fresh.extend([1, 5, 9, 5, 11, 13, 15])
    assert backend.tokens == fresh.tokens
    for kept, want in zip(backend.cache.layers, fresh.cache.layers):
        assert torch.equal(kept.keys[:, :, :7], want.keys[:, :, :7])
        assert torch.equal(kept.values[:, :, :7], want.values[:, :, :7])


# -- capacity ----------------------------------------------------------------------------------------
def test_the_cache_is_sized_for_the_generation_and_grows_when_it_must(tiny_llama):
    backend = HFStaticBackend(tiny_llama, pad_rows=16)
    backend.reserve(300)  # prompt and answer, plus room for a padded forward
    assert backend.cache.capacity == 512
    backend.reserve(10)
    assert backend.cache.capacity == 512  # never shrinks: its graphs stay captured
    grown = HFStaticBackend(tiny_llama, pad_rows=16)
    grown.extend(list(range(3, 90)) * 3)  # 261 tokens: no reserve, the cache doubles mid-sequence
    assert grown.cache.capacity == 512 and MIN_CAPACITY == 256
    fresh = HFStaticBackend(tiny_llama, pad_rows=16)
    fresh.reserve(600)
    fresh.extend(list(range(3, 90)) * 3)
    assert torch.equal(grown.extend([7, 8]), fresh.extend([7, 8]))


def test_unpadded_forwards_run_in_the_next_graph_size(tiny_llama):
    backend = HFStaticBackend(tiny_llama)
    backend.extend([4])
    backend.extend([5, 6, 7])
    backend.extend(list(range(10, 30)))
    assert sorted(backend._graphs) == [1, 16, 32] and BUCKETS[:3] == (1, 16, 32)


# -- decoding ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("pad", [0, 16])
def test_speculation_equals_plain_decoding_and_verifies_drafts(tiny_llama, pad):
    prompt = [1, 5, 9, 5, 9, 5, 9, 11]
    cfg = DecodeConfig(max_new_tokens=40)
    plain = decode(HFStaticBackend(tiny_llama, pad), prompt, cfg)
    assert plain.token_ids == decode(HFBackend(tiny_llama, pad), prompt, cfg).token_ids
    for drafter in (NgramDrafter(), ModelDrafter(HFStaticBackend(tiny_llama, pad))):
        spec = decode(HFStaticBackend(tiny_llama, pad), prompt, cfg, drafter, FixedK(6))
        assert spec.token_ids == plain.token_ids and spec.stats.accepted > 0


@pytest.fixture(scope="module")
def tiny_static(tiny_model_dir):
    return specdec.load(str(tiny_model_dir), graphs=True)


@pytest.fixture(scope="module")
def tiny_draft_static(tiny_draft_dir):
    return specdec.load(str(tiny_draft_dir), graphs=True)


def _drafters():
    return [pytest.param(e.name, marks=[pytest.mark.skipif(bool(e.missing()), reason=e.missing() or "")]
                         + ([pytest.mark.peers] if e.available is not None else []))
            for e in DRAFTERS if e.name != "none"]


@pytest.mark.parametrize("name", _drafters())
def test_every_registered_drafter_gives_plain_greedy_tokens_on_the_static_cache(tiny_static, tiny_draft_static,
                                                                                name):
    assert isinstance(tiny_static.loaded.backend(), HFStaticBackend)
    extra = {"draft_model": tiny_draft_static} if DRAFTERS.get(name).needs_draft_model else {}
    plain = tiny_static.generate(PROMPT, max_new_tokens=24, drafter="none")
    out = tiny_static.generate(PROMPT, max_new_tokens=24, drafter=name, policy="fixed", num_draft=4, **extra)
    assert out.token_ids == plain.token_ids
    assert out.stats.drafted > 0, "no draft was verified: the comparison says nothing"


def test_the_graphs_option_picks_the_static_cache_and_is_off_on_a_cpu_by_default(tiny_model_dir, tiny_static):
    assert isinstance(specdec.load(str(tiny_model_dir)).loaded.backend(), HFBackend)
    assert not isinstance(specdec.load(str(tiny_model_dir)).loaded.backend(), HFStaticBackend)
    assert "static" in tiny_static.loaded.cost_key


# -- compiled kernels and graphs ---------------------------------------------------------------------
def test_on_a_cpu_steps_are_called_not_captured_and_nothing_compiles(tiny_llama):
    before = cuda_graphs.Replay.captures
    shared = StaticModel(tiny_llama)
    assert shared.step == shared.forward  # compiled only on CUDA (or when asked)
    decode(HFStaticBackend(tiny_llama, 16, shared), [1, 5, 9], DecodeConfig(max_new_tokens=8))
    assert cuda_graphs.Replay.captures == before


def test_a_compiler_that_fails_leaves_eager_kernels_and_says_so(monkeypatch, capsys):
    def broken(function, **kwargs):
        def fail(*args, **kw):
            raise RuntimeError("no compiler here")
        return fail

    monkeypatch.setattr(torch, "compile", broken)
    monkeypatch.setattr(cuda_graphs, "_compile_state", {"fallback": False, "compiled_ran": False})
    run = cuda_graphs.compiled(lambda x: x + 1, torch.device("cpu"), enabled=True)
    assert run(1) == 2 and run(2) == 3 and run.state["fallback"]
    assert capsys.readouterr().err.count("torch.compile failed (RuntimeError: no compiler here)") == 1
    # One kernel choice per process: every step compiled after it stays eager too.
    later = cuda_graphs.compiled(lambda x: x * 2, torch.device("cpu"), enabled=True)
    assert later(4) == 8 and not capsys.readouterr().err


def test_a_compiler_that_fails_after_compiled_steps_ran_is_an_error(monkeypatch):
    """Falling back then would leave two sequences on different kernels (rounding differently)."""
    calls = {"n": 0}

    def flaky(function, **kwargs):
        def run(*args, **kw):
            calls["n"] += 1
            if calls["n"] > 1:
                raise RuntimeError("out of compiler")
            return function(*args, **kw)
        return run

    monkeypatch.setattr(torch, "compile", flaky)
    monkeypatch.setattr(cuda_graphs, "_compile_state", {"fallback": False, "compiled_ran": False})
    run = cuda_graphs.compiled(lambda x: x + 1, torch.device("cpu"), enabled=True)
    assert run(1) == 2
    with pytest.raises(SpecdecError, match="after compiled kernels ran in this process; SPECDEC_COMPILE=0"):
        run(2)


# -- the split attention of decoding steps --------------------------------------------------------------
@pytest.mark.parametrize("attention", ["split", "paged"])
def test_split_and_paged_attention_give_the_models_own_attention_in_float64(tiny_llama, attention):
    """Chunks of the buffer combined by their softmax statistics, query heads folded onto their
    key-value head: the same attention, another rounding (none shows in float64), chunks that see
    nothing included (a 1,024-slot buffer, 37 tokens in it)."""
    split = HFStaticBackend(tiny_llama, 16, StaticModel(tiny_llama, attention=attention))
    split.reserve(900)
    assert split.cache.capacity == 1024
    reference = HFBackend(tiny_llama, 16)
    rng = random.Random(4)
    for backend in (split, reference):
        backend.prefill(list(range(3, 40)))
    for _ in range(12):
        chunk = [rng.randrange(96) for _ in range(rng.randint(1, 6))]
        tree = [-1] + [rng.randrange(-1, i) for i in range(len(chunk) - 1)] if rng.random() < 0.3 else None
        got, want = split.extend(chunk, tree=tree), reference.extend(chunk, tree=tree)
        assert torch.allclose(got, want, atol=1e-12, rtol=0) and not got.isnan().any()
        base = split.length - len(chunk)
        keep = rng.randint(base, split.length)
        for backend in (split, reference):
            if tree is not None:
                backend.truncate(base, keep=[0])
            else:
                backend.truncate(keep)
    assert tiny_llama.config._attn_implementation == "sdpa"  # set for the step only


@pytest.mark.parametrize("attention", ["split", "paged"])
def test_speculation_with_split_or_paged_attention_equals_plain_decoding(tiny_llama, attention):
    model = tiny_llama.float()
    try:
        shared = StaticModel(model, attention=attention)
        prompt, cfg = [1, 5, 9, 5, 9, 5, 9, 11], DecodeConfig(max_new_tokens=40)
        plain = decode(HFStaticBackend(model, 16, shared), prompt, cfg)
        for drafter in (NgramDrafter(), ModelDrafter(HFStaticBackend(model, 16, shared))):
            spec = decode(HFStaticBackend(model, 16, shared), prompt, cfg, drafter, FixedK(6))
            assert spec.token_ids == plain.token_ids and spec.stats.accepted > 0
    finally:
        tiny_llama.double()


def test_an_unknown_attention_is_refused_by_name(tiny_llama, monkeypatch):
    monkeypatch.setenv("SPECDEC_ATTENTION", "flash")
    with pytest.raises(specdec.SpecdecError, match="SPECDEC_ATTENTION must be one of sdpa, split, paged, got 'flash'"):
        StaticModel(tiny_llama)
