"""Per-shape choice of matmul kernel for the few rows that decoding and verification produce.

On CPUs PyTorch's ``F.linear`` can be efficient for one row (a GEMV) but slow on its small-M GEMM
path: for a large fp32 LM head, 2-8 rows may cost several one-row forwards through ``F.linear``
while the same product written ``W @ h.T`` costs far less (measured numbers: the benchmarks page
of the documentation). Since speculative decoding lives on forwards of 2-16 tokens, that gap
decides whether verification pays, and which formulation wins differs by shape and machine.

:func:`tune` times the candidate formulations of every distinct weight shape of a model for each
row count up to ``MAX_ROWS`` (over all layers of that shape in turn, so caches are as cold as in a
real forward). :func:`install` swaps each plain ``nn.Linear`` for a :class:`TunedLinear` sharing
its parameters (gpt-fast's quantize.py swaps modules the same way) and returns a handle that puts
the originals back. All candidates compute the same product; only the summation order, hence the
last bits, may differ. specdec tunes only models it loaded itself.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from specdec.cache import JsonCache

MAX_ROWS = 16
ROWS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16)  # measured; other counts use the nearest smaller one
MARGIN = 0.93  # an alternative must beat F.linear by 7% to be chosen: noise must not flip choices

Choices = dict[tuple[int, int], list[str]]  # (out, in) -> kernel name per row count (index = rows)


def _linear(w: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    return F.linear(h, w)


def _transposed(w: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    return (w @ h.t()).t()


def _pair_linear(w: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    return F.linear(torch.cat([h, h]), w)[: h.shape[0]]


def _pair_transposed(w: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    return (w @ torch.cat([h, h]).t())[:, : h.shape[0]].t()


KERNELS = {"linear": _linear, "transposed": _transposed, "pair-linear": _pair_linear,
           "pair-transposed": _pair_transposed}


def _candidates(rows: int) -> list[str]:
    # Computing one row as two only makes sense for one row.
    return list(KERNELS) if rows == 1 else ["linear", "transposed"]


def _plain_linears(model: torch.nn.Module):
    """(parent, attribute, module) for every module whose type is exactly ``nn.Linear``.

    Subclasses (quantized or LoRA linears, say) have forwards of their own and are left alone.
    """
    for parent in model.modules():
        for name, child in parent.named_children():
            if type(child) is torch.nn.Linear:
                yield parent, name, child


def tune(model: torch.nn.Module, repeats: int = 3) -> Choices:
    """Measure every candidate kernel per weight shape and row count; return the fastest."""
    groups: dict[tuple[int, int], list[torch.Tensor]] = defaultdict(list)
    seen: set[int] = set()
    for _, _, mod in _plain_linears(model):
        if id(mod.weight) not in seen:
            seen.add(id(mod.weight))
            groups[tuple(mod.weight.shape)].append(mod.weight)
    choices: Choices = {}
    with torch.inference_mode():
        for shape, weights in groups.items():
            best: dict[int, str] = {}
            for rows in ROWS:
                h = torch.randn(rows, shape[1], dtype=weights[0].dtype)
                names = _candidates(rows)
                samples: dict[str, list[float]] = {n: [] for n in names}
                for _ in range(repeats + 1):  # the first round is a warm-up
                    for name in names:
                        fn = KERNELS[name]
                        t0 = time.perf_counter()
                        for w in weights:
                            fn(w, h)
                        samples[name].append(time.perf_counter() - t0)
                med = {n: statistics.median(v[1:]) for n, v in samples.items()}
                fastest = min(med, key=med.get)
                best[rows] = fastest if med[fastest] < MARGIN * med["linear"] else "linear"
            choices[shape] = [best[max(r for r in ROWS if r <= n)] if n else "linear"
                              for n in range(MAX_ROWS + 1)]
    return choices


class TunedLinear(torch.nn.Linear):
    """An ``nn.Linear`` (same parameters, same state-dict keys) that picks its kernel by row count."""

    def __init__(self, original: torch.nn.Linear, table: list[str]) -> None:
        torch.nn.Module.__init__(self)  # no fresh parameters: share the original's
        self.in_features, self.out_features = original.in_features, original.out_features
        self.weight = original.weight
        self.bias = original.bias
        self.table = table

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.reshape(-1, x.shape[-1])
        rows = h.shape[0]
        if rows >= len(self.table) or self.table[rows] == "linear":
            return F.linear(x, self.weight, self.bias)
        out = KERNELS[self.table[rows]](self.weight, h)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], out.shape[-1])


@dataclass
class Installed:
    """What :func:`install` swapped; :meth:`undo` restores the original modules."""

    swaps: list[tuple[torch.nn.Module, str, torch.nn.Linear]] = field(default_factory=list)

    def undo(self) -> None:
        for parent, name, original in reversed(self.swaps):
            setattr(parent, name, original)
        self.swaps.clear()


def install(model: torch.nn.Module, choices: Choices) -> Installed:
    """Swap each plain ``nn.Linear`` of ``model`` for a :class:`TunedLinear` with its shape's choices."""
    handle = Installed()
    for parent, name, mod in list(_plain_linears(model)):
        table = choices.get(tuple(mod.weight.shape))
        if table is not None:
            setattr(parent, name, TunedLinear(mod, table))
            handle.swaps.append((parent, name, mod))
    return handle


def tuned(model: torch.nn.Module, key: str) -> Choices:
    """:func:`tune`'s result for ``key`` (model, dtype, machine), measured once and cached as JSON."""
    cache = JsonCache("kernels", key)
    choices = cache.load(_parse_choices)
    if choices is None:
        choices = tune(model)
        cache.store({f"{o}x{i}": table for (o, i), table in choices.items()})
    return choices


def _parse_choices(raw) -> Choices:
    choices = {tuple(int(x) for x in shape.split("x")): list(table) for shape, table in raw.items()}
    if any(len(shape) != 2 or len(t) != MAX_ROWS + 1 or not set(t) <= set(KERNELS) for shape, t in choices.items()):
        raise ValueError("not a kernel table")
    return choices
