"""A vLLM generation worker, run by vLLM's own interpreter (its virtual environment pins other
packages than specdec's): imports only vLLM and the standard library.

Reads one JSON request per line on stdin ({"prompt_ids": [...], "max_new_tokens": N,
"temperature": T, "top_k": K, "top_p": P, "seed": S}) and answers one JSON line on stdout
({"token_ids": [...], "wall_s": seconds of the generate call}). The first line it prints is
{"ready": true} once the model is loaded.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True, help="a transformers folder")
    parser.add_argument("--ngram", type=int, default=0, help="n-gram speculation with this many tokens (0: off)")
    args = parser.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    # This file's folder is specdec's bench package, which must not shadow vLLM's modules.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    # vLLM and its engine processes log to file descriptor 1: the protocol gets a copy of it, and
    # descriptor 1 becomes stderr.
    out = os.fdopen(os.dup(1), "w")
    sys.stdout.flush()
    os.dup2(2, 1)
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    extra = {}
    if args.ngram:
        extra["speculative_config"] = {"method": "ngram", "num_speculative_tokens": args.ngram,
                                       "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    llm = LLM(model=args.model, dtype="float32", enforce_eager=True, **extra)
    print(json.dumps({"ready": True}), file=out, flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        params = SamplingParams(max_tokens=req["max_new_tokens"], temperature=req.get("temperature", 0.0),
                                top_k=req.get("top_k") or -1, top_p=req.get("top_p", 1.0), seed=req.get("seed"))
        t0 = time.perf_counter()
        result = llm.generate([TokensPrompt(prompt_token_ids=req["prompt_ids"])], params, use_tqdm=False)
        wall = time.perf_counter() - t0
        print(json.dumps({"token_ids": list(result[0].outputs[0].token_ids), "wall_s": wall}), file=out, flush=True)


if __name__ == "__main__":
    main()
