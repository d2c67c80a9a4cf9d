"""Draft trees as parent arrays: depths, children, paths and the ancestor mask (Medusa's buffers,
built from parents; SpecInfer and Sequoia verify such trees in one target forward).

A tree over n draft nodes is ``parents``: ``parents[i]`` is the index of node i's parent, or -1
when node i follows the context directly. Parents always come before their children, so every
prefix of the nodes is a tree too (drafters emit nodes best-first, and a policy keeps a prefix).
A chain is the tree ``[-1, 0, 1, ...]``; ``None`` stands for a chain wherever a tree is accepted.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

Parents = list[int]


def chain(n: int) -> Parents:
    """The parents of a chain of ``n`` nodes."""
    return list(range(-1, n - 1))


def check(parents: Sequence[int]) -> None:
    """Raise ``ValueError`` unless every node's parent comes before it."""
    for i, p in enumerate(parents):
        if not -1 <= p < i:
            raise ValueError(f"tree node {i} has parent {p}: parents must precede their children")


def is_chain(parents: Sequence[int] | None) -> bool:
    return parents is None or all(p == i - 1 for i, p in enumerate(parents))


def depths(parents: Sequence[int]) -> list[int]:
    """Depth of each node; nodes that follow the context directly have depth 1."""
    out: list[int] = []
    for p in parents:
        out.append(1 if p < 0 else out[p] + 1)
    return out


def path_probabilities(parents: Sequence[int], confidence: Sequence[float]) -> list[float]:
    """P(node and all its ancestors accepted), from each node's conditional acceptance estimate.

    Siblings are disjoint events (the target picks one token), so the expected number of accepted
    tokens of a tree is the sum of these.
    """
    out: list[float] = []
    for i, p in enumerate(parents):
        out.append(confidence[i] * (out[p] if p >= 0 else 1.0))
    return out


def children(parents: Sequence[int]) -> dict[int, list[int]]:
    """Node -> its children in order (-1 for the context's own children)."""
    kids: dict[int, list[int]] = {-1: []}
    for i, p in enumerate(parents):
        kids.setdefault(p, []).append(i)
        kids.setdefault(i, [])
    return kids


def path_to(parents: Sequence[int], node: int) -> list[int]:
    """The nodes from the context's child down to ``node`` (empty for -1)."""
    path: list[int] = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


def leaves(parents: Sequence[int]) -> list[int]:
    kids = children(parents)
    return [i for i in range(len(parents)) if not kids[i]]


def ancestor_mask(parents: Sequence[int]) -> torch.Tensor:
    """``[n, n]`` bool: entry (i, j) is True when node j is node i or one of its ancestors."""
    n = len(parents)
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i, p in enumerate(parents):
        if p >= 0:
            mask[i] = mask[p]
        mask[i, i] = True
    return mask


def subset(parents: Sequence[int], keep: Sequence[int]) -> Parents:
    """The parents of the sub-tree of the nodes ``keep`` (in that order, each parent kept before it)."""
    index = {node: i for i, node in enumerate(keep)}
    out = []
    for node in keep:
        p = parents[node]
        if p >= 0 and p not in index:
            raise ValueError(f"node {node} is kept without its parent {p}")
        out.append(index[p] if p >= 0 else -1)
    return out


def closed_under_ancestors(parents: Sequence[int], drop: set[int]) -> list[int]:
    """The nodes that remain when ``drop`` and all their descendants are removed, in order."""
    removed: set[int] = set()
    for i, p in enumerate(parents):
        if i in drop or p in removed:
            removed.add(i)
    return [i for i in range(len(parents)) if i not in removed]


def judged(parents: Sequence[int], path: Sequence[int]) -> list[tuple[int, bool]]:
    """(node, accepted) for every node verification judged: the children of the root and of each
    accepted node (the one on ``path`` accepted, the others rejected). Deeper nodes were never
    judged on the context they were drafted for."""
    kids = children(parents)
    on_path = set(path)
    out = []
    for node in [-1, *path]:
        out.extend((child, child in on_path) for child in kids[node])
    return out


def first_children(parents: Sequence[int]) -> list[int]:
    """The path that takes the first child at every node, from the root down to a leaf."""
    kids, path, node = children(parents), [], -1
    while kids[node]:
        node = kids[node][0]
        path.append(node)
    return path
