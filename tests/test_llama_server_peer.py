"""llama.cpp's own server as a bench peer (``llama-server-*``) and the llama-cpp-python peer's
sampling. The parsing, the request and the method strings are checked without a server; the tests
that run ``llama-server`` on SmolLM2-135M are skipped unless ``make llama-peers`` built it."""

from __future__ import annotations

import json
import stat
import urllib.request

import pytest

from conftest import FakeCosts

from specdec.bench.base import RunResult, baselines, split
from specdec.bench.methods import check_specs
from specdec.bench.peers import llama_server as ls
from specdec.bench.peers.llamacpp_python import LlamaMethod
from specdec.errors import SpecdecError
from specdec.options import GenerationOptions

GREEDY = GenerationOptions(max_new_tokens=16)

# An answer of this llama.cpp version's /completion (return_tokens, a draft model), trimmed.
CANNED = {
    "index": 0, "content": " jumps over the lazy", "tokens": [34933, 690, 260, 23790, 2],
    "id_slot": 0, "stop": True, "model": "model.gguf", "tokens_predicted": 5, "tokens_evaluated": 7,
    "stop_type": "eos", "stopping_word": "", "tokens_cached": 0, "truncated": False,
    "timings": {"cache_n": 0, "prompt_n": 7, "prompt_ms": 12.5, "prompt_per_token_ms": 1.786,
                "prompt_per_second": 560.0, "predicted_n": 5, "predicted_ms": 40.0,
                "predicted_per_token_ms": 10.0, "predicted_per_second": 100.0,
                "draft_n": 6, "draft_n_accepted": 3},
}


def built() -> bool:
    try:
        ls.binary()
    except SpecdecError:
        return False
    return True


def needs_build(test):
    """A test of the peer itself: skipped without its build, except under `make test-peers`."""
    skip = pytest.mark.skipif(not built(), reason="llama-server is not built (make llama-peers)")
    return pytest.mark.peers(skip(test))


def test_an_answer_gives_the_tokens_and_llamacpps_own_generation_rate():
    answer = ls.parse_answer(CANNED)
    assert answer.token_ids == [34933, 690, 260, 23790, 2]
    assert answer.prompt_s == 0.0125 and answer.prompt_tokens == 7 and answer.cached_tokens == 0
    # predicted_per_second counts the tokens after the first (its logits come with the prompt)
    assert answer.gen_tokens == 4 and answer.gen_s == 0.04
    assert answer.gen_tokens / answer.gen_s == pytest.approx(CANNED["timings"]["predicted_per_second"])
    assert (answer.drafted, answer.accepted) == (6, 3)
    # the prompt's forward yields 1 token, one verification the 3 accepted and 1 more
    assert answer.target_forwards == 2


def test_an_answer_without_drafting_or_without_tokens():
    plain = dict(CANNED, timings={k: v for k, v in CANNED["timings"].items() if not k.startswith("draft")})
    answer = ls.parse_answer(plain)
    assert answer.drafted is None and answer.accepted is None and answer.target_forwards == 5
    with pytest.raises(RuntimeError, match="token ids"):
        ls.parse_answer(dict(CANNED, tokens=None))
    with pytest.raises(RuntimeError, match="timings"):
        ls.parse_answer({k: v for k, v in CANNED.items() if k != "timings"})


def test_the_request_is_cold_and_samples_as_ours():
    body = ls.request_body([1, 2, 3], 16, GREEDY, seed=None)
    assert body["prompt"] == [1, 2, 3] and body["n_predict"] == 16 and body["stream"] is False
    assert body["cache_prompt"] is False and body["return_tokens"] is True
    # greedy, and no top-k, min-p or penalties that ours does not have
    assert body["temperature"] == 0 and body["top_k"] == 0 and body["top_p"] == 1.0 and body["min_p"] == 0.0
    assert body["repeat_penalty"] == 1.0 and "seed" not in body
    sampled = ls.request_body([1], 8, GREEDY.with_(temperature=0.7, top_k=20, top_p=0.9), seed=5)
    assert (sampled["temperature"], sampled["top_k"], sampled["top_p"], sampled["seed"]) == (0.7, 20, 0.9, 5)
    assert sampled["samplers"] == ["temperature", "top_k", "top_p"]  # our order


@pytest.mark.parametrize("spec,settings,flags", [
    ("llama-server-plain", ls.ServerSettings(), []),
    ("llama-server-draft:d.gguf", ls.ServerSettings("draft-simple", "d.gguf"), ["--spec-type", "draft-simple",
                                                                                "--model-draft", "D"]),
    ("llama-server-draft:d.gguf:n=5", ls.ServerSettings("draft-simple", "d.gguf", 5),
     ["--spec-type", "draft-simple", "--model-draft", "D", "--spec-draft-n-max", "5"]),
    ("llama-server-ngram-mod", ls.ServerSettings("ngram-mod"), ["--spec-type", "ngram-mod"]),
    ("llama-server-ngram-mod:n=16", ls.ServerSettings("ngram-mod", None, 16),
     ["--spec-type", "ngram-mod", "--spec-ngram-mod-n-max", "16", "--spec-ngram-mod-n-min", "16"]),
    ("llama-server-ngram-simple:n=8", ls.ServerSettings("ngram-simple", None, 8),
     ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-m", "8"]),
    ("llama-server-ngram-cache", ls.ServerSettings("ngram-cache"), ["--spec-type", "ngram-cache"]),
])
def test_method_strings_become_server_flags(tmp_path, monkeypatch, spec, settings, flags):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d.gguf").write_bytes(b"GGUF")
    _, args, pairs = split(spec)
    got = ls.parse(spec, args, pairs)
    assert got == settings
    assert got.args("D") == flags


def test_a_draft_without_alias_is_the_targets_default_draft_model():
    from specdec.models import default_draft_model

    target = next((a for a in ("qwen2.5-coder-1.5b",) if default_draft_model(a)), None)
    if target is not None:
        got = ls.parse("llama-server-draft", [], {}, target)
        assert got.draft == default_draft_model(target)
    with pytest.raises(SpecdecError, match="names no default draft model"):
        ls.parse("llama-server-draft", [], {}, "smollm2-135m")


@pytest.mark.parametrize("spec,message", [
    ("llama-server-ngram-foo", "unknown method 'llama-server-ngram-foo': use plain"),
    ("llama-server-ngram-mod:n=0", "n must be a whole number >= 1"),
    ("llama-server-draft:smollm2-135m:n=x", "n must be a whole number >= 1"),
    ("llama-server-ngram-cache:n=4", "ngram-cache takes no n"),
    ("llama-server-ngram-mod:smollm2-135m", "takes no model"),
    ("llama-server-plain:n=3", "takes no options"),
    ("llama-server-ngram-mod:k=3", "unknown option(s) k"),
    ("llama-server-draft:a:b", "llama-server-draft[:ALIAS][:n=N]"),
    ("llama-server-draft:no-such-model", "unknown draft model 'no-such-model'"),
])
def test_bad_method_strings_are_refused_before_any_model_loads(capsys, tmp_path, tiny_model_dir, no_loading,
                                                                 spec, message):
    from specdec.cli import main

    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"question_id": 1, "category": "a", "turns": ["hi"]}) + "\n")
    code = main(["bench", "--model", str(tiny_model_dir), "--questions", str(questions), "--methods", spec,
                 "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code != 0 and message in err and "Traceback" not in err and no_loading == []


def test_missing_binaries_say_how_to_build_them(tmp_path, monkeypatch):
    monkeypatch.setenv(ls.BIN_ENV, str(tmp_path))
    with pytest.raises(SpecdecError, match="make llama-peers"):
        ls.binary()
    with pytest.raises(SpecdecError, match="make llama-peers"):
        check_specs(["llama-server-plain"], "llamacpp", GREEDY)


def test_the_llama_server_family_has_its_own_plain_baseline():
    assert baselines()["llama-server"] == "llama-server-plain"
    assert ls.LlamaServerMethod("llama-server-ngram-mod", None, GREEDY).baseline == "llama-server-plain"


def test_a_server_that_cannot_start_fails_its_method_which_the_bench_drops(tmp_path, monkeypatch):
    """Reported, not fatal: the start error reaches run(), where the runner drops the peer."""
    fake = tmp_path / "llama-server"
    fake.write_text("#!/bin/sh\necho 'error: unknown argument: --spec-type'\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv(ls.BIN_ENV, str(tmp_path))
    from specdec.bench.questions import Question
    from specdec.bench.runner import run_bench

    class Plain:
        name, family = "plain", "ours"
        baseline = "plain"

        def run(self, prompt_ids, max_new_tokens, seed):
            return RunResult([1], 0.1)

    class FakeModel(FakeCosts):
        has_chat_template = False

        @property
        def loaded(self):  # the loaded side is the fake itself
            return self

        def encode(self, text, chat=False):
            return [1, 2, 3]

    server = ls.LlamaServer(tmp_path / "m.gguf")
    peer = ls.LlamaServerMethod("llama-server-plain", server, GREEDY)
    bench = run_bench(FakeModel(), [Plain(), peer], [Question(1, "a", "x")], 4, greedy=True)
    assert [m.name for m in bench.methods] == ["plain"]
    assert "unknown argument: --spec-type" in bench.failed["llama-server-plain"]
    with pytest.raises(SpecdecError, match="did not start"):  # the same error again, no second launch
        server.start()


def test_llamacpp_python_peer_samples_like_ours():
    """No top-k when ours has none (it used to send 40), no min-p, and its generation time."""
    class FakeLlama:
        def reset(self):
            pass

        def set_seed(self, seed):
            self.seed = seed

        def generate(self, tokens, **kwargs):
            self.kwargs = kwargs
            yield from [5, 6, 7, 8]

    llama = FakeLlama()
    method = LlamaMethod("llamacpp-plain", llama, {99}, GREEDY.with_(temperature=0.8, top_p=0.9))
    result = method.run([1, 2], 3, seed=1)
    assert result.token_ids == [5, 6, 7]
    assert llama.kwargs["top_k"] == 0 and llama.kwargs["min_p"] == 0.0
    assert (llama.kwargs["temp"], llama.kwargs["top_p"]) == (0.8, 0.9)
    assert result.gen_tokens == 2 and 0 <= result.gen_s <= result.wall_s


# --- with the binaries built: llama-server on SmolLM2-135M ---------------------------------------

def _tokenize(server: ls.LlamaServer, text: str) -> list[int]:
    request = urllib.request.Request(server.url + "/tokenize", data=json.dumps({"content": text}).encode(),
                                     headers={"Content-Type": "application/json"})
    with ls._HTTP.open(request, timeout=30) as reply:
        return json.loads(reply.read())["tokens"]


@pytest.fixture(scope="module")
def smollm2_gguf():
    from specdec.models import resolve

    return resolve("smollm2-135m", need_hf=False).gguf


@needs_build
@pytest.mark.real
def test_llama_server_plain_greedy_returns_the_tokens_and_its_timings(smollm2_gguf):
    with ls.LlamaServer(smollm2_gguf, threads=1) as server:  # correctness, not speed: one thread
        method = ls.LlamaServerMethod("llama-server-plain", server, GREEDY)
        prompt = _tokenize(server, "The three primary colours are red, yellow and")
        first = method.run(prompt, 16, None)
        again = method.run(prompt, 16, None)
    assert len(first.token_ids) == 16 and first.gen_tokens == 15 and first.gen_s > 0
    assert first.wall_s > first.gen_s and first.peer_forwards == 16
    assert again.token_ids == first.token_ids  # greedy, and cold each time: the same answer
    assert server.proc.poll() is not None  # stopped with the context


@needs_build
@pytest.mark.real
def test_llama_server_draft_counts_its_drafts(smollm2_gguf):
    """SmolLM2 drafting for itself: llama.cpp's draft counters come back and make sense."""
    flags = ls.ServerSettings("draft-simple", str(smollm2_gguf)).args(smollm2_gguf)
    with ls.LlamaServer(smollm2_gguf, flags, threads=1) as server:
        method = ls.LlamaServerMethod("llama-server-draft", server, GREEDY)
        result = method.run(_tokenize(server, "One, two, three, four, five, six,"), 24, None)
    assert len(result.token_ids) == 24
    assert result.peer_drafted and 0 < result.peer_accepted <= result.peer_drafted
    assert result.peer_forwards == 24 - result.peer_accepted


@needs_build
@pytest.mark.real
def test_bench_runs_llama_server_peers_beside_ours(capsys, tmp_path):
    from specdec.cli import main

    questions = tmp_path / "q.jsonl"
    question = {"question_id": 1, "category": "count",
                "turns": ["Count from one to twenty in words, separated by commas."]}
    questions.write_text(json.dumps(question) + "\n")
    out = tmp_path / "out"
    code = main(["bench", "--model", "smollm2-135m", "--backend", "llamacpp", "--questions", str(questions),
                 "--max-new-tokens", "24", "--methods", "plain,llama-server-ngram-mod", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    results = json.loads((out / "results.json").read_text())["methods"]
    assert list(results) == ["llama-server-plain", "plain", "llama-server-ngram-mod"]  # its baseline added
    for name, r in results.items():
        assert r["overall"]["gen_tokens_per_s"] > 0, name
    assert results["llama-server-plain"]["overall"]["speedup"] == 1.0
    assert results["llama-server-ngram-mod"]["overall"]["gen_speedup"] > 0
