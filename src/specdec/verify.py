"""Verification of a chain draft against the target's logits.

Two rules, both lossless:

* **By the target's choice** (greedy, and the default "coupled" sampling): the target's token at
  each position is a deterministic function of its logits and the (seed, position) noise
  (:class:`specdec.sampling.Sampler`); a draft token is kept exactly when it equals that token.
  The output is then the output of plain decoding with the same seed, whatever was drafted. For a
  deterministic draft this is rejection sampling itself: x survives with probability p(x), and a
  rejection yields p without x, renormalised.
* **Rejection sampling** (Leviathan et al. 2023, Algorithm 1; Chen et al. 2023), for drafts drawn
  from a distribution q with independent noise: accept x with probability min(1, p(x)/q(x)); at
  the first rejection sample from norm(max(0, p - q)); if every token is accepted, sample a bonus
  token from the last p. Names follow the papers: ``p`` is the target, ``q`` the drafter.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from specdec.sampling import Noise, Sampler
from specdec.types import Draft, Verdict


def verify(
    draft: Draft,
    logits: torch.Tensor,  # [k+1, V] target logits after the last context token and each draft token
    sampler: Sampler,
    position: int,  # sequence position of the first draft token (the token row 0 predicts)
    record: bool = False,  # also report p(x) and min(1, p/q) of each judged token (for the trace)
) -> Verdict:
    """Decide which draft tokens to keep and which token the target adds after them."""
    k = len(draft)
    if logits.shape[0] != k + 1:
        raise ValueError(f"expected {k + 1} rows of target logits for {k} draft tokens, got {logits.shape[0]}")
    if sampler.greedy or sampler.coupled or draft.q is None:
        verdict = verify_by_choice(draft.tokens, lambda j: sampler.target_token(logits[j], position + j))
    else:
        verdict = verify_rejection(draft, sampler.probs(logits), sampler, position)
    if record and k:
        _record(verdict, draft, logits, sampler)
    return verdict


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


def verify_rejection(draft: Draft, p: torch.Tensor, sampler: Sampler, position: int) -> Verdict:
    """Rejection sampling; ``p`` is the target distribution ``[k+1, V]`` after the sampling transform.

    Every random number is keyed by its position, so a configuration replays exactly with its seed.
    """
    k, q = len(draft), draft.q
    if q is None or q.shape != (k, p.shape[-1]):
        raise ValueError(f"rejection sampling needs q of shape {(k, p.shape[-1])} in the target's vocabulary, "
                         f"got {None if q is None else tuple(q.shape)}")
    for j, x in enumerate(draft.tokens):
        u = sampler.noise.uniform(Noise.ACCEPT, position + j)
        # u < p/q written without the division: q(x) > 0 for every token the drafter could have drawn.
        if u * float(q[j, x]) < float(p[j, x]):
            continue
        residual = (p[j] - q[j]).clamp_min(0.0)
        total = residual.sum()
        # A zero residual means p <= q everywhere, i.e. p == q, where a rejection has probability 0;
        # it can only come from rounding, and then p itself is the right distribution.
        residual = p[j] if total <= 0 else residual / total
        return Verdict(draft.tokens[:j] + [sampler.draw(residual, position + j, Noise.RESIDUAL)], j, bonus=False)
    return Verdict(draft.tokens + [sampler.draw(p[k], position + k, Noise.TARGET)], k, bonus=True)


def _record(verdict: Verdict, draft: Draft, logits: torch.Tensor, sampler: Sampler) -> None:
    judged = min(verdict.num_accepted + 1, len(draft))
    rows = logits[:judged].float()
    # Greedy decisions are argmax, but the distribution worth showing is the model's softmax.
    p = rows.softmax(-1) if sampler.greedy else sampler.probs(rows)
    p_x = p[torch.arange(judged), torch.tensor(draft.tokens[:judged])].tolist()
    q_x = draft.probs[:judged] if draft.probs else [1.0] * judged
    verdict.target_probs = p_x
    verdict.accept_probs = [min(1.0, a / b) if b > 0 else 0.0 for a, b in zip(p_x, q_x)]
