"""What a grammar engine's token masks cost on a real vocabulary, beside a plain decoding step of
the same model in the same run: why specdec masks with llguidance, and what constrained decoding
adds to a token's time.

For each engine (llguidance, specdec's; xgrammar where it is installed, ``pip install xgrammar``)
and each JSON Schema of the structured workload, an answer valid against the schema is walked
token by token as decoding walks it: the mask of allowed tokens computed at every position, then
the token consumed. Reported: the grammar's compile time (once per schema; the tokenizer's own
preparation apart, once per model), milliseconds of mask per token (median over the positions of
all answers, and the mean), and specdec's whole per-token cost of a constraint (mask, unpacking it
to the vocabulary, masking the logits; the fast-forward tokens' lookup) against a one-row forward
of the model, the plain step it adds to.

    python scripts/grammar_costs.py --out bench-results/grammar-costs
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent

# Answers as the model writes them (indented, as Qwen2.5-Coder does under a schema), one per schema.
CASES = {
    "function": ({"type": "object", "properties": {
        "name": {"type": "string"},
        "parameters": {"type": "array", "items": {"type": "object", "properties": {
            "name": {"type": "string"}, "type": {"type": "string"}}, "required": ["name", "type"]}},
        "returns": {"type": "string"}, "summary": {"type": "string"},
        "examples": {"type": "array", "items": {"type": "string"}}},
        "required": ["name", "parameters", "returns", "summary", "examples"]},
        {"name": "has_close_elements", "parameters": [{"name": "numbers", "type": "List[float]"},
                                                      {"name": "threshold", "type": "float"}],
         "returns": "bool", "summary": "Check if any two numbers are closer to each other than the threshold.",
         "examples": ["has_close_elements([1.0, 2.0, 3.0], 0.5) == False",
                      "has_close_elements([1.0, 2.8, 3.0, 4.0, 5.0, 2.0], 0.3) == True"]}),
    "entities": ({"type": "object", "properties": {
        "people": {"type": "array", "items": {"type": "string"}},
        "places": {"type": "array", "items": {"type": "string"}},
        "organizations": {"type": "array", "items": {"type": "string"}},
        "dates": {"type": "array", "items": {"type": "string"}}},
        "required": ["people", "places", "organizations", "dates"], "additionalProperties": False},
        {"people": ["Ada Lovelace", "Charles Babbage"], "places": ["London"],
         "organizations": ["Royal Society"], "dates": ["1843"]}),
}


def answer_tokens(tokenizer, value: dict) -> list[int]:
    return tokenizer.encode(json.dumps(value, indent=2), add_special_tokens=False)


def time_llguidance(tokenizer, vocab: int, eos: list[int], schema: dict, tokens: list[int]) -> dict:
    import llguidance
    import llguidance.hf

    from specdec.constraints import Grammar, Spec, apply

    t0 = time.perf_counter()
    lltok = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab, eos_token=eos)
    tokenizer_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    grammar = Grammar(Spec("json_schema", json.dumps(schema)), lltok)
    constraint = grammar.start()
    compile_s = time.perf_counter() - t0
    mask_ms, whole_ms = [], []
    scratch = np.zeros((vocab + 31) // 32, dtype=np.int32)
    for token in tokens:  # the engine's mask alone
        t0 = time.perf_counter()
        constraint.matcher.unsafe_compute_mask_ptr(scratch.ctypes.data, scratch.nbytes)
        mask_ms.append(1e3 * (time.perf_counter() - t0))
        constraint.consume([token])
    constraint = grammar.start()
    logits = torch.randn(1, vocab)
    for token in tokens:  # all a constrained step adds in specdec
        t0 = time.perf_counter()
        constraint.forced()
        apply(logits, constraint.masks([]))
        whole_ms.append(1e3 * (time.perf_counter() - t0))
        constraint.consume([token])
    return {"tokenizer_s": round(tokenizer_s, 3), "compile_s": round(compile_s, 4), "mask_ms": mask_ms,
            "specdec_per_token_ms": whole_ms}


def time_xgrammar(tokenizer, vocab: int, schema: dict, tokens: list[int]) -> dict | None:
    try:
        import xgrammar as xgr
    except ImportError:
        return None
    t0 = time.perf_counter()
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab)
    compiler = xgr.GrammarCompiler(info)
    tokenizer_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    compiled = compiler.compile_json_schema(json.dumps(schema))
    matcher = xgr.GrammarMatcher(compiled)
    compile_s = time.perf_counter() - t0
    bitmask = xgr.allocate_token_bitmask(1, vocab)
    mask_ms = []
    for token in tokens:
        t0 = time.perf_counter()
        matcher.fill_next_token_bitmask(bitmask)
        mask_ms.append(1e3 * (time.perf_counter() - t0))
        if not matcher.accept_token(token):
            raise RuntimeError(f"xgrammar refused token {token}")
    return {"tokenizer_s": round(tokenizer_s, 3), "compile_s": round(compile_s, 4), "mask_ms": mask_ms}


def one_row_forward_ms(model: str, repeats: int = 30) -> float:
    """The median one-row forward of ``model`` on llama.cpp (exact kernels), 200 tokens of context."""
    import random

    from specdec.backends.llamacpp import LlamaCppBackend, load_llamacpp
    from specdec.models import resolve

    backend = LlamaCppBackend(load_llamacpp(str(resolve(model, need_hf=False).gguf), n_ctx=1024))
    rng = random.Random(0)
    context = [rng.randrange(100, 30000) for _ in range(200)]
    backend.prefill(context)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        backend.extend([rng.randrange(100, 30000)])
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def summary(per_case: dict[str, dict], key: str) -> dict:
    values = [v for case in per_case.values() for v in case[key]]
    return {"median": round(statistics.median(values), 4), "mean": round(statistics.mean(values), 4),
            "tokens": len(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    import specdec

    model = specdec.load(args.model, backend="llamacpp")
    tokenizer, vocab = model.loaded.tokenizer, model.loaded.logit_width
    eos = sorted(model.loaded.eos_token_ids)
    engines: dict[str, dict] = {"llguidance": {}, "xgrammar": {}}
    for name, (schema, value) in CASES.items():
        tokens = answer_tokens(tokenizer, value)
        engines["llguidance"][name] = time_llguidance(tokenizer, vocab, eos, schema, tokens)
        timed = time_xgrammar(tokenizer, vocab, schema, tokens)
        if timed is not None:
            engines["xgrammar"][name] = timed
    forward_ms = one_row_forward_ms(args.model)
    result = {"run": "scripts/grammar_costs.py", "command": " ".join(["python", *sys.argv]),
              "date": datetime.datetime.now().isoformat(timespec="seconds"),
              "commit": subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True,
                                       cwd=ROOT).stdout.strip(),
              "model": args.model, "vocab": vocab, "one_row_forward_ms": round(forward_ms, 2), "engines": {}}
    from specdec.cpu import machine_tag

    result["cpu"] = machine_tag()
    for engine, cases in engines.items():
        if not cases:
            continue
        out = {"mask_ms": summary(cases, "mask_ms"),
               "compile_s": {name: case["compile_s"] for name, case in cases.items()},
               "tokenizer_s": next(iter(cases.values()))["tokenizer_s"]}
        if engine == "llguidance":
            out["specdec_per_token_ms"] = summary(cases, "specdec_per_token_ms")
            out["share_of_plain_step"] = round(out["specdec_per_token_ms"]["mean"] / forward_ms, 4)
        result["engines"][engine] = out
    text = json.dumps(result, indent=1)
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(text + "\n")


if __name__ == "__main__":
    main()
