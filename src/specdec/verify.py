"""Verification of a chain draft against the target's logits: greedy match and rejection sampling.

Rejection sampling follows Leviathan et al. 2023 (Algorithm 1) and Chen et al. 2023: accept draft
token x with probability min(1, p(x)/q(x)); at the first rejection sample from
norm(max(0, p - q)); if every token is accepted, sample a bonus token from the last p. Variable
names follow the papers: ``p`` is the target, ``q`` the drafter.
"""

from __future__ import annotations

import torch

from specdec.sampling import SamplingParams, logits_to_probs, sample
from specdec.types import Draft, Verdict


def verify(
    draft: Draft,
    logits: torch.Tensor,  # [k+1, V] target logits after the last context token and each draft token
    params: SamplingParams,
    generator: torch.Generator | None = None,
) -> Verdict:
    """Decide which draft tokens to keep and which token the target adds after them."""
    k = len(draft)
    if logits.shape[0] != k + 1:
        raise ValueError(f"expected {k + 1} rows of target logits for {k} draft tokens, got {logits.shape[0]}")
    if params.greedy:
        return verify_greedy(draft.tokens, logits)
    if generator is None:
        raise ValueError("sampling verification needs a torch.Generator")
    return verify_sampling(draft, logits_to_probs(logits, params), generator)


def verify_greedy(tokens: list[int], logits: torch.Tensor) -> Verdict:
    """Keep the longest prefix equal to the target's argmax, then add the target's argmax."""
    target = logits.argmax(-1).tolist()  # [k+1]
    n = 0
    while n < len(tokens) and tokens[n] == target[n]:
        n += 1
    return Verdict(tokens[:n] + [target[n]], n, bonus=n == len(tokens) and n > 0)


def verify_sampling(draft: Draft, p: torch.Tensor, generator: torch.Generator) -> Verdict:
    """Rejection sampling; ``p`` is the target distribution ``[k+1, V]`` after the sampling transform."""
    k = len(draft)
    if k == 0:
        return Verdict([sample(p[0], generator)], 0, bonus=False)
    q = None if draft.q is None else _match_vocab(draft.q, p.shape[-1])  # [k, V]
    x = torch.tensor(draft.tokens)
    p_x = p[torch.arange(k), x]  # [k]
    q_x = torch.ones(k) if q is None else q[torch.arange(k), x]  # [k]
    u = torch.rand(k, generator=generator)
    # u < p/q written without the division: q(x) > 0 for every token the drafter could have drawn.
    accepted = (u * q_x < p_x).tolist()
    n = accepted.index(False) if False in accepted else k
    if n == k:
        return Verdict(draft.tokens + [sample(p[k], generator)], k, bonus=True)
    if q is None:
        residual = p[n].clone()
        residual[draft.tokens[n]] = 0.0  # max(0, p - onehot(x))
    else:
        residual = (p[n] - q[n]).clamp_min(0.0)
    total = residual.sum()
    # A zero residual means p <= q everywhere, i.e. p == q, where a rejection has probability 0; it
    # can only come from rounding, and then p itself is the right distribution.
    residual = p[n] if total <= 0 else residual / total
    return Verdict(draft.tokens[:n] + [sample(residual, generator)], n, bonus=False)


def _match_vocab(q: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Same tokenizer, differently padded embedding tables: ids past either end have no mass."""
    if q.shape[-1] > vocab_size:
        return q[..., :vocab_size]
    if q.shape[-1] < vocab_size:
        return torch.nn.functional.pad(q, (0, vocab_size - q.shape[-1]))
    return q
