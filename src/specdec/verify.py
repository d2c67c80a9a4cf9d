"""Verification of a draft (a chain or a tree) against the target's logits.

Two rules, both lossless:

* **By the target's choice** (greedy, and the default "coupled" sampling): the target's token at
  each position is a deterministic function of its logits and the (seed, position) noise
  (:class:`specdec.sampling.Sampler`); a draft token is kept exactly when it equals that token, and
  in a tree the walk follows the child equal to it. The output is then the output of plain
  decoding with the same seed, whatever was drafted. For deterministic drafts this *is* rejection
  sampling: x survives with probability p(x), and a rejection yields p without x, renormalised;
  for several deterministic siblings it is the multi-candidate rule (accept each with the current
  p(x), zero it on rejection, renormalise).
* **Rejection sampling** (Leviathan et al. 2023, Algorithm 1; Chen et al. 2023), for drafts drawn
  from a distribution q with independent noise: accept x with probability min(1, p(x)/q(x)); at
  the first rejection sample from norm(max(0, p - q)); if every token is accepted, sample a bonus
  token from the last p. In a tree whose siblings were drawn i.i.d. from q, the children are tried
  in order, each rejection replacing p by norm(max(0, p - q)) (SpecInfer, Miao et al. 2024).

Names follow the papers: ``p`` is the target, ``q`` the drafter. Logits row 0 belongs to the last
context token (the tree's root); row i + 1 to draft node i.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from specdec import tree as trees
from specdec.sampling import Noise, Sampler
from specdec.types import Draft, Verdict


def verify(
    draft: Draft,
    logits: torch.Tensor,  # [n+1, V] target logits: the last context token, then each draft node
    sampler: Sampler,
    position: int,  # sequence position of the first draft token (the token row 0 predicts)
    record: bool = False,  # also report p(x) and min(1, p/q) of each node (for the trace)
) -> Verdict:
    """Decide which draft tokens to keep and which token the target adds after them."""
    n = len(draft)
    if logits.shape[0] != n + 1:
        raise ValueError(f"expected {n + 1} rows of target logits for {n} draft tokens, got {logits.shape[0]}")
    by_choice = sampler.greedy or sampler.coupled or draft.q is None
    if reads_back_once(logits):
        if by_choice:
            depths = [0] + (trees.depths(draft.parents) if draft.is_tree else list(range(1, n + 1)))
            chosen = sampler.target_tokens(logits, [position + d for d in depths])
            if not draft.is_tree:
                verdict = verify_by_choice(draft.tokens, chosen.__getitem__)
            else:
                verdict = verify_tree_by_choice(draft.tokens, draft.parents, lambda row, depth: chosen[row])
        else:
            p, q = _to_host(sampler.probs(logits), draft.q)
            draft = dataclasses.replace(draft, q=q)
            verdict = (verify_tree_rejection if draft.is_tree else verify_rejection)(draft, p, sampler, position)
    elif not draft.is_tree:
        if by_choice:
            verdict = verify_by_choice(draft.tokens, lambda j: sampler.target_token(logits[j], position + j))
        else:
            verdict = verify_rejection(draft, sampler.probs(logits), sampler, position)
    elif by_choice:
        verdict = verify_tree_by_choice(draft.tokens, draft.parents,
                                        lambda row, depth: sampler.target_token(logits[row], position + depth))
    else:
        verdict = verify_tree_rejection(draft, sampler.probs(logits), sampler, position)
    if record and n:
        _record(verdict, draft, logits, sampler)
    return verdict


def reads_back_once(logits: torch.Tensor) -> bool:
    """Whether a step reads what it needs from ``logits`` in one transfer (the target's token of
    every row, or p and q) and decides on the host: on a GPU, where each value read back waits for
    the device. On a CPU the target's token is computed only as far as the draft survives."""
    return logits.device.type != "cpu"


def verify_by_choice(tokens: list[int], target_token: Callable[[int], int]) -> Verdict:
    """Keep the longest prefix equal to the target's own tokens, then add the target's token.

    ``target_token(j)`` is the target's token at draft position j; it is asked only up to the
    first disagreement, so a seeded sampler draws noise for no more positions than it uses.
    """
    n = 0
    while True:
        chosen = target_token(n)
        if n < len(tokens) and tokens[n] == chosen:
            n += 1
            continue
        return Verdict(tokens[:n] + [chosen], n, bonus=n == len(tokens) and n > 0)


def verify_tree_by_choice(tokens: list[int], parents: list[int],
                          target_token: Callable[[int, int], int]) -> Verdict:
    """Walk down from the root along the child equal to the target's token at each depth.

    ``target_token(row, depth)``: the target's token after logits row ``row`` (node row - 1), which
    sits ``depth`` positions after the first draft position.
    """
    kids = trees.children(parents)
    node, path = -1, []
    while True:
        chosen = target_token(node + 1, len(path))
        nxt = next((c for c in kids[node] if tokens[c] == chosen), None)
        if nxt is None:
            return Verdict([tokens[i] for i in path] + [chosen], len(path), bonus=bool(path) and not kids[node],
                           path=path)
        path.append(nxt)
        node = nxt


def verify_rejection(draft: Draft, p: torch.Tensor, sampler: Sampler, position: int) -> Verdict:
    """Rejection sampling; ``p`` is the target distribution ``[k+1, V]`` after the sampling transform.

    Every random number is keyed by its position, so a configuration replays exactly with its seed.
    """
    k, q = len(draft), _check_q(draft, p)
    for j, x in enumerate(draft.tokens):
        u = sampler.noise.uniform(Noise.ACCEPT, position + j)
        # u < p/q written without the division: q(x) > 0 for every token the drafter could have drawn.
        if u * float(q[j, x]) < float(p[j, x]):
            continue
        residual = _residual(p[j], q[j])
        return Verdict(draft.tokens[:j] + [sampler.draw(residual, position + j, Noise.RESIDUAL)], j, bonus=False)
    return Verdict(draft.tokens + [sampler.draw(p[k], position + k, Noise.TARGET)], k, bonus=True)


def verify_tree_rejection(draft: Draft, p: torch.Tensor, sampler: Sampler, position: int) -> Verdict:
    """Multi-candidate rejection sampling over each node's children (SpecInfer).

    Children drawn from q (``draft.q[child]``) are accepted with min(1, p(x)/q(x)) and a rejection
    leaves norm(max(0, p - q)); deterministic children (no q) are accepted with p(x) and a
    rejection zeroes p(x). When every child is rejected the residual is sampled.
    """
    q = _check_q(draft, p)
    kids = trees.children(draft.parents)
    node, path = -1, []
    while True:
        depth = len(path)
        if not kids[node]:
            bonus = sampler.draw(p[node + 1], position + depth, Noise.TARGET)
            return Verdict([draft.tokens[i] for i in path] + [bonus], depth, bonus=bool(path), path=path)
        residual = p[node + 1]
        accepted = None
        for attempt, child in enumerate(kids[node]):
            x = draft.tokens[child]
            q_child = q[child] if q is not None else torch.nn.functional.one_hot(torch.tensor(x), p.shape[-1]).float()
            u = sampler.noise.uniform(Noise.ACCEPT, position + depth, attempt)
            if u * float(q_child[x]) < float(residual[x]):
                accepted = child
                break
            residual = _residual(residual, q_child)
        if accepted is None:
            token = sampler.draw(residual, position + depth, Noise.RESIDUAL)
            return Verdict([draft.tokens[i] for i in path] + [token], depth, bonus=False, path=path)
        path.append(accepted)
        node = accepted


def _to_host(p: torch.Tensor, q: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """p and q on the host in one transfer."""
    if q is None:
        return p.cpu(), None
    both = torch.cat([p, q.to(p.device, p.dtype)]).cpu()
    return both[:len(p)], both[len(p):]


def _residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)); p itself when that is all zero (p <= q everywhere means p == q, where a
    rejection has probability 0: it can only come from rounding)."""
    residual = (p - q).clamp_min(0.0)
    total = residual.sum()
    return p if total <= 0 else residual / total


def _check_q(draft: Draft, p: torch.Tensor) -> torch.Tensor | None:
    q = draft.q
    if q is None and not draft.is_tree:
        raise ValueError("rejection sampling of a chain needs the drafter's q")
    if q is not None and q.shape != (len(draft), p.shape[-1]):
        raise ValueError(f"rejection sampling needs q of shape {(len(draft), p.shape[-1])} in the target's "
                         f"vocabulary, got {tuple(q.shape)}")
    return q


def _record(verdict: Verdict, draft: Draft, logits: torch.Tensor, sampler: Sampler) -> None:
    parents = draft.parents if draft.parents is not None else trees.chain(len(draft))
    rows = logits[[p + 1 for p in parents]].float()  # each node is scored by its parent's row
    # Greedy decisions are argmax, but the distribution worth showing is the model's softmax.
    p = rows.softmax(-1) if sampler.greedy else sampler.probs(rows)
    p_x = p[torch.arange(len(draft)), torch.tensor(draft.tokens)].tolist()
    q_x = draft.probs if draft.probs else [1.0] * len(draft)
    verdict.target_probs = p_x
    verdict.accept_probs = [min(1.0, a / b) if b > 0 else 0.0 for a, b in zip(p_x, q_x)]
