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


def test_levels_measured_by_separate_runs_compare_answers_with_one_reference(monkeypatch, capsys, tmp_path):
    """A load test that alternates servers level by level runs each level alone: the first run
    writes its answers to --reference, later runs compare theirs with them, and a changed answer
    is counted."""
    reference = tmp_path / "ref.json"
    with serving(fake_server()) as url:
        first, = run_main(monkeypatch, capsys, url, "--clients", "1", "--requests", "4", "--reference", str(reference))
        assert first["differ_from_first_level"] == 0 and json.loads(reference.read_text())["0"].startswith("echo: ")
        again, = run_main(monkeypatch, capsys, url, "--clients", "4", "--requests", "4", "--reference", str(reference))
        assert again["differ_from_first_level"] == 0 and again["compared_with_first_level"] == 4
        answers = json.loads(reference.read_text())
        answers["2"] = "another answer"
        reference.write_text(json.dumps(answers))
        changed, = run_main(monkeypatch, capsys, url, "--clients", "2", "--requests", "4", "--reference", str(reference))
    assert changed["differ_from_first_level"] == 1 and changed["compared_with_first_level"] == 4


def test_a_level_measured_in_parts_numbers_its_requests_and_compares_each_with_its_first_answer(
        monkeypatch, capsys, tmp_path):
    """loadtest_servers.sh's WAVES: a level in parts, each a run of its own. A part's requests are
    the numbers it was given (prompt i of the mixed list), and each answer is compared with the
    first answer to that request number, whichever part or level gave it."""
    reference = tmp_path / "ref.json"
    with serving(fake_server()) as url:
        first, = run_main(monkeypatch, capsys, url, "--clients", "1", "--requests", "2", "--reference", str(reference),
                          "--questions", "humaneval")
        second, = run_main(monkeypatch, capsys, url, "--clients", "1", "--first", "2", "--requests", "2",
                           "--reference", str(reference), "--questions", "humaneval")
        answers = json.loads(reference.read_text())
        assert sorted(answers) == ["0", "1", "2", "3"] and "first" not in first and second["first"] == 2
        assert first["compared_with_first_level"] == second["compared_with_first_level"] == 0
        prompts = loadtest.mixed_prompts(["humaneval"])
        assert answers["3"] == "echo: " + prompts[3] + " " and answers["3"] != answers["1"]
        answers["3"] = "another answer"
        reference.write_text(json.dumps(answers))
        later, = run_main(monkeypatch, capsys, url, "--clients", "2", "--first", "2", "--requests", "2",
                          "--reference", str(reference), "--questions", "humaneval")
    assert later["compared_with_first_level"] == 2 and later["differ_from_first_level"] == 1


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
        monkeypatch.setattr(sys, "argv", ["loadtest", "--url", url, "--ready-timeout", "0.5", "--label", "x"])
        capsys.readouterr()
        with pytest.raises(SystemExit, match="^loadtest: .*did not answer"):
            loadtest.main()
        lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert [(line["clients"], line["failures"], line["figures"]) for line in lines] == [
            (1, 32, None), (4, 32, None), (8, 32, None)]  # every level says why it was not measured
        assert lines[0]["errors"][0].startswith("not measured: ") and "did not answer" in lines[0]["errors"][0]
    with serving(fake_server(fails=lambda n: True, status=404)) as url:  # asking again will not help
        t0 = time.monotonic()
        with pytest.raises(loadtest.NotReady, match="refused the readiness request: 404"):
            loadtest.wait_ready(url, timeout=30)
        assert time.monotonic() - t0 < 5
    with pytest.raises(loadtest.NotReady, match="nothing listening|ConnectError"):
        loadtest.wait_ready("http://127.0.0.1:9", timeout=0.5, poll_s=0.1)  # the discard port: closed


class DroppingServer:
    """A bare HTTP/1.1 chat server on a thread that closes the connection of every request
    ``drop(n)`` picks without a byte of answer (as a server does with a kept-alive connection it
    has just timed out), and answers the others as a plain chat completion."""

    def __init__(self, drop) -> None:
        import asyncio
        import threading

        self.drop, self.seen, self.loop = drop, 0, asyncio.new_event_loop()
        self.server = self.loop.run_until_complete(asyncio.start_server(self.handle, "127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    async def handle(self, reader, writer) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        body = await reader.readexactly(length)
        if head.startswith(b"GET /v1/models"):
            payload = {"data": [{"id": "fake"}]}
        else:
            self.seen += 1
            if self.drop(self.seen):
                writer.close()
                return
            content = json.loads(body)["messages"][-1]["content"]
            payload = {"choices": [{"message": {"content": "echo: " + content}}], "usage": {"completion_tokens": 2}}
        data = json.dumps(payload).encode()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(data), data))
        await writer.drain()
        writer.close()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.server.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def test_a_request_that_got_no_answer_at_all_is_sent_again_and_counted(monkeypatch, capsys):
    """The issue's case: llama-server plain failed 2 of 16 requests at 1 client with "Server
    disconnected without sending a response" (a kept-alive connection it had closed)."""
    server = DroppingServer(drop=lambda n: n in (3, 7, 8))  # n = 1: the readiness check
    try:
        line, = run_main(monkeypatch, capsys, server.url, "--clients", "1", "--requests", "12", "--no-stream")
    finally:
        server.close()
    assert (line["answered"], line["failures"], line["retried"]) == (12, 0, 3)
    assert line["tokens_per_s"] > 0
    server = DroppingServer(drop=lambda n: n > 1)  # never answers: said so, not retried forever
    try:
        line, = run_main(monkeypatch, capsys, server.url, "--clients", "2", "--requests", "2", "--no-stream")
    finally:
        server.close()
    assert line["failures"] == 2 and line["figures"] is None
    assert "no answer after 3 sends" in line["errors"][0] and "RemoteProtocolError" in line["errors"][0]


def test_a_level_reports_what_its_ticks_held_from_the_servers_counters():
    before = {"ticks": 100, "sequences": 400, "drafted": 50, "drafting": 20, "accepted": 30, "generated": 500,
              "decode_s": 10.0}
    after = {"ticks": 300, "sequences": 1900, "drafted": 250, "drafting": 70, "accepted": 130, "generated": 2100,
             "decode_s": 28.0}
    figures = {
        "counts": {"ticks": 200, "sequences": 1500, "drafted": 200, "drafting": 50, "accepted": 100, "generated": 1600,
                   "decode_s": 18.0},
        "ticks": 200, "sequences_per_tick": 7.5, "drafted_per_tick": 1.0, "accepted_per_tick": 0.5,
        "ticks_per_token": 0.125, "no_draft_share": 0.75}
    assert loadtest.tick_figures(before, after) == figures
    # a level of 20 s whose ticks spent 18 s in their forwards: 90 ms a tick in them, 10 ms outside
    assert loadtest.tick_figures(before, after, 20.0) == {**figures, "forward_ms_per_tick": 90.0,
                                                          "outside_ms_per_tick": 10.0}
    assert loadtest.tick_figures(None, after) == {} and loadtest.tick_figures(before, before) == {}


def test_a_specdec_server_reports_its_ticks_per_level(monkeypatch, capsys):
    counters = {"ticks": 0}
    app = fake_server()

    @app.middleware("http")
    async def count(request: Request, call_next):
        if request.url.path == "/v1/chat/completions":
            counters["ticks"] += 3  # three ticks and 2 tokens a request, one of the ticks drafting
        return await call_next(request)

    @app.get("/metrics")
    def metrics():
        from fastapi.responses import PlainTextResponse

        t = counters["ticks"]
        names = {"specdec:batch_ticks_total": t, "specdec:batch_sequences_total": 2 * t,
                 "specdec:batch_draft_rows_total": t, "specdec:batch_drafting_ticks_total": t / 3,
                 "specdec:spec_decode_num_accepted_tokens_total": t / 3,
                 "specdec:generation_tokens_total": 2 * t / 3, "specdec:batch_decode_seconds_total": t / 1000}
        return PlainTextResponse("# HELP ...\n" + "".join(f"{k} {v}\n" for k, v in names.items()))

    with serving(app) as url:
        lines = run_main(monkeypatch, capsys, url, "--clients", "1,2", "--requests", "4")
    for line in lines:
        assert line["ticks"] == 12 and line["sequences_per_tick"] == 2.0 and line["ticks_per_token"] == 1.5
        assert line["no_draft_share"] == pytest.approx(2 / 3, abs=1e-3)
        assert line["forward_ms_per_tick"] == 1.0  # 1 ms a tick in forwards, the rest of the level outside
        assert line["outside_ms_per_tick"] == pytest.approx(1e3 * line["wall_s"] / 12 - 1.0, abs=0.5)
    with serving(fake_server()) as url:  # no /metrics: no tick figures, the rest as ever
        line, = run_main(monkeypatch, capsys, url, "--clients", "1", "--requests", "2")
    assert "ticks" not in line and line["answered"] == 2


def _pass(server: str, tokens: int, wall: float, latencies: list[float], ticks: int | None = None) -> dict:
    line = {"server": server, "clients": 4, "requests": len(latencies), "answered": len(latencies), "failures": 0,
            "retried": 0, "wall_s": wall, "tokens": tokens, "tokens_per_s": round(tokens / wall, 2),
            "latencies_s": latencies, "ttfts_s": [v / 10 for v in latencies], "p95_s": max(latencies),
            "differ_from_first_level": 0, "compared_with_first_level": len(latencies)}
    if ticks is not None:
        line["counts"] = {"ticks": ticks, "sequences": 4 * ticks, "drafted": ticks, "drafting": ticks // 2,
                          "accepted": ticks // 2, "generated": 2 * ticks, "decode_s": ticks / 10}
    return line


def test_passes_of_a_level_merge_into_one_line_over_all_their_requests():
    """Two passes of a level (the servers' order reversed between them): tokens/s over both
    passes' tokens and seconds, not the mean of two rates; percentiles over both passes'
    requests; tick figures over both passes' ticks; each pass's own figures kept beside."""
    header = {"run": "scripts/loadtest_servers.sh", "passes": 2}
    lines = [header, _pass("a", 100, 10.0, [1.0, 2.0, 3.0, 4.0], ticks=50), _pass("b", 90, 10.0, [1.5] * 4),
             _pass("b", 90, 9.0, [1.0] * 4), _pass("a", 100, 40.0, [5.0, 6.0, 7.0, 8.0], ticks=150)]
    merged = loadtest.merge_passes(lines)
    assert merged[0] == header and [(m["server"], m["passes"]) for m in merged[1:]] == [("a", 2), ("b", 2)]
    a = merged[1]
    assert a["tokens_per_s"] == 4.0 and a["wall_s"] == 50.0 and a["requests"] == 8 and a["answered"] == 8
    assert a["tokens_per_s_by_pass"] == [10.0, 2.5] and a["p95_s_by_pass"] == [4.0, 8.0]
    # Nearest rank over the 8 requests, as one pass of 8 would give.
    assert a["p50_s"] == 5.0 and a["p95_s"] == 8.0 and a["ttft_p50_s"] == 0.5
    assert a["ticks"] == 200 and a["sequences_per_tick"] == 4.0 and a["ticks_per_token"] == 0.5
    # 20 s of the passes' 50 in the 200 ticks' forwards: 100 ms a tick in them, 150 outside
    assert a["forward_ms_per_tick"] == 100.0 and a["outside_ms_per_tick"] == 150.0
    assert "ticks" not in merged[2]  # a server without counters has no tick figures
    # One pass alone stays as it was.
    assert loadtest.merge_passes([lines[1]]) == [lines[1]]


def test_a_level_reports_the_share_of_cpu_time_the_hypervisor_took_and_passes_merge_it():
    """Steal: the host ran something else on our virtual CPUs; passes merge it over all their ticks."""
    assert loadtest.steal_figures({"steal": 10, "total": 1000}, {"steal": 60, "total": 2000}) == {
        "cpu_ticks": {"steal": 50, "total": 1000}, "steal_share": 0.05}
    assert loadtest.steal_figures(None, {"steal": 0, "total": 1}) == {}
    now = loadtest.cpu_times()
    assert now is None or (0 <= now["steal"] <= now["total"] and now["total"] > 0)
    a = {**_pass("a", 100, 10.0, [1.0] * 4), **loadtest.steal_figures({"steal": 0, "total": 0},
                                                                      {"steal": 10, "total": 100})}
    b = {**_pass("a", 100, 10.0, [1.0] * 4), **loadtest.steal_figures({"steal": 0, "total": 0},
                                                                      {"steal": 50, "total": 300})}
    merged, = loadtest.merge_passes([a, b])
    assert merged["steal_share"] == 0.15 and merged["steal_share_by_pass"] == [0.1, 0.1667]


def test_a_level_with_a_failed_pass_has_no_merged_figures():
    failed = {"server": "a", "clients": 4, "requests": 4, "answered": 3, "failures": 1, "retried": 0, "wall_s": 9.0,
              "figures": None, "errors": ["0: ReadTimeout"]}
    merged, = loadtest.merge_passes([_pass("a", 100, 10.0, [1.0] * 4), failed])
    assert merged["figures"] is None and merged["failures"] == 1 and merged["errors"] == ["0: ReadTimeout"]
    assert "tokens_per_s" not in merged


def test_the_merge_command_prints_one_line_per_server_and_level(tmp_path, monkeypatch, capsys):
    raw = tmp_path / "results-passes.jsonl"
    raw.write_text("\n".join(json.dumps(line) for line in
                             [{"run": "x"}, _pass("a", 100, 10.0, [1.0] * 4), _pass("a", 50, 10.0, [2.0] * 4)]) + "\n")
    monkeypatch.setattr(sys, "argv", ["loadtest", "--merge", str(raw)])
    loadtest.main()
    header, a = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert header == {"run": "x"} and a["tokens_per_s"] == 7.5 and a["passes"] == 2


def _tick(seqs, rows, drafted, offered, running, seconds, forwards):
    return {"context": 7, "seconds": seconds, "seqs": seqs, "rows": rows, "drafted": drafted, "offered": offered,
            "running": running, "forwards": forwards}


def test_the_tick_traces_command_sums_up_what_the_ticks_did(tmp_path, monkeypatch, capsys):
    """A prompt's tick (several rows, no draft) apart; a tick that verified a draft, and one that did
    not and left a running sequence out; the draft rows offered to the tick's choice and taken."""
    trace = tmp_path / "specdec.jsonl"
    ticks = [_tick([0], [12], [0], [None], [0], 0.5, [[12, 1]]),
             _tick([0, 1], [4, 1], [3, 0], [3, None], [0, 1], 0.2, [[5, 2]]),
             _tick([0], [1], [0], [2], [0, 1], 0.1, [[1, 1]])]
    trace.write_text("".join(json.dumps(t) + "\n" for t in ticks))
    monkeypatch.setattr(sys, "argv", ["loadtest", "--tick-traces", str(trace)])
    loadtest.main()
    summary = json.loads(capsys.readouterr().out)["specdec.jsonl"]["0"]
    assert summary["prompt_ticks"]["ticks"] == 1 and summary["prompt_ticks"]["seconds"] == 0.5
    assert summary["drafting_ticks"] == {"ticks": 1, "seconds": 0.2, "mean_s": 0.2, "sequences": 2, "rows": 5,
                                         "draft_rows": 3, "forwards": 1}
    assert summary["plain_ticks"]["ticks"] == 1 and summary["plain_ticks"]["rows"] == 1
    # Of the two ticks with two sequences running, the last left one of them out.
    assert summary["ticks_leaving_some_behind"] == 0.5 and summary["left_behind_per_tick"] == 0.5
    assert summary["offered_rows"] == 5 and summary["taken_rows"] == 3
