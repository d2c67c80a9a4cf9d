"""A bounded load test of a running OpenAI-compatible server (specdec's, llama-cpp-python's,
vLLM's): N concurrent clients send a fixed list of chat requests over loopback, streamed, and the
report gives failures, latency and time-to-first-token percentiles, total tokens/s, and how many
answers differ from the same request's answer at the first concurrency level (served alone when
that level is 1).

    python scripts/loadtest.py --url http://127.0.0.1:8000 --clients 1,4,8,16 --requests 32 \
        --questions humaneval,spec-bench

``--questions`` names prompt sets shipped with specdec (or ``.jsonl`` files; comma-separated): the
requests take their prompts from each in turn (``humaneval,spec-bench``: the first HumanEval
problem, the first Spec-Bench question, the second of each, ...; Spec-Bench's in category order).

Before the first timed request the test waits until the server answers a real one-token request
(:func:`wait_ready`): a server that listens while it still loads its model (llama-server answers
``/v1/models`` then, and 503 to the rest) would otherwise fail the first timed requests. Every
request opens a connection of its own (a kept-alive one the server had closed meanwhile failed
requests with "Server disconnected without sending a response"), and one that got no answer at all
(no connection, or closed before any byte) is sent again, counted per level as ``retried``. A
level where any request still failed reports how many and why, and no figures
(:meth:`LoadReport.summary`).

Where the server counts its batch's ticks on ``/metrics`` (``specdec serve`` with batching), each
level also reports what its ticks held (:func:`tick_figures`): sequences, draft rows and accepted
draft tokens per tick, ticks per generated token, and the share of ticks that verified no draft.

Each level also reports the share of the machine's CPU time its hypervisor took meanwhile
(``steal_share``, from ``/proc/stat``; :func:`steal_figures`), so a run can tell whether a gap
between two servers doing the same work was the host taking the CPUs or something else.

Each level's line keeps its requests' latencies and tokens, so that several passes of the same
levels merge into one line per server and level (``--merge FILE``, :func:`merge_passes`).

``--tick-traces FILE...`` sums up what a batch's ticks did in tick traces (``SPECDEC_TICK_TRACE=FILE
specdec serve``; :func:`summarize_tick_trace`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from specdec.files import write_atomic


@dataclass
class Result:
    status: int
    latency_s: float
    text: str = ""
    tokens: int = 0
    error: str = ""
    first_s: float | None = None  # time to the first streamed text


def _percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` by nearest rank (NaN for none)."""
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


@dataclass
class LoadReport:
    clients: int
    requests: int
    wall_s: float
    results: list[Result] = field(default_factory=list)
    indexed: dict[int, Result] = field(default_factory=dict)
    retried: int = 0  # requests sent again after getting no answer at all

    @property
    def answered(self) -> int:
        """Requests answered in full (200)."""
        return sum(r.status == 200 for r in self.results)

    @property
    def failures(self) -> int:
        """Requests that failed or were never sent (the time limit)."""
        return self.requests - self.answered

    def percentile(self, q: float, first: bool = False) -> float:
        return _percentile([(r.first_s if first else r.latency_s) for r in self.results
                            if r.status == 200 and (r.first_s is not None or not first)], q)

    @property
    def tokens_per_s(self) -> float:
        return sum(r.tokens for r in self.results) / self.wall_s if self.wall_s > 0 else 0.0

    def summary(self) -> dict:
        """The level's figures, or, where any request failed, how many failed and why, and no figures.

        Figures over the answered requests alone would compare a server with another on different
        work: the failed requests are not a random sample (those sent while a server still loads
        are the first prompts; under load, a request refused early frees the server for the rest,
        so the others' latency and tokens/s look better than a server's that answered everything).
        """
        line = {"clients": self.clients, "requests": self.requests, "answered": self.answered,
                "failures": self.failures, "retried": self.retried, "wall_s": round(self.wall_s, 2)}
        if self.failures:
            errors = sorted({f"{r.status}: {r.error[:200]}" for r in self.results if r.status != 200})[:5]
            unsent = self.requests - len(self.results)
            return {**line, "figures": None, "errors": errors + ([f"{unsent} not sent within the time limit"]
                                                                 if unsent else [])}
        return {**line, "p50_s": round(self.percentile(0.5), 3), "p95_s": round(self.percentile(0.95), 3),
                "ttft_p50_s": round(self.percentile(0.5, True), 3),
                "ttft_p95_s": round(self.percentile(0.95, True), 3),
                "tokens_per_s": round(self.tokens_per_s, 2),
                # What another pass of the same level merges with (merge_passes)
                "tokens": sum(r.tokens for r in self.results),
                "latencies_s": [round(r.latency_s, 3) for r in self.results],
                "ttfts_s": [round(r.first_s, 3) for r in self.results if r.first_s is not None]}

    def texts(self) -> dict[int, str]:
        return {i: r.text for i, r in self.indexed.items() if r.status == 200}


RETRIES = 2  # more sends of a request that got no answer at all


class _Broken(Exception):
    """The answer broke off after it began (not sent again: the server had taken the request)."""


async def run_load(url: str, bodies: list[dict], clients: int, time_limit: float = 300.0,
                   path: str = "/v1/completions", stream: bool = False, api_key: str | None = None) -> LoadReport:
    """Send every body once, ``clients`` at a time; stop at ``time_limit`` seconds whatever is left.
    ``api_key``: every client's (one tenant of the server, sharing its index of earlier outputs)."""
    queue: asyncio.Queue = asyncio.Queue()
    for i, body in enumerate(bodies):
        queue.put_nowait((i, body))
    results: list[Result | None] = [None] * len(bodies)
    retried = [0]

    async def send(http: httpx.AsyncClient, body: dict, t0: float) -> Result:
        if stream:
            return await _streamed(http, url.rstrip("/") + path, body, t0)
        response = await http.post(url.rstrip("/") + path, json=body)
        latency = time.perf_counter() - t0
        if response.status_code != 200:
            try:
                return Result(response.status_code, latency, error=json.dumps(response.json()))
            except ValueError:
                return Result(response.status_code, latency, error=response.text)
        try:
            data = response.json()
            choice = data["choices"][0]
            text = choice.get("text", choice.get("message", {}).get("content", ""))
            return Result(200, latency, text, data["usage"]["completion_tokens"])
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise _Broken(f"{type(exc).__name__}: {exc}") from None

    async def client(http: httpx.AsyncClient) -> None:
        while not queue.empty():
            i, body = queue.get_nowait()
            t0 = time.perf_counter()  # a request sent again is timed from its first send
            for attempt in range(RETRIES + 1):
                try:
                    results[i] = await send(http, body, t0)
                    break
                except (httpx.ConnectError, httpx.RemoteProtocolError) as exc:
                    # No answer at all: the server never took the request, so sending it again
                    # measures the same work.
                    if attempt < RETRIES:
                        retried[0] += 1
                        continue
                    results[i] = Result(0, time.perf_counter() - t0, error=f"{type(exc).__name__}: {exc} "
                                        f"(no answer after {RETRIES + 1} sends)")
                except (httpx.HTTPError, _Broken) as exc:
                    results[i] = Result(0, time.perf_counter() - t0, error=f"{type(exc).__name__}: {exc}")
                    break

    t0 = time.perf_counter()
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    # A connection per request: a kept-alive one may be closed by the server just as it is reused.
    limits = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=time_limit, headers=headers, limits=limits) as http:
        tasks = [asyncio.create_task(client(http)) for _ in range(clients)]
        done, pending = await asyncio.wait(tasks, timeout=time_limit)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    report = LoadReport(clients, len(bodies), time.perf_counter() - t0, retried=retried[0])
    report.results = [r for r in results if r is not None]
    report.indexed = {i: r for i, r in enumerate(results) if r is not None}
    return report


async def _streamed(http, url: str, body: dict, t0: float | None = None) -> Result:
    """One streamed chat request: its text, completion tokens (from the final usage chunk, else
    the number of content chunks) and the time to its first text (from ``t0``, default now).
    Connection errors before the answer began propagate as httpx's; after, as :class:`_Broken`."""
    t0 = time.perf_counter() if t0 is None else t0
    first, parts, tokens, chunks = None, [], None, 0
    async with http.stream("POST", url, json={**body, "stream": True, "stream_options": {"include_usage": True}}) as r:
        if r.status_code != 200:
            return Result(r.status_code, time.perf_counter() - t0, error=(await r.aread()).decode(errors="replace"))
        try:
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                data = json.loads(line[6:])
                if data.get("usage"):
                    tokens = data["usage"].get("completion_tokens", tokens)
                for choice in data.get("choices") or []:
                    text = (choice.get("delta") or {}).get("content") or choice.get("text") or ""
                    if text:
                        chunks += 1
                        parts.append(text)
                        if first is None:
                            first = time.perf_counter() - t0
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            raise _Broken(f"{type(exc).__name__}: {exc} (after {chunks} chunks)") from None
    return Result(200, time.perf_counter() - t0, "".join(parts), tokens if tokens is not None else chunks,
                  first_s=first)


TICK_COUNTERS = {"ticks": "specdec:batch_ticks_total", "sequences": "specdec:batch_sequences_total",
                 "drafted": "specdec:batch_draft_rows_total", "drafting": "specdec:batch_drafting_ticks_total",
                 "accepted": "specdec:spec_decode_num_accepted_tokens_total",
                 "generated": "specdec:generation_tokens_total", "decode_s": "specdec:batch_decode_seconds_total"}


def batch_counters(url: str, api_key: str | None = None) -> dict[str, float] | None:
    """The server's batch counters from ``/metrics`` (None: it keeps none, or has no such page)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    try:
        response = httpx.get(url.rstrip("/") + "/metrics", headers=headers, timeout=30)
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    values = {}
    for line in response.text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = value
    try:
        return {key: float(values[name]) for key, name in TICK_COUNTERS.items()}
    except (KeyError, ValueError):
        return None


def tick_figures(before: dict[str, float] | None, after: dict[str, float] | None, wall_s: float | None = None) -> dict:
    """What a level's ticks held, from the counters before and after it: sequences, draft rows
    and accepted draft tokens per tick, ticks per generated token, the share of ticks that
    verified no draft, and, given the level's ``wall_s``, the milliseconds per tick spent outside
    the ticks' forwards (everything a server does between them: the requests' engine steps,
    drafting, streaming; empty where the server counts no ticks)."""
    if before is None or after is None:
        return {}
    d = {key: after[key] - before[key] for key in TICK_COUNTERS}
    if d["ticks"] <= 0:
        return {}
    ticks = d["ticks"]
    figures = {"counts": {key: (round(value, 3) if key == "decode_s" else int(value)) for key, value in d.items()},
               "ticks": int(ticks), "sequences_per_tick": round(d["sequences"] / ticks, 2),
               "drafted_per_tick": round(d["drafted"] / ticks, 2), "accepted_per_tick": round(d["accepted"] / ticks, 2),
               "ticks_per_token": round(ticks / d["generated"], 3) if d["generated"] > 0 else None,
               "no_draft_share": round(1 - d["drafting"] / ticks, 3)}
    if wall_s is not None:
        figures["forward_ms_per_tick"] = round(1e3 * d["decode_s"] / ticks, 2)
        figures["outside_ms_per_tick"] = round(1e3 * (wall_s - d["decode_s"]) / ticks, 2)
    return figures


def cpu_times() -> dict[str, int] | None:
    """The machine's CPU time so far, in clock ticks over all its CPUs (``/proc/stat``): ``steal``,
    the time a hypervisor ran something else on our virtual CPUs, and ``total`` (None where the
    system keeps no such file)."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    # user nice system idle iowait irq softirq steal (guest time is already counted in user)
    return {"steal": fields[7] if len(fields) > 7 else 0, "total": sum(fields[:8])}


def steal_figures(before: dict[str, int] | None, after: dict[str, int] | None) -> dict:
    """The share of the machine's CPU time its hypervisor took while a level ran (``steal_share``):
    a server loses that share of its speed and more (a stolen thread stalls the other at every
    barrier of a forward). Empty where unknown."""
    if before is None or after is None or after["total"] <= before["total"]:
        return {}
    steal, total = after["steal"] - before["steal"], after["total"] - before["total"]
    return {"cpu_ticks": {"steal": steal, "total": total}, "steal_share": round(steal / total, 4)}


def merge_passes(lines: list[dict]) -> list[dict]:
    """One line per server and level from several passes of the same levels (``loadtest_servers.sh``
    with ``PASSES``, the servers' order reversed from one pass to the next, so a machine that
    drifts over a level weighs on every server alike): tokens/s over all the passes' tokens and
    seconds, latency percentiles over all their requests, tick figures over all their ticks, and
    each pass's tokens/s and p95 beside them. A level where any pass failed a request has no
    figures. Lines that are no level's (the run's header) pass through, in place."""
    groups: dict[tuple, list[dict]] = {}
    out: list[dict | tuple] = []
    for line in lines:
        if "clients" not in line or "server" not in line:
            out.append(line)
            continue
        key = (line["server"], line["clients"])
        if key not in groups:
            groups[key] = []
            out.append(key)
        groups[key].append(line)
    return [item if isinstance(item, dict) else _merged(groups[item]) for item in out]


def _merged(passes: list[dict]) -> dict:
    if len(passes) == 1:
        return passes[0]
    first = passes[0]
    line = {"server": first["server"], "clients": first["clients"], "passes": len(passes)}
    for key in ("requests", "answered", "failures", "retried", "differ_from_first_level", "compared_with_first_level"):
        line[key] = sum(p.get(key, 0) for p in passes)
    line["wall_s"] = round(sum(p["wall_s"] for p in passes), 2)
    if any(p.get("figures", ...) is None or "latencies_s" not in p for p in passes):
        errors = sorted({e for p in passes for e in p.get("errors", [])})[:5]
        return {**line, "figures": None, "errors": errors or ["a pass without per-request figures"]}
    latencies = [v for p in passes for v in p["latencies_s"]]
    ttfts = [v for p in passes for v in p["ttfts_s"]]
    tokens = sum(p["tokens"] for p in passes)
    line.update({"p50_s": _percentile(latencies, 0.5), "p95_s": _percentile(latencies, 0.95),
                 "ttft_p50_s": _percentile(ttfts, 0.5), "ttft_p95_s": _percentile(ttfts, 0.95),
                 "tokens_per_s": round(tokens / line["wall_s"], 2) if line["wall_s"] > 0 else 0.0,
                 "tokens": tokens, "latencies_s": latencies, "ttfts_s": ttfts,
                 "tokens_per_s_by_pass": [p["tokens_per_s"] for p in passes],
                 "p95_s_by_pass": [p["p95_s"] for p in passes]})
    if all("cpu_ticks" in p for p in passes):
        line.update(steal_figures({"steal": 0, "total": 0}, {key: sum(p["cpu_ticks"][key] for p in passes)
                                                             for key in ("steal", "total")}))
        line["steal_share_by_pass"] = [p["steal_share"] for p in passes]
    if all("counts" in p and set(TICK_COUNTERS) <= set(p["counts"]) for p in passes):
        counts = {key: sum(p["counts"][key] for p in passes) for key in TICK_COUNTERS}
        line.update(tick_figures(dict.fromkeys(TICK_COUNTERS, 0), counts, line["wall_s"]))
    return line


class NotReady(Exception):
    """The server did not answer a request within the time allowed, or refused it for good."""


# Statuses of a server that is up but not serving yet (still loading, a replica starting, a
# proxy in front with nothing behind): worth asking again. Any other refusal will not change.
_RETRY = {429, 500, 502, 503, 504}


def wait_ready(url: str, model: str | None = None, *, path: str = "/v1/chat/completions",
               timeout: float = 600.0, api_key: str | None = None, poll_s: float = 1.0) -> str:
    """Wait until the server at ``url`` answers a real one-token request on ``path`` (a chat or a
    completion request) with 200, and return the model it was asked for (``model``, else the first
    it lists). Raises :class:`NotReady` after ``timeout`` seconds, or at once on a refusal that
    asking again will not change (a 4xx other than 429: a wrong model name, a missing key)."""
    base = url.rstrip("/")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    deadline = time.monotonic() + timeout
    last = "nothing listening"
    with httpx.Client(timeout=max(timeout, 1.0), headers=headers) as http:
        while True:
            try:
                name = model or http.get(base + "/v1/models").raise_for_status().json()["data"][0]["id"]
                # One token, and a prompt none of the timed requests has: it costs the server next
                # to nothing and leaves its caches next to nothing the timed requests could reuse.
                body: dict = {"model": name, "max_tokens": 1, "temperature": 0}
                if path.endswith("/chat/completions"):
                    body["messages"] = [{"role": "user", "content": "Are you ready?"}]
                else:
                    body["prompt"] = "Are you ready?"
                response = http.post(base + path, json=body)
                if response.status_code == 200 and response.json().get("choices"):
                    return name
                last = f"{response.status_code} {response.text[:200]}"
                if response.status_code not in _RETRY:
                    raise NotReady(f"{base}{path} refused the readiness request: {last}")
            except httpx.HTTPStatusError as exc:
                last = f"{exc.response.status_code} on /v1/models {exc.response.text[:200]}"
                if exc.response.status_code not in _RETRY:
                    raise NotReady(f"{base}/v1/models refused the request: {last}") from None
            except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
                last = f"{type(exc).__name__}: {exc}"
            if time.monotonic() + poll_s > deadline:
                raise NotReady(f"{base} did not answer a request within {timeout:.0f} s (last: {last})")
            time.sleep(poll_s)


def mixed_prompts(sources: list[str]) -> list[str]:
    """The prompts of several prompt sets, taken from each in turn (Spec-Bench's one category after
    another: its first question of each category, then the second, ...;
    :func:`specdec.bench.questions.mixed_questions`)."""
    from specdec.bench.questions import mixed_questions

    return [q.prompt for q in mixed_questions(sources)]


def tick_trace_summary(lines: list[dict]) -> dict:
    """The figures of one tick trace (one context's ticks): the decoding ticks (prompts' ticks apart:
    a submission of several rows that verifies no draft is a prompt), split into those that verified a
    draft and those that did not, with their mean seconds, sequences, rows and forwards; how often
    running sequences were left out of a tick (they then step in one of their own); the draft rows
    offered to the batch's choice and taken."""
    prompt = [t for t in lines if any(r > 1 and d == 0 for r, d in zip(t["rows"], t["drafted"]))]
    decoding = [t for t in lines if t not in prompt]
    drafting = [t for t in decoding if any(t["drafted"])]
    plain = [t for t in decoding if not any(t["drafted"])]
    busy = [t for t in decoding if len(t["running"]) >= 2]
    behind = [len(set(t["running"]) - set(t["seqs"])) for t in busy]

    def kind(ticks: list[dict]) -> dict:
        if not ticks:
            return {"ticks": 0}
        return {"ticks": len(ticks), "seconds": round(sum(t["seconds"] for t in ticks), 2),
                "mean_s": round(statistics.mean(t["seconds"] for t in ticks), 3),
                "sequences": round(statistics.mean(len(t["seqs"]) for t in ticks), 2),
                "rows": round(statistics.mean(sum(t["rows"]) for t in ticks), 2),
                "draft_rows": round(statistics.mean(sum(t["drafted"]) for t in ticks), 2),
                "forwards": round(statistics.mean(len(t["forwards"]) for t in ticks), 2)}

    offered = sum(o for t in lines for o in t["offered"] if o is not None)
    taken = sum(d for t in lines for o, d in zip(t["offered"], t["drafted"]) if o is not None)
    return {"prompt_ticks": kind(prompt), "drafting_ticks": kind(drafting), "plain_ticks": kind(plain),
            "ticks_leaving_some_behind": round(sum(b > 0 for b in behind) / len(busy), 3) if busy else None,
            "left_behind_per_tick": round(statistics.mean(behind), 2) if behind else None,
            "offered_rows": offered, "taken_rows": taken}


def summarize_tick_trace(path: Path) -> dict:
    """Every context's summary in a tick trace file (``SPECDEC_TICK_TRACE=FILE specdec serve``: every
    tick of the batched llama.cpp context as a JSON line; a draft model's ticks are a context of their
    own)."""
    by_context: dict[int, list[dict]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            tick = json.loads(line)
            by_context.setdefault(tick.get("context", 0), []).append(tick)
    return {str(i): tick_trace_summary(ticks) for i, ticks in enumerate(by_context.values())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default=None, help="default: the first model the server lists")
    parser.add_argument("--clients", default="1,4,8", help="comma-separated concurrency levels")
    parser.add_argument("--requests", type=int, default=32, help="requests per level")
    parser.add_argument("--first", type=int, default=0, metavar="I",
                        help="the level's requests are numbers I to I + requests - 1 (default 0): a level measured "
                             "in parts, each part by a run of its own (loadtest_servers.sh's WAVES)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--questions", default=None,
                        help="prompt sets (spec-bench, humaneval, humaneval-edit, humaneval-files) or .jsonl files, "
                             "comma-separated")
    parser.add_argument("--distinct", type=int, default=None, metavar="N",
                        help="only the first N prompts: the requests go through them in rounds, so later rounds "
                             "repeat earlier requests (clients asking about the same files in turn)")
    parser.add_argument("--time-limit", type=float, default=600.0)
    parser.add_argument("--ready-timeout", type=float, default=600.0,
                        help="seconds to wait for the server to answer a first request (it may still be loading)")
    parser.add_argument("--no-stream", action="store_true", help="whole answers (no time to first token)")
    parser.add_argument("--label", default="", help="a name for this server in the output")
    parser.add_argument("--texts", default=None, metavar="FILE",
                        help="write every answer (by request number, last level) as JSON, to compare servers")
    parser.add_argument("--reference", default=None, metavar="FILE",
                        help="compare every level's answers with the ones in FILE (--texts' format) instead of "
                             "this run's first level; the answers to requests FILE does not have yet are added to "
                             "it (one server's levels, or parts of them, measured by several runs)")
    parser.add_argument("--api-key", default=None,
                        help="every client sends this key (one tenant: they share its index of earlier outputs; "
                             "default: none, each request drafts from its own text alone)")
    parser.add_argument("--merge", default=None, metavar="FILE",
                        help="print FILE's load-test lines merged, one per server and level (merge_passes), and exit")
    parser.add_argument("--tick-traces", nargs="+", default=None, metavar="FILE",
                        help="print what the ticks of these tick traces (SPECDEC_TICK_TRACE) did, as JSON, and exit")
    args = parser.parse_args()
    if args.tick_traces:
        print(json.dumps({Path(p).name: summarize_tick_trace(Path(p)) for p in args.tick_traces}, indent=1))
        return
    if args.merge:
        with open(args.merge, encoding="utf-8") as f:
            lines = [json.loads(line) for line in f if line.strip()]
        for line in merge_passes(lines):
            print(json.dumps(line))
        return
    try:
        model = wait_ready(args.url, args.model, timeout=args.ready_timeout, api_key=args.api_key)
    except NotReady as exc:
        # Every level gets its line, saying why it has no figures (a results file then shows it).
        for clients in (int(c) for c in args.clients.split(",")):
            print(json.dumps({"server": args.label, "clients": clients, "requests": args.requests, "answered": 0,
                              "failures": args.requests, "figures": None, "errors": [f"not measured: {exc}"]}),
                  flush=True)
        sys.exit(f"loadtest: {exc}")
    prompts = mixed_prompts(args.questions.split(",")) if args.questions else [
        "Write a short story about a robot who learns to paint."]
    prompts = prompts[:args.distinct] if args.distinct else prompts
    reference: dict[int, str] | None = None
    if args.reference and os.path.exists(args.reference):
        with open(args.reference, encoding="utf-8") as f:
            reference = {int(i): t for i, t in json.load(f).items()}
    numbers = range(args.first, args.first + args.requests)
    for clients in (int(c) for c in args.clients.split(",")):
        bodies = [{"model": model, "messages": [{"role": "user", "content": prompts[i % len(prompts)]}],
                   "max_tokens": args.max_tokens, "temperature": 0} for i in numbers]
        before, cpu = batch_counters(args.url, args.api_key), cpu_times()
        report = asyncio.run(run_load(args.url, bodies, clients, args.time_limit, "/v1/chat/completions",
                                      stream=not args.no_stream, api_key=args.api_key))
        steal = steal_figures(cpu, cpu_times())
        ticks = tick_figures(before, batch_counters(args.url, args.api_key), report.wall_s)
        texts = {numbers[i]: t for i, t in report.texts().items()}
        both = [i for i in texts if reference is not None and i in reference]
        differ = sum(reference[i] != texts[i] for i in both)
        new = {i: t for i, t in texts.items() if reference is None or i not in reference}
        if new:  # the first answer to each request is the one later answers are compared with
            reference = {**(reference or {}), **new}
            if args.reference:
                write_atomic(args.reference, json.dumps({str(i): t for i, t in sorted(reference.items())}))
        line = {"server": args.label, **report.summary(), **ticks, **steal, "differ_from_first_level": differ,
                "compared_with_first_level": len(both)}
        print(json.dumps({**line, "first": args.first} if args.first else line), flush=True)
        if args.texts:
            write_atomic(args.texts, json.dumps({str(i): t for i, t in sorted(texts.items())}))


if __name__ == "__main__":
    main()
