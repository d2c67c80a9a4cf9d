"""The load test (scripts/loadtest.py) against fake servers: it waits until a server
answers a real request before timing any (a server that listens while it loads its model, as
llama-server does, answered the first timed requests with 503), and a level where requests failed
gives no figures to compare, only how many failed and why."""

from __future__ import annotations

import json
import sys
import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from fastapi import FastAPI, Request  # noqa: E402
from fastapi.responses import JSONResponse, StreamingResponse  # noqa: E402

from conftest import serving  # noqa: E402
import loadtest  # noqa: E402


def fake_server(fails=lambda n: False, status: int = 503) -> FastAPI:
    """An OpenAI-style server of one model that echoes the prompt; its ``n``-th completion request
    (from 1) is refused with ``status`` where ``fails(n)``. Like llama-server while it loads, it
    lists its model all along."""
    app = FastAPI()
    seen = {"requests": 0}

    @app.get("/v1/models")
    def models() -> dict:
        return {"data": [{"id": "fake"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        seen["requests"] += 1
        if fails(seen["requests"]):
            return JSONResponse({"error": {"code": status, "message": "Loading model"}}, status_code=status)
        text = "echo: " + body["messages"][-1]["content"]
        if not body.get("stream"):
            return {"choices": [{"message": {"content": text}}], "usage": {"completion_tokens": 2}}

        def events():
            for word in text.split(" "):
                yield f"data: {json.dumps({'choices': [{'delta': {'content': word + ' '}}]})}\n\n"
            yield f"data: {json.dumps({'choices': [], 'usage': {'completion_tokens': 2}})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


def run_main(monkeypatch, capsys, url: str, *flags: str) -> list[dict]:
    monkeypatch.setattr(sys, "argv", ["loadtest", "--url", url, "--ready-timeout", "20", *flags])
    loadtest.main()
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_the_timed_requests_start_once_the_server_answers(monkeypatch, capsys):
    """The issue's case: the first 3 requests reach a server still loading its model (503), and
    were counted as 3 of 16 failed at 1 client though the server then answered everything."""
    with serving(fake_server(fails=lambda n: n <= 3)) as url:
        lines = run_main(monkeypatch, capsys, url, "--clients", "1,4", "--requests", "16")
    counts = [(line["clients"], line["answered"], line["failures"]) for line in lines]
    assert counts == [(1, 16, 0), (4, 16, 0)]
    assert all(line["tokens_per_s"] > 0 and line["p50_s"] <= line["p95_s"] for line in lines)
    assert lines[1]["differ_from_first_level"] == 0 and lines[1]["compared_with_first_level"] == 16


def test_a_level_with_failed_requests_gives_no_figures(monkeypatch, capsys):
    """Figures over the answered requests alone would compare servers on different work."""
    with serving(fake_server(fails=lambda n: n > 1 and n % 5 == 0)) as url:  # n = 1: the readiness check
        line, = run_main(monkeypatch, capsys, url, "--clients", "1", "--requests", "16", "--no-stream")
    assert line["answered"] == 13 and line["failures"] == 3 and line["figures"] is None
    assert not {"p50_s", "p95_s", "ttft_p50_s", "tokens_per_s"} & line.keys()
    assert line["errors"] == ['503: {"error": {"code": 503, "message": "Loading model"}}']


def test_a_server_that_never_answers_is_a_clear_error(monkeypatch, capsys):
    with serving(fake_server(fails=lambda n: True)) as url:
        t0 = time.monotonic()
        with pytest.raises(loadtest.NotReady, match=r"did not answer a request within 1 s .*503.*Loading"):
            loadtest.wait_ready(url, timeout=1.0, poll_s=0.2)
        assert time.monotonic() - t0 < 5
        monkeypatch.setattr(sys, "argv", ["loadtest", "--url", url, "--ready-timeout", "0.5"])
        with pytest.raises(SystemExit, match="^loadtest: .*did not answer"):
            loadtest.main()
    with serving(fake_server(fails=lambda n: True, status=404)) as url:  # asking again will not help
        t0 = time.monotonic()
        with pytest.raises(loadtest.NotReady, match="refused the readiness request: 404"):
            loadtest.wait_ready(url, timeout=30)
        assert time.monotonic() - t0 < 5
    with pytest.raises(loadtest.NotReady, match="nothing listening|ConnectError"):
        loadtest.wait_ready("http://127.0.0.1:9", timeout=0.5, poll_s=0.1)  # the discard port: closed
