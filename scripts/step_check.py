"""Our one-row step beside llama-server's, in one run: plain decoding through ``specdec generate``
and through a 1-row tick of ``specdec serve --drafter none``, against stock llama-server plain
(``make llama-peers``) on the same GGUF, prompt and machine. A regression in either shows as a ratio
over the budget (exit status 1).

    python scripts/step_check.py --out bench-results/tick-costs/step-check.json
    python scripts/step_check.py --context 10 --out bench-results/tick-costs/step-check-long.json

Rounds alternate the three (``generate``, our server, llama-server), so a machine that drifts shifts
them alike; the median of the rounds counts. Per round and path:

- ``generate``: a fresh ``specdec generate --drafter none --json`` process; its step is the time
  after the prompt per new token (``wall_s - prefill_s``, forwards, argmax and the engine's loop),
  beside llama-server's own ``predicted_per_token_ms`` for the same prompt (its forwards, sampling
  and loop; HTTP outside both); the prompt's time per token beside it, both cold (``prefill_s``,
  ``prompt_per_token_ms``), reported but not in the budget;
- ``serve``: one streamed chat request to each server, alone, timed by the same client from its first
  streamed token to its last (every step, HTTP included, for both); our server's 1-row ticks also
  give their own forward time (``batch_decode_seconds`` / ``batch_ticks`` on ``/metrics``, less a
  two-token request's: the prompt's).
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from loadtest import batch_counters, wait_ready  # noqa: E402

from specdec.backends.llamacpp_lib import lib  # noqa: E402
from specdec.bench.peers.llama_server import LlamaServer  # noqa: E402
from specdec.cpu import machine_tag, usable_cpus  # noqa: E402
from specdec.files import write_atomic  # noqa: E402
from specdec.models import resolve  # noqa: E402

PROMPT_FILE = ROOT / "examples" / "edit_function.txt"
SLOTS = 16  # both servers as the load test runs them
CELLS = 2048  # context per slot, as in the load test


def _generate(model: str, prompt: str, tokens: int) -> dict:
    """One ``specdec generate`` process, plain decoding: its time per new token after the prompt."""
    out = subprocess.run([str(ROOT / ".venv" / "bin" / "specdec"), "generate", prompt, "--model", model,
                          "--backend", "llamacpp", "--chat", "--drafter", "none", "--max-new-tokens", str(tokens),
                          "--json"], capture_output=True, text=True, timeout=900, check=True)
    stats = json.loads(out.stdout)["stats"]
    n = stats["new_tokens"]
    return {"tokens": n, "ms_per_token": 1e3 * (stats["wall_s"] - stats["prefill_s"]) / n,
            "forward_ms": 1e3 * stats["verify_s"] / n,
            "prompt_ms_per_token": 1e3 * stats["prefill_s"] / stats["prompt_tokens"]}


def _llama_server_step(server: LlamaServer, prompt_ids: list[int], tokens: int) -> dict:
    """llama-server's own time per predicted token for the same prompt (its ``timings``)."""
    answer = server.complete({"prompt": prompt_ids, "n_predict": tokens, "temperature": 0, "cache_prompt": False,
                              "ignore_eos": True})
    timings = answer["timings"]
    return {"tokens": timings["predicted_n"], "ms_per_token": timings["predicted_per_token_ms"],
            "prompt_tokens": timings["prompt_n"], "prompt_ms_per_token": timings["prompt_per_token_ms"]}


def _streamed(url: str, model: str, prompt: str, tokens: int) -> dict:
    """One streamed chat request, alone: the client's time per token from the first to the last."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": tokens,
            "temperature": 0, "stream": True}
    times = []
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=900) as reply:
        reply.raise_for_status()
        for line in reply.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            choices = chunk.get("choices") or []
            if choices and (choices[0].get("delta") or {}).get("content"):
                times.append(time.perf_counter())
    if len(times) < 2:
        raise RuntimeError(f"{url} streamed {len(times)} tokens")
    return {"chunks": len(times), "ms_per_token": 1e3 * (times[-1] - times[0]) / (len(times) - 1)}


def _ticks(url: str) -> tuple[float, float]:
    """Our server's ticks and seconds in their forwards so far (``/metrics``)."""
    counters = batch_counters(url)
    if counters is None:
        raise RuntimeError(f"{url} counts no ticks on /metrics")
    return counters["ticks"], counters["decode_s"]


def _with_context(request: str, problems: int) -> str:
    """``request`` after a module of the first ``problems`` shipped HumanEval solutions (none: as it is)."""
    if problems <= 0:
        return request
    rows = [json.loads(line) for line in resources.files("specdec.data").joinpath("prompts", "humaneval.jsonl")
            .read_text(encoding="utf-8").splitlines()[:problems]]
    code = "\n\n".join(row["prompt"] + row["canonical_solution"] for row in rows)
    return f"Here is a Python module:\n```python\n{code}```\n\n{request}"


def _start_ours(model: str, port: int) -> subprocess.Popen:
    log = open(f"/tmp/step-check-specdec-{port}.log", "w")
    proc = subprocess.Popen([str(ROOT / ".venv" / "bin" / "specdec"), "serve", "--model", model, "--backend",
                             "llamacpp", "--drafter", "none", "--slots", str(SLOTS), "--port", str(port)],
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    wait_ready(f"http://127.0.0.1:{port}", timeout=600)
    return proc


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--budget", type=float, default=1.03, help="the most our step may cost over llama-server's")
    parser.add_argument("--port", type=int, default=8190)
    parser.add_argument("--prompt-file", type=Path, default=PROMPT_FILE, help="the request")
    parser.add_argument("--context", type=int, default=0, metavar="N",
                        help="put the code of the first N shipped HumanEval problems (prompt and solution) before the "
                             "request: the step at a longer context (10: about 1,700 prompt tokens)")
    parser.add_argument("--out", type=Path, default=None, help="a folder for results.json, or a .json file")
    args = parser.parse_args()

    import specdec

    prompt = _with_context(args.prompt_file.read_text(), args.context)
    gguf = resolve(args.model, need_hf=False).gguf
    prompt_ids = specdec.load(args.model, backend="llamacpp").encode(prompt, chat=True)
    peer = LlamaServer(gguf, ["--parallel", str(SLOTS)], ctx=SLOTS * CELLS)  # the last --parallel counts
    peer.start()
    ours = _start_ours(args.model, args.port)
    ours_url = f"http://127.0.0.1:{args.port}"
    rounds = []
    try:
        for url in (ours_url, peer.url):  # each server's first request (our prompt cache starts empty)
            _streamed(url, args.model, prompt, 2)
        for r in range(args.rounds):
            row = {}
            order = ["generate", "peer-step", "serve", "peer-serve"]
            for part in order if r % 2 == 0 else order[::-1]:
                if part == "generate":
                    row["generate"] = _generate(args.model, prompt, args.tokens)
                elif part == "peer-step":
                    row["llama_server_step"] = _llama_server_step(peer, prompt_ids, args.tokens)
                elif part == "serve":
                    # The prompt's own forwards, from a request of the same prompt for two tokens,
                    # are taken off the ticks' forward time (the second request finds the prompt's
                    # cache as the first left it).
                    t0 = _ticks(ours_url)
                    _streamed(ours_url, args.model, prompt, 2)
                    t1 = _ticks(ours_url)
                    row["serve"] = _streamed(ours_url, args.model, prompt, args.tokens)
                    t2 = _ticks(ours_url)
                    ticks = (t2[0] - t1[0]) - (t1[0] - t0[0])
                    seconds = (t2[1] - t1[1]) - (t1[1] - t0[1])
                    row["serve"]["tick_forward_ms"] = 1e3 * seconds / ticks if ticks > 0 else None
                else:
                    row["llama_server_serve"] = _streamed(peer.url, args.model, prompt, args.tokens)
            rounds.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    finally:
        ours.terminate()
        ours.wait(30)
        peer.close()

    def median(path: str, key: str = "ms_per_token") -> float:
        return round(statistics.median(row[path][key] for row in rounds), 2)

    result = {
        "run": "scripts/step_check.py", "command": " ".join(["python", *sys.argv]),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "commit": subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True,
                                 cwd=ROOT).stdout.strip(),
        "cpu": machine_tag(), "threads": usable_cpus(), "model": args.model, "tokens": args.tokens,
        "context_problems": args.context,
        "system": lib().llama_print_system_info().decode().strip(),
        "rounds": rounds,
        "generate_ms_per_token": median("generate"), "generate_forward_ms": median("generate", "forward_ms"),
        "llama_server_ms_per_token": median("llama_server_step"),
        "serve_ms_per_token": median("serve"), "llama_server_serve_ms_per_token": median("llama_server_serve"),
        "serve_tick_forward_ms": round(statistics.median(row["serve"]["tick_forward_ms"] for row in rounds), 2),
    }
    result["generate_ratio"] = round(result["generate_ms_per_token"] / result["llama_server_ms_per_token"], 3)
    result["serve_ratio"] = round(result["serve_ms_per_token"] / result["llama_server_serve_ms_per_token"], 3)
    # The prompt beside it, cold on both sides (not in the budget: a prompt is not a step)
    result["prompt_tokens"] = rounds[0]["llama_server_step"]["prompt_tokens"]
    result["generate_prompt_ms_per_token"] = median("generate", "prompt_ms_per_token")
    result["llama_server_prompt_ms_per_token"] = median("llama_server_step", "prompt_ms_per_token")
    result["prompt_ratio"] = round(result["generate_prompt_ms_per_token"] / result["llama_server_prompt_ms_per_token"], 3)
    result["budget"] = args.budget
    result["within_budget"] = result["generate_ratio"] <= args.budget and result["serve_ratio"] <= args.budget
    text = json.dumps(result, indent=1)
    print(text)
    if args.out is not None:  # a folder (its results.json) or a .json file
        path = args.out if args.out.suffix == ".json" else args.out / "results.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, text + "\n")
    return 0 if result["within_budget"] else 1


if __name__ == "__main__":
    sys.exit(main())
