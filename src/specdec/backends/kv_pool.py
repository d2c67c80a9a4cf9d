"""One pool of KV-cache pages on a device for every sequence a server runs, within a memory budget.

Every layer's keys and values are ``[pages, PAGE, kv_heads, head_dim]``, allocated once: memory is
the same after the thousandth request as after the first, and a request that does not fit waits
for pages instead of failing with an out-of-memory error. A sequence takes the pages its prompt
and answer need when it starts (:meth:`KVPool.take`, all or nothing) and gives them back when it
ends. Page 0 is never handed out: the empty slots of a padded batch write their rows there.
Requests waiting for pages are served in arrival order (a small one never overtakes a large one
ahead of it), and a waiting request whose client left (``cancelled``) leaves the line.

The budget is ``--kv-memory``: bytes (``8GiB``, ``512MiB``, ``2000000000``) or a fraction of the
device's memory (``0.3``); by default what the slots can use at most (every slot at the model's
context), capped at :data:`DEFAULT_FRACTION` of the memory free after the weights loaded, which
leaves the rest for the compile, the graphs and a tick's logits.
"""

from __future__ import annotations

import re
import threading
import time
from collections import deque
from collections.abc import Iterable

import torch

from specdec.backends.paged_attention import PAGE
from specdec.errors import SpecdecError

DEFAULT_FRACTION = 0.5  # of the device memory free after loading, at most, by default
POLL_S = 0.05  # how often a waiting request looks whether it was cancelled
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}


def kv_shape(config) -> tuple[int, int, int]:
    """(layers, kv heads, head dim) of a transformers config."""
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return config.num_hidden_layers, heads, head_dim


def page_bytes(config, dtype: torch.dtype) -> int:
    """Bytes of one page of keys and values over every layer."""
    layers, heads, head_dim = kv_shape(config)
    return 2 * layers * PAGE * heads * head_dim * torch.empty(0, dtype=dtype).element_size()


def parse_budget(text: str | float | int) -> tuple[int | None, float | None]:
    """``(bytes, None)`` or ``(None, fraction)`` from ``--kv-memory``'s value, or a clear error."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        text = str(text)
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise SpecdecError(f"--kv-memory takes bytes (8GiB, 512MiB, 2000000000) or a fraction of the device's "
                           f"memory (0.3), got {text!r}")
    value = float(match.group(1))
    if not unit and value < 1:
        if value <= 0:
            raise SpecdecError(f"--kv-memory must be more than 0, got {text!r}")
        return None, value
    return int(value * _UNITS[unit]), None


def forward_scratch(config, dtype: torch.dtype, sequences: int, rows: int, width: int,
                    logit_rows: int | None = None) -> int:
    """Bytes a forward of ``sequences`` x ``rows`` rows over ``width`` key slots each allocates at
    most besides the KV pages, whichever attention runs it: the reference attention's float32
    scores (a few live at once), masks and gathered keys and values; the Triton kernel's per-split
    sums; the layers' activations (float32 at most); the logits of ``logit_rows`` rows (default: all)
    in the model's type, in float32 and a tick's copy of them. An upper bound, not a measurement:
    tests/test_gpu_batch.py counts what the forwards allocate against it."""
    layers, kv_heads, head_dim = kv_shape(config)
    heads = config.num_attention_heads
    element = torch.empty(0, dtype=dtype).element_size()
    hidden = config.hidden_size
    inner = getattr(config, "intermediate_size", None) or 4 * hidden
    n = sequences * rows
    score = max(4, element)  # float32 scores, or the model's type where wider
    reference = sequences * width * (4 * heads * rows * score + 2 * kv_heads * head_dim * element + 8 * rows + 32)
    splits = -(-width // PAGE)
    m = max(16, 1 << (heads // kv_heads * rows - 1).bit_length())
    kernel = sequences * kv_heads * splits * m * (head_dim + 2) * 4
    activations = n * (12 * hidden + 4 * inner + 4 * heads * head_dim) * score
    logits = (n if logit_rows is None else logit_rows) * config.vocab_size * (element + 2 * score)
    return reference + kernel + activations + logits


def prefill_chunk(config, dtype: torch.dtype, width: int, room: int, most: int, step: int = 16) -> int:
    """The most prompt rows a prefill forward may take (a multiple of ``step``, at most ``most``)
    whose scratch over ``width`` key slots fits in ``room`` bytes; at least ``step``."""
    chunk = most
    while chunk > step and forward_scratch(config, dtype, 1, chunk, width, logit_rows=1) > room:
        chunk = max(step, chunk // 2 // step * step)
    return chunk


def budget_pages(config, dtype: torch.dtype, device: torch.device, slots: int, tokens_per_slot: int,
                 kv_memory: str | None = None, scratch: int = 0) -> int:
    """Pages of the pool (page 0 included) for ``slots`` sequences of up to ``tokens_per_slot``
    slots each, within the budget less ``scratch`` bytes (what the forwards allocate besides the
    pages; see the module)."""
    size = page_bytes(config, dtype)
    most = slots * -(-tokens_per_slot // PAGE) + 1  # more could never be used at once
    if kv_memory is None:
        if device.type != "cuda":
            return most
        free, _ = torch.cuda.mem_get_info(device)
        return max(2, min(most, (int(free * DEFAULT_FRACTION) - scratch) // size))
    amount = budget_bytes(kv_memory, device)
    pages = (amount - scratch) // size
    if pages < 2:
        raise SpecdecError(f"--kv-memory {kv_memory} holds no page of {PAGE} tokens ({size} bytes each) beside "
                           f"the {scratch} bytes its forwards need (its logits, attention and activations)")
    return min(pages, most)


def budget_bytes(kv_memory: str, device: torch.device) -> int:
    """``--kv-memory`` in bytes (a fraction: of the GPU's memory)."""
    amount, fraction = parse_budget(kv_memory)
    if fraction is not None:
        if device.type != "cuda":
            raise SpecdecError("--kv-memory as a fraction needs a GPU: give bytes (e.g. 2GiB) on a CPU")
        amount = int(torch.cuda.get_device_properties(device).total_memory * fraction)
    return amount


class KVPool:
    """The pages, and who holds them (see the module). Thread-safe."""

    def __init__(self, config, pages: int, device: torch.device, dtype: torch.dtype) -> None:
        if pages < 2:
            raise SpecdecError(f"a KV pool needs at least 2 pages, got {pages}")
        layers, heads, head_dim = kv_shape(config)
        self.pages = pages
        self.page_bytes = page_bytes(config, dtype)
        with torch.inference_mode(False):  # written in and out of inference mode
            self.keys = [torch.zeros(pages, PAGE, heads, head_dim, device=device, dtype=dtype) for _ in range(layers)]
            self.values = [torch.zeros(pages, PAGE, heads, head_dim, device=device, dtype=dtype) for _ in range(layers)]
        self._free = list(range(pages - 1, 0, -1))  # page 0 is the empty slots' scratch
        self._line: deque[object] = deque()  # the callers waiting for pages, in arrival order
        self._cond = threading.Condition()

    @property
    def capacity(self) -> int:
        """Pages a sequence can hold at most (all but the scratch page)."""
        return self.pages - 1

    @property
    def free(self) -> int:
        with self._cond:
            return len(self._free)

    def fits(self, count: int) -> None:
        """Refuse ``count`` pages that the pool could never give at once."""
        if count > self.capacity:
            raise SpecdecError(f"this request needs {count * PAGE} tokens of KV cache; the pool holds "
                               f"{self.capacity * PAGE} (--kv-memory, or ask for fewer tokens)")

    def take(self, count: int, timeout: float | None = None,
             cancelled: threading.Event | None = None) -> list[int]:
        """``count`` pages, waiting in line (up to ``timeout`` seconds; None: as long as it takes)
        until that many are free and every earlier caller was served; all or nothing. A caller whose
        ``cancelled`` is set while it waits leaves the line with a :class:`SpecdecError`."""
        self.fits(count)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            ticket = object()
            self._line.append(ticket)
            try:
                while self._line[0] is not ticket or len(self._free) < count:
                    if cancelled is not None and cancelled.is_set():
                        raise SpecdecError("the request was cancelled while it waited for KV cache pages")
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        raise SpecdecError(f"the KV pool has {len(self._free)} free pages, {count} needed")
                    if cancelled is not None:
                        left = POLL_S if left is None else min(left, POLL_S)
                    self._cond.wait(left)
                taken, self._free = self._free[-count:][::-1] if count else [], self._free[:len(self._free) - count]
                return taken
            finally:
                self._line.remove(ticket)
                self._cond.notify_all()  # the next in line may fit now

    def give(self, pages: Iterable[int]) -> None:
        pages = list(pages)
        if not pages:
            return
        with self._cond:
            self._free.extend(reversed(pages))
            self._cond.notify_all()


def split_budget(kv_memory: str, device: torch.device, models: list[tuple[object, torch.dtype]]) -> list[str]:
    """One ``--kv-memory`` shared by the pools of several models that serve the same requests (a
    target and its draft model): each its share in bytes, in proportion to the KV bytes a token
    takes in it, so that every pool holds as many tokens as the others."""
    amount = budget_bytes(kv_memory, device)
    sizes = [page_bytes(config, dtype) for config, dtype in models]
    return [str(amount * size // sum(sizes)) for size in sizes]
