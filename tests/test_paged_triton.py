"""The paged attention's Triton kernels (:mod:`specdec.backends.paged_triton`) run on the CPU by
Triton's interpreter (tests/conftest.py sets ``TRITON_INTERPRET=1`` where no GPU is, before
Triton imports; Triton is part of the test install).

What they must hold: the bits of a reference that does the kernels' arithmetic in their own order
(split by split, page by page, the splits combined in order), the naive attention's result within
rounding, and the same bits for a sequence whoever shares the launch and however wide the page
table, at page and split boundaries, in bf16 and float64. Two broken variants (a split size that
follows the batch, as flash-decoding's launch heuristics choose it, and a split that reads its
neighbour's page) show that the invariance check catches what it is there for."""

from __future__ import annotations

import inspect
import os

import numpy as np
import pytest
import torch

from specdec import tree as trees
from specdec.backends import paged_attention as pa

from naive_attention import naive_attention  # tests/naive_attention.py, beside this file

import triton  # noqa: F401  (part of the test install: never skipped for want of it)
from triton.runtime import interpreter

from specdec.backends import paged_triton

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cpu" if INTERPRETED else "cuda"


@pytest.fixture(autouse=True, scope="module")
def _interpreter_as_the_gpu():
    """Triton 3.9's interpreter multiplies bf16 operands of ``tl.dot`` as their raw 16-bit patterns
    and casts float32 to bf16 by truncation; a GPU multiplies the values (exact products, float32
    sums) and rounds to nearest even. Both made the GPU's here, so that a bf16 run means what it
    means on a GPU."""
    if not INTERPRETED:
        yield
        return
    builder = interpreter.InterpreterBuilder
    dot, cast = builder.create_dot, builder.cast_impl
    import triton.language as tl

    def as_f32(handle):
        return torch.from_numpy(handle.data.view(np.int16)).view(torch.bfloat16).float().numpy()

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if a.dtype.scalar == tl.bfloat16 and b.dtype.scalar == tl.bfloat16:
            a = interpreter.TensorHandle(as_f32(a), tl.float32)
            b = interpreter.TensorHandle(as_f32(b), tl.float32)
        return dot(self, a, b, d, input_precision, max_num_imprecise_acc)

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            rounded = torch.from_numpy(np.ascontiguousarray(src.data)).to(torch.bfloat16).view(torch.int16)
            return interpreter.TensorHandle(rounded.numpy().view(np.uint16), tl.bfloat16)
        return cast(self, src, dst_type)

    builder.create_dot, builder.cast_impl = create_dot, cast_impl
    try:
        yield
    finally:
        builder.create_dot, builder.cast_impl = dot, cast


def test_the_kernels_run_here():
    """Never skipped: the CPU runs them interpreted, a GPU compiled."""
    assert INTERPRETED or torch.cuda.is_available()
    assert isinstance(paged_triton.split_kernel, interpreter.InterpretedFunction) == INTERPRETED


# -- cases -------------------------------------------------------------------------------------------------
HEADS, KV_HEADS, ROWS, DIM, PAGES = 4, 2, 8, 16, 12
# Sequences whose forward rows end just before, at and just after page (and split) boundaries, and
# one that starts at one: start + ROWS = 64, 65; start = 64, 128; the first forward of a sequence.
STARTS = [56, 57, 64, 121, 0]


def _case(seed: int, dtype: torch.dtype, starts=STARTS, table_pages: int = 3):
    g = torch.Generator().manual_seed(seed)
    b = len(starts)
    keys = torch.randn(PAGES, pa.PAGE, KV_HEADS, DIM, generator=g).to(dtype)
    values = torch.randn(PAGES, pa.PAGE, KV_HEADS, DIM, generator=g).to(dtype)
    # Each sequence's own pages (page 0 is a server's scratch page: never a sequence's).
    table = torch.stack([torch.randperm(PAGES - 1, generator=g)[:table_pages] + 1 for _ in range(b)])
    start = torch.tensor(starts)
    tree = [-1, 0, 0, 1, 2, -1, 5, 3]
    block = torch.stack([trees.ancestor_mask(tree) if i % 2 else torch.ones(ROWS, ROWS).tril().bool()
                         for i in range(b)])
    positions = start[:, None] + torch.arange(ROWS)[None]
    for i in range(1, b, 2):
        positions[i] = start[i] - 1 + torch.tensor(trees.depths(tree))
    q = torch.randn(b, HEADS, ROWS, DIM, generator=g).to(dtype) * 2
    return q, keys, values, pa.PagedMeta(table, start, block, positions)


def _on(device, q, keys, values, meta):
    move = lambda t: t.to(device)  # noqa: E731
    return (move(q), move(keys), move(values),
            pa.PagedMeta(*(move(t) for t in (meta.table, meta.start, meta.block, meta.positions)), meta.layout))


def _kernel(q, keys, values, meta, scale=0.3, window=0):
    return pa.triton_attention(*_on(DEVICE, q, keys, values, meta), scale, window).cpu()


def _static(q, keys, values, meta, s: int):
    """Sequence ``s`` of a pool case as a static cache's buffer ``[1, kv_heads, capacity, d]``."""
    def buffer(pool):
        return pool[meta.table[s]].reshape(-1, KV_HEADS, DIM).permute(1, 0, 2)[None].contiguous()
    one = pa.PagedMeta(torch.arange(meta.table.shape[1])[None], meta.start[s:s + 1], meta.block[s:s + 1],
                       meta.positions[s:s + 1], layout="static")
    return q[s:s + 1], buffer(keys), buffer(values), one


# -- the reference in the kernels' order ---------------------------------------------------------------------
def _np(t: torch.Tensor) -> np.ndarray:
    return t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy()


def _round(x: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    """``x`` (float32) cast to ``dtype`` and read as the kernels' next operation reads it."""
    if dtype == torch.bfloat16:
        return torch.from_numpy(x).to(torch.bfloat16).float().numpy()
    return x.astype(np.float64) if dtype == torch.float64 else x


def _split_order(q, keys, values, meta, scale=0.3, window=0, split=pa.SPLIT):
    """What the two kernels compute, step by step in the same NumPy operations Triton's interpreter
    runs them with: per (sequence, key-value head) the query rows of the group as one ``[M, d]``
    block, per split of ``split`` keys an online softmax over its pages in order (scores and weights
    in float32, products in the inputs' type), the splits the sequence holds combined in order."""
    f32 = np.float32
    b, heads, rows, dim = q.shape
    kv_heads = keys.shape[2] if meta.layout == "pool" else keys.shape[1]
    group = heads // kv_heads
    m = max(16, 1 << (group * rows - 1).bit_length())
    wide = np.float64 if q.dtype == torch.float64 else f32  # the products' type (bf16's are exact in float32)
    qn, kn, vn = _np(q), _np(keys), _np(values)
    out = torch.zeros(b, rows, heads, dim, dtype=q.dtype)
    line = np.arange(m)
    real, g, r = line < group * rows, line // rows, line % rows
    for s in range(b):
        start = int(meta.start[s])
        end = start + rows
        block = meta.block[s].numpy().astype(bool)
        pos = np.where(real, meta.positions[s].numpy()[r], 0)

        def page(buf, p, h):  # [PAGE, d]: page p of sequence s, head h
            if meta.layout == "pool":
                return buf[int(meta.table[s, p]), :, h]
            return buf[0, h, p * pa.PAGE:(p + 1) * pa.PAGE]
        for h in range(kv_heads):
            qh = np.zeros((m, dim), dtype=qn.dtype)
            qh[real] = qn[s, h * group + g[real], r[real]]
            parts = []
            for lo in range(0, end, split):
                top, total, acc = np.full(m, -np.inf, f32), np.zeros(m, f32), np.zeros((m, dim), f32)
                for first in range(lo, min(lo + split, end), pa.PAGE):
                    k, v = page(kn, first // pa.PAGE, h), page(vn, first // pa.PAGE, h)
                    scores = np.matmul(qh, k.T, dtype=wide).astype(f32) * f32(scale)
                    slot = first + np.arange(pa.PAGE)
                    col = slot - start
                    mine = (col >= 0) & (col < rows)
                    seen = np.zeros((m, pa.PAGE), bool)
                    seen[np.ix_(real, mine)] = block[np.ix_(r[real], col[mine])]
                    allowed = (slot[None, :] < start) | seen
                    if window:
                        key_pos = np.where(mine, meta.positions[s].numpy()[np.clip(col, 0, rows - 1)], slot)
                        allowed &= (pos[:, None] - key_pos[None, :]) < window
                    allowed &= real[:, None]
                    scores = np.where(allowed, scores, f32(-np.inf))
                    new_top = np.maximum(top, np.nanmax(scores, 1))
                    safe = np.where(new_top == -np.inf, f32(0), new_top)
                    p = np.exp(scores - safe[:, None])
                    alpha = np.exp(top - safe)
                    total = total * alpha + np.sum(p, 1)
                    acc = acc * alpha[:, None] + np.matmul(_round(p, q.dtype), v, dtype=wide).astype(f32)
                    top = new_top
                parts.append((top, total, acc))
            best = np.full(m, -np.inf, f32)
            for top, _, _ in parts:
                best = np.maximum(best, np.where(real, top, f32(-np.inf)))
            safe = np.where(best == -np.inf, f32(0), best)
            num, den = np.zeros((m, dim), f32), np.zeros(m, f32)
            for top, total, acc in parts:
                share = np.exp(top - safe)
                den = den + share * total
                num = num + share[:, None] * acc
            result = num / np.maximum(den, f32(1e-30))[:, None]
            out[s, r[real], h * group + g[real]] = torch.from_numpy(np.ascontiguousarray(result[real])).to(q.dtype)
    return out


# -- the kernels --------------------------------------------------------------------------------------------
DTYPES = [torch.bfloat16, torch.float64]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("window", [0, 40])
def test_the_kernels_give_their_split_order_bit_for_bit_and_the_naive_attention_within_rounding(dtype, window):
    q, keys, values, meta = _case(1, dtype)
    got = _kernel(q, keys, values, meta, window=window)
    want = _split_order(q, keys, values, meta, window=window)
    assert torch.equal(got, want), f"max diff {(got.double() - want.double()).abs().max()}"
    # bf16: the output's own rounding (8 bits) and the weights' cast before the values' product;
    # float64 inputs: float32 scores and sums.
    naive = naive_attention(q, keys, values, meta, 0.3, window)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    assert torch.allclose(got.double(), naive, atol=tol, rtol=tol)
    # Rounding is visible in bf16 (what a bit-for-bit check there is worth) and not zero in float64.
    assert (got.double() != naive).any()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_long_sequence_combines_more_splits_than_one_unrolled_pass_in_split_order(dtype):
    """The combine reads its splits several at a time (``UNROLL``): sequences holding 9 and 10 splits
    (two passes, the second mostly past the sequence; the ninth split holds one key) and exactly 8
    (one full pass) sum in the split order, bit for bit."""
    q, keys, values, meta = _case(4, dtype, starts=[8 * pa.SPLIT - ROWS + 1, 600, 8 * pa.SPLIT - ROWS],
                                  table_pages=PAGES - 1)
    assert [-(-(int(s) + ROWS) // pa.SPLIT) for s in meta.start] == [9, 10, 8]
    got = _kernel(q, keys, values, meta)
    want = _split_order(q, keys, values, meta)
    assert torch.equal(got, want), f"max diff {(got.double() - want.double()).abs().max()}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_static_cache_gives_the_pools_bits(dtype):
    q, keys, values, meta = _case(2, dtype)
    s = 1
    pooled = pa.PagedMeta(meta.table[s:s + 1], meta.start[s:s + 1], meta.block[s:s + 1], meta.positions[s:s + 1])
    static = _kernel(*_static(q, keys, values, meta, s))
    assert torch.equal(static, _kernel(q[s:s + 1], keys, values, pooled))
    assert torch.equal(static, _split_order(*_static(q, keys, values, meta, s)))


# -- batch invariance and its negative controls --------------------------------------------------------------
def _invariant(attention, dtype) -> bool:
    """Whether every sequence of a launch gets the bits it gets alone, in the middle of another
    company (other sequences, another order) and with a wider page table."""
    q, keys, values, meta = _case(3, dtype)
    together = attention(q, keys, values, meta)
    b = q.shape[0]
    for s in range(b):
        alone = pa.PagedMeta(meta.table[s:s + 1], meta.start[s:s + 1], meta.block[s:s + 1], meta.positions[s:s + 1])
        if not torch.equal(attention(q[s:s + 1], keys, values, alone)[0], together[s]):
            return False
    order = [b - 1 - i for i in range(b)]
    shuffled = pa.PagedMeta(meta.table[order], meta.start[order], meta.block[order], meta.positions[order])
    if not torch.equal(attention(q[order], keys, values, shuffled), together[order]):
        return False
    wider = torch.cat([meta.table, meta.table.flip(1)], 1)  # pages past a sequence's length are never read
    return torch.equal(attention(q, keys, values, pa.PagedMeta(wider, meta.start, meta.block, meta.positions)),
                       together)


def _split_follows_the_batch(q, keys, values, meta):
    """Flash-decoding's launch heuristic: fewer sequences, more splits (to fill the GPU)."""
    split = pa.PAGE if q.shape[0] == 1 else 2 * pa.PAGE
    original = pa.SPLIT
    pa.SPLIT = split
    try:
        return _kernel(q, keys, values, meta)
    finally:
        pa.SPLIT = original


def _reads_a_neighbours_page(q, keys, values, meta):
    """The last split of a sequence reads its page from the next sequence's table row."""
    real = paged_triton.split_kernel
    source = inspect.getsource(real.fn).replace("page = tl.load(TABLE + b * stb + first // PAGE_SIZE)",
                              "page = tl.load(TABLE + ((b + (split == (end - 1) // SPLIT_SIZE)) % (tl.num_programs(0) // KV_HEADS))"
                              " * stb + first // PAGE_SIZE)")
    assert "(end - 1) // SPLIT_SIZE))" in source
    paged_triton.split_kernel = _jit(source)
    try:
        return _kernel(q, keys, values, meta)
    finally:
        paged_triton.split_kernel = real


def _jit(source: str):
    """A variant of a kernel from its edited source (a file of its own: Triton reads a kernel's source)."""
    import importlib.util
    import tempfile

    path = os.path.join(tempfile.mkdtemp(), "variant_kernel.py")
    with open(path, "w") as f:
        f.write("import triton\nimport triton.language as tl\n\n\n" + source)
    spec = importlib.util.spec_from_file_location("variant_kernel", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.split_kernel


VARIANTS = {"kernel": _kernel, "split follows the batch": _split_follows_the_batch,
            "reads a neighbour's page": _reads_a_neighbours_page}


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_invariance_check_passes_the_kernel_and_catches_the_broken_variants(variant):
    assert _invariant(VARIANTS[variant], torch.bfloat16) == (variant == "kernel")


def test_the_kernel_is_batch_invariant_in_float64():
    assert _invariant(_kernel, torch.float64)
