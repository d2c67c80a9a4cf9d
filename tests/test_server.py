"""The OpenAI-compatible server on a tiny model, started on 127.0.0.1 in the test: the official
``openai`` client (completions and chat, streamed and not), greedy text equal to ``generate``,
seeds, metrics, clean OpenAI-style errors, a disconnecting client, a bounded load test, a fuzz
test of malformed bodies, and the options: ``specdec serve`` flags as the requests' defaults,
the CLI's messages for bad values, drafter-declared options in the body."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import serving
from specdec.server.app import ServeConfig, Server
from loadtest import run_load

PROMPTS = ["the quick brown fox", "hello world hello world", "zebra", "the quick brown fox jumps over the lazy"]


@pytest.fixture(scope="module")
def served(tiny):
    """(base url, server) of a running server; it stops when the module's tests are done."""
    server = Server(tiny, config=ServeConfig(slots=4, max_tokens=24, max_body=64 * 1024))
    server.warm_up()
    with serving(server.app(), timeout=30) as url:
        yield url, server


@pytest.fixture(scope="module")
def http(served):
    """One HTTP client for many requests (a client per request costs its set-up each time)."""
    with httpx.Client(base_url=served[0]) as session:
        yield session


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served[0] + "/v1", api_key="none", max_retries=0, timeout=60)


def test_completion_equals_generate(client, tiny):
    for prompt in PROMPTS:
        expected = tiny.generate(prompt, max_new_tokens=12, drafter="none")
        out = client.completions.create(model=tiny.name, prompt=prompt, max_tokens=12, temperature=0)
        assert out.choices[0].text == expected.text
        assert out.usage.completion_tokens == len(expected.token_ids)
        assert out.usage.prompt_tokens == len(tiny.encode(prompt))
        spec = out.model_extra["speculative"]
        assert set(spec) == {"draft_n", "draft_n_accepted", "acceptance_rate", "mean_accepted_length",
                             "target_forwards", "tokens_per_s"}  # no counter twice; no seed when greedy
        assert out.choices[0].finish_reason in ("stop", "length")


def test_streamed_completion_equals_the_whole_one(client, tiny):
    prompt = PROMPTS[1]
    whole = client.completions.create(model=tiny.name, prompt=prompt, max_tokens=16, temperature=0)
    chunks = list(client.completions.create(model=tiny.name, prompt=prompt, max_tokens=16, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason


def test_chat_streamed_and_not_equal_generate_with_the_template(client, tiny):
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "the quick brown"},
                {"role": "assistant", "content": "fox"}, {"role": "user", "content": "hello world"}]
    expected = tiny.generate(tiny.loaded.codec.encode_messages(messages), max_new_tokens=10, drafter="none")
    out = client.chat.completions.create(model=tiny.name, messages=messages, max_tokens=10, temperature=0)
    assert out.choices[0].message.content == expected.text and out.choices[0].message.role == "assistant"
    chunks = list(client.chat.completions.create(model=tiny.name, messages=messages, max_tokens=10, temperature=0,
                                                 stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected.text


def test_greedy_server_output_equals_the_cli(client, tiny, tiny_model_dir, capsys):
    from specdec.cli import main

    assert main(["generate", PROMPTS[0], "--model", str(tiny_model_dir), "--max-new-tokens", "12", "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    out = client.completions.create(model=tiny.name, prompt=PROMPTS[0], max_tokens=12, temperature=0)
    assert out.choices[0].text == cli["text"]


def test_a_seed_gives_the_same_text_with_any_drafter(client, tiny):
    texts = set()
    for drafter in ("none", "ngram"):
        for tree in (False, True):
            out = client.completions.create(model=tiny.name, prompt=PROMPTS[3], max_tokens=20, temperature=0.9,
                                            seed=1234, extra_body={"drafter": drafter, "num_draft": 3, "tree": tree})
            texts.add(out.choices[0].text)
            assert out.model_extra["speculative"]["seed"] == 1234
    assert len(texts) == 1


def test_models_health_and_metrics(served, client, tiny):
    url = served[0]
    assert [m.id for m in client.models.list()] == [tiny.name]
    assert httpx.get(url + "/health").json()["status"] == "ok"
    client.completions.create(model=tiny.name, prompt="hello world hello world hello world", max_tokens=12,
                              temperature=0, extra_body={"drafter": "ngram", "policy": "fixed", "num_draft": 2})
    metrics = httpx.get(url + "/metrics").text
    for name in ("specdec:spec_decode_num_drafts_total", "specdec:spec_decode_num_draft_tokens_total",
                 "specdec:spec_decode_num_accepted_tokens_total",
                 'specdec:spec_decode_num_accepted_tokens_per_pos_total{position="0"}',
                 "specdec:e2e_request_latency_seconds_bucket", "specdec:generation_tokens_total",
                 'specdec:requests_total{endpoint="/v1/completions",status="200"}'):
        assert name in metrics, name
    drafts = [line for line in metrics.splitlines() if line.startswith("specdec:spec_decode_num_draft_tokens_total")]
    assert float(drafts[0].split()[-1]) > 0


def test_the_request_counter_counts_streamed_refused_and_unknown_requests_by_status(served, http, tiny):
    def counted(endpoint: str, status: str) -> float:
        key = f'specdec:requests_total{{endpoint="{endpoint}",status="{status}"}}'
        lines = [line for line in http.get("/metrics").text.splitlines() if line.startswith(key)]
        return float(lines[0].split()[-1]) if lines else 0.0

    before = [counted("/v1/chat/completions", "200"), counted("/v1/chat/completions", "400"), counted("other", "404")]
    with http.stream("POST", "/v1/chat/completions", json={
            "model": tiny.name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True}) as r:
        assert r.status_code == 200 and "[DONE]" in r.read().decode()
    assert http.post("/v1/chat/completions", json={"model": tiny.name, "messages": []}).status_code == 400
    assert http.get("/v1/nowhere").status_code == 404
    after = [counted("/v1/chat/completions", "200"), counted("/v1/chat/completions", "400"), counted("other", "404")]
    assert [b - a for a, b in zip(before, after)] == [1, 1, 1]


@pytest.mark.parametrize("body, status, words", [
    (b"{not json", 400, "not valid JSON"),
    (b"[]", 400, ""),
    (json.dumps({"prompt": "hi"}).encode(), 400, "missing field: model"),
    (json.dumps({"model": "MODEL"}).encode(), 400, "missing field: prompt"),
    (json.dumps({"model": "MODEL", "prompt": "hi", "max_tokens": "8"}).encode(), 400, "max_tokens"),
    (json.dumps({"model": "MODEL", "prompt": "hi", "max_tokens": 0}).encode(), 400, "max_tokens must be >= 1"),
    (json.dumps({"model": "MODEL", "prompt": "hi", "max_tokens": 10 ** 6}).encode(), 400, "context"),
    (json.dumps({"model": "MODEL", "prompt": "hi", "temperature": -1}).encode(), 400, "temperature"),
    (json.dumps({"model": "MODEL", "prompt": "hi", "n": 2}).encode(), 400, "n: only one"),
    (json.dumps({"model": "MODEL", "prompt": "hi", "drafter": "magic"}).encode(), 400, "magic"),
    (json.dumps({"model": "MODEL", "prompt": "hi", "num_draft": 0}).encode(), 400, "num_draft must be >= 1, got 0"),
    (json.dumps({"model": "MODEL", "prompt": "hi", "num_draft": "3"}).encode(), 400, "num_draft"),
    (json.dumps({"model": "MODEL", "prompt": "hi", "verify": "maybe"}).encode(), 400, "unknown verify 'maybe'"),
    (json.dumps({"model": "MODEL", "prompt": ""}).encode(), 400, "empty"),
    (json.dumps({"model": "MODEL", "prompt": [10 ** 9]}).encode(), 400, "outside the vocabulary"),
    (json.dumps({"model": "gpt-9", "prompt": "hi"}).encode(), 404, "not served here"),
    (json.dumps({"model": "MODEL", "prompt": "x" * 70_000}).encode(), 413, "larger than"),
    # nothing silently ignored: a field the server does not implement, or a value it cannot honour
    (json.dumps({"model": "MODEL", "prompt": "hi", "frobnicate": 1}).encode(), 400,
     "frobnicate: not a field specdec serve implements"),
    (json.dumps({"model": "MODEL", "prompt": "hi", "best_of": 2}).encode(), 400, "best_of: not a field"),
    (json.dumps({"model": "MODEL", "prompt": "hi", "frequency_penalty": 0.5}).encode(), 400,
     "frequency_penalty: not supported"),
    (json.dumps({"model": "MODEL", "prompt": "hi", "logit_bias": {"5": 10}}).encode(), 400, "logit_bias"),
    (json.dumps({"model": "MODEL", "prompt": "hi", "stream_options": {"include_usage": True, "x": 1}}).encode(),
     400, "stream_options.x"),
])
def test_bad_requests_get_openai_style_errors(served, tiny, body, status, words):
    url = served[0]
    body = body.replace(b"MODEL", tiny.name.encode())
    for stream in (False, True):
        if stream and body.startswith(b"{\""):
            body = body[:-1] + b', "stream": true}'
        response = httpx.post(url + "/v1/completions", content=body, headers={"Content-Type": "application/json"})
        assert response.status_code == status, response.text
        error = response.json()["error"]
        assert words in error["message"] and error["type"]
    assert httpx.get(url + "/health").status_code == 200


def test_unknown_routes_and_methods(served):
    url = served[0]
    assert httpx.get(url + "/v1/nothing").status_code == 404
    assert httpx.get(url + "/v1/completions").status_code == 405
    assert "error" in httpx.get(url + "/v1/nothing").json()


def test_chat_errors(served, tiny):
    url = served[0] + "/v1/chat/completions"
    user = {"role": "user", "content": "hi"}
    for body, words in (({"model": tiny.name, "messages": []}, "messages"),
                        ({"model": tiny.name, "messages": [{"role": "robot", "content": "hi"}]}, "role"),
                        ({"model": tiny.name, "messages": [{"role": "user", "content": 5}]}, "content"),
                        ({"model": tiny.name, "messages": [user],
                          "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
                              "type": "object", "properties": {"a": {"type": "frob"}}}}}},
                         "could not be compiled: Invalid type: frob"),
                        ({"model": tiny.name, "messages": [user], "response_format": {"type": "json_schema"}},
                         "response_format"),
                        ({"model": tiny.name, "messages": [user], "regex": "[unclosed"}, "unclosed character class"),
                        ({"model": tiny.name, "messages": [user], "tools": [{"type": "function"}]},
                         "missing field: tools.0.function"),
                        ({"model": tiny.name, "messages": [user], "tool_choice": "required"}, "needs tools"),
                        ({"model": tiny.name, "messages": [user], "top_logprobs": 3}, "top_logprobs"),
                        ({"model": tiny.name, "messages": [{**user, "name": "alice"}]}, "messages.0.name"),
                        ({"model": tiny.name, "messages": [user, {"role": "assistant", "content": "x",
                                                                  "tool_calls": [{"id": "1"}]}]}, "tool_calls")):
        response = httpx.post(url, json=body)
        assert response.status_code == 400 and words in response.json()["error"]["message"], response.text


def test_advisory_fields_and_neutral_values_are_accepted(served, tiny):
    """OpenAI's fields that cannot change an answer, and the values that ask for nothing (what
    SDKs send back with an assistant's earlier message), leave the answer as it is without them."""
    url = served[0] + "/v1/chat/completions"
    messages = [{"role": "user", "content": "hello world"}]
    plain = httpx.post(url, json={"model": tiny.name, "messages": messages, "max_tokens": 6, "temperature": 0})
    assert plain.status_code == 200, plain.text
    body = {"model": tiny.name, "max_tokens": 6, "temperature": 0, "user": "u-1", "metadata": {"k": "v"},
            "store": False, "frequency_penalty": 0, "presence_penalty": 0.0, "logit_bias": {},
            "response_format": {"type": "text"}, "tools": [], "tool_choice": "none", "top_logprobs": 0,
            "messages": [{"role": "user", "content": "hello world", "refusal": None, "annotations": [],
                          "tool_calls": None}]}
    answer = httpx.post(url, json=body)
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"] == plain.json()["choices"][0]["message"]


BOUNDED = {"type": "object", "properties": {"name": {"type": "string", "pattern": "^[a-z]{1,3}$"},
                                            "age": {"type": "integer", "minimum": 0, "maximum": 99}},
           "required": ["name", "age"], "additionalProperties": False,
           "x-guidance": {"whitespace_flexible": False}}  # a random model would wander in free whitespace


def test_a_json_schema_answer_streamed_or_not_is_valid_and_equals_generate(served, tiny):
    """``response_format`` json_schema through the server: whole and streamed, the answer follows
    the schema and is the same request's ``generate`` answer; a schema that does not compile is a
    400 before any byte of a stream."""
    url = served[0] + "/v1/chat/completions"
    messages = [{"role": "user", "content": "the quick brown fox"}]
    body = {"model": tiny.name, "messages": messages, "max_tokens": 24, "temperature": 0,
            "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": BOUNDED}}}
    whole = httpx.post(url, json=body, timeout=60).json()
    text = whole["choices"][0]["message"]["content"]
    expected = tiny.generate("the quick brown fox", chat=True, max_new_tokens=24, response_format=BOUNDED)
    assert text == expected.text and whole["choices"][0]["finish_reason"] == "stop"
    value = json.loads(text)
    assert set(value) == {"name", "age"} and 0 <= value["age"] <= 99
    parts = []
    with httpx.stream("POST", url, json={**body, "stream": True}, timeout=60) as reply:
        for line in reply.iter_lines():
            if line.startswith("data: {"):
                delta = json.loads(line[6:])["choices"][0]["delta"]
                parts.append(delta.get("content") or "")
    assert "".join(parts) == text
    bad = {**body, "stream": True, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"type": "frob"}}}}}}
    response = httpx.post(url, json=bad, timeout=60)
    assert response.status_code == 400 and "frob" in response.json()["error"]["message"]


def test_a_request_without_max_tokens_runs_until_the_context_is_full(tiny):
    """As OpenAI's API and llama-server: no max_tokens, no limit but the context (the tiny model
    never says its end-of-sequence token after "zebra", so its answer fills the context);
    ``--max-tokens`` caps every request, one that asks for more too."""
    context = tiny.loaded.backend().max_length
    prompt = "zebra"
    prompt_tokens = len(tiny.encode(prompt))
    uncapped = Server(tiny, config=ServeConfig(slots=1))
    with serving(uncapped.app(), timeout=30) as url:
        out = httpx.post(url + "/v1/completions", json={"model": tiny.name, "prompt": prompt, "temperature": 0},
                         timeout=120).json()
        whole = tiny.generate(prompt, max_new_tokens=context - prompt_tokens, temperature=0)
        assert out["usage"]["completion_tokens"] == len(whole.token_ids) > 256  # past the old default
        assert out["choices"][0]["finish_reason"] == {"eos": "stop"}.get(whole.finish_reason, whole.finish_reason)
        full = httpx.post(url + "/v1/completions", json={"model": tiny.name, "prompt": [5] * context}).json()
        assert "leaves no room" in full["error"]["message"]
    capped = Server(tiny, config=ServeConfig(slots=1, max_tokens=7))
    with serving(capped.app(), timeout=30) as url:
        for body, tokens in (({}, 7), ({"max_tokens": 100}, 7), ({"max_tokens": 3}, 3)):
            out = httpx.post(url + "/v1/completions", json={"model": tiny.name, "prompt": prompt, "temperature": 0,
                                                           **body}).json()
            expected = tiny.generate(prompt, max_new_tokens=tokens, temperature=0)  # the cap, or an end before it
            assert out["usage"]["completion_tokens"] == len(expected.token_ids), body


def running(url: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith("specdec:num_requests_running "):
            return float(line.split()[-1])
    raise AssertionError("no running gauge")


def test_a_client_that_disconnects_mid_stream_frees_its_slot(served, tiny):
    url = served[0]
    body = {"model": tiny.name, "prompt": PROMPTS[0], "max_tokens": 400, "temperature": 0, "stream": True,
            "drafter": "none"}
    with httpx.Client(timeout=30) as http:
        with http.stream("POST", url + "/v1/completions", json=body) as response:
            assert response.status_code == 200
            next(response.iter_lines())  # the generation is under way
    deadline = time.time() + 10
    while running(url) > 0:
        assert time.time() < deadline, "the abandoned generation kept its slot"
        time.sleep(0.05)
    out = httpx.post(url + "/v1/completions", json={"model": tiny.name, "prompt": "hi", "max_tokens": 3}, timeout=30)
    assert out.status_code == 200


def test_bounded_load_test(served, tiny):
    """16 concurrent clients, 256 requests: no failure, every answer the right one for its prompt."""
    url = served[0]
    expected = {p: tiny.generate(p, max_new_tokens=8, drafter="none").text for p in PROMPTS}
    bodies = [{"model": tiny.name, "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": 8, "temperature": 0,
               "drafter": ["ngram", "none"][i % 2]} for i in range(256)]
    report = asyncio.run(run_load(url, bodies, clients=16, time_limit=240))
    print("load test:", report.summary())
    assert report.failures == 0, [r.error for r in report.results if r.status != 200][:3]
    assert len(report.results) == 256
    for body, result in zip(bodies, report.results):
        assert result.text == expected[body["prompt"]]
    assert report.percentile(0.5) <= report.percentile(0.95)
    assert httpx.get(url + "/health").status_code == 200


json_values = st.recursive(st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70) | st.floats(allow_nan=False)
                           | st.text(max_size=20), lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=8)
FIELDS = ["model", "prompt", "messages", "max_tokens", "temperature", "top_p", "top_k", "stop", "seed", "stream",
          "n", "drafter", "num_draft", "tree", "policy", "verify", "stream_options"]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.one_of(
    st.binary(max_size=64),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=6).map(lambda d: json.dumps(d).encode()),
), path=st.sampled_from(["/v1/completions", "/v1/chat/completions"]))
def test_fuzzed_bodies_get_clean_4xx_and_the_server_stays_up(http, body, path):
    response = http.post(path, content=body, headers={"Content-Type": "application/json"}, timeout=60)
    if response.status_code != 200:  # a random body is rarely a valid request, but may be
        assert 400 <= response.status_code < 500, response.text
        assert response.json()["error"]["message"]
    assert http.get("/health", timeout=10).status_code == 200


@pytest.mark.parametrize("argv, message", [
    (["--slots", "0"], "--slots must be >= 1"),
    (["--max-tokens", "0"], "--max-tokens must be >= 1"),
    (["--port", "70000"], "--port must be in 0..65535"),
    (["--model", "smollm2-135m", "--drafter", "model"], "needs --draft-model"),  # an alias without a draft model
])
def test_serve_refuses_bad_options_before_loading(capsys, no_loading, argv, message):
    from specdec.cli import main

    assert main(["serve", *argv]) == 2
    assert message in capsys.readouterr().err and not no_loading


def test_serve_refuses_a_taken_port_before_loading(capsys, no_loading):
    import socket

    from specdec.cli import main

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        assert main(["serve", "--port", str(port)]) == 2
    assert "cannot listen on 127.0.0.1" in capsys.readouterr().err and not no_loading


def test_serve_freezes_what_it_loaded_before_serving(monkeypatch, tiny, tiny_model_dir):
    """What is loaded before the first request lives as long as the server: frozen, the collector's
    full collections no longer walk it in the middle of requests."""
    import gc

    from specdec.cli import main

    monkeypatch.setattr("specdec.api.load", lambda *args, **kwargs: tiny)
    frozen = []
    monkeypatch.setattr("specdec.server.app.serve_forever", lambda *args: frozen.append(gc.get_freeze_count()))
    try:
        assert main(["serve", "--model", str(tiny_model_dir), "--port", "0", "--no-batch"]) == 0
    finally:
        gc.unfreeze()
    assert frozen and frozen[0] > 1000


# -- options: the serve flags are the defaults, one message per mistake, drafters' own options ------
def serve_args(*argv: str):
    """``specdec serve`` flags parsed and checked by the real CLI (nothing is loaded)."""
    from specdec.cli import build_parser
    from specdec.commands import serve

    args = build_parser().parse_args(["serve", "--port", "0", *argv])
    serve.check_args(args)
    return args


@pytest.fixture()
def started(monkeypatch):
    """The options every generation of the target model started with (a spy on ``Model.start``)."""
    from specdec.api import Model

    seen, original = [], Model.start

    def start(self, prompt, options=None, **kwargs):
        run = original(self, prompt, options, **kwargs)
        seen.append(run.options)
        return run

    monkeypatch.setattr(Model, "start", start)
    return seen


def test_serve_verify_rejection_is_the_default_of_requests(tiny, tiny_model_dir, tiny_draft_dir, started):
    """``specdec serve --verify rejection`` verifies requests that do not choose with rejection
    sampling: the options they run with say so, and a seeded sampled answer with a model drafter
    is rejection sampling's text (it differs from coupled drafting's, which is plain decoding's)."""
    from fastapi.testclient import TestClient

    import specdec
    from specdec.commands.serve import serve_config

    args = serve_args("--model", str(tiny_model_dir), "--drafter", "model", "--draft-model", str(tiny_draft_dir),
                      "--policy", "fixed", "--num-draft", "3", "--verify", "rejection")
    assert args.options.verify == "rejection"
    server = Server(tiny, specdec.load(args.draft_model), serve_config(args))
    body = {"model": tiny.name, "prompt": PROMPTS[3], "max_tokens": 24, "temperature": 1.0, "seed": 7}
    with TestClient(server.app()) as http:
        texts = {}
        for verify in (None, "rejection", "coupled"):
            response = http.post("/v1/completions", json={**body, **({"verify": verify} if verify else {})})
            assert response.status_code == 200, response.text
            texts[verify] = response.json()["choices"][0]["text"]
            assert (started[-1].verify, started[-1].drafter, started[-1].num_draft) == \
                   (verify or "rejection", "model", 3)
    plain = tiny.generate(PROMPTS[3], max_new_tokens=24, temperature=1.0, seed=7, drafter="none").text
    assert texts["coupled"] == plain
    assert texts[None] == texts["rejection"] != plain


@pytest.mark.parametrize("name, value", [("num_draft", 0), ("top_p", 0), ("temperature", -1), ("drafter", "nope"),
                                         ("top_k", -2), ("seed", -1), ("policy", "sometimes")])
def test_a_bad_option_reads_as_it_does_everywhere(served, tiny, tiny_model_dir, capsys, no_loading, name, value):
    """The server's 400 says exactly what :meth:`GenerationOptions.validate` says (and the CLI)."""
    from specdec.cli import main
    from specdec.errors import SpecdecError
    from specdec.options import GenerationOptions, option

    with pytest.raises(SpecdecError) as raised:
        GenerationOptions(**{name: value}).validate()
    for path, extra in (("/v1/completions", {"prompt": "hi"}),
                        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})):
        response = httpx.post(served[0] + path, json={"model": tiny.name, name: value, **extra}, timeout=30)
        assert response.status_code == 400
        assert response.json()["error"] == {"message": str(raised.value), "type": "invalid_request_error",
                                            "param": name, "code": None}
    spec = option(name)
    if spec.choices is None:  # (argparse itself refuses an unknown choice, in its own words)
        typed = spec.parse(str(value))  # the flag's value: -1.0 for "--temperature -1"
        with pytest.raises(SpecdecError) as raised:
            GenerationOptions(**{name: typed}).validate()
        assert main(["generate", "hi", "--model", str(tiny_model_dir), spec.cli_flag, str(value)]) == 2
        assert capsys.readouterr().err.strip().splitlines()[-1] == f"error: {raised.value}"


@pytest.fixture()
def probe_drafter():
    """A drafter declaring an option of its own, ``probe_width`` (registered for one test only);
    the list records the values it was built with."""
    from specdec import registry
    from specdec.options import Option, at_least

    registry.DRAFTERS.names()  # every built-in drafter registered first, so that undoing keeps them
    entries, seen = dict(registry.DRAFTERS._entries), []

    @registry.drafter("probe", "n-gram drafting that records its width", options=[
        Option("probe_width", int, 2, "how wide the probe looks", at_least(1))])
    def build(request):
        seen.append(request.options["probe_width"])
        return registry.DRAFTERS.get("ngram").build(request)

    yield seen
    registry.DRAFTERS._entries.clear()
    registry.DRAFTERS._entries.update(entries)  # the probe's option goes with its entry


def test_a_drafter_declared_option_is_a_flag_default_and_a_body_field(tiny, tiny_model_dir, probe_drafter):
    from fastapi.testclient import TestClient

    from specdec.commands.serve import serve_config
    from specdec.errors import SpecdecError
    from specdec.options import GenerationOptions

    args = serve_args("--model", str(tiny_model_dir), "--drafter", "probe", "--probe-width", "5")
    server = Server(tiny, config=serve_config(args))
    body = {"model": tiny.name, "prompt": PROMPTS[0], "max_tokens": 6, "temperature": 0}
    expected = tiny.generate(PROMPTS[0], max_new_tokens=6, drafter="none").text
    with TestClient(server.app()) as http:
        for chosen, width in (({}, 5), ({"probe_width": 3}, 3)):
            response = http.post("/v1/completions", json={**body, **chosen})
            assert response.status_code == 200, response.text
            assert response.json()["choices"][0]["text"] == expected and probe_drafter[-1] == width
        with pytest.raises(SpecdecError) as raised:
            GenerationOptions(extra={"probe_width": 0}).validate()
        wrong = http.post("/v1/completions", json={**body, "probe_width": 0})
        assert wrong.status_code == 400 and wrong.json()["error"]["message"] == str(raised.value)
        assert wrong.json()["error"]["param"] == "probe_width"
        typed = http.post("/v1/completions", json={**body, "probe_width": "wide"})
        assert typed.status_code == 400 and typed.json()["error"]["param"] == "probe_width"


# -- the routes read the server through a few methods ------------------------------------------------
class FakeServed:
    """Only what :class:`specdec.server.routes.Served` names: no model, no metrics registry."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def health(self) -> dict:
        return {"status": "ok", "model": "fake"}

    def models(self) -> list[dict]:
        return [{"id": "fake", "object": "model"}]

    def metrics_text(self) -> str:
        return "fake_metric 1\n"

    def options(self, req, max_tokens, prompt):
        from specdec.options import GenerationOptions

        return GenerationOptions(max_new_tokens=max_tokens or 3)

    def prompt_ids(self, prompt):
        return [7] if isinstance(prompt, str) else prompt

    def constraint(self, req):
        return None

    def token_text(self, token):
        return str(token)

    def chat_prompt(self, messages: list[dict], tools=None) -> list[int]:
        self.calls.append(f"chat:{messages[-1]['content']}")
        return [1, 2]

    async def generate(self, asked, request, t0):
        from specdec.api import Output
        from specdec.stats import GenerationStats

        self.calls.append(f"generate:{asked.prompt}:{asked.opts.max_new_tokens}")
        return Output("ok", [5], list(asked.prompt), "length", GenerationStats(new_tokens=1))

    async def events(self, asked, answer, include_usage, t0):
        yield ""
        yield "data: [DONE]\n\n"


def test_the_routes_need_only_the_servers_few_methods():
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from specdec.server.routes import router

    fake = FakeServed()
    app = FastAPI()
    app.include_router(router(fake))
    with TestClient(app) as http:
        assert http.get("/health").json()["model"] == "fake"
        assert http.get("/v1/models").json()["data"][0]["id"] == "fake"
        assert http.get("/metrics").text == "fake_metric 1\n"
        chat = http.post("/v1/chat/completions", json={"model": "fake", "max_tokens": 4,
                                                        "messages": [{"role": "user", "content": "hi"}]})
        assert chat.status_code == 200 and chat.json()["choices"][0]["message"]["content"] == "ok"
        streamed = http.post("/v1/completions", json={"model": "fake", "prompt": "x", "stream": True})
        assert streamed.text == "data: [DONE]\n\n"
    assert fake.calls == ["chat:hi", "generate:[1, 2]:4"]


# -- settings by name: the CLI's flags and a Serve config file's args ---------------------------------
def test_a_config_files_settings_are_the_serve_flags(tiny_model_dir, tiny_draft_dir):
    from specdec.commands.serve import serve_config
    from specdec.server.settings import settings_from

    flags = serve_args("--model", str(tiny_model_dir), "--drafter", "model", "--draft-model", str(tiny_draft_dir),
                       "--num-draft", "3", "--verify", "rejection", "--slots", "2", "--max-tokens", "40")
    named = settings_from({"model": str(tiny_model_dir), "drafter": "model", "draft_model": str(tiny_draft_dir),
                           "num_draft": 3, "verify": "rejection", "slots": 2, "max_tokens": 40})
    assert named.config == serve_config(flags)
    assert (named.model, named.draft_model) == (flags.model, flags.draft_model)
    assert named.load == {"backend": "transformers", "dtype": "float32", "exact": None, "graphs": None,
                          "device": "cpu", "threads": None, "context": None}
    assert named.scaling.fixed == 2 and not named.scaling.autoscaled
    assert settings_from({"min_replicas": 1, "max_replicas": 3}).scaling.fixed is None


@pytest.mark.parametrize("values, message", [
    ({"temperature": 0.5}, "temperature is chosen by each request, not by the server"),
    ({"prot": 80}, "unknown setting 'prot': use one of "),
    ({"num_draft": 0}, "num_draft must be >= 1, got 0"),
    ({"slots": "4"}, "slots must be a whole number, got '4'"),
    ({"replicas": 2, "max_replicas": 3}, "give replicas or min_replicas/max_replicas, not both"),
    ({"replica_cpus": -1}, "replica_cpus must be >= 0, got -1"),
    ({"routing": "random"}, "routing must be one of prefix, default, got 'random'"),
    ({"backend": "onnx"}, "unknown backend 'onnx': use one of "),
    ({"drafter": "ngram", "draft_model": "x"}, "draft_model is only used with a drafter that runs a model"),
    ({"model": "some/folder", "drafter": "model"}, "drafter model needs draft_model (some/folder names no default"),
])
def test_a_config_files_mistake_is_one_message_before_anything_loads(values, message, no_loading):
    from specdec.errors import SpecdecError
    from specdec.server.settings import settings_from

    with pytest.raises(SpecdecError) as raised:
        settings_from(values)
    assert str(raised.value).startswith(message), str(raised.value)
    assert no_loading == []


def test_two_threads_calibrate_the_cost_model_once(tiny, monkeypatch):
    """The server's first requests run in threads: the cost model is measured once, not once each."""
    import threading

    from specdec import loaded

    model = tiny
    monkeypatch.setattr(model.loaded, "_costs", None)  # not measured yet (restored after the test)
    calls = []

    def calibrated(key, backend, context):
        calls.append(key)
        time.sleep(0.3)
        return object()

    monkeypatch.setattr(loaded, "calibrated", calibrated)
    got = []
    threads = [threading.Thread(target=lambda: got.append(model.loaded.cost_model())) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and got[0] is got[1]
