"""The llama.cpp backend on the real GGUFs: rollback, the decoding loop, and the API path.

llama.cpp's logits depend slightly on the batch shape (MODELS.md: up to ~1 at some positions), so
the contract here is argmax agreement plus a loose bound, not the transformers backend's 1e-3.
"""

from __future__ import annotations

import random

import pytest
import torch

pytest.importorskip("llama_cpp")

import specdec  # noqa: E402
from specdec.backends.llamacpp import load_llamacpp  # noqa: E402
from specdec.engine import DecodeConfig, decode  # noqa: E402
from specdec.models import resolve  # noqa: E402
from specdec.drafters.ngram import NgramDrafter  # noqa: E402
from specdec.policies import FixedK  # noqa: E402

pytestmark = pytest.mark.real


@pytest.fixture(scope="module", params=["smollm2-135m", "gemma3-270m"])
def weights(request):
    return load_llamacpp(str(resolve(request.param, need_hf=False).gguf))


def test_random_extends_and_rollbacks_match_fresh_forwards(weights):
    rng = random.Random(0)
    backend = weights.backend()
    seq: list[int] = []
    agree = total = 0
    worst = 0.0
    for _ in range(12):
        if seq and rng.random() < 0.5:
            keep = rng.randint(1, len(seq))
            backend.truncate(keep)
            del seq[keep:]
        new = [rng.randrange(100, 5000) for _ in range(rng.randint(1, 6))]
        got = backend.extend(new)
        seq += new
        want = weights.backend().extend(seq)[-len(new):]
        assert got.shape == (len(new), weights.vocab_size)
        agree += int((got.argmax(-1) == want.argmax(-1)).sum())
        total += len(new)
        worst = max(worst, float((got - want).abs().max()))
    assert worst < 3.0, worst  # random tokens: flat, noisy distributions
    assert agree / total >= 0.85


def test_prefill_longer_than_a_batch(weights):
    backend = weights.backend()
    ids = [100 + i % 50 for i in range(weights.n_batch + 37)]
    backend.prefill(ids)
    assert backend.length == len(ids)
    last = backend.extend([7], last_only=True)
    assert last.shape == (1, weights.vocab_size)


def test_greedy_speculative_output_diverges_only_at_near_ties(weights):
    """Exact equality is not guaranteed on llama.cpp (batch-shape numerics): where speculative
    output leaves plain output, plain decoding's own top-2 logits must be nearly tied."""
    prompt = [100, 200, 300, 400, 100, 200, 300, 400, 100]
    cfg = DecodeConfig(max_new_tokens=24)
    plain = decode(weights.backend(), prompt, cfg).token_ids
    spec = decode(weights.backend(), prompt, cfg, NgramDrafter(), FixedK(4)).token_ids
    assert len(spec) == len(plain) == 24
    diverge = next((i for i, (a, b) in enumerate(zip(spec, plain)) if a != b), None)
    if diverge is not None:
        top2 = weights.backend().extend(prompt + plain[:diverge])[-1].topk(2).values
        assert float(top2[0] - top2[1]) < 1.0


def test_api_generate_on_llamacpp():
    model = specdec.load("smollm2-135m", backend="llamacpp")
    out = model.generate("The capital of France is", max_new_tokens=8)
    assert "Paris" in out.text
    assert out.stats.new_tokens == len(out.token_ids) <= 8


def test_context_overflow_is_a_clear_error():
    weights = load_llamacpp(str(resolve("smollm2-135m", need_hf=False).gguf), n_ctx=64)
    with pytest.raises(specdec.SpecdecError, match="context of 64"):
        weights.backend().extend(list(range(100, 170)))
