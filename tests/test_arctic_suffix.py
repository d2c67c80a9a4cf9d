"""SuffixDecoding's suffix trees (arctic-inference) as the ``arctic-suffix`` drafter: what it drafts,
that it stays lossless on our verification, and the error where ``make arctic-suffix`` did not run
(the build is optional, so the tests that need it skip without it, saying so)."""

from __future__ import annotations

import pytest

from specdec.drafters import arctic_suffix
from specdec.errors import SpecdecError


def _built() -> bool:
    try:
        arctic_suffix.suffix_cache_class()
        return True
    except SpecdecError:
        return False


def needs_build(test):
    """A test of the peer itself: skipped without its build, except under `make test-peers`."""
    skip = pytest.mark.skipif(not _built(), reason="SuffixDecoding is not built (make arctic-suffix)")
    return pytest.mark.peers(skip(test))


def test_without_the_build_the_drafter_names_the_make_target(monkeypatch, tmp_path):
    import builtins

    real_import = builtins.__import__

    def no_arctic(name, *args, **kwargs):
        if name.startswith("arctic_inference"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_arctic)
    monkeypatch.setenv(arctic_suffix.PATH_ENV, str(tmp_path))
    with pytest.raises(SpecdecError, match="make arctic-suffix"):
        arctic_suffix.suffix_cache_class()


@needs_build
def test_it_copies_from_the_prompt_and_from_earlier_outputs():
    cache = arctic_suffix._new_cache()
    drafter = arctic_suffix.ArcticSuffixDrafter(cache)
    drafter.begin([1, 2, 3, 4, 5, 9, 1, 2], None)
    draft = drafter.propose([1, 2, 3, 4, 5, 9, 1, 2], 4)
    # a match of 2 tokens ([1, 2]) drafts at most 2 (max_spec_factor 1 x the match length)
    assert draft.tokens == [3, 4] and all(0 < c <= 1 for c in draft.confidence)
    drafter.propose([1, 2, 3, 4, 5, 9, 1, 2, 3, 70, 71, 72, 73], 4)  # the output so far: 3 70 71 72 73
    drafter.close()
    other = arctic_suffix.ArcticSuffixDrafter(cache)  # a later request: the global tree has that output
    other.begin([50, 51, 70, 71], None)
    assert other.propose([50, 51, 70, 71], 2).tokens == [72, 73]
    other.close()


@needs_build
@pytest.mark.parametrize("tree", [False, True])
def test_greedy_output_is_plain_decoding_s(tiny, tree):
    prompt = "the quick brown fox jumps over the lazy dog the quick brown"
    plain = tiny.generate(prompt, max_new_tokens=24, drafter="none")
    for _ in range(2):  # the second time, the global tree holds the first answer
        out = tiny.generate(prompt, max_new_tokens=24, drafter="arctic-suffix", tree=tree)
        assert out.token_ids == plain.token_ids
    assert out.stats.accepted > 0


@needs_build
def test_a_copy_of_the_cache_remembers_the_same_outputs_and_learns_on_its_own():
    """A benchmark's repeats each start from a copy of the state before the question; the C++
    trees cannot be copied, so a copy is a new cache fed the same responses."""
    import copy

    def answered(cache, prompt, tokens):
        drafter = arctic_suffix.ArcticSuffixDrafter(cache)
        drafter.begin(prompt, None)
        drafted = drafter.propose(prompt + tokens, 2).tokens
        drafter.close()
        return drafted

    cache = arctic_suffix._new_cache()
    answered(cache, [1, 2], [70, 71, 72, 73])
    twin = copy.deepcopy(cache)
    assert answered(cache, [50, 51, 70, 71], []) == answered(twin, [50, 51, 70, 71], []) == [72, 73]
    answered(twin, [5], [80, 81, 82, 83])  # only the copy sees this answer
    assert answered(twin, [60, 80, 81], []) == [82, 83]
    assert answered(cache, [60, 80, 81], []) == []
