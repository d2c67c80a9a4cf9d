"""The Python API on a tiny transformers model: generate, stop strings, streaming, validation."""

from __future__ import annotations

import pytest

import specdec
from specdec.errors import SpecdecError


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return specdec.load(str(tiny_model_dir))


@pytest.fixture(scope="module")
def tiny_draft(tiny_draft_dir):
    return specdec.load(str(tiny_draft_dir))


def test_generate_returns_text_ids_and_stats(tiny):
    out = tiny.generate("the quick brown fox", max_new_tokens=10, drafter="ngram", num_draft=3)
    assert 1 <= len(out.token_ids) <= 10
    assert out.text == tiny.decode(out.token_ids).rstrip("\ufffd")  # a cut character is held back
    assert out.stats.new_tokens == len(out.token_ids)
    assert out.prompt_ids == tiny.encode("the quick brown fox")
    assert out.finish_reason in ("length", "eos")


def test_every_drafter_gives_plain_greedy_tokens(tiny, tiny_draft):
    plain = tiny.generate("hello world", max_new_tokens=25, drafter="none")
    assert plain.stats.mean_accepted_length == 1.0
    for kwargs in (dict(drafter="ngram"), dict(drafter="model", draft_model=tiny_draft),
                   dict(drafter="model", draft_model=tiny)):
        for k in (1, 5):
            out = tiny.generate("hello world", max_new_tokens=25, num_draft=k, **kwargs)
            assert out.token_ids == plain.token_ids


def test_stop_string_cuts_text_and_matches_plain(tiny):
    full = tiny.generate("the quick brown fox", max_new_tokens=30, drafter="none")
    assert len(full.text) > 6
    stop = full.text[3:6]
    before = full.text[:full.text.index(stop)]
    for drafter in ("none", "ngram"):
        out = tiny.generate("the quick brown fox", max_new_tokens=30, drafter=drafter, stop=[stop])
        assert out.finish_reason == "stop"
        assert out.text == before
        assert stop in tiny.decode(out.token_ids)


def test_stream_yields_the_same_text_as_generate(tiny):
    kwargs = dict(max_new_tokens=20, drafter="ngram", num_draft=4)
    pieces = [delta for _, delta in tiny.stream("the lazy dog", **kwargs)]
    assert "".join(pieces) == tiny.generate("the lazy dog", **kwargs).text


def test_stream_holds_back_a_possible_stop_string(tiny):
    full = tiny.generate("the quick brown fox", max_new_tokens=30, drafter="none").text
    stop = full[4:8]
    streamed = "".join(d for _, d in tiny.stream("the quick brown fox", max_new_tokens=30, stop=[stop]))
    assert streamed == full[:full.index(stop)]


def test_token_id_prompts_are_accepted(tiny):
    ids = tiny.encode("the quick")
    assert tiny.generate(ids, max_new_tokens=5).token_ids == tiny.generate("the quick", max_new_tokens=5).token_ids


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_draft=0), "draft tokens"),
    (dict(max_new_tokens=0), "max new tokens"),
    (dict(temperature=-2), "temperature"),
    (dict(drafter="model"), "needs a draft model"),
    (dict(drafter="medusa"), "unknown drafter"),
])
def test_api_errors(tiny, kwargs, message):
    with pytest.raises(SpecdecError, match=message):
        tiny.generate("hi", **kwargs)


def test_empty_prompt_is_refused(tiny):
    for prompt in ("", "  \n", []):
        with pytest.raises(SpecdecError, match="empty"):
            tiny.generate(prompt)


def test_unknown_dtype(tiny_model_dir):
    with pytest.raises(SpecdecError, match="dtype"):
        specdec.load(str(tiny_model_dir), dtype="float8")
