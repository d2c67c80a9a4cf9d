"""Per-shape choice of matmul kernel for the few rows that decoding and verification produce.

On these CPUs PyTorch's ``F.linear`` is efficient for one row (a GEMV) but its small-M GEMM path
is not: in fp32, Gemma's 262144 x 640 LM head takes 57 ms for 1 row and 110-190 ms for 2-8 rows,
while the same product written ``W @ h.T`` takes 21-46 ms for 2-8 rows, and one row computed as
two takes 21 ms. The body's linears show the same pattern on a smaller scale. Since speculative
decoding lives on forwards of 2-16 tokens, that gap decides whether verification pays.

:func:`tune` times the candidate formulations of every distinct weight shape of a model for each
row count up to ``MAX_ROWS`` (over all layers of that shape in turn, so caches are as cold as in a
real forward) and :func:`install` routes each ``nn.Linear`` through the fastest. All candidates
compute the same product; only the summation order, hence the last bits, may differ.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections import defaultdict
from functools import partial

import torch
import torch.nn.functional as F

from specdec.models import cache_root

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


def tune(model: torch.nn.Module, repeats: int = 3) -> Choices:
    """Measure every candidate kernel per weight shape and row count; return the fastest."""
    groups: dict[tuple[int, int], list[torch.Tensor]] = defaultdict(list)
    for mod in model.modules():
        if isinstance(mod, torch.nn.Linear):
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


def install(model: torch.nn.Module, choices: Choices) -> None:
    """Route each ``nn.Linear`` of ``model`` through its shape's chosen kernel (parameters untouched)."""
    for mod in model.modules():
        if isinstance(mod, torch.nn.Linear):
            table = choices.get(tuple(mod.weight.shape))
            if table is not None:
                mod.forward = partial(_dispatch, mod, table)


def uninstall(model: torch.nn.Module) -> None:
    """Back to ``nn.Linear``'s own forward."""
    for mod in model.modules():
        if isinstance(mod, torch.nn.Linear) and "forward" in mod.__dict__:
            del mod.forward


def _dispatch(mod: torch.nn.Linear, table: list[str], x: torch.Tensor) -> torch.Tensor:
    h = x.reshape(-1, x.shape[-1])
    rows = h.shape[0]
    if rows >= len(table) or table[rows] == "linear":
        return F.linear(x, mod.weight, mod.bias)
    out = KERNELS[table[rows]](mod.weight, h)
    if mod.bias is not None:
        out = out + mod.bias
    return out.reshape(*x.shape[:-1], out.shape[-1])


def tuned(model: torch.nn.Module, key: str) -> Choices:
    """:func:`tune`'s result for ``key`` (model, dtype, machine), measured once and cached as JSON."""
    path = cache_root() / "kernels" / f"{''.join(c if c.isalnum() or c in '-._' else '_' for c in key)}.json"
    try:
        raw = json.loads(path.read_text())
        return {tuple(int(x) for x in shape.split("x")): table for shape, table in raw.items()}
    except (OSError, ValueError):
        pass
    choices = tune(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({f"{o}x{i}": table for (o, i), table in choices.items()}))
    os.replace(tmp, path)
    return choices
