"""The Python API on a tiny transformers model: generate, stop strings, streaming, validation."""

from __future__ import annotations

import gc
import json

import pytest

import specdec
from specdec.drafters.base import Drafter
from specdec.errors import SpecdecError
from specdec.types import Draft


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
    (dict(num_draft=0), "num_draft must be >= 1, got 0"),
    (dict(max_new_tokens=0), "max_new_tokens must be >= 1, got 0"),
    (dict(temperature=-2), "temperature"),
    (dict(drafter="model"), "needs draft_model"),
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


def test_context_length_is_checked_before_decoding(tiny):
    assert tiny.loaded.backend().max_length == 512  # from config.max_position_embeddings
    with pytest.raises(SpecdecError, match=r"prompt \(2 tokens\) plus max new tokens \(600\) exceed .* 512"):
        tiny.generate([5, 6], max_new_tokens=600)
    with pytest.raises(SpecdecError, match=r"prompt \(505 tokens\) .* context of 512 tokens"):
        tiny.generate([5] * 505, max_new_tokens=10)
    out = tiny.generate([5] * 510, max_new_tokens=2, drafter="none")  # exactly the context: allowed
    assert out.stats.prompt_tokens + len(out.token_ids) <= 512


def test_empty_stop_string_is_ignored(tiny):
    kwargs = dict(max_new_tokens=12, drafter="ngram")
    plain = tiny.generate("the quick brown fox", **kwargs)
    for stop in ("", ["", ""]):
        out = tiny.generate("the quick brown fox", stop=stop, **kwargs)
        assert out.text == plain.text != "" and out.finish_reason == plain.finish_reason
        assert "".join(d for _, d in tiny.stream("the quick brown fox", stop=stop, **kwargs)) == plain.text


def test_a_single_stop_string_is_one_string_not_its_characters(tiny):
    plain = tiny.generate("the quick brown fox", max_new_tokens=20)
    # Characters of "answer" occur (one stop per character would cut there), the word does not.
    assert set("answer") & set(plain.text) and "answer" not in plain.text
    out = tiny.generate("the quick brown fox", max_new_tokens=20, stop="answer")
    assert out.text == plain.text and out.finish_reason == plain.finish_reason
    streamed = "".join(d for _, d in tiny.stream("the quick brown fox", max_new_tokens=20, stop="answer"))
    assert streamed == plain.text
    word = plain.text[3:7]  # and a string that does occur cuts at its first occurrence
    assert tiny.generate("the quick brown fox", max_new_tokens=20, stop=word).text == \
        plain.text[:plain.text.index(word)]


@pytest.mark.parametrize("prompt, message", [
    ([5, 1.7], "whole numbers, got 1.7"),
    ([5, 6.0], "whole numbers, got 6.0"),
    ([True, 5], "whole numbers, got True"),
    ([5, 10**9], "token id 1000000000 is outside the vocabulary"),
    ([-1, 5], "token id -1 is outside the vocabulary"),
    ([5, "6"], "whole numbers"),
    (None, "text or a list of token ids"),
    (12, "text or a list of token ids"),
    (b"hello", "not text"),
])
def test_bad_token_id_prompts_are_refused(tiny, prompt, message):
    with pytest.raises(SpecdecError, match=message):
        tiny.generate(prompt, max_new_tokens=2)
    with pytest.raises(SpecdecError, match=message):
        next(tiny.stream(prompt, max_new_tokens=2))


def test_a_character_cut_by_the_token_limit_is_dropped(tiny):
    """The byte-level tiny model often emits half of a multi-byte character as the last token."""
    ids = tiny.generate("0123456789", max_new_tokens=24, drafter="none").token_ids
    # A cut after a few tokens, so that there is text before it and the drafter gets to draft.
    cut = next((n for n in range(4, len(ids) + 1) if tiny.decode(ids[:n]).endswith("\ufffd")
                and tiny.decode(ids[:n]).rstrip("\ufffd")), None)
    assert cut is not None, "no prefix of the output ends inside a character: pick another prompt"
    kwargs = dict(max_new_tokens=cut, drafter="ngram", num_draft=3)
    out = tiny.generate("0123456789", **kwargs)
    assert out.token_ids == ids[:cut] and out.finish_reason == "length"
    assert tiny.decode(out.token_ids).endswith("\ufffd") and not out.text.endswith("\ufffd")
    assert out.text == tiny.decode(out.token_ids).rstrip("\ufffd") != ""
    assert "".join(d for _, d in tiny.stream("0123456789", **kwargs)) == out.text


def test_run_twice_returns_the_same_result_and_iterating_twice_is_refused(tiny, monkeypatch):
    run = tiny.start("the quick brown fox", max_new_tokens=8)
    first = run.run()
    ids = list(first.token_ids)
    # The backend went back to the pool when the run ended: touching it again could corrupt
    # another generation's cache.
    for method in ("reset", "extend", "truncate"):
        monkeypatch.setattr(run.target, method, lambda *a, **k: pytest.fail("the finished run decoded again"))
    assert run.run() is first and first.token_ids == ids and len(ids) == first.stats.new_tokens
    with pytest.raises(SpecdecError, match="only once"):
        list(run)
    assert first.token_ids == ids


def test_a_run_whose_stream_was_closed_cannot_be_finished(tiny):
    run = tiny.start("the quick brown fox", max_new_tokens=8, drafter="none")
    steps = iter(run)
    next(steps)
    steps.close()
    with pytest.raises(SpecdecError, match="did not finish"):
        run.run()
    assert len(run.result.token_ids) == 1


@pytest.fixture()
def counted_pool(tiny, monkeypatch):
    """``tiny``'s pool with one idle backend and a count of the backends it makes from then on."""
    tiny.generate("warm up", max_new_tokens=2)  # also calibrates the cost model
    made: list[object] = []
    make = tiny.loaded.pool.make

    def counting_make():
        made.append(make())
        return made[-1]

    monkeypatch.setattr(tiny.loaded.pool, "make", counting_make)
    return made


def test_an_abandoned_stream_gives_its_backend_back(tiny, counted_pool):
    idle = len(tiny.loaded.pool._idle)
    steps = tiny.stream("the quick brown fox", max_new_tokens=20)
    next(steps)
    assert len(tiny.loaded.pool._idle) == idle - 1
    steps.close()
    assert len(tiny.loaded.pool._idle) == idle
    steps = tiny.stream("the quick brown fox", max_new_tokens=20)
    next(steps)
    del steps  # dropped without close(): the generator's finalizer must release too
    gc.collect()
    assert len(tiny.loaded.pool._idle) == idle
    assert tiny.generate("hello", max_new_tokens=4).token_ids
    assert counted_pool == []  # every generation reused the one backend


def test_a_run_closed_before_its_first_step_gives_its_backend_back(tiny, counted_pool):
    """A server's client that leaves between the start of its generation and its first step: the
    run was never iterated, and closing it must still close its drafter and release its backend."""
    idle = len(tiny.loaded.pool._idle)
    drafter = FailingDrafter(fail_after=100)
    run = tiny.start("the quick brown fox", max_new_tokens=20, drafter=drafter)
    assert len(tiny.loaded.pool._idle) == idle - 1
    run.close()
    assert len(tiny.loaded.pool._idle) == idle and drafter.closed
    run.close()  # again: nothing more to give back
    assert len(tiny.loaded.pool._idle) == idle
    assert counted_pool == []


class FailingDrafter(Drafter):
    """Drafts nothing for a few steps, then raises (a bug in someone's drafter)."""

    name = "failing"

    def __init__(self, fail_after: int) -> None:
        self.fail_after = fail_after
        self.calls = 0
        self.closed = False

    def propose(self, tokens, k, stop=None) -> Draft:
        self.calls += 1
        if self.calls > self.fail_after:
            raise RuntimeError("drafter failed")
        return Draft([])

    def close(self) -> None:
        self.closed = True


def test_a_failing_generation_gives_its_backend_back(tiny, counted_pool):
    idle = len(tiny.loaded.pool._idle)
    drafter = FailingDrafter(fail_after=3)
    with pytest.raises(RuntimeError, match="drafter failed"):
        tiny.generate("the quick brown fox", max_new_tokens=20, drafter=drafter, policy="fixed", num_draft=2)
    assert drafter.calls == 4 and drafter.closed
    assert len(tiny.loaded.pool._idle) == idle
    assert tiny.generate("hello", max_new_tokens=4).token_ids
    assert counted_pool == []


OLD_CURVE = json.dumps({str(n): 0.01 for n in range(1, 17)}).encode()  # before the shape-switch cost
ABSOLUTE_SWITCH = json.dumps({**{str(n): 0.01 for n in range(1, 17)}, "switch": 0.048}).encode()  # seconds


@pytest.mark.parametrize("garbage", [b"\xff\xfe not even utf-8", b"{ truncated", b"[1, 2]", b'{"1": "nan"}',
                                     b'{"1": -0.5}', b"{}", OLD_CURVE, ABSOLUTE_SWITCH])
def test_a_corrupt_cost_cache_is_measured_again(tmp_path, monkeypatch, garbage):
    from specdec import costs
    from specdec.backends.toy import ToyLM

    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    path = tmp_path / "costs" / "toy-key.json"
    path.parent.mkdir()
    path.write_bytes(garbage)
    model = costs.calibrated("toy-key", ToyLM(vocab_size=8).backend(), [1, 2, 3], repeats=costs.REPEATS)
    assert model.forward(1) > 0
    stored = json.loads(path.read_text())
    assert sorted(int(n) for n in stored if n != costs.SWITCH_KEY) == sorted(costs.CALIBRATION_SIZES)
    assert stored[costs.SWITCH_KEY] >= 0
    # The rewritten file is used as it is: no second measurement.
    monkeypatch.setattr(costs, "measure_forward_costs", lambda *a, **k: pytest.fail("measured again"))
    again = costs.calibrated("toy-key", ToyLM(vocab_size=8).backend(), [1, 2, 3], repeats=costs.REPEATS)
    assert again.seconds == model.seconds and again.switch == model.switch


def test_a_calibration_of_fewer_rounds_is_kept_apart_from_a_full_one(tmp_path, monkeypatch):
    from specdec import costs
    from specdec.backends.toy import ToyLM

    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    monkeypatch.setenv(costs.REPEATS_ENV, "1")
    costs.calibrated("toy-key", ToyLM(vocab_size=8).backend(), [1, 2, 3])
    assert [p.name for p in (tmp_path / "costs").iterdir()] == ["toy-key-r1.json"]
    monkeypatch.delenv(costs.REPEATS_ENV)
    assert costs.calibration_repeats() == costs.REPEATS
    costs.calibrated("toy-key", ToyLM(vocab_size=8).backend(), [1, 2, 3])
    assert sorted(p.name for p in (tmp_path / "costs").iterdir()) == ["toy-key-r1.json", "toy-key.json"]
    for bad in ("0", "-2", "three"):
        monkeypatch.setenv(costs.REPEATS_ENV, bad)
        with pytest.raises(SpecdecError, match="SPECDEC_CALIBRATION_REPEATS must be a whole number >= 1"):
            costs.calibration_repeats()
