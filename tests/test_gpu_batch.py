"""The GPU server's batch (:mod:`specdec.backends.hf_batched`) checked on the CPU with the graph's
eager step: the same pool, tick inputs, masks and attention as under CUDA graphs, every tick called
instead of replayed.

What it must hold: a sequence in the batch gives the growing cache's logits (bit for bit in
float64, chains and trees, under rollback); its answers do not depend on which other sequences
share its ticks (greedy and seeded, with drafts verified); the KV pool bounds memory, makes a
request that does not fit wait, and gets every page back; the paged attention reads the held
slots only (its Triton kernels: tests/test_paged_triton.py)."""

from __future__ import annotations

import random
import threading
import time
import weakref

import numpy as np
import pytest
import torch

from specdec import tree as trees
from specdec.backends import paged_attention as pa
from specdec.backends.hf import HFBackend
from specdec.backends.hf_batched import PagedBatch
from specdec.backends.kv_pool import KVPool, budget_pages, parse_budget
from specdec.drafters.base import Drafter
from specdec.drafters.model import ModelDrafter
from specdec.drafters.ngram import NgramDrafter
from specdec.engine import DecodeConfig, decode
from specdec.errors import SpecdecError
from specdec.policies.fixed import FixedK
from specdec.sampling import SamplingParams
from specdec.types import Draft

from naive_attention import naive_attention  # tests/naive_attention.py, beside this file

PROMPTS = [[1, 5, 9, 5, 9, 5, 9, 11], [1, 7, 8, 7, 8, 30, 7, 8], [1, 40, 41, 42, 40, 41, 42],
           [1, 3, 4, 5, 6, 3, 4, 5, 6, 3], [1, 60, 61, 60, 61, 60]]


@pytest.fixture(scope="module")
def batch(tiny_llama):
    return PagedBatch(tiny_llama, slots=len(PROMPTS), pages=48, max_length=200)


@pytest.fixture(scope="module")
def draft_llama(tiny_llama):
    """The same weights in a model object of their own: a batch's ticks switch its model's attention
    while they run, so a draft model running beside them is another object (as a server's is)."""
    import copy

    return copy.deepcopy(tiny_llama)


def _lease(batch: PagedBatch):
    """A sequence of ``batch`` and its hand-back (idle, then its slot freed)."""
    seq = batch.backend()

    def back() -> None:
        seq.idle()
        seq.__del__()
    return seq, back


def _run(batch, prompt, config, drafter=None, policy=None):
    seq, back = _lease(batch)
    try:
        return decode(seq, prompt, config, drafter, policy)
    finally:
        back()


# -- attention --------------------------------------------------------------------------------------------
def _attention_case(seed: int, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    b, heads, kv_heads, rows, dim, pages = 3, 6, 2, 16, 16, 24
    keys = torch.randn(pages, pa.PAGE, kv_heads, dim, generator=g, dtype=dtype)
    values = torch.randn(pages, pa.PAGE, kv_heads, dim, generator=g, dtype=dtype)
    table = torch.stack([torch.randperm(pages - 1, generator=g)[:6] + 1 for _ in range(b)])
    start = torch.tensor([0, 70, 300])
    tree = [-1, 0, 0, 1, 1, 2, -1, 6] + [-1] * 8
    block = torch.stack([torch.ones(rows, rows).tril().bool(), trees.ancestor_mask(tree),
                         torch.ones(rows, rows).tril().bool()])
    positions = start[:, None] + torch.arange(rows)[None]
    positions[1] = start[1] - 1 + torch.tensor(trees.depths(tree))
    q = torch.randn(b, heads, rows, dim, generator=g, dtype=dtype)
    return q, keys, values, pa.PagedMeta(table, start, block, positions)


@pytest.mark.parametrize("window", [0, 40])
def test_the_reference_attention_sees_the_cached_slots_and_the_blocks_rows(window):
    q, keys, values, meta = _attention_case(0)
    got = pa.reference_attention(q, keys, values, meta, 0.25, window)
    assert torch.allclose(got, naive_attention(q, keys, values, meta, 0.25, window), atol=1e-12)


def test_a_sequences_attention_does_not_depend_on_the_others():
    q, keys, values, meta = _attention_case(1)
    together = pa.reference_attention(q, keys, values, meta, 0.25)
    for s in range(q.shape[0]):
        alone = pa.PagedMeta(meta.table[s:s + 1], meta.start[s:s + 1], meta.block[s:s + 1], meta.positions[s:s + 1])
        assert torch.equal(pa.reference_attention(q[s:s + 1], keys, values, alone, 0.25)[0], together[s])


def test_a_static_cache_is_read_as_pages_in_order():
    q, keys, values, meta = _attention_case(2)
    s = 2
    buffer_k = keys[meta.table[s]].reshape(-1, *keys.shape[2:]).permute(1, 0, 2)[None].contiguous()
    buffer_v = values[meta.table[s]].reshape(-1, *values.shape[2:]).permute(1, 0, 2)[None].contiguous()
    static = pa.PagedMeta(torch.arange(meta.table.shape[1])[None], meta.start[s:s + 1], meta.block[s:s + 1],
                          meta.positions[s:s + 1], layout="static")
    pooled = pa.PagedMeta(meta.table[s:s + 1], meta.start[s:s + 1], meta.block[s:s + 1], meta.positions[s:s + 1])
    assert torch.equal(pa.reference_attention(q[s:s + 1], buffer_k, buffer_v, static, 0.25),
                       pa.reference_attention(q[s:s + 1], keys, values, pooled, 0.25))


def test_an_unknown_kernel_is_refused_by_name(monkeypatch):
    pa._choice.cache_clear()
    monkeypatch.setenv("SPECDEC_PAGED_KERNEL", "flash")
    try:
        with pytest.raises(SpecdecError, match="SPECDEC_PAGED_KERNEL must be one of triton, reference"):
            pa.choice(torch.device("cpu"))
    finally:
        pa._choice.cache_clear()
    monkeypatch.delenv("SPECDEC_PAGED_KERNEL")
    assert pa.choice(torch.device("cpu")) == "reference"


# -- one sequence -------------------------------------------------------------------------------------------
def test_a_batched_sequence_gives_the_growing_caches_logits_bit_for_bit(batch, tiny_llama):
    """Random chains and trees, each followed by a rollback (a chain cut anywhere, a tree's random
    path kept), in float64: the pool, the tick's inputs and the masks are the growing cache's."""
    rng = random.Random(0)
    seq, back = _lease(batch)
    seq.supports_tree = True  # the tree forward a server does not use yet (PagedSequence), checked as it is
    try:
        twin = HFBackend(tiny_llama)
        seq.reserve(150)
        for backend in (seq, twin):
            backend.prefill(list(range(3, 70)))  # past one page
        trees_seen = 0
        for step in range(30):
            chunk = [rng.randrange(3, 96) for _ in range(rng.randint(1, 16))]
            tree = None
            if rng.random() < 0.4:
                tree = [-1] + [rng.randrange(-1, i) for i in range(len(chunk) - 1)]
                trees_seen += 1
            got, want = seq.extend(chunk, tree=tree), twin.extend(chunk, tree=tree)
            assert torch.equal(got, want), f"step {step}: max diff {(got - want).abs().max()}"
            base = seq.length - len(chunk)
            if tree is not None:
                node, path = rng.randrange(len(chunk)), []
                while node >= 0:
                    path.append(node)
                    node = tree[node]
                for backend in (seq, twin):
                    backend.truncate(base, keep=path[::-1])
            else:
                keep = rng.randint(base, seq.length)
                for backend in (seq, twin):
                    backend.truncate(keep)
        assert trees_seen >= 5
    finally:
        back()


def test_a_chain_longer_than_a_block_runs_as_consecutive_blocks(batch, tiny_llama):
    seq, back = _lease(batch)
    try:
        seq.reserve(100)
        twin = HFBackend(tiny_llama)
        for backend in (seq, twin):
            backend.prefill([1, 2, 3])
        before = batch.ticks
        assert torch.equal(seq.extend(list(range(10, 50))), twin.extend(list(range(10, 50))))
        assert batch.ticks - before == 3  # 40 rows in blocks of 16
    finally:
        back()


def test_a_tree_is_verified_as_its_best_path(batch):
    """The batch's sequences verify chains only (PagedSequence.supports_tree): a tree drafter's
    tree is cut to its best path by the engine, and the answer is plain decoding's."""
    seq, back = _lease(batch)
    try:
        seq.reserve(60)
        seq.prefill([1, 2, 3])
        with pytest.raises(ValueError, match="cannot score draft trees"):
            seq.extend([10, 11], tree=[-1, 0])
    finally:
        back()

    class Wide(Drafter):
        def propose(self, tokens, k, stop=None):
            return Draft([3 + i % 90 for i in range(k)], parents=[-1 if i < 8 else i % 8 for i in range(k)])

    config = DecodeConfig(max_new_tokens=24)
    out = _run(batch, PROMPTS[0], config, Wide(), FixedK(40))
    assert all(s.drafted and len(s.drafted) <= 2 for s in out.trace if s.drafted)  # a path: a root, one child
    assert out.token_ids == _run(batch, PROMPTS[0], config).token_ids


# -- many sequences -------------------------------------------------------------------------------------------
def _together(batch, runs):
    """Each of ``runs`` (prompt, config, drafter, policy) in its own thread at once; their tokens."""
    out: dict[int, list[int]] = {}
    errors: list[BaseException] = []

    def one(i, args):
        try:
            time.sleep(0.002 * i)  # staggered: sequences join and leave between ticks
            out[i] = _run(batch, *args).token_ids
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
    threads = [threading.Thread(target=one, args=(i, a)) for i, a in enumerate(runs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return [out[i] for i in range(len(runs))]


@pytest.mark.parametrize("sampled", [False, True])
def test_every_answer_is_the_same_as_the_requests_alone(batch, draft_llama, sampled):
    sampling = SamplingParams(temperature=0.9, top_k=20, seed=7) if sampled else SamplingParams()
    configs = [DecodeConfig(max_new_tokens=20 + 5 * i, sampling=sampling) for i in range(len(PROMPTS))]
    drafters = [lambda: NgramDrafter(), lambda: NgramDrafter(tree=True), lambda: None,
                lambda: ModelDrafter(HFBackend(draft_llama)), lambda: NgramDrafter()]
    runs = [(p, c, d(), FixedK(6) if d() is not None else None) for p, c, d in zip(PROMPTS, configs, drafters)]
    alone = [_run(batch, *r) for r in runs]
    assert sum(out.stats.accepted for out in alone) > 0, "no draft was verified: the comparison says nothing"
    plain = [_run(batch, p, c).token_ids for p, c in zip(PROMPTS, configs)]
    assert [out.token_ids for out in alone] == plain
    runs = [(p, c, d(), FixedK(6) if d() is not None else None) for p, c, d in zip(PROMPTS, configs, drafters)]
    batch.trace = []
    try:
        assert _together(batch, runs) == plain
        assert max(len(rows) for rows, _ in batch.trace) > 1, "no tick was shared: the comparison says nothing"
    finally:
        batch.trace = None


def test_a_tick_holds_every_running_sequences_rows(tiny_llama):
    batch = PagedBatch(tiny_llama, slots=4, pages=40, max_length=200, gather_s=0.5)
    batch.trace = []
    _together(batch, [(p, DecodeConfig(max_new_tokens=12), None, None) for p in PROMPTS[:4]])
    assert max(len(rows) for rows, _ in batch.trace) == 4  # lockstep: four sequences in one tick


# -- memory ---------------------------------------------------------------------------------------------------
def test_a_request_that_does_not_fit_waits_for_pages_and_every_page_comes_back(tiny_llama):
    # Room for one sequence of 128 tokens at a time: the second waits until the first is done.
    batch = PagedBatch(tiny_llama, slots=2, pages=4, max_length=180)
    assert batch.pool.capacity == 3
    config = DecodeConfig(max_new_tokens=100)
    done: list[tuple[int, float]] = []

    def one(i):
        _run(batch, PROMPTS[i], config)
        done.append((i, time.monotonic()))
    first = threading.Thread(target=one, args=(0,))
    first.start()
    while batch.pool.free == 3:
        time.sleep(0.001)
    second = threading.Thread(target=one, args=(1,))
    second.start()
    first.join()
    second.join()
    assert [i for i, _ in done] == [0, 1] and batch.pool.free == 3
    for i in range(20):
        _run(batch, PROMPTS[i % len(PROMPTS)], DecodeConfig(max_new_tokens=10))
    assert batch.pool.free == 3


def test_a_request_larger_than_the_pool_is_refused_with_what_would_fit(tiny_llama):
    batch = PagedBatch(tiny_llama, slots=1, pages=3, max_length=180)
    with pytest.raises(SpecdecError, match="needs 192 tokens of KV cache; the pool holds 128"):
        _run(batch, PROMPTS[0], DecodeConfig(max_new_tokens=160))
    assert batch.pool.free == 2


def test_pages_are_taken_all_or_nothing_and_given_back():
    from transformers import LlamaConfig

    pool = KVPool(LlamaConfig(hidden_size=32, num_attention_heads=4, num_hidden_layers=1), 5, torch.device("cpu"),
                  torch.float32)
    a = pool.take(3)
    with pytest.raises(SpecdecError, match="1 free pages, 2 needed"):
        pool.take(2, timeout=0.01)
    assert pool.free == 1 and 0 not in a
    pool.give(a)
    assert pool.free == 4 and sorted(pool.take(4)) == [1, 2, 3, 4]


def _pool(pages: int) -> KVPool:
    from transformers import LlamaConfig

    return KVPool(LlamaConfig(hidden_size=32, num_attention_heads=4, num_hidden_layers=1), pages,
                  torch.device("cpu"), torch.float32)


def _waiting(*threads) -> None:
    """A moment for the threads to reach their wait (at most 5 s while they live)."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        time.sleep(0.05)
        if all(t.is_alive() for t in threads):
            return


def test_requests_waiting_for_pages_are_served_in_arrival_order():
    pool = _pool(6)  # 5 pages
    held = pool.take(4)
    order: list[str] = []

    def take(name, count):
        order.append(name + " waits")
        pages = pool.take(count)
        order.append(name)
        pool.give(pages)
    big = threading.Thread(target=take, args=("big", 5))
    big.start()
    _waiting(big)
    small = threading.Thread(target=take, args=("small", 1))  # would fit now, but comes after the big one
    small.start()
    time.sleep(0.2)
    assert order == ["big waits", "small waits"]
    pool.give(held)
    big.join(5)
    small.join(5)
    assert order[2:] == ["big", "small"] and pool.free == 5


def test_a_cancelled_request_leaves_the_line():
    pool = _pool(3)
    held = pool.take(2)
    cancelled = threading.Event()
    errors: list[Exception] = []

    def wait():
        try:
            pool.take(2, cancelled=cancelled)
        except SpecdecError as exc:
            errors.append(exc)
    waiter = threading.Thread(target=wait)
    waiter.start()
    _waiting(waiter)
    cancelled.set()
    waiter.join(2)
    assert not waiter.is_alive() and "cancelled while it waited" in str(errors[0])
    pool.give(held)
    assert pool.take(2, timeout=0) and not pool._line  # the line is empty: the next is served at once


def test_a_run_waiting_for_pages_stops_when_cancelled(tiny_llama):
    from specdec.engine import DecodeRun

    batch = PagedBatch(tiny_llama, slots=2, pages=4, max_length=180)  # one sequence of 128 tokens at a time
    seq, back = _lease(batch)
    seq.reserve(100)
    other, other_back = _lease(batch)
    run = DecodeRun(other, PROMPTS[1], DecodeConfig(max_new_tokens=100))
    errors: list[Exception] = []

    def go():
        try:
            run.run()
        except SpecdecError as exc:
            errors.append(exc)
    waiter = threading.Thread(target=go)
    try:
        waiter.start()
        _waiting(waiter)
        assert waiter.is_alive() and batch.pool.free < 2  # it waits for the pages the first holds
        run.cancel()
        waiter.join(2)
        assert not waiter.is_alive() and "cancelled while it waited" in str(errors[0])
    finally:
        back()
        other_back()
    assert batch.pool.free == batch.pool.capacity


def test_a_draft_models_sequence_waits_for_pages_as_it_grows(tiny_llama):
    """A sequence that grows as it goes (a draft model's: no reserve) waits for pages instead of
    failing, without holding up the ticks of the others."""
    batch = PagedBatch(tiny_llama, slots=2, pages=4, max_length=180)
    first, first_back = _lease(batch)
    first.reserve(100)  # 2 of the 3 pages
    grower, grower_back = _lease(batch)
    done = threading.Event()

    def grow():
        grower.prefill(list(range(3, 70)))  # past one page: a second page it must wait for
        done.set()
    thread = threading.Thread(target=grow)
    try:
        thread.start()
        time.sleep(0.3)
        assert not done.is_set()
        first.prefill([1, 2, 3])  # the other sequence's forwards run meanwhile
        first_back()
        thread.join(10)
        assert done.is_set() and grower.length == 67
    finally:
        grower_back()
    assert batch.pool.free == batch.pool.capacity


def test_draft_sequences_take_their_pages_up_front_and_wait_in_line(tiny_llama, draft_llama):
    """Two drafting requests whose draft model's pool holds one of them at a time: each draft
    sequence takes its pages before it drafts (as a target's does), so the second waits for the
    first to end (grown page by page they would each hold one page and wait for the other's)."""
    targets = PagedBatch(tiny_llama, slots=2, pages=8, max_length=180)
    drafts = PagedBatch(draft_llama, slots=2, pages=3, max_length=180)  # 2 pages: one 108-token sequence
    config = DecodeConfig(max_new_tokens=100)

    def release(seq):
        seq.idle()
        seq.__del__()

    def drafting(prompt):
        drafter = ModelDrafter(drafts.backend(), release=release)
        return (prompt, config, drafter, FixedK(4))
    plain = [_run(targets, p, config).token_ids for p in PROMPTS[:2]]
    result: list = []
    runner = threading.Thread(target=lambda: result.append(_together(targets, [drafting(p) for p in PROMPTS[:2]])))
    runner.start()
    runner.join(60)
    assert not runner.is_alive(), "the drafting requests deadlocked on the draft model's pages"
    assert result == [plain] and drafts.pool.free == drafts.pool.capacity


def test_a_request_the_pool_can_never_hold_gets_a_400_before_its_stream_opens(tiny_model_dir):
    from fastapi.testclient import TestClient

    import specdec
    from specdec.server.app import Server
    from specdec.server.settings import ServeConfig

    model = specdec.load(str(tiny_model_dir))
    hf = model.loaded.hf_model
    model.loaded._batched_factory = lambda slots, kv_memory=None: PagedBatch(hf, slots, pages=3, max_length=256)
    server = Server(model, config=ServeConfig(slots=2, batch=True, index_tokens=0))
    capacity = model.loaded.batched.pool.capacity * 64  # 128 tokens: less than the model's context
    with TestClient(server.app()) as client:
        body = {"model": model.name, "prompt": "hello", "max_tokens": 150, "stream": True}
        r = client.post("/v1/completions", json=body)
        assert r.status_code == 400 and f"the pool holds {capacity}" in r.text
        small = client.post("/v1/completions", json={**body, "max_tokens": 8})
        assert small.status_code == 200 and small.text.rstrip().endswith("[DONE]")


class _Allocated:
    """What the forwards of a batch allocate, counted op by op (a dispatch mode entered on the
    ticker's thread around each tick and prefill chunk): the most bytes live at once in any of them.
    A storage counts from the op that made it until the tensor that brought it dies."""

    def __init__(self, batch: PagedBatch) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_flatten

        self.peaks: dict[str, int] = {"_run": 0, "_prefill_chunk": 0}
        counter = self

        class Count(TorchDispatchMode):
            def __init__(self):
                super().__init__()
                self.live: dict[int, int] = {}
                self.now = self.peak = 0

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                for t in tree_flatten(out)[0]:
                    if isinstance(t, torch.Tensor):
                        storage = t.untyped_storage()
                        key = storage.data_ptr()
                        if key and key not in self.live:
                            self.live[key] = storage.nbytes()
                            self.now += storage.nbytes()
                            self.peak = max(self.peak, self.now)
                            weakref.finalize(t, self.free, key)
                return out

            def free(self, key):
                self.now -= self.live.pop(key, 0)

        for name in self.peaks:
            call = getattr(batch, name)

            def counted(*args, _call=call, _name=name, **kwargs):
                with Count() as count:
                    result = _call(*args, **kwargs)
                counter.peaks[_name] = max(counter.peaks[_name], count.peak)
                return result
            setattr(batch, name, counted)


def test_what_serving_allocates_stays_within_the_kv_memory_budget(tiny_llama, draft_llama):
    """``--kv-memory`` bounds the pool and what the forwards allocate beside it (logits, attention,
    activations), counted op by op: a long prompt's prefill is chunked to fit, and unchunked the
    same prompt would not."""
    from specdec.backends.hf_batched import PREFILL_CHUNK, paged_batch
    from specdec.backends.kv_pool import parse_budget

    budget = "6MiB"
    batch = paged_batch(tiny_llama, 2, budget, max_length=1000)
    pool = sum(t.nbytes for t in batch.pool.keys + batch.pool.values)
    assert batch.prefill_chunk < PREFILL_CHUNK
    assert 2 < batch.pool.pages < 2 * batch.table_pages + 1  # the budget, not the slots, sizes the pool
    allocated = _Allocated(batch)
    long_prompt = [3 + i % 90 for i in range(700)]
    runs = [(long_prompt, DecodeConfig(max_new_tokens=40), NgramDrafter(), FixedK(6)),
            (PROMPTS[1], DecodeConfig(max_new_tokens=60), ModelDrafter(HFBackend(draft_llama)), FixedK(4))]
    _together(batch, runs)
    peak = max(allocated.peaks.values())
    assert allocated.peaks["_run"] > 0 and allocated.peaks["_prefill_chunk"] > 0
    assert pool + peak <= parse_budget(budget)[0], (pool, allocated.peaks)
    # The same prompt in one chunk of PREFILL_CHUNK rows would not have fit beside the pool.
    whole = PagedBatch(tiny_llama, slots=2, pages=batch.pool.pages, max_length=1000)
    unchunked = _Allocated(whole)
    _run(whole, long_prompt, DecodeConfig(max_new_tokens=2))
    assert pool + unchunked.peaks["_prefill_chunk"] > parse_budget(budget)[0]


@pytest.mark.parametrize("text, parsed", [("8GiB", (8 * 2**30, None)), ("512MiB", (512 * 2**20, None)),
                                          ("2000000000", (2000000000, None)), ("0.3", (None, 0.3)),
                                          ("1.5gb", (1_500_000_000, None))])
def test_the_memory_budget_reads_bytes_or_a_fraction(text, parsed):
    assert parse_budget(text) == parsed


@pytest.mark.parametrize("text", ["lots", "-1", "0", "3 parsecs"])
def test_a_bad_memory_budget_says_what_it_takes(text):
    with pytest.raises(SpecdecError, match="--kv-memory"):
        parse_budget(text)


def test_the_budget_caps_the_pool_at_what_the_slots_can_use(tiny_llama):
    config, dtype, cpu = tiny_llama.config, tiny_llama.dtype, torch.device("cpu")
    assert budget_pages(config, dtype, cpu, 4, 1000) == 4 * 16 + 1  # no budget on a CPU: what they can use
    small = budget_pages(config, dtype, cpu, 4, 1000, "64KiB")
    assert 2 <= small < 65
    with pytest.raises(SpecdecError, match="fraction of the device's memory needs a GPU|needs a GPU"):
        budget_pages(config, dtype, cpu, 4, 1000, "0.5")


# -- through the server --------------------------------------------------------------------------------------
def test_the_server_batches_transformers_sequences_and_answers_as_alone(tiny_model_dir):
    """``specdec serve`` with the batch a GPU runs (here its eager step): concurrent streamed
    requests with drafts get the answers each gets alone, and the pool gets every page back."""
    from fastapi.testclient import TestClient

    import specdec
    from specdec.backends.hf_batched import paged_batch
    from specdec.server.app import Server
    from specdec.server.settings import ServeConfig

    model = specdec.load(str(tiny_model_dir))
    hf = model.loaded.hf_model
    model.loaded._batched_factory = lambda slots, kv_memory=None: paged_batch(hf, slots, kv_memory, max_length=256)
    app = Server(model, config=ServeConfig(slots=3, batch=True, index_tokens=0)).app()
    bodies = [{"model": model.name, "prompt": p, "max_tokens": 24, "temperature": 0, "drafter": d, "num_draft": 4, "policy": "fixed"}
              for p, d in [("the quick brown fox jumps over the lazy dog the quick", "ngram"),
                           ("hello world, hello there; hello", "ngram"), ("0123456789 + - 0123", "none"),
                           ("speculative decoding drafts and verifies speculative", "ngram")]]
    with TestClient(app) as client:
        alone = [client.post("/v1/completions", json=b).json() for b in bodies]
        results: dict[int, dict] = {}

        def ask(i):
            results[i] = client.post("/v1/completions", json=bodies[i]).json()
        threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(bodies))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert [r["choices"][0]["text"] for r in alone] == [results[i]["choices"][0]["text"] for i in range(len(bodies))]
    assert sum(r["speculative"]["draft_n_accepted"] for r in alone) > 0
    batch = model.loaded.batched
    assert batch is not None and batch.ticks > 0 and batch.pool.free == batch.pool.capacity


def test_the_default_draft_model_is_batched_like_a_servers_draft_model(tiny_model_dir, tiny_draft_dir):
    """A request that drafts with the model's default draft model (no --draft-model) on the GPU
    batch gets the draft model batched too, and the answer plain decoding's."""
    import specdec
    from specdec.backends.hf_batched import paged_batch

    model, draft = specdec.load(str(tiny_model_dir)), specdec.load(str(tiny_draft_dir)).loaded
    for loaded in (model.loaded, draft):
        hf = loaded.hf_model
        loaded._batched_factory = lambda slots, kv_memory=None, hf=hf: paged_batch(hf, slots, kv_memory, max_length=256)
    model.loaded._default_draft_model = draft
    model.loaded.enable_batching(2)
    assert model.loaded.default_draft_model() is draft and draft.batched is not None and draft.batched.slots == 2
    plain = model.generate("hello world, hello", max_new_tokens=16, drafter="none")
    drafted = model.generate("hello world, hello", max_new_tokens=16, drafter="model", policy="fixed", num_draft=3)
    assert drafted.token_ids == plain.token_ids and drafted.stats.drafted > 0
    assert draft.batched.ticks > 0 and draft.batched.pool.free == draft.batched.pool.capacity


def test_one_kv_memory_budget_is_shared_by_the_target_and_the_draft_models_pools(tiny_model_dir, tiny_draft_dir,
                                                                                 monkeypatch):
    """``--kv-memory`` with ``--draft-model`` on the GPU batch: both pools within the one budget,
    each its share by the KV bytes a token takes in it."""
    import specdec
    from specdec.backends.hf_batched import paged_batch
    from specdec.backends.kv_pool import page_bytes, split_budget
    from specdec.server.app import Server
    from specdec.server.settings import ServeConfig

    model, draft = specdec.load(str(tiny_model_dir)), specdec.load(str(tiny_draft_dir)).loaded
    draft.hf_model.to(torch.float64)  # another KV size than the target's: an uneven share
    given: dict[str, str | None] = {}
    for name, loaded in (("target", model.loaded), ("draft", draft)):
        def factory(slots, kv_memory=None, hf=loaded.hf_model, name=name):
            given[name] = kv_memory
            return paged_batch(hf, slots, None, max_length=256)
        loaded._batched_factory = factory
        monkeypatch.setattr(loaded, "device", "cuda:0")  # enable_batching's check; the forwards stay here
    Server(model, draft_model=draft, config=ServeConfig(slots=2, batch=True, index_tokens=0, kv_memory="3MiB"))
    target_share, draft_share = int(given["target"]), int(given["draft"])
    assert target_share + draft_share <= 3 * 2**20 and draft_share == 2 * target_share
    assert [int(b) for b in split_budget("3MiB", torch.device("cpu"), [(draft.hf_model.config, torch.float32),
                                                                     (draft.hf_model.config, torch.float64)])] \
        == [2**20, 2 * 2**20]
    assert page_bytes(draft.hf_model.config, torch.float64) == 2 * page_bytes(model.loaded.hf_model.config,
                                                                                torch.float32)


def test_kv_memory_needs_a_gpu(tiny_model_dir):
    import specdec

    model = specdec.load(str(tiny_model_dir))
    model.loaded._batched_factory = lambda slots, kv_memory=None: None
    with pytest.raises(SpecdecError, match="--kv-memory sizes the GPU server's KV pool: it needs --device cuda"):
        model.loaded.enable_batching(2, "1GiB")


def test_transformers_batches_only_on_a_gpu(tiny_model_dir):
    import specdec

    loaded = specdec.load(str(tiny_model_dir)).loaded
    assert not loaded.can_batch
    with pytest.raises(SpecdecError, match="transformers with --device cuda"):
        loaded.enable_batching(2)


def test_inputs_of_an_empty_slot_write_to_the_scratch_page(batch):
    inputs = batch._inputs
    inputs.fill([], batch.width)
    assert not inputs.host_views["table"].any()
    assert np.array_equal(inputs.host_views["flat"], np.tile(np.arange(batch.width), batch.slots))
    assert np.array_equal(inputs.host_views["block"][0], np.eye(batch.width))


# -- exactness on a GPU: what is reported and refused ---------------------------------------------------------
def test_exact_is_reported_only_where_every_forward_is_padded(tiny_gemma3, tiny_llama):
    from specdec.backends.hf_load import prepared

    # The growing cache runs a model with sliding layers unpadded (--no-graphs): not exact.
    assert not prepared(tiny_gemma3, "g", False, pad=16, graphs=False)[0].exact
    assert prepared(tiny_gemma3, "g", False, pad=16, graphs=True)[0].exact
    assert prepared(tiny_llama, "l", False, pad=16, graphs=False)[0].exact
    assert not prepared(tiny_llama, "l", False, pad=0, graphs=False)[0].exact


def test_a_model_wrapped_by_hand_is_padded_when_asked_and_on_a_gpu_by_default(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import specdec

    hf = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert not specdec.Model.from_hf("m", hf, tok).exact  # a CPU keeps its own path
    padded = specdec.Model.from_hf("m", hf, tok, exact=True)
    assert padded.exact and padded.loaded.backend().pad_rows == 16


def test_padded_trees_stay_within_the_padded_shape(tiny_llama):
    class Wide(Drafter):
        def propose(self, tokens, k, stop=None):
            return Draft([3 + i % 90 for i in range(k)], parents=[-1 if i < 8 else i % 8 for i in range(k)])

    out = decode(HFBackend(tiny_llama, 16), PROMPTS[1], DecodeConfig(max_new_tokens=20), Wide(), FixedK(40))
    assert max(len(s.drafted) for s in out.trace) == 15
    assert HFBackend(tiny_llama, 0).max_tree is None


def test_the_self_drafter_is_refused_on_a_gpu_by_what_it_would_break(tiny):
    from dataclasses import replace

    from specdec.drafters.self_spec import shared_state

    context = replace(tiny.loaded.draft_context(), device="cuda:0")
    with pytest.raises(SpecdecError, match="self drafter is not available on a GPU.*--drafter ngram"):
        shared_state(context)


def test_the_batch_chooses_the_draft_lengths_and_answers_stay_the_requests_alone(batch):
    """The adaptive policy offers its drafts to the tick (extend_offer) and the tick's joint choice
    cuts them (one shape: every draft that may gain is verified, up to a block); the answers are
    plain decoding's, alone or together."""
    from specdec.costs import CostModel
    from specdec.policies.adaptive import AdaptiveK

    curve = CostModel({n: 0.01 for n in (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32, 48, 64)}, 0.0)
    configs = [DecodeConfig(max_new_tokens=30) for _ in PROMPTS]
    plain = [_run(batch, p, c).token_ids for p, c in zip(PROMPTS, configs)]
    taken = batch.taken
    runs = [(p, c, NgramDrafter(), AdaptiveK(curve)) for p, c in zip(PROMPTS, configs)]
    assert _together(batch, runs) == plain
    assert batch.taken > taken


# -- the same tokens alone, sharing ticks and in plain decoding --------------------------------------------
def test_in_float32_a_requests_tokens_are_its_alone_sharing_ticks_and_plain_decodings(tiny_llama):
    """Rounding is visible in float32 (float64 hides it): every request's tokens, with chain drafts,
    tree drafts (verified as their best path) and none, are the same alone in the batch, sharing its
    ticks, and in plain decoding on the batch's one attention path."""
    import copy

    model = copy.deepcopy(tiny_llama).float()
    drafter_model = copy.deepcopy(tiny_llama).float()
    batch = PagedBatch(model, slots=len(PROMPTS), pages=48, max_length=200)
    batch.trace = []
    configs = [DecodeConfig(max_new_tokens=24) for _ in PROMPTS]
    drafters = [lambda: NgramDrafter(), lambda: NgramDrafter(tree=True), lambda: None,
                lambda: ModelDrafter(HFBackend(drafter_model)), lambda: NgramDrafter(tree=True)]

    def runs():
        return [(p, c, d(), FixedK(6) if d() is not None else None) for p, c, d in zip(PROMPTS, configs, drafters)]
    plain = [_run(batch, p, c).token_ids for p, c in zip(PROMPTS, configs)]
    alone = [_run(batch, *r) for r in runs()]
    assert sum(out.stats.accepted for out in alone) > 0, "no draft was verified: the comparison says nothing"
    assert [out.token_ids for out in alone] == plain
    batch.trace = []
    assert _together(batch, runs()) == plain
    assert max(len(rows) for rows, _ in batch.trace) > 1, "no tick was shared: the comparison says nothing"


def test_in_float64_the_batch_answers_as_the_growing_cache(batch, tiny_llama):
    """The growing cache (``specdec generate``'s transformers backend) and the batch differ in their
    attention's sums only by rounding float64 does not show: the same tokens, drafted or not."""
    for prompt in PROMPTS[:3]:
        config = DecodeConfig(max_new_tokens=24)
        want = decode(HFBackend(tiny_llama), prompt, config).token_ids
        assert _run(batch, prompt, config).token_ids == want
        assert _run(batch, prompt, config, NgramDrafter(tree=True), FixedK(6)).token_ids == want


# -- what the GPU batch refuses -------------------------------------------------------------------------------
def _gpu_batch_server(tiny_model_dir, **config):
    import specdec
    from specdec.backends.hf_batched import paged_batch
    from specdec.server.app import Server
    from specdec.server.settings import ServeConfig

    model = specdec.load(str(tiny_model_dir))
    hf = model.loaded.hf_model
    model.loaded._batched_factory = lambda slots, kv_memory=None: paged_batch(hf, slots, kv_memory, max_length=256)
    return model, Server(model, config=ServeConfig(slots=2, batch=True, index_tokens=0, **config))


def test_a_tree_request_to_the_gpu_batch_gets_a_400_that_says_why(tiny_model_dir):
    from fastapi.testclient import TestClient

    model, server = _gpu_batch_server(tiny_model_dir)
    with TestClient(server.app()) as client:
        body = {"model": model.name, "prompt": "hello hello", "max_tokens": 4, "drafter": "ngram", "tree": True}
        r = client.post("/v1/completions", json=body)
        assert r.status_code == 400 and "tree drafts are not verified on the GPU batch" in r.text
        assert client.post("/v1/completions", json={**body, "tree": False}).status_code == 200


@pytest.mark.parametrize("option, value", [("max_tick_stretch", 2.0), ("max_delay_share", 0.5)])
def test_options_that_do_nothing_on_the_gpu_batch_are_refused(tiny_model_dir, option, value):
    name = "--" + option.replace("_", "-")
    with pytest.raises(SpecdecError, match=f"{name} bounds the delays of llama.cpp's batched ticks.*leave it out"):
        _gpu_batch_server(tiny_model_dir, **{option: value})
