"""The llama.cpp backend on the real GGUFs: exact rollback, tree scoring, the API path.

Batch invariance (a k-token forward equals k one-token forwards bit for bit with the exact
kernels) and speculative == plain output are in ``test_llamacpp_exact.py``.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("llama_cpp")

import specdec  # noqa: E402
from conftest import twin_rollback_walk  # noqa: E402
from specdec.backends.llamacpp import LlamaCppBackend, load_llamacpp  # noqa: E402
from specdec.engine import DecodeConfig, decode  # noqa: E402
from specdec.models import resolve  # noqa: E402

pytestmark = pytest.mark.real


@pytest.fixture(scope="module", params=["smollm2-135m", "gemma3-270m"])
def weights(request):
    return load_llamacpp(str(resolve(request.param, need_hf=False).gguf))


def test_rollback_is_exact(weights):
    assert twin_rollback_walk(lambda: LlamaCppBackend(weights), 5000, seed=0, steps=14, low=100) == 14


def test_the_exact_rollback_test_catches_a_cache_that_keeps_rolled_back_tokens(weights):
    class Forgetful(LlamaCppBackend):
        def truncate(self, length):  # forgets the bookkeeping, leaves the KV cells
            del self.tokens[length:]

    # Either the twins' logits differ, or llama.cpp refuses to decode over the stale cells.
    with pytest.raises((AssertionError, RuntimeError)):
        twin_rollback_walk(lambda: Forgetful(weights), 5000, seed=0, steps=14, low=100)


def test_prefill_longer_than_a_batch(weights):
    backend = LlamaCppBackend(weights)
    ids = [100 + i % 50 for i in range(weights.n_batch + 37)]
    backend.prefill(ids)
    assert backend.length == len(ids)
    last = backend.extend([7], last_only=True)
    assert last.shape == (1, weights.vocab_size)


def test_api_generate_on_llamacpp(shared_model):
    model = shared_model("smollm2-135m")
    out = model.generate("The capital of France is", max_new_tokens=8)
    assert "Paris" in out.text
    assert out.stats.new_tokens == len(out.token_ids) <= 8


def test_context_overflow_is_a_clear_error():
    weights = load_llamacpp(str(resolve("smollm2-135m", need_hf=False).gguf), n_ctx=64)
    with pytest.raises(specdec.SpecdecError, match="context of 64"):
        LlamaCppBackend(weights).extend(list(range(100, 170)))
    with pytest.raises(specdec.SpecdecError, match="context of 64 tokens"):
        decode(LlamaCppBackend(weights), list(range(100, 150)), DecodeConfig(max_new_tokens=20))


def test_out_of_vocabulary_ids_are_refused_not_wrapped(weights):
    with pytest.raises(specdec.SpecdecError, match="token ids must be in"):
        LlamaCppBackend(weights).extend([2**40])


def _tree_twins(weights, backend_class=LlamaCppBackend):
    """Two backends score trees of one shape that differ off the kept path only."""
    import random

    from specdec import tree as trees

    rng = random.Random(0)
    prefix = [rng.randrange(100, 5000) for _ in range(20)]
    shape = [-1, 0, 0, 1, 1, 2, 3, 3, 5]
    path = trees.path_to(shape, 7)
    tokens_a = [rng.randrange(100, 5000) for _ in shape]
    tokens_b = [t if i in path else t + 1 for i, t in enumerate(tokens_a)]
    twins = []
    for tokens in (tokens_a, tokens_b):
        backend = backend_class(weights)
        backend.extend(prefix)
        twins.append((backend, backend.extend(tokens, tree=shape)))
    return prefix, path, twins


def test_tree_nodes_see_only_their_ancestors_and_the_kept_path_is_exact(weights):
    prefix, path, twins = _tree_twins(weights)
    (a, logits_a), (b, logits_b) = twins
    for node in path:  # the twins' other branches differ, and no path node can tell
        assert torch.equal(logits_a[node], logits_b[node]), node
    assert not torch.equal(logits_a[2], logits_b[2])  # node 2 itself differs between the twins
    for backend in (a, b):
        backend.truncate(len(prefix), keep=path)
        assert backend.length == len(prefix) + len(path)
    assert torch.equal(a.extend([7, 8]), b.extend([7, 8]))


def test_the_tree_twin_test_catches_siblings_that_see_each_other(weights):
    class OneSequence(LlamaCppBackend):
        def _run_batch(self, tokens, positions, seq_ids, wanted):  # every node in sequence 0 only
            return super()._run_batch(tokens, positions, [[0]] * len(tokens), wanted)

    _, path, twins = _tree_twins(weights, OneSequence)
    assert any(not torch.equal(twins[0][1][node], twins[1][1][node]) for node in path)
