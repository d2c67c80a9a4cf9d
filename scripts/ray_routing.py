"""Prefix routing vs Ray Serve's default routing, same workload, one run (README "Serving on Ray").

Groups of requests share a long prefix (a Spec-Bench RAG / summarization document, then different
instructions), sent interleaved by 2 clients to `specdec serve --ray --replicas 2` started once with
`--routing prefix` and once with `--routing default`. Per request: the replica that answered (the
`X-Specdec-Replica` header), mean accepted length and tokens/s (the answer's `speculative` usage).
A request is *warm* when its replica served an earlier request of its group.

    .venv/bin/python scripts/ray_routing.py --model smollm2-135m --out bench-results/ray-routing/results.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

INSTRUCTIONS = ["Summarize the text above in three sentences.", "List the key facts of the text above.",
                "What is the main topic of the text above? Answer briefly.",
                "Write a title for the text above and explain it.", "Which names and numbers appear in the text above?"]


def workload(questions: Path, groups: int, per_group: int) -> list[tuple[int, str]]:
    docs = []
    for line in questions.read_text(encoding="utf-8").splitlines():
        q = json.loads(line)
        if q["category"] in ("rag", "summarization") and len(q["turns"][0]) > 800:
            docs.append(q["turns"][0][:2000])
        if len(docs) == groups:
            break
    # Interleaved: every group's first request, then every group's second, ...
    return [(g, docs[g] + "\n\n" + INSTRUCTIONS[i % len(INSTRUCTIONS)]) for i in range(per_group) for g in range(groups)]


async def send(url: str, model: str, requests: list[tuple[int, str]], clients: int, max_tokens: int) -> list[dict]:
    queue: asyncio.Queue = asyncio.Queue()
    for i, item in enumerate(requests):
        queue.put_nowait((i, item))
    out: list[dict | None] = [None] * len(requests)

    async def client(http: httpx.AsyncClient) -> None:
        while not queue.empty():
            i, (group, prompt) = queue.get_nowait()
            body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
                    "temperature": 0}
            r = await http.post(url + "/v1/chat/completions", json=body)
            data = r.json()
            spec = data.get("speculative", {})
            out[i] = {"group": group, "status": r.status_code, "replica": r.headers.get("x-specdec-replica"),
                      "mean_accepted_length": spec.get("mean_accepted_length"),
                      "tokens_per_s": spec.get("tokens_per_s")}

    async with httpx.AsyncClient(timeout=300) as http:
        await asyncio.gather(*(client(http) for _ in range(clients)))
    return [o for o in out if o is not None]


def run(routing: str, args, requests) -> dict:
    port = args.port
    memory = Path(tempfile.mkdtemp()) / "memory.json"
    cmd = [str(Path(sys.executable).with_name("specdec")), "serve", "--ray", "--replicas", "2", "--model", args.model,
           "--backend", args.backend, "--port", str(port), "--routing", routing, "--memory", str(memory)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(f"/tmp/ray-{routing}.log", "w"),
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 600
        while True:
            try:
                if httpx.get(url + "/v1/models", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.time() > deadline or proc.poll() is not None:
                raise SystemExit(f"the {routing} server did not start (see /tmp/ray-{routing}.log)")
            time.sleep(2)
        model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
        results = asyncio.run(send(url, model, requests, args.clients, args.max_tokens))
    finally:
        os.killpg(proc.pid, 2)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
    seen: dict[tuple[str, int], bool] = {}
    warm = 0
    for r in results:
        key = (r["replica"], r["group"])
        warm += bool(seen.get(key))
        seen[key] = True
    ok = [r for r in results if r["status"] == 200]
    later = [r for i, r in enumerate(results) if i >= args.groups and r["status"] == 200]  # not a group's first
    return {"routing": routing, "requests": len(results), "failures": len(results) - len(ok),
            "warm_share": round(warm / max(1, len(results) - args.groups), 3),
            "mean_accepted_length": round(statistics.mean(r["mean_accepted_length"] for r in ok), 3),
            "mean_accepted_length_later": round(statistics.mean(r["mean_accepted_length"] for r in later), 3),
            "tokens_per_s_per_request": round(statistics.mean(r["tokens_per_s"] for r in ok), 2),
            "replicas_used": sorted({r["replica"] for r in ok}), "per_request": results}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--backend", default="llamacpp")
    parser.add_argument("--questions", type=Path, default=Path("../shared/data/spec_bench/questions.jsonl"))
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--per-group", type=int, default=5)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--port", type=int, default=8120)
    parser.add_argument("--out", type=Path, default=Path("bench-results/ray-routing/results.json"))
    args = parser.parse_args()
    requests = workload(args.questions, args.groups, args.per_group)
    report = {"command": " ".join(sys.argv), "model": args.model, "backend": args.backend, "groups": args.groups,
              "per_group": args.per_group, "clients": args.clients, "max_tokens": args.max_tokens,
              "date": time.strftime("%Y-%m-%d %H:%M %Z"), "runs": [run(r, args, requests) for r in ("prefix", "default")]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    for r in report["runs"]:
        print(json.dumps({k: v for k, v in r.items() if k != "per_request"}))


if __name__ == "__main__":
    main()
