"""SuffixDecoding (Oliaro et al. 2024; Snowflake's arctic-inference) as a drafter: its own C++
suffix trees, run on our target, kernels, policy and verification, so that a comparison with it is
drafter against drafter.

It keeps a suffix tree of each request's prompt and output, and a global one over the outputs of
earlier requests (at most ``max_cached_requests``, evicted first in, first out). A draft follows the
context's longest match in either tree, each token scored by the product of child/parent counts
along its path, cut where that estimate falls under ``min_token_prob``, at most ``min(K, factor *
match length + offset)`` tokens, a path or (``--tree``) a tree. The settings are its authors'
defaults in arctic-inference 0.3.0's vLLM plugin (``ArcticSpeculativeConfig``: tree depth 64,
100000 cached requests, factor 1, offset 0, cut at 0.1). Each token's confidence for the
draft-length policy is its estimate over its parent's.

Built by ``make arctic-suffix`` (the extension only: no vLLM, no CUDA) into
``.peers/arctic-inference``, or found under ``$SPECDEC_ARCTIC_PATH``.
"""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from specdec.context import LearnedSlot
from specdec.drafters.base import Drafter, StopDrafting
from specdec.errors import SpecdecError
from specdec.registry import DraftRequest, drafter
from specdec.types import Draft

PATH_ENV = "SPECDEC_ARCTIC_PATH"
PEER_DIR = Path(".peers") / "arctic-inference"
# arctic-inference 0.3.0's defaults for vLLM (its SuffixDecoding speculative config)
MAX_TREE_DEPTH = 64
MAX_CACHED_REQUESTS = 100000
MAX_SPEC_FACTOR = 1.0
MAX_SPEC_OFFSET = 0.0
MIN_TOKEN_PROB = 0.1


def suffix_cache_class():
    """arctic-inference's ``SuffixDecodingCache``, from ``make arctic-suffix``'s build; a clear
    error when it was not built."""
    try:
        from arctic_inference.suffix_decoding import SuffixDecodingCache
        return SuffixDecodingCache
    except ImportError:
        pass
    chosen = os.environ.get(PATH_ENV)
    checkout = Path(__file__).resolve().parents[3]
    for folder in [Path(chosen)] if chosen else [Path.cwd() / PEER_DIR, checkout / PEER_DIR]:
        if (folder / "arctic_inference" / "suffix_decoding" / "cache.py").is_file():
            sys.path.insert(0, str(folder))
            try:
                from arctic_inference.suffix_decoding import SuffixDecodingCache
            except ImportError as exc:
                raise SpecdecError(f"arctic-suffix: the build in {folder} does not load ({exc}); "
                                   "rebuild it with `make arctic-suffix`") from None
            return SuffixDecodingCache
    raise SpecdecError("drafter arctic-suffix needs SuffixDecoding's suffix tree: build it with "
                       f"`make arctic-suffix` (or point {PATH_ENV} at the folder it built)")


class ArcticSuffixDrafter(Drafter):
    """A request of arctic-inference's ``SuffixDecodingCache`` per generation; the cache (its global
    tree of earlier outputs) is the target model's learned state."""

    name = "arctic-suffix"
    _ids = itertools.count()

    def __init__(self, cache, tree: bool = False, max_spec_factor: float = MAX_SPEC_FACTOR,
                 max_spec_offset: float = MAX_SPEC_OFFSET, min_token_prob: float = MIN_TOKEN_PROB) -> None:
        self.cache = cache
        self.tree = tree
        self.max_spec_factor, self.max_spec_offset, self.min_token_prob = max_spec_factor, max_spec_offset, min_token_prob
        self._request: int | None = None
        self._fed = 0  # tokens of the sequence the cache has seen

    def begin(self, prompt, sampler, target=None) -> None:
        super().begin(prompt, sampler, target)
        self._stop()
        self._request = next(self._ids)
        self.cache.start_request(self._request, list(prompt))
        self._fed = len(prompt)

    def propose(self, tokens: Sequence[int], k: int, stop: StopDrafting | None = None) -> Draft:
        if self._request is None:
            raise SpecdecError("arctic-suffix: propose before begin")
        if len(tokens) > self._fed:
            self.cache.add_active_response(self._request, list(tokens[self._fed:]))
            self._fed = len(tokens)
        context = list(tokens[-self.cache.max_tree_depth:])
        found = self.cache.speculate(self._request, context, max_spec_tokens=k,
                                     max_spec_factor=self.max_spec_factor, max_spec_offset=self.max_spec_offset,
                                     min_token_prob=self.min_token_prob, use_tree_spec=self.tree)
        ids, parents, probs = list(found.token_ids), list(found.parents), list(found.probs)
        if not ids:
            return Draft([])
        # Its estimates are path probabilities; the policy wants each node's given its parent.
        confidence = [p / (probs[q] if q >= 0 else 1.0) for p, q in zip(probs, parents)]
        confidence = [min(1.0, max(0.0, c)) for c in confidence]
        return Draft(ids, confidence=confidence, parents=parents if self.tree else None,
                     extra={"match": found.match_len})

    def close(self) -> None:
        self._stop()

    def _stop(self) -> None:
        if self._request is not None:
            self.cache.stop_request(self._request)
            self._request = None


class CopyableCache:
    """arctic-inference's ``SuffixDecodingCache`` with the responses it cached recorded beside it,
    so that a copy is a new cache fed the same responses: its C++ trees cannot be copied, and a
    benchmark's repeats each start from a copy of the learned state before the question."""

    def __init__(self) -> None:
        self.cache = suffix_cache_class()(max_tree_depth=MAX_TREE_DEPTH, max_cached_requests=MAX_CACHED_REQUESTS)
        self.responses: dict[int, list[int]] = {}  # request -> its response, oldest request first

    def __getattr__(self, name: str):
        return getattr(self.__dict__["cache"], name)

    def start_request(self, request: int, prompt: list[int]) -> None:
        self.cache.start_request(request, prompt)
        self.responses[request] = []

    def add_active_response(self, request: int, tokens: list[int]) -> None:
        self.cache.add_active_response(request, tokens)
        self.responses[request].extend(tokens)

    def stop_request(self, request: int) -> None:
        self.cache.stop_request(request)
        while len(self.responses) > MAX_CACHED_REQUESTS:  # the cache forgets its oldest first too
            del self.responses[next(iter(self.responses))]

    def __deepcopy__(self, memo) -> CopyableCache:
        # Only the global tree outlives a request, and it holds responses alone: an empty prompt
        # replays it.
        new = CopyableCache()
        for request, response in self.responses.items():
            new.start_request(request, [])
            new.add_active_response(request, response)
            new.stop_request(request)
        return new


def _new_cache() -> CopyableCache:
    return CopyableCache()


# The target's cache: its global tree of earlier outputs carries over to later generations (of the
# same tenant, where the server keeps them apart).
ARCTIC_CACHE: LearnedSlot = LearnedSlot("arctic-suffix-cache", _new_cache)


@drafter("arctic-suffix", "SuffixDecoding's suffix trees (arctic-inference, built by `make arctic-suffix`): "
                          "the prompt and output, and earlier outputs; with --tree a tree", order=90,
         available=suffix_cache_class)
def _build_arctic_suffix(request: DraftRequest) -> ArcticSuffixDrafter:
    suffix_cache_class()  # the clear error, before any state is made
    return ArcticSuffixDrafter(request.target.text_state(ARCTIC_CACHE), tree=request.tree)
