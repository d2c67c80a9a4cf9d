"""Growing a draft tree best first by estimated path probability (SuffixDecoding's speculation
tree, Sequoia's "most likely nodes first"), shared by the drafters that score candidates without
a model forward."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable

from specdec.types import Draft

MIN_PATH = 0.02  # nodes less likely than this to be reached add nothing worth a verified row
# Most nodes a tree grows: every node costs a verified row and a tree's branches share its few
# likely tokens, so past this a tree only costs drafting time (a chain may go longer: copying).
MAX_TREE_NODES = 16

# path (draft tokens from the root) -> candidates (token, P(accepted | parent accepted), features), best first
Expand = Callable[[list[int]], list[tuple[int, float, Hashable]]]


def best_first_tree(expand: Expand, k: int, width: int, min_path: float = MIN_PATH) -> tuple[Draft, list]:
    """Pop the likeliest candidate, add its children, until ``k`` nodes (at most
    :data:`MAX_TREE_NODES`); every prefix of the result is the best tree of its size, so a policy
    can keep the size that pays. The draft, and each node's features (for the drafter's notes).

    Siblings are disjoint events (the target picks one token), so estimates that add up past 1
    are scaled down together.
    """
    tokens: list[int] = []
    parents: list[int] = []
    confidence: list[float] = []
    features: list = []
    paths: list[list[int]] = []
    heap: list[tuple[float, int, int, int, Hashable, float]] = []
    order = 0

    def push(parent: int, path: list[int], reach: float) -> None:
        nonlocal order
        found = expand(path)[:width]
        total = sum(est for _, est, _ in found)
        scale = min(1.0, 1.0 / total) if total > 0 else 1.0
        for token, est, feats in found:
            conf = est * scale
            if reach * conf >= min_path:
                heapq.heappush(heap, (-reach * conf, order, parent, token, feats, conf))
                order += 1

    k = min(k, MAX_TREE_NODES)
    push(-1, [], 1.0)
    while heap and len(tokens) < k:
        neg, _, parent, token, feats, conf = heapq.heappop(heap)
        path = (paths[parent] if parent >= 0 else []) + [token]
        tokens.append(token)
        parents.append(parent)
        confidence.append(conf)
        features.append(feats)
        paths.append(path)
        push(len(tokens) - 1, path, -neg)
    return Draft(tokens, confidence=confidence, parents=parents or None), features


def best_chain(expand: Expand, k: int, min_path: float = MIN_PATH) -> tuple[Draft, list]:
    """The chain of best candidates, up to ``k`` tokens or until it is unlikely to be reached, and
    each token's features (for the drafter's notes)."""
    tokens: list[int] = []
    confidence: list[float] = []
    features: list = []
    reach = 1.0
    while len(tokens) < k:
        found = expand(tokens)
        if not found:
            break
        token, est, feats = found[0]
        reach *= est
        if reach < min_path and tokens:
            break
        tokens.append(token)
        confidence.append(est)
        features.append(feats)
    return Draft(tokens, confidence=confidence), features
