"""The llama.cpp backend on the real GGUFs: exact rollback, the decoding loop, and the API path.

llama.cpp's logits depend on the batch shape (its kernels round differently for 1 and for k rows,
and differently again on AVX2 and AVX-512 builds), so nothing here compares against a forward of
another shape with a fixed tolerance: rollback is checked bit for bit against a twin that saw
the same chunk shapes, and greedy divergences against a batch-shape noise measured in the run.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("llama_cpp")

import specdec  # noqa: E402
from conftest import twin_rollback_walk  # noqa: E402
from specdec.backends.llamacpp import LlamaCppBackend, load_llamacpp  # noqa: E402
from specdec.drafters.ngram import NgramDrafter  # noqa: E402
from specdec.engine import DecodeConfig, decode  # noqa: E402
from specdec.models import resolve  # noqa: E402
from specdec.policies.fixed import FixedK  # noqa: E402

pytestmark = pytest.mark.real


@pytest.fixture(scope="module", params=["smollm2-135m", "gemma3-270m"])
def weights(request):
    return load_llamacpp(str(resolve(request.param, need_hf=False).gguf))


def test_rollback_is_exact(weights):
    assert twin_rollback_walk(weights.backend, 5000, seed=0, steps=14, low=100) == 14


def test_the_exact_rollback_test_catches_a_cache_that_keeps_rolled_back_tokens(weights):
    class Forgetful(LlamaCppBackend):
        def truncate(self, length):  # forgets the bookkeeping, leaves the KV cells
            del self.tokens[length:]

    # Either the twins' logits differ, or llama.cpp refuses to decode over the stale cells.
    with pytest.raises((AssertionError, RuntimeError)):
        twin_rollback_walk(lambda: Forgetful(weights), 5000, seed=0, steps=14, low=100)


def test_prefill_longer_than_a_batch(weights):
    backend = weights.backend()
    ids = [100 + i % 50 for i in range(weights.n_batch + 37)]
    backend.prefill(ids)
    assert backend.length == len(ids)
    last = backend.extend([7], last_only=True)
    assert last.shape == (1, weights.vocab_size)


def test_greedy_speculative_output_diverges_only_within_batch_noise(weights):
    """Exact equality is not guaranteed on llama.cpp: where speculative output leaves plain output,
    the speculative token must be within this machine's batch-shape noise of plain's top logit."""
    prompt = [100, 200, 300, 400, 100, 200, 300, 400, 100]
    cfg = DecodeConfig(max_new_tokens=24)
    plain = decode(weights.backend(), prompt, cfg).token_ids
    spec = decode(weights.backend(), prompt, cfg, NgramDrafter(), FixedK(4)).token_ids
    assert len(spec) == len(plain) == 24
    d = next((i for i, (a, b) in enumerate(zip(spec, plain)) if a != b), None)
    if d is None:
        return
    seq = prompt + plain[:d]
    one_by_one = weights.backend()
    one_by_one.prefill(seq[:-8])
    sequential = torch.cat([one_by_one.extend([t]) for t in seq[-8:]])
    batched = weights.backend()
    batched.prefill(seq[:-8])
    noise = float((batched.extend(seq[-8:]) - sequential).abs().max())  # this CPU's, measured now
    row = sequential[-1]
    assert float(row.max() - row[spec[d]]) <= 2 * noise + 1e-6


def test_api_generate_on_llamacpp():
    model = specdec.load("smollm2-135m", backend="llamacpp")
    out = model.generate("The capital of France is", max_new_tokens=8)
    assert "Paris" in out.text
    assert out.stats.new_tokens == len(out.token_ids) <= 8


def test_context_overflow_is_a_clear_error():
    weights = load_llamacpp(str(resolve("smollm2-135m", need_hf=False).gguf), n_ctx=64)
    with pytest.raises(specdec.SpecdecError, match="context of 64"):
        weights.backend().extend(list(range(100, 170)))
    with pytest.raises(specdec.SpecdecError, match="context of 64 tokens"):
        decode(weights.backend(), list(range(100, 150)), DecodeConfig(max_new_tokens=20))


def test_out_of_vocabulary_ids_are_refused_not_wrapped(weights):
    with pytest.raises(specdec.SpecdecError, match="token ids must be in"):
        weights.backend().extend([2**40])
