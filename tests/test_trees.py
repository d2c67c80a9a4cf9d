"""Draft trees: the parent-array helpers, tree verification, the toy backend's tree forward, and
exactness of tree speculation against plain decoding (greedy, and seeded sampling)."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import specdec.engine
from conftest import chi_square_pvalue, sequence_distribution
from specdec import tree as trees
from specdec.backends.toy import ToyLM
from specdec.drafters.base import Drafter
from specdec.engine import DecodeConfig, decode
from specdec.policies.fixed import FixedK
from specdec.sampling import SamplingParams, logits_to_probs
from specdec.types import Draft, Verdict
from specdec.verify import verify, verify_tree_by_choice


# -- the helpers -----------------------------------------------------------------------------------
def test_parent_array_helpers():
    parents = [-1, 0, 0, -1, 1, 4]
    assert trees.depths(parents) == [1, 2, 2, 1, 3, 4]
    assert trees.children(parents) == {-1: [0, 3], 0: [1, 2], 1: [4], 2: [], 3: [], 4: [5], 5: []}
    assert trees.path_to(parents, 5) == [0, 1, 4, 5] and trees.path_to(parents, -1) == []
    assert trees.leaves(parents) == [2, 3, 5]
    assert trees.subset(parents, [0, 2, 3]) == [-1, 0, -1]
    with pytest.raises(ValueError, match="without its parent"):
        trees.subset(parents, [0, 4])
    assert trees.closed_under_ancestors(parents, {1}) == [0, 2, 3]
    assert trees.path_probabilities(parents, [0.5, 0.5, 0.2, 0.4, 1.0, 0.5]) == [0.5, 0.25, 0.1, 0.4, 0.25, 0.125]
    assert trees.is_chain([-1, 0, 1]) and not trees.is_chain(parents)
    with pytest.raises(ValueError):
        trees.check([-1, 2, 0])


def test_ancestor_mask():
    mask = trees.ancestor_mask([-1, 0, 0, 1])
    assert mask.tolist() == [[True, False, False, False], [True, True, False, False],
                             [True, False, True, False], [True, True, False, True]]


# -- verification ----------------------------------------------------------------------------------
def test_tree_walk_follows_the_targets_choice():
    tokens, parents = [5, 6, 7, 8], [-1, -1, 1, 1]  # two roots; 6 has children 7 and 8
    wanted = {0: 6, 2: 8, 4: 3}  # row -> the target's token (row = node + 1)
    v = verify_tree_by_choice(tokens, parents, lambda row, depth: wanted[row])
    assert (v.tokens, v.path, v.num_accepted, v.bonus) == ([6, 8, 3], [1, 3], 2, True)  # 8 is a leaf
    v = verify_tree_by_choice(tokens, parents, lambda row, depth: {0: 6, 2: 9}[row])
    assert (v.tokens, v.path, v.bonus) == ([6, 9], [1], False)  # 6 accepted, its children both wrong


def test_a_tree_draft_on_a_chain_only_backend_falls_back_to_its_best_path():
    class ChainOnly(type(ToyLM(4).backend())):
        supports_tree = False

    lm = ToyLM(8, 2, seed=1)
    plain = decode(lm.backend(), [1, 2], DecodeConfig(max_new_tokens=12)).token_ids
    drafter = RandomTreeDrafter([1, 2] + plain, 8, right=True, seed=0)
    out = decode(ChainOnly(lm), [1, 2], DecodeConfig(max_new_tokens=12), drafter, FixedK(6))
    assert out.token_ids == plain
    assert all(step.parents is None for step in out.trace)


# -- drafters that make trees ------------------------------------------------------------------------
class RandomTreeDrafter(Drafter):
    """A random tree; with ``right`` one branch is the true continuation (from ``reference``), else
    no node at depth 1 is right."""

    def __init__(self, reference: Sequence[int], vocab: int, right: bool, seed: int) -> None:
        self.reference, self.vocab, self.right = list(reference), vocab, right
        self.rng = random.Random(seed)
        self.truth_lengths: list[int] = []

    def propose(self, tokens, k, stop=None) -> Draft:
        truth = self.reference[len(tokens):len(tokens) + self.rng.randint(1, k)]
        self.truth_lengths.append(len(truth) if self.right else 0)
        parents, out = [], []
        on_path = -1
        for depth, tok in enumerate(truth if self.right else []):  # the true branch, interleaved below
            parents.append(on_path)
            out.append(tok)
            on_path = len(out) - 1
        while len(out) < k:
            p = self.rng.randrange(-1, len(out))
            siblings = {out[c] for c in range(len(out)) if parents[c] == p}
            tok = self.rng.randrange(self.vocab)
            if tok in siblings or (p == -1 and not self.right and truth and tok == truth[0]):
                if len(siblings) >= self.vocab - 1:
                    break
                continue
            parents.append(p)
            out.append(tok)
        order = _best_first(parents)  # parents before children, in a shuffled but valid order
        return Draft([out[i] for i in order], parents=trees.subset(parents, order),
                     confidence=[self.rng.random() for _ in order])


def _best_first(parents: list[int]) -> list[int]:
    ready, order, placed = [i for i, p in enumerate(parents) if p == -1], [], set()
    rng = random.Random(len(parents))
    while ready:
        node = ready.pop(rng.randrange(len(ready)))
        order.append(node)
        placed.add(node)
        ready += [i for i, p in enumerate(parents) if p == node]
    return order


class SampledTreeDrafter(Drafter):
    """SpecInfer-style: at each node ``width`` children drawn i.i.d. from the draft model's q."""

    def __init__(self, lm: ToyLM, width: int = 2, depth: int = 2) -> None:
        self.lm, self.width, self.depth = lm, width, depth

    def propose(self, tokens, k, stop=None) -> Draft:
        tokens = list(tokens)
        out, parents, qs = [], [], []
        frontier = [(-1, [])]
        for depth in range(self.depth):
            nxt = []
            for node, path in frontier:
                q = logits_to_probs(self.lm.logits(tokens + path), self.params)
                for w in range(self.width):
                    if len(out) == k:
                        break
                    rng = np.random.Generator(np.random.PCG64([self.sampler.seed, 99, len(tokens), node + 1, w]))
                    tok = int(rng.choice(len(q), p=(q.double() / q.double().sum()).numpy()))
                    out.append(tok)
                    parents.append(node)
                    qs.append(q)
                    nxt.append((len(out) - 1, path + [tok]))
            frontier = nxt
        return Draft(out, torch.stack(qs) if qs else None, parents=parents if out else None)


# -- exactness ---------------------------------------------------------------------------------------
@settings(max_examples=150, deadline=None)
@given(
    vocab=st.integers(2, 10),
    order=st.integers(1, 3),
    lm_seed=st.integers(0, 10_000),
    prompt=st.lists(st.integers(0, 9), min_size=1, max_size=10),
    k=st.integers(1, 12),
    max_new=st.integers(1, 30),
    eos=st.sets(st.integers(0, 9), max_size=2),
    right=st.booleans(),
    temperature=st.sampled_from([0.0, 0.0, 0.8, 1.3]),
    seed=st.integers(0, 2**64 - 1),
    tree_seed=st.integers(0, 1000),
)
def test_tree_speculation_equals_plain_decoding(vocab, order, lm_seed, prompt, k, max_new, eos, right,
                                               temperature, seed, tree_seed):
    lm = ToyLM(vocab, order, seed=lm_seed, scale=2.0)
    prompt = [t % vocab for t in prompt]
    cfg = DecodeConfig(max_new_tokens=max_new, eos_token_ids=frozenset(e % vocab for e in eos),
                       sampling=SamplingParams(temperature, seed=seed))
    plain = decode(lm.backend(), prompt, cfg)
    reference = prompt + decode(lm.backend(), prompt, DecodeConfig(max_new_tokens=max_new + k,
                                                                   sampling=cfg.sampling)).token_ids
    drafter = RandomTreeDrafter(reference, vocab, right, tree_seed)
    spec = decode(lm.backend(), prompt, cfg, drafter, FixedK(k))
    assert spec.token_ids == plain.token_ids
    assert spec.finish_reason == plain.finish_reason
    if right and not eos and max_new > 1:
        # the true branch is followed to its end (the limit may cut it; a random node may extend it)
        assert spec.trace[0].accepted >= min(drafter.truth_lengths[0], max_new - 1)
    if not right:
        assert spec.stats.accepted == 0


def test_tree_steps_record_their_shape_and_path():
    lm = ToyLM(8, 2, seed=5)
    prompt = [1, 2, 3]
    plain = decode(lm.backend(), prompt, DecodeConfig(max_new_tokens=20)).token_ids
    out = decode(lm.backend(), prompt, DecodeConfig(max_new_tokens=20, record=True),
                 RandomTreeDrafter(prompt + plain + [0] * 20, 8, True, 1), FixedK(8))
    assert out.token_ids == plain
    tree_steps = [s for s in out.trace if s.parents is not None]
    assert tree_steps
    for s in tree_steps:
        assert [s.drafted[i] for i in s.accepted_nodes] == s.emitted[:s.accepted]
        assert trees.path_to(s.parents, s.path[-1]) == s.path if s.path else True
        assert len(s.target_probs) == len(s.drafted)
    # every token accounted for once: accepted path tokens plus one target token per step
    assert sum(len(s.emitted) for s in out.trace) == len(out.token_ids)


def test_toy_backend_keeps_exactly_the_accepted_path():
    lm = ToyLM(6, 2, seed=2)
    backend = lm.backend()
    backend.extend([1, 2, 3])
    base = backend.length
    parents = [-1, 0, 0, 1, 2]  # root (the last token) then a tree below it
    logits = backend.extend([4, 5, 0, 1, 2], tree=parents)
    for i in range(5):  # each node sees the cache and its ancestors only
        ctx = [1, 2, 3] + [[4, 5, 0, 1, 2][a] for a in trees.path_to(parents, i)]
        assert torch.equal(logits[i], lm.logits(ctx))
    with pytest.raises(ValueError, match="not a path"):
        backend.truncate(base, keep=[0, 1, 4])
    backend.truncate(base, keep=[0, 2, 4])
    assert backend.tokens == [1, 2, 3, 4, 0, 2]
    assert torch.equal(backend.extend([3])[0], lm.logits([1, 2, 3, 4, 0, 2, 3]))


# -- sampling with sampled siblings (SpecInfer) --------------------------------------------------------
V, LENGTH, SAMPLES = 4, 3, 5000
PROMPT = [0, 1, 2]
TARGET = ToyLM(V, 1, seed=21, scale=1.2)
DRAFT = ToyLM(V, 1, seed=99, scale=1.5)


def _exact(params):
    return sequence_distribution(TARGET, PROMPT, LENGTH, params)


def _tree_counts(mode):
    params = SamplingParams(1.0)
    counts, accepted = Counter(), 0
    for i in range(SAMPLES):
        cfg = DecodeConfig(max_new_tokens=LENGTH, verify=mode, sampling=SamplingParams(1.0, seed=i))
        out = decode(TARGET.backend(), PROMPT, cfg, SampledTreeDrafter(DRAFT), FixedK(6))
        counts[tuple(out.token_ids)] += 1
        accepted += out.stats.accepted
    return counts, accepted / (SAMPLES * LENGTH), _exact(params)


@pytest.mark.parametrize("mode", ["rejection", "coupled"])
def test_sampled_trees_follow_the_target_distribution(mode):
    counts, acceptance, dist = _tree_counts(mode)
    assert chi_square_pvalue(counts, dist) > 1e-3
    assert acceptance > 0.2  # siblings were accepted often: the multi-candidate rule was exercised


def _no_residual_update(draft, logits, sampler, position, record=False):
    """Broken: after a rejected sibling, tries the next one against the unchanged p."""
    if not draft.is_tree or sampler.coupled:
        return verify(draft, logits, sampler, position)
    p = sampler.probs(logits)
    kids = trees.children(draft.parents)
    node, path = -1, []
    while True:
        for attempt, child in enumerate(kids[node]):
            x = draft.tokens[child]
            if sampler.noise.uniform(3, position + len(path), attempt) * float(draft.q[child, x]) < float(p[node + 1, x]):
                path.append(child)
                node = child
                break
        else:
            tok = sampler.draw(p[node + 1], position + len(path), 2)
            return Verdict([draft.tokens[i] for i in path] + [tok], len(path), False, path=path)


def test_the_tree_distribution_test_catches_a_broken_tree_verifier(monkeypatch):
    monkeypatch.setattr(specdec.engine, "verify", _no_residual_update)
    counts, _, dist = _tree_counts("rejection")
    assert chi_square_pvalue(counts, dist) < 1e-6


# -- the transformers backend ---------------------------------------------------------------------
def _hf_model(request, which: str, attention: str):
    import copy

    model = copy.deepcopy(request.getfixturevalue(which))
    model.set_attn_implementation(attention)
    return model


TREE = [-1, 0, 0, 1, 1, 2, 3, 3, 5]  # the root (the last token) and a tree below it, depth up to 4
DEEP = [-1, 0, 1, 2, 3, 4, 5, 6, 7, 7, 2]  # deeper than tiny Gemma's window of 6: a branch forgets its start


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("which, prefix_len, TREE", [("tiny_llama", 5, TREE), ("tiny_gemma3", 3, TREE),
                                                     ("tiny_gemma3", 11, TREE), ("tiny_gemma3", 8, DEEP)],
                         ids=["llama", "gemma3-inside-window", "gemma3-past-window", "gemma3-deeper-than-window"])
def test_hf_tree_logits_equal_branch_by_branch_runs(request, which, prefix_len, TREE, attention):
    from specdec.backends.hf import HFBackend

    model = _hf_model(request, which, attention)
    rng = random.Random(prefix_len)
    prefix = [rng.randrange(3, 96) for _ in range(prefix_len)]
    tokens = [rng.randrange(3, 96) for _ in TREE]
    backend = HFBackend(model)
    assert backend.supports_tree
    backend.extend(prefix)
    logits = backend.extend(tokens, tree=TREE)
    # float64 throughout with SDPA; eager attention takes its softmax in float32 (Gemma), so rows of
    # different lengths round differently there at the 1e-8 level
    atol = 1e-9 if attention == "sdpa" else 1e-6
    for i in range(len(TREE)):  # each node as the end of its own branch, run as a plain sequence
        branch = prefix + [tokens[a] for a in trees.path_to(TREE, i)]
        assert torch.allclose(logits[i], HFBackend(model).extend(branch)[-1], atol=atol), i
    keep = trees.path_to(TREE, 8)
    backend.truncate(prefix_len, keep=keep)
    accepted = prefix + [tokens[o] for o in keep]
    assert backend.length == len(accepted)
    assert torch.allclose(backend.extend([7, 8]), HFBackend(model).extend(accepted + [7, 8])[-2:], atol=atol)


def test_the_tree_mask_test_catches_the_wrong_mask_convention(request):
    """A boolean mask handed to eager attention is added to the scores as 0/1: nothing is masked."""
    from specdec.backends.hf import HFBackend

    model = _hf_model(request, "tiny_llama", "eager")
    backend = HFBackend(model)
    backend._mask_style = "bool"
    prefix, tokens = [5, 6, 7], [8, 9, 10, 11]
    backend.extend(prefix)
    logits = backend.extend(tokens, tree=[-1, 0, 0, 1])
    branch = prefix + [8, 10]  # node 2's branch: it must not see its sibling 9
    assert not torch.allclose(logits[2], HFBackend(model).extend(branch)[-1], atol=1e-6)


@pytest.mark.parametrize("which", ["tiny_llama", "tiny_gemma3"])
@pytest.mark.parametrize("right", [True, False])
def test_greedy_tree_speculation_on_hf_models_equals_plain(request, which, right):
    from specdec.backends.hf import HFBackend

    model = request.getfixturevalue(which)
    prompt = [1, 5, 9, 5, 9, 5, 9, 11]
    cfg = DecodeConfig(max_new_tokens=24, eos_token_ids=frozenset({2}))
    plain = decode(HFBackend(model), prompt, cfg)
    reference = prompt + decode(HFBackend(model), prompt, DecodeConfig(max_new_tokens=40)).token_ids
    tree_steps = 0
    for seed in range(3):
        spec = decode(HFBackend(model), prompt, cfg, RandomTreeDrafter(reference, 96, right, seed), FixedK(8))
        assert spec.token_ids == plain.token_ids, seed
        tree_steps += sum(s.parents is not None for s in spec.trace)
    assert tree_steps > 0
