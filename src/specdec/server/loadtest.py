"""A bounded load test of a running server: N concurrent clients send a fixed list of requests
over loopback and the report gives failures, latency percentiles and total tokens/s.

    python -m specdec.server.loadtest --url http://127.0.0.1:8000 --clients 1,4,8 --requests 32
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx


@dataclass
class Result:
    status: int
    latency_s: float
    text: str = ""
    tokens: int = 0
    error: str = ""


@dataclass
class LoadReport:
    clients: int
    requests: int
    wall_s: float
    results: list[Result] = field(default_factory=list)

    @property
    def failures(self) -> int:
        return sum(r.status != 200 for r in self.results) + (self.requests - len(self.results))

    def percentile(self, q: float) -> float:
        latencies = sorted(r.latency_s for r in self.results if r.status == 200)
        if not latencies:
            return float("nan")
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))]

    @property
    def tokens_per_s(self) -> float:
        return sum(r.tokens for r in self.results) / self.wall_s if self.wall_s > 0 else 0.0

    def summary(self) -> dict:
        return {"clients": self.clients, "requests": self.requests, "completed": len(self.results),
                "failures": self.failures, "p50_s": round(self.percentile(0.5), 3),
                "p95_s": round(self.percentile(0.95), 3), "tokens_per_s": round(self.tokens_per_s, 2),
                "wall_s": round(self.wall_s, 2)}


async def run_load(url: str, bodies: list[dict], clients: int, time_limit: float = 300.0,
                   path: str = "/v1/completions") -> LoadReport:
    """Send every body once, ``clients`` at a time; stop at ``time_limit`` seconds whatever is left."""
    queue: asyncio.Queue = asyncio.Queue()
    for i, body in enumerate(bodies):
        queue.put_nowait((i, body))
    results: list[Result | None] = [None] * len(bodies)

    async def client(http: httpx.AsyncClient) -> None:
        while not queue.empty():
            i, body = queue.get_nowait()
            t0 = time.perf_counter()
            try:
                response = await http.post(url.rstrip("/") + path, json=body)
                latency = time.perf_counter() - t0
                data = response.json()
                if response.status_code == 200:
                    choice = data["choices"][0]
                    text = choice.get("text", choice.get("message", {}).get("content", ""))
                    results[i] = Result(200, latency, text, data["usage"]["completion_tokens"])
                else:
                    results[i] = Result(response.status_code, latency, error=json.dumps(data))
            except (httpx.HTTPError, ValueError, KeyError) as exc:
                results[i] = Result(0, time.perf_counter() - t0, error=f"{type(exc).__name__}: {exc}")

    t0 = time.perf_counter()
    async with httpx.AsyncClient(timeout=time_limit) as http:
        tasks = [asyncio.create_task(client(http)) for _ in range(clients)]
        done, pending = await asyncio.wait(tasks, timeout=time_limit)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    report = LoadReport(clients, len(bodies), time.perf_counter() - t0)
    report.results = [r for r in results if r is not None]
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default=None, help="default: the first model the server lists")
    parser.add_argument("--clients", default="1,4,8", help="comma-separated concurrency levels")
    parser.add_argument("--requests", type=int, default=32, help="requests per level")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--questions", type=Path, default=None, help="Spec-Bench jsonl for the prompts")
    parser.add_argument("--time-limit", type=float, default=600.0)
    args = parser.parse_args()
    model = args.model or httpx.get(args.url.rstrip("/") + "/v1/models").json()["data"][0]["id"]
    prompts = ["Write a short story about a robot who learns to paint."]
    if args.questions:
        prompts = [json.loads(line)["turns"][0] for line in args.questions.read_text(encoding="utf-8").splitlines()]
    for clients in (int(c) for c in args.clients.split(",")):
        bodies = [{"model": model, "messages": [{"role": "user", "content": prompts[i % len(prompts)]}],
                   "max_tokens": args.max_tokens, "temperature": 0} for i in range(args.requests)]
        report = asyncio.run(run_load(args.url, bodies, clients, args.time_limit, "/v1/chat/completions"))
        print(json.dumps(report.summary()))


if __name__ == "__main__":
    main()
