"""The cost measurements whose results the docs cite, one subcommand each:

- ``kernels``: what an exact forward of k rows costs on llama.cpp against the fast kernels of the
  same build (and other builds), and whether its rows have the one-row bits
  (bench-results/amx-kernels, qwen-kernels-*);
- ``grammar``: what a grammar engine's token masks cost on a real vocabulary, beside a plain step
  (bench-results/grammar-costs);
- ``ticks``: what a shared tick of the batched llama.cpp context costs by its layout
  (bench-results/tick-costs);
- ``index``: what the index of earlier outputs costs, memory and lookups (bench-results/index-costs).

    python scripts/costs.py SUBCOMMAND --help
"""

from __future__ import annotations

import argparse
import datetime
import inspect
import json
import os
import random
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _commit() -> str | None:
    """The checkout's commit, ``+dirty`` with uncommitted changes (what reproduces the file)."""
    try:
        return subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty=+dirty", "--abbrev=12"],
                              capture_output=True, text=True, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


# --- kernels: a k-row forward's cost per kernel setting, and its bits -----------------------------
SIZES = (1, 2, 3, 4, 8, 16, 32, 64)
SETTINGS = ("exact", "capped", "fast", "stock", "stock-fast", "previous")


def worker(setting: str, model: str, sizes: list[int], repeats: int, bits: bool) -> dict:
    import torch

    from specdec.backends.llamacpp import LlamaCppBackend, load_llamacpp
    from specdec.backends.llamacpp_lib import has_selftest, lib
    from specdec.costs import measure_forward_costs
    from specdec.models import resolve

    weights = load_llamacpp(str(resolve(model, need_hf=False).gguf), n_ctx=1024,
                            exact=setting not in ("fast", "stock-fast"))
    backend = LlamaCppBackend(weights)
    rng = random.Random(0)
    context = [rng.randrange(100, 30000) for _ in range(200)]
    costs = measure_forward_costs(backend, context, sizes, repeats)
    out = {"seconds": {str(k): v for k, v in costs.items()}, "n_ubatch": weights.n_ubatch,
           "patched": has_selftest(), "system": lib().llama_print_system_info().decode().strip()}
    if bits:
        backend.reset()
        backend.prefill(context)
        window = [rng.randrange(100, 30000) for _ in range(max(sizes))]
        ones = torch.cat([backend.extend([t]) for t in window])
        backend.truncate(len(context))
        differing = {}
        for k in sizes:
            many = backend.extend(window[:k])
            backend.truncate(len(context))
            differing[str(k)] = int((many != ones[:k]).any(dim=1).sum())
        out["rows_differing"] = differing
    return out


def run_worker(setting: str, model: str, sizes: list[int], repeats: int, bits: bool, libs: dict[str, str]) -> dict:
    env = dict(os.environ)
    env.pop("SPECDEC_MULTIROW", None)
    if setting == "capped":
        env["SPECDEC_MULTIROW"] = "0"
    if setting in libs:
        env["LLAMA_CPP_LIB_PATH"] = libs[setting]
    command = [sys.executable, __file__, "kernels", "--worker", setting, "--model", model, "--sizes",
               ",".join(map(str, sizes)), "--repeats", str(repeats)] + (["--bits"] if bits else [])
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def kernels(argv: list[str]) -> None:
    """What an exact forward of k rows costs on llama.cpp, against the fast kernels of the same build
    and the stock library's one row, and whether its rows have the one-row bits.

    Kernel settings are fixed per process (ggml reads its tiled-matmul switch once), so each setting
    runs in a process of its own, the settings alternating over ``--rounds`` rounds; the fastest
    forward of each size over all rounds counts (noise only adds time). Settings:

    - ``exact``: exact kernels with specdec's multi-row kernels (no row cap; the patched library);
    - ``capped``: exact kernels capped at 3 rows a micro-batch (``SPECDEC_MULTIROW=0``: the stock library's
      cap; 2 and 3 rows still run the patch's multi-row kernels, which the stock library lacks);
    - ``fast``: llama.cpp's fast kernels (``--no-exact``), same build;
    - ``stock``: exact kernels on the stock library (``--stock-lib DIR``, its libllama.so), capped;
    - ``stock-fast``: the llama.cpp users get (``--users-lib DIR``: ``make llama-peers`` builds it in
      ``.peers/llama.cpp/build/bin``, default options, llamafile's kernels on) with its own kernels
      (``--no-exact``; exact decoding refuses a llamafile build);
    - ``previous``: exact kernels on a build of an earlier version of the patch (``--previous-lib DIR``),
      uncapped: what the newest version of the patch changed, in the same run.

    Then, per model, the bits: a k-token forward against k one-token forwards for every k in the sizes.

        python scripts/costs.py kernels --out bench-results/qwen-kernels-stock --users-lib .peers/llama.cpp/build/bin
    """
    parser = argparse.ArgumentParser(prog="costs.py kernels", description=inspect.getdoc(kernels), formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--bits-models", default="qwen2.5-coder-1.5b,qwen2.5-coder-0.5b")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--stock-lib", help="folder of a stock llama.cpp build without llamafile, its libllama.so "
                                            "(the 'stock' setting: exact, capped)")
    parser.add_argument("--users-lib", help="folder of the llama.cpp build users get, its libllama.so (the "
                                            "'stock-fast' setting; make llama-peers: .peers/llama.cpp/build/bin)")
    parser.add_argument("--previous-lib", help="folder of a build of an earlier version of specdec's patch "
                                               "(the 'previous' setting)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--worker", choices=SETTINGS, help=argparse.SUPPRESS)
    parser.add_argument("--bits", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.worker:
        print(json.dumps(worker(args.worker, args.model, sizes, args.repeats, args.bits)))
        return

    from specdec.cpu import machine_tag

    libs = {s: d for s, d in (("stock", args.stock_lib), ("stock-fast", args.users_lib),
                              ("previous", args.previous_lib)) if d}
    settings = [s for s in SETTINGS if s in ("exact", "capped", "fast") or s in libs]
    best: dict[str, dict[str, float]] = {}
    info: dict[str, dict] = {}
    for r in range(args.rounds):
        for setting in settings if r % 2 == 0 else reversed(settings):
            got = run_worker(setting, args.model, sizes, args.repeats, False, libs)
            info[setting] = {k: v for k, v in got.items() if k != "seconds"}
            for k, v in got["seconds"].items():
                best.setdefault(setting, {})[k] = min(v, best.get(setting, {}).get(k, v))
            print(setting, {k: round(v * 1000, 1) for k, v in got["seconds"].items()}, file=sys.stderr)
    bits = {m: {s: run_worker(s, m, sizes, 1, True, libs)["rows_differing"] for s in ("exact", "fast")}
            for m in args.bits_models.split(",")}
    ms = {s: {k: round(v * 1000, 2) for k, v in best[s].items()} for s in best}
    ratios = {k: round(best["exact"][k] / best["fast"][k], 3) for k in best["exact"]}
    result = {
        "model": args.model, "cpu": machine_tag(),
        "build_isa": "AVX-512" if "AVX512 = 1" in info["exact"]["system"] else "AVX2", "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join(["python", "scripts/costs.py", "kernels", *argv]),
        "commit": _commit(),
        "ms": ms, "exact_over_fast": ratios,
        "exact_one_row_over_stock": round(best["exact"]["1"] / best["stock"]["1"], 3) if "stock" in best else None,
        "exact_over_stock_fast": ({k: round(best["exact"][k] / best["stock-fast"][k], 3) for k in best["exact"]}
                                  if "stock-fast" in best else None),
        "exact_over_previous": ({k: round(best["exact"][k] / best["previous"][k], 3) for k in best["exact"]}
                                if "previous" in best else None),
        "ms_per_row": {s: {k: round(v / int(k), 2) for k, v in ms[s].items()} for s in ms},
        "rows_differing_from_one_row_forwards": bits, "settings": info,
    }
    print(json.dumps({k: result[k] for k in ("ms", "exact_over_fast", "exact_one_row_over_stock", "exact_over_stock_fast",
                                             "exact_over_previous")}, indent=1))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(result, indent=1) + "\n")


# --- grammar: a grammar engine's token masks beside a plain step ----------------------------------

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
    import numpy as np
    import torch

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


def grammar(argv: list[str]) -> None:
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

        python scripts/costs.py grammar --out bench-results/grammar-costs
    """
    parser = argparse.ArgumentParser(prog="costs.py grammar", description=inspect.getdoc(grammar), formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)

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
    result = {"run": "scripts/costs.py grammar", "command": " ".join(["python", *sys.argv]),
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


# --- ticks: a shared tick's cost by its layout ----------------------------------------------------
# "NxR": N sequences (ids 0, 1, ...) of R rows each; "+k": the first of them has k draft rows more
# ("+4x3": the first four, 3 each).
LAYOUTS = {
    "1x1": [1], "1x1+3": [4],
    "4x1": [1] * 4, "4x2": [2] * 4, "4x4": [4] * 4, "4x1+3": [4, 1, 1, 1],
    "8x1": [1] * 8, "8x2": [2] * 8, "8x1+1": [2] + [1] * 7, "8x1+3": [4] + [1] * 7, "8x1+4x3": [4] * 4 + [1] * 4,
    "16x1": [1] * 16, "16x2": [2] * 16,
}


def ticks(argv: list[str]) -> None:
    """What a shared tick costs by its layout on the batched llama.cpp context: sequences at a given
    context length, each putting one row (a plain step) or more (its step and draft rows) in one
    ``llama_decode``, with llama.cpp's split of the tick into forwards. It answers what a draft costs
    the other sequences of a tick on this machine: a tick of 4 one-row steps against the same tick
    with one sequence's 3 draft rows (an extra forward) or with every sequence's row doubled.

        python scripts/costs.py ticks --out bench-results/tick-costs --context 700 --rounds 5

    Layouts are timed in turn, round after round (the median of the rounds counts: a shared machine's
    slow minute then weighs on every layout alike); each tick's rows are removed after it, so every
    round sees the same cache.
    """
    parser = argparse.ArgumentParser(prog="costs.py ticks", description=inspect.getdoc(ticks), formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--context", type=int, default=700, help="cells each sequence holds before the tick")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default=None, help="a folder for results.json")
    parser.add_argument("--unified", action="store_true",
                        help="one KV cache for all sequences instead of a stream each: llama.cpp then "
                             "computes any layout in one forward, and each row's attention scans every "
                             "sequence's cells (what unequal rows would cost there; specdec's batching "
                             "keeps a stream per sequence, whose cells stay in position order)")
    args = parser.parse_args(argv)

    import specdec
    from specdec.backends.llamacpp_batched import forwards
    from specdec.backends.llamacpp_lib import lib
    from specdec.cpu import machine_tag

    model = specdec.load(args.model, backend="llamacpp")
    model.loaded.enable_batching(16)
    shared = model.loaded.batched
    if args.unified:  # the same sequences on another context (the streams' one freed: its KV cache is large)
        lib().llama_free(shared.ctx)
        shared.layout = (shared.layout[0], shared.layout[1], True)
        shared.ctx = shared.weights.context(shared.layout)
    backends = [shared.backend() for _ in range(16)]
    rng = random.Random(0)
    for backend in backends:
        backend.reset()
        backend.prefill([rng.randrange(1000, 20000) for _ in range(args.context)])
    llama = lib()
    memory = llama.llama_get_memory(shared.ctx)

    def tick(rows: list[int]) -> float:
        subs = []
        for seq, n in enumerate(rows):
            base = len(backends[seq].tokens)
            subs.append(shared.submission(seq, [100 + i for i in range(n)], [base + i for i in range(n)],
                                          [[seq]] * n, [True] * n))
        t0 = time.perf_counter()
        shared._run(subs)
        seconds = time.perf_counter() - t0
        for seq in range(len(rows)):
            llama.llama_memory_seq_rm(memory, seq, len(backends[seq].tokens), -1)
        return seconds

    times: dict[str, list[float]] = {name: [] for name in LAYOUTS}
    for _ in range(args.rounds):
        for name, rows in LAYOUTS.items():
            times[name].append(tick(rows))
    ms = {name: round(1000 * statistics.median(v), 1) for name, v in times.items()}
    plain = {n: ms[f"{n}x1"] for n in (1, 4, 8, 16)}
    results = {
        "model": args.model, "cpu": machine_tag(), "context": args.context, "rounds": args.rounds,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True).stdout.strip(),
        "command": " ".join(["python", "scripts/costs.py", "ticks", *argv]),
        "ms": ms,
        # each layout's tick over the tick of the same sequences' one-row steps
        "over_plain_tick": {name: round(ms[name] / plain[len(rows)], 2) for name, rows in LAYOUTS.items()},
        "kv": "unified" if args.unified else "a stream per sequence",
        # split_simple (unified) takes n_ubatch rows a forward, whatever their sequences
        "forwards": {name: ([(sum(rows), len(rows))] if args.unified and sum(rows) <= shared.weights.n_ubatch
                            else forwards(list(range(len(rows))), rows, shared.weights.n_ubatch))
                     for name, rows in LAYOUTS.items()},
    }
    text = json.dumps(results, indent=1)
    print(text)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "results.json").write_text(text + "\n", encoding="utf-8")


# --- index: the index of earlier outputs: memory and lookups --------------------------------------
def index(argv: list[str]) -> None:
    """What the index of earlier outputs costs: memory and lookup time at its default bound.

    Fills an index (``specdec.drafting.suffix_index.NgramMemory``) with the tokens of HumanEval solutions
    and Spec-Bench questions (Qwen2.5-Coder's tokenizer) until it is full, several times over so
    eviction runs and common n-grams have many occurrences, then times the drafter's lookups at
    random points of that text against the model's one-token forward (the cost curve's unit).

        python scripts/costs.py index --out bench-results/index-costs
    """
    import specdec
    from specdec.bench.questions import load_questions
    from specdec.cpu import machine_tag
    from specdec.drafting.suffix_index import DEFAULT_CAPACITY, NgramMemory

    parser = argparse.ArgumentParser(prog="costs.py index", description=inspect.getdoc(index), formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--capacity", type=int, default=DEFAULT_CAPACITY)
    parser.add_argument("--lookups", type=int, default=20000)
    parser.add_argument("--out", default="bench-results/index-costs")
    args = parser.parse_args(argv)
    model = specdec.load(args.model, backend="llamacpp")
    texts = [q.prompt for q in load_questions("humaneval-files")[::3]] + [q.prompt for q in load_questions("spec-bench")]
    outputs = [model.encode(t) for t in texts]
    tracemalloc.start()
    memory = NgramMemory(capacity=args.capacity)
    added, t0 = 0, time.perf_counter()
    while added < 2 * args.capacity:
        for tokens in outputs:
            memory.add(tokens)
            added += len(tokens)
    add_s = time.perf_counter() - t0
    used, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rng = random.Random(0)
    tails = []
    for _ in range(args.lookups):
        tokens = rng.choice(outputs)
        end = rng.randrange(2, len(tokens))
        tails.append(tokens[max(0, end - 64):end])
    t0 = time.perf_counter()
    hits = sum(bool(memory.matches(t)[0]) for t in tails)
    lookup_s = (time.perf_counter() - t0) / len(tails)
    unit = model.loaded.cost_model().unit
    result = {"model": args.model, "cpu": machine_tag(), "capacity_tokens": args.capacity, "tokens_kept": len(memory),
              "outputs_kept": memory.outputs, "tokens_added": added, "bytes": used, "bytes_per_token": used / len(memory),
              "add_us_per_token": 1e6 * add_s / added, "lookup_us": 1e6 * lookup_s, "lookup_hit_rate": hits / len(tails),
              "one_token_forward_ms": 1e3 * unit, "lookup_over_forward": lookup_s / unit,
              "command": "python scripts/costs.py index " + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items())}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


COMMANDS: dict[str, Callable[[list[str]], None]] = {"kernels": kernels, "grammar": grammar, "ticks": ticks,
                                                    "index": index}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in COMMANDS:
        print(__doc__.strip(), file=sys.stderr)
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    COMMANDS[argv[0]](argv[1:])
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
