"""transformers' own continuous batching behind the OpenAI chat API, as the GPU check's peer: the
same load test (scripts/loadtest.py's requests) runs against it and against ``specdec serve``.

The model runs in transformers' ``ContinuousBatchingManager`` (``init_continuous_batching``: paged
KV cache, one batch of every running request a step) with CUDA graphs and its compiled forward, as
its documentation recommends for speed (``--compile-level``: ``ContinuousBatchingConfig``'s
``default_compile_level``; ``--no-graphs`` turns the graphs off); greedy decoding. A dispatcher
thread takes every streamed result off the manager's output queue and hands it to its request.

    python scripts/hf_cb_server.py --model /path/to/hf-folder --port 8101 --slots 16
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
import uuid

import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse


def build_app(model, tokenizer, manager, name: str, max_tokens: int = 256):
    app = FastAPI()
    waiting: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
    lock = threading.Lock()

    def dispatch() -> None:  # the manager's results to the requests waiting for them
        while True:
            result = manager.get_result(timeout=0.5)
            if result is None:
                if not manager.is_running():
                    return
                continue
            with lock:
                target = waiting.get(result.request_id)
            if target is not None:
                loop, queue = target
                loop.call_soon_threadsafe(queue.put_nowait, result)

    threading.Thread(target=dispatch, daemon=True, name="cb-dispatch").start()

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "transformers"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        ids = tokenizer.apply_chat_template(body["messages"], add_generation_prompt=True, tokenize=True)
        ids = list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
        new = int(body.get("max_tokens") or max_tokens)
        rid = f"req-{uuid.uuid4().hex}"
        queue: asyncio.Queue = asyncio.Queue()
        with lock:
            waiting[rid] = (asyncio.get_running_loop(), queue)
        manager.add_request(ids, request_id=rid, max_new_tokens=new, streaming=True)

        async def results():
            try:
                while True:
                    result = await queue.get()
                    yield result
                    if result.is_finished():
                        return
            finally:
                with lock:
                    waiting.pop(rid, None)

        if not body.get("stream"):
            last = None
            async for result in results():
                last = result
            tokens = list(last.generated_tokens)
            text = tokenizer.decode(tokens, skip_special_tokens=True)
            return JSONResponse({"id": rid, "object": "chat.completion", "model": name,
                                 "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                              "finish_reason": "stop"}],
                                 "usage": {"prompt_tokens": len(ids), "completion_tokens": len(tokens)}})

        async def stream():
            sent, tokens = "", []
            async for result in results():
                tokens = list(result.generated_tokens)
                text = tokenizer.decode(tokens, skip_special_tokens=True)
                if text.endswith("\ufffd"):  # half a character: wait for the rest
                    continue
                delta, sent = text[len(sent):], text
                if delta:
                    chunk = {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()), "model": name,
                             "choices": [{"index": 0, "delta": {"content": delta}, "finish_reason": None}]}
                    yield f"data: {json.dumps(chunk)}\n\n"
            usage = {"prompt_tokens": len(ids), "completion_tokens": len(tokens)}
            yield f"data: {json.dumps({'id': rid, 'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")

    return app


def manager_for(model, tokenizer, slots: int, graphs: bool, compile_level: int, max_tokens: int,
                max_batch_tokens: int = 4096):
    """A started ``ContinuousBatchingManager`` for ``model``, greedy, its graphs captured (warm-up)."""
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    eos = tokenizer.eos_token_id if model.generation_config.eos_token_id is None else model.generation_config.eos_token_id
    config = GenerationConfig(max_new_tokens=max_tokens, do_sample=False, eos_token_id=eos,
                              pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos)
    # Its KV cache and batch sized for the load test (by default it takes 90% of the free memory and
    # sizes a batch's tokens from it, and its warm-up then runs out of memory on an H200).
    cb = ContinuousBatchingConfig(max_requests_per_batch=slots, use_cuda_graph=graphs,
                                  default_compile_level=compile_level, max_memory_percent=0.3,
                                  max_batch_tokens=max_batch_tokens)
    manager = model.init_continuous_batching(generation_config=config, continuous_batching_config=cb)
    manager.warmup()
    manager.start()
    return manager


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a transformers folder")
    parser.add_argument("--name", default=None)
    parser.add_argument("--port", type=int, default=8101)
    parser.add_argument("--slots", type=int, default=16, help="requests in a batch at most")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--compile-level", type=int, default=1)
    parser.add_argument("--no-graphs", dest="graphs", action="store_false")
    parser.add_argument("--max-batch-tokens", type=int, default=4096, help="tokens of one batch (prompts included)")
    args = parser.parse_args(argv)

    import uvicorn
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=getattr(torch, args.dtype)).to(args.device).eval()
    manager = manager_for(model, tokenizer, args.slots, args.graphs and args.device.startswith("cuda"),
                          args.compile_level, args.max_tokens, args.max_batch_tokens)
    app = build_app(model, tokenizer, manager, args.name or args.model, args.max_tokens)
    try:
        uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")
    finally:
        manager.stop(block=False)


if __name__ == "__main__":
    main()
