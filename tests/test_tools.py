"""Tool calls through the server: tools rendered by the model's own chat template, the model's
``<tool_call>`` blocks parsed into OpenAI's ``tool_calls`` (whole and streamed), ``tool_choice``
``required`` or a named function constraining the answer to calls whose arguments follow the
function's parameters, and a round trip with the tool's result, through the openai SDK unchanged
on Qwen2.5-Coder-1.5B (whose template writes tool calls)."""

from __future__ import annotations

import json

import httpx
import pytest

from conftest import serving
from specdec.constraints import Grammar
from specdec.server.app import ServeConfig, Server
from specdec.server.tools import call_constraint, held_back, parse, template_messages

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"type": "string", "enum": ["C", "F"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}


def test_tool_call_blocks_parse_into_openai_calls():
    text = 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}\n</tool_call>'
    parsed = parse(text)
    assert parsed.content == "Let me look." and len(parsed.calls) == 1
    call = parsed.calls[0]
    assert call["function"]["name"] == "get_weather" and json.loads(call["function"]["arguments"]) == {
        "city": "Paris", "unit": "C"} and call["id"].startswith("call_")
    assert parse("<tool_call>not json</tool_call>").calls == []  # stays text
    assert parse("no calls here") .content == "no calls here"
    assert held_back("answer <tool") == len("answer ") and held_back("plain") == 5
    assert held_back("x <tool_call>{") == 2


def test_earlier_calls_go_to_the_template_with_arguments_as_objects():
    messages = [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]}]
    assert template_messages(messages)[0]["tool_calls"][0]["function"]["arguments"] == {"a": 1}


def test_a_required_call_is_a_grammar_of_the_functions_calls(tiny):
    spec = call_constraint([WEATHER, TIME], "required", parallel=False)
    grammar = tiny.loaded.grammar(spec)  # it compiles, and allows exactly a call block
    constraint = grammar.start()
    good = tiny.encode('<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')
    assert constraint.allowed_prefix(good) == len(good)
    bad = tiny.encode('<tool_call>\n{"name": "get_weather", "arguments": {"city": 3}}')
    assert constraint.allowed_prefix(bad) < len(bad)
    named = call_constraint([WEATHER, TIME], {"type": "function", "function": {"name": "get_weather"}}, True)
    assert "get_time" not in named.source and isinstance(tiny.loaded.grammar(named), Grammar)


def test_tools_for_a_template_without_tool_calls_are_refused(tiny):
    server = Server(tiny, config=ServeConfig(slots=1, max_tokens=8))
    with serving(server.app(), timeout=30) as url:
        body = {"model": tiny.name, "messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER]}
        response = httpx.post(url + "/v1/chat/completions", json=body)
        assert response.status_code == 400 and "writes no tool calls" in response.json()["error"]["message"]
        for extra, words in (({"tool_choice": "required"}, "needs tools"),
                             ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
                              "not among the tools")):
            body = {"model": tiny.name, "messages": [{"role": "user", "content": "hi"}], **extra}
            response = httpx.post(url + "/v1/chat/completions", json=body)
            assert response.status_code == 400 and words in response.json()["error"]["message"]


@pytest.mark.real
def test_a_tool_call_round_trip_through_the_sdk_on_qwen(shared_model):
    pytest.importorskip("llama_cpp")
    openai = pytest.importorskip("openai")
    model = shared_model("qwen2.5-coder-1.5b", "llamacpp")
    server = Server(model, config=ServeConfig(slots=2))
    with serving(server.app(), timeout=120) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=300)
        messages = [{"role": "user", "content": "What is the weather in Paris, in Celsius?"}]
        first = client.chat.completions.create(model=model.name, messages=messages, tools=[WEATHER],
                                               tool_choice="required", temperature=0, max_tokens=60)
        choice = first.choices[0]
        assert choice.finish_reason == "tool_calls"
        call = choice.message.tool_calls[0]
        arguments = json.loads(call.function.arguments)
        assert call.function.name == "get_weather" and set(arguments) == {"city", "unit"}
        assert arguments["unit"] in ("C", "F")
        streamed = client.chat.completions.create(model=model.name, messages=messages, tools=[WEATHER],
                                                  tool_choice="required", temperature=0, max_tokens=60, stream=True)
        deltas = [c.choices[0].delta for c in streamed if c.choices]
        calls = [t for d in deltas for t in (d.tool_calls or [])]
        assert calls and calls[0].function.name == "get_weather"
        assert json.loads(calls[0].function.arguments) == arguments
        messages += [choice.message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": "18 degrees and sunny"}]
        final = client.chat.completions.create(model=model.name, messages=messages, tools=[WEATHER],
                                               temperature=0, max_tokens=40)
    # the call and the tool's result went to the model as its own template renders them
    rendered = model.loaded.codec.encode_messages(template_messages(messages), [WEATHER])
    assert final.usage.prompt_tokens == len(rendered)
    assert final.choices[0].finish_reason in ("stop", "length", "tool_calls")
