"""Log-probabilities: each new token's under the target (after a constraint's mask), in the Python
API and in OpenAI's shapes through the server, whole and streamed; the same with and without
speculation (bit for bit on llama.cpp's exact kernels)."""

from __future__ import annotations

import json
import math

import httpx
import pytest
import torch

from conftest import serving
from specdec.engine import token_logprobs
from specdec.errors import SpecdecError
from specdec.server.app import ServeConfig, Server


def test_token_logprobs_read_each_tokens_row():
    logits = torch.tensor([[0.0, 1.0, 2.0], [3.0, 0.0, 0.0]])
    first, second = token_logprobs(logits, [0, 1], [2, 1], top=2)
    assert first.token == 2 and math.isclose(first.logprob, float(torch.log_softmax(logits[0], -1)[2]))
    assert [t for t, _ in first.top] == [2, 1] and second.top[0][0] == 0 and second.logprob < second.top[0][1]


def test_the_api_keeps_one_logprob_per_new_token_masked_by_a_constraint(tiny):
    out = tiny.generate("the quick brown fox", max_new_tokens=10, drafter="ngram", logprobs=3)
    assert len(out.logprobs) == len(out.token_ids) and [e.token for e in out.logprobs] == out.token_ids
    assert all(len(e.top) == 3 and e.logprob <= e.top[0][1] + 1e-6 for e in out.logprobs)
    assert tiny.generate("the quick brown fox", max_new_tokens=4).logprobs is None
    constrained = tiny.generate("zebra", max_new_tokens=6, regex="[0-9]+", logprobs=5)
    digits = {t for t in range(tiny.loaded.logit_width) if tiny.decode([t]).isdigit()}
    for entry in constrained.logprobs[:-1]:  # every listed token is one the mask allows
        assert {t for t, lp in entry.top if lp > -math.inf} <= digits | set(tiny.eos_token_ids)
    with pytest.raises(SpecdecError, match="logprobs must be a whole number"):
        tiny.generate("hi", max_new_tokens=2, logprobs=-1)


@pytest.fixture(scope="module")
def url(tiny):
    server = Server(tiny, config=ServeConfig(slots=2, max_tokens=16))
    with serving(server.app(), timeout=30) as base:
        yield base


def test_chat_logprobs_whole_and_streamed(url, tiny):
    body = {"model": tiny.name, "messages": [{"role": "user", "content": "hello world"}], "max_tokens": 8,
            "temperature": 0, "logprobs": True, "top_logprobs": 2}
    whole = httpx.post(url + "/v1/chat/completions", json=body, timeout=60).json()
    content = whole["choices"][0]["logprobs"]["content"]
    expected = tiny.generate("hello world", chat=True, max_new_tokens=8, logprobs=2)
    assert [c["logprob"] for c in content] == [e.logprob for e in expected.logprobs]
    assert all(len(c["top_logprobs"]) == 2 and c["bytes"] == list(c["token"].encode()) for c in content)
    streamed = []
    with httpx.stream("POST", url + "/v1/chat/completions", json={**body, "stream": True}, timeout=60) as reply:
        for line in reply.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])["choices"][0]
                streamed += (chunk["logprobs"] or {}).get("content", [])
    assert streamed == content
    plain = httpx.post(url + "/v1/chat/completions", json={**body, "logprobs": False, "top_logprobs": None}).json()
    assert plain["choices"][0]["logprobs"] is None


def test_completion_logprobs(url, tiny):
    body = {"model": tiny.name, "prompt": "the quick brown fox", "max_tokens": 6, "temperature": 0, "logprobs": 1}
    choice = httpx.post(url + "/v1/completions", json=body, timeout=60).json()["choices"][0]
    shown = choice["logprobs"]
    assert len(shown["tokens"]) == len(shown["token_logprobs"]) == 6
    offsets = [sum(len(t) for t in shown["tokens"][:i]) for i in range(6)]
    assert shown["text_offset"] == offsets and all(len(top) == 1 for top in shown["top_logprobs"])


@pytest.mark.parametrize("body, words", [
    ({"logprobs": 3}, "logprobs: true or false"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs: a whole number 0..20"),
    ({"top_logprobs": 2}, "top_logprobs: needs logprobs true"),
])
def test_bad_logprobs_are_refused(url, tiny, body, words):
    full = {"model": tiny.name, "messages": [{"role": "user", "content": "hi"}], **body}
    response = httpx.post(url + "/v1/chat/completions", json=full)
    assert response.status_code == 400 and words in response.json()["error"]["message"]


@pytest.mark.real
def test_logprobs_are_the_same_with_and_without_speculation_through_the_sdk(shared_model):
    """On llama.cpp's exact kernels a token's logits do not depend on how many rows its forward
    had, so its log-probability is the same bit for bit whether a draft verified it or a plain
    step computed it (the openai SDK, unchanged)."""
    pytest.importorskip("llama_cpp")
    openai = pytest.importorskip("openai")
    model = shared_model("smollm2-135m", "llamacpp")
    server = Server(model, config=ServeConfig(slots=2))
    messages = [{"role": "user", "content": "Repeat exactly: the cat sat on the mat, the cat sat on the mat."}]
    with serving(server.app(), timeout=60) as base:
        client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=120)
        answers = {drafter: client.chat.completions.create(
            model=model.name, messages=messages, temperature=0, max_tokens=40, logprobs=True, top_logprobs=3,
            extra_body={"drafter": drafter, "policy": "fixed", "num_draft": 4}) for drafter in ("none", "ngram")}
    plain, spec = (answers[d].choices[0].logprobs.content for d in ("none", "ngram"))
    assert answers["ngram"].speculative["draft_n_accepted"] > 0  # tokens verified from drafts
    assert [(c.token, c.logprob) for c in plain] == [(c.token, c.logprob) for c in spec]
    assert [[t.logprob for t in c.top_logprobs] for c in plain] == [[t.logprob for t in c.top_logprobs] for c in spec]
