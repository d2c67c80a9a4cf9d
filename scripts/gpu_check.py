"""The GPU check: specdec's engine on one CUDA GPU, in minutes, with what that machine has (PyTorch
and transformers; no network). Writes OUT/report.json after every step and prints a summary.

1. ``arch``: architectures with random weights, built on the device from the shipped models'
   configurations (:data:`ARCHS`: Qwen2.5-Coder 1.5B and 0.5B from their GGUF metadata,
   the 7B from its published config), run through the engine as it runs on a GPU (a static KV
   cache, every forward replayed from a captured CUDA graph, exact: one 16-row shape):
   - the engine's cost curve, and its plain decoding step after a 50-token and a 2,000-token
     prompt, against a bare replay of its own 16-row graph and against transformers' forward on its
     StaticCache captured in a graph of the same shape (eager kernels: the reference of earlier runs);
   - exactness: the model drafting for itself must accept every token and give plain decoding's
     output (random weights give near-uniform logits, the hardest case);
   - the 7B drafted by the 0.5B: both run through the engine with graphs (random weights, so nothing
     is accepted), its draft and verification step costs measured, and the speed-up *computed* from
     them and a per-token acceptance measured on the CPU. A computation, not a run.
2. ``smollm2`` (``--smollm2 GGUF``, SmolLM2-135M's real weights): Spec-Bench, one question per
   category per round, our plain decoding and n-gram drafter against transformers' ``generate``
   plain, with its compiled static cache (each prompt timed after a first run) and with prompt
   lookup, the outputs compared.

3. ``serve`` (``--smollm2 GGUF``): ``specdec serve --device cuda --slots N`` (one padded forward of
   every running request a tick, CUDA graphs, a paged KV pool) under the load test's chat requests
   (HumanEval problems and Spec-Bench questions) at each ``--levels`` concurrency, with its default
   drafter and with ``"drafter": "none"`` in the same server, against transformers' continuous
   batching (``gpu_check.py hf-cb-server``: ``init_continuous_batching`` with CUDA graphs and its
   compiled forward) on the same model and requests; every answer compared with the same request
   alone (the first level, one client), and the server's GPU memory after 20 and after 200 requests.

The parts run in the order ``--parts`` gives (default: serve, serve-peers, smollm2, arch: serving
first). Each server is warmed at every level's shape before its timed levels; the peer's answers are
compared with ours (``differ_from_specdec_none``) and ours with and without drafting over it
(``ngram_over_transformers_cb``, ``none_over_transformers_cb``). Servers run in process groups of
their own, stopped however the check ends (SIGTERM from a time limit included).

    python scripts/gpu_check.py --device cuda --smollm2 /path/SmolLM2-135M-Instruct.Q4_1.gguf --out OUT
    python scripts/gpu_check.py --device cpu --toy --out OUT     # every part at toy size (the tests)
    python scripts/gpu_check.py --check-archs                    # ARCHS against the shipped GGUFs
"""

# Annotations are evaluated as each function is defined (no ``from __future__ import annotations``):
# FastAPI reads the peer's chat route's at runtime, and the ``Request`` it names is imported inside
# ``hf_cb_app`` (FastAPI is not needed by the rest of the check), where a postponed string could not
# be resolved.
import argparse
import asyncio
import functools
import json
import os
import platform
import sys
import threading
import time
import traceback
import uuid
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # runs from a copied working tree, specdec not installed

import torch  # noqa: E402

from specdec import devices  # noqa: E402
from specdec.backends.hf import PAD_ROWS  # noqa: E402
from specdec.backends.hf_static import HFStaticBackend, StaticModel  # noqa: E402
from specdec.costs import CostModel, measure_forward_costs  # noqa: E402
from specdec.drafters.model import ModelDrafter  # noqa: E402
from specdec.engine import DecodeConfig, decode  # noqa: E402
from specdec.policies.adaptive import AdaptiveK  # noqa: E402
from specdec.policies.fixed import FixedK  # noqa: E402

ARCH_NAMES = ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "qwen2.5-coder-7b")
TARGET, DRAFT = "qwen2.5-coder-7b", "qwen2.5-coder-0.5b"
# Per-token acceptance of the 0.5B drafting for the 1.5B: their greedy agreement on HumanEval,
# measured on the CPU with llama.cpp (../shared/MODELS.md; CHANGELOG.md: the 0.5B drafting the 1.5B on HumanEval).
PAIR_ACCEPTANCE = 0.979
PAIR_KS = (4, 8, 12, 15)  # draft lengths timed for the pair (15 + 1 rows: one 16-row verification)
CURVE_SIZES = (1, 2, 4, 8, 15, 16, 17, 32, 64)
VARIANTS_ON = "qwen2.5-coder-1.5b"  # the architecture every --attention variant runs on (the first: all)
# The architectures the arch part builds with random weights (no weights travel to the GPU, only
# these shapes): the shipped models' from their GGUF metadata (``--check-archs`` reads them again and
# says where they differ), Qwen2.5-Coder-7B's as published (no 7B ships here).
SHIPPED_ARCHS = ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "smollm2-135m")
ARCHS: dict[str, dict] = {
    "qwen2.5-coder-1.5b": {
        "model_type": "qwen2", "vocab_size": 151936, "hidden_size": 1536, "intermediate_size": 8960,
        "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2,
        "max_position_embeddings": 32768, "rope_theta": 1000000.0, "rms_norm_eps": 1e-06,
        "tie_word_embeddings": False,
        "source": "GGUF metadata of qwen2.5-coder-1.5b as shipped (1,117,320,768 bytes)"},
    "qwen2.5-coder-0.5b": {
        "model_type": "qwen2", "vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864,
        "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
        "max_position_embeddings": 32768, "rope_theta": 1000000.0, "rms_norm_eps": 1e-06,
        "tie_word_embeddings": False,
        "source": "GGUF metadata of qwen2.5-coder-0.5b as shipped (491,400,064 bytes)"},
    "smollm2-135m": {
        "model_type": "llama", "vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536,
        "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
        "max_position_embeddings": 8192, "rope_theta": 100000.0, "rms_norm_eps": 1e-05,
        "tie_word_embeddings": True,
        "source": "GGUF metadata of smollm2-135m as shipped (98,362,432 bytes)"},
    "qwen2.5-coder-7b": {
        "model_type": "qwen2", "vocab_size": 152064, "hidden_size": 3584, "intermediate_size": 18944,
        "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
        "max_position_embeddings": 32768, "rope_theta": 1000000.0, "rms_norm_eps": 1e-06,
        "tie_word_embeddings": False,
        "source": "Qwen/Qwen2.5-Coder-7B-Instruct config.json (published)"},
}
TOY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
       "num_key_value_heads": 2, "vocab_size": 512}


def build(arch: dict, device: str, dtype: torch.dtype, toy: bool, seed: int = 0):
    """A causal LM of ``arch``'s shapes with random weights, made directly on the device."""
    from transformers import AutoConfig, AutoModelForCausalLM

    values = {k: v for k, v in arch.items() if k not in ("model_type", "source")}
    if toy:
        values.update(TOY)
    config = AutoConfig.for_model(arch["model_type"], **values)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


def engine_backend(model, shared: StaticModel, pad: int = PAD_ROWS) -> HFStaticBackend:
    """A sequence as the engine runs it on a GPU: static cache, graphs, one padded shape."""
    return HFStaticBackend(model, pad, shared)


def first_capture_s(model, shared: StaticModel, context: list[int]) -> float:
    """Seconds of the first forward of a sequence: its graph's capture and (once per model) the
    compilation of its kernels."""
    backend = engine_backend(model, shared)
    backend.prefill(context)
    t0 = time.perf_counter()
    _read(backend.extend(context[:1]))
    return round(time.perf_counter() - t0, 2)


def compile_state(shared: StaticModel) -> str:
    """How the engine's kernels run: compiled, eager (compiling failed: the reason went to stderr),
    or eager as asked (or on a CPU)."""
    state = getattr(shared.step, "state", None)
    return "eager" if state is None else "eager (compiling failed)" if state["fallback"] else "compiled"


def plain_step_ms(model, shared: StaticModel, prompt: list[int], tokens: int) -> dict:
    """The engine's plain decoding step (milliseconds a token after the prompt), on a sequence that
    ran the same generation once before (its graphs captured, its cache sized)."""
    backend = engine_backend(model, shared)
    config = DecodeConfig(max_new_tokens=tokens)
    decode(backend, prompt, config)
    out = decode(backend, prompt, config)
    steps = out.stats.target_forwards
    return {"prompt_tokens": len(prompt), "new_tokens": len(out.token_ids),
            "step_ms": round((out.stats.wall_s - out.stats.prefill_s) / steps * 1e3, 3),
            "capacity": backend.cache.capacity}


def bare_replay_ms(model, shared: StaticModel, context: list[int], repeats: int = 30) -> float:
    """A bare replay of the engine's 16-row graph (no inputs copied, nothing read back): the
    forward alone, launched from its graph."""
    backend = engine_backend(model, shared)
    backend.prefill(context)
    _read(backend.extend(context[:1]))
    replay = backend._graphs[PAD_ROWS].replay
    return _median_ms(replay, repeats, backend.device)


def reference_graph_ms(model, context: list[int], rows: int = PAD_ROWS, repeats: int = 20) -> float:
    """Milliseconds of transformers' own forward of ``rows`` tokens on its StaticCache, eager
    kernels replayed from a captured CUDA graph: the reference of earlier runs, beside the engine."""
    from transformers import StaticCache

    device = model.device
    cache = StaticCache(config=model.config, max_cache_len=len(context) + rows + 8)
    with torch.inference_mode():
        model(torch.tensor([context], device=device), past_key_values=cache,
              position_ids=torch.arange(len(context), device=device)[None], use_cache=True)
    # transformers 5.x's static layers write where a device-side counter says; set it back to the
    # context's end before every forward (inside the graph too), so each forward rewrites the same slots.
    counters = [layer.cumulative_length for layer in getattr(cache, "layers", [])
                if isinstance(getattr(layer, "cumulative_length", None), torch.Tensor)]
    ids = torch.randint(0, model.config.vocab_size, (1, rows), device=device)
    pos = torch.arange(len(context), len(context) + rows, device=device)[None]

    def forward():
        for counter in counters:
            counter.fill_(len(context))
        return model(ids, past_key_values=cache, position_ids=pos, use_cache=True).logits

    with torch.inference_mode():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                forward()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            forward()
        return _median_ms(graph.replay, repeats, device)


def _median_ms(run, repeats: int, device) -> float:
    times = []
    for _ in range(repeats):
        devices.synchronize(str(device))
        t0 = time.perf_counter()
        run()
        devices.synchronize(str(device))
        times.append(time.perf_counter() - t0)
    return round(sorted(times)[len(times) // 2] * 1e3, 3)


def _read(logits: torch.Tensor) -> None:
    float(logits.reshape(-1)[0])  # waits for the device


def self_draft(model, shared: StaticModel, prompts: list[list[int]], new_tokens: int, k: int) -> dict:
    """The model drafting for itself, k tokens a step, against plain decoding, on each prompt: both
    sequences (and the drafter's) on graphs of the one padded shape."""
    config = DecodeConfig(max_new_tokens=new_tokens)
    identical, accepted, drafted, parted_at = 0, 0, 0, []
    for prompt in prompts:
        plain = decode(engine_backend(model, shared), prompt, config)
        spec = decode(engine_backend(model, shared), prompt, config,
                      ModelDrafter(engine_backend(model, shared)), FixedK(k))
        accepted += spec.stats.accepted
        drafted += spec.stats.drafted
        if spec.token_ids == plain.token_ids:
            identical += 1
        else:
            parted_at.append(next(i for i, (a, b) in enumerate(zip(spec.token_ids, plain.token_ids)) if a != b))
    return {"prompts": len(prompts), "new_tokens": new_tokens, "k": k, "identical": identical == len(prompts),
            "identical_rate": identical / len(prompts),
            "acceptance_rate": round(accepted / drafted, 4) if drafted else None, "parted_at": parted_at}


def attention_variant(model, shared: StaticModel, context: list[int], long_prompt: list[int],
                      prompts: list[list[int]], args) -> dict:
    """The plain steps (short and long prompt) and the self-draft check again, the decoding steps
    on another attention (:mod:`specdec.backends.decode_attention`)."""
    out: dict = {"first_capture_s": first_capture_s(model, shared, context), "kernels": compile_state(shared)}
    short = plain_step_ms(model, shared, context[:50], args.tokens)
    long = plain_step_ms(model, shared, long_prompt, args.tokens)
    out["plain_step"] = {"prompt_50": short, f"prompt_{len(long_prompt)}": long}
    out["long_over_short"] = round(long["step_ms"] / short["step_ms"], 3)
    out["graph_replay_16_ms"] = bare_replay_ms(model, shared, context)
    out["step_over_graph_replay_16"] = round(short["step_ms"] / out["graph_replay_16_ms"], 3)
    out["self_draft"] = self_draft(model, shared, prompts, args.tokens, args.k)
    return out


def pair_steps(target, target_shared, draft, draft_shared, context: list[int], tokens: int) -> dict:
    """Milliseconds of the engine's steps for the target drafted by the draft model, k tokens a
    step (FixedK), both on graphs: what drafting k tokens costs and what verifying them costs."""
    out = {}
    for k in PAIR_KS:
        backend = engine_backend(target, target_shared)
        drafter_backend = engine_backend(draft, draft_shared)
        config = DecodeConfig(max_new_tokens=tokens)
        for _ in range(2):  # the first run captures the graphs
            run = decode(backend, context, config, ModelDrafter(drafter_backend), FixedK(k))
        # Steps of a whole draft (the last ones of a run draft less: nothing is drafted past the end).
        whole = [s for s in run.trace if len(s.drafted) == k]
        out[k] = {"draft_ms": round(sum(s.draft_s for s in whole) / len(whole) * 1e3, 3),
                  "verify_ms": round(sum(s.verify_s for s in whole) / len(whole) * 1e3, 3), "steps": len(whole)}
    return out


def pair_speedup(plain_ms: float, steps: dict, acceptance: float) -> dict:
    """Tokens per second of drafting k tokens over plain decoding, from the engine's measured step
    costs: each draft token accepted with probability ``acceptance``, (1 + a + ... + a^k) tokens a
    step that costs its drafting and its verification."""
    by_k = {}
    for k, cost in steps.items():
        made = sum(acceptance ** i for i in range(int(k) + 1))
        by_k[int(k)] = made * plain_ms / (cost["draft_ms"] + cost["verify_ms"])
    best = max(by_k, key=by_k.get)
    return {"acceptance": acceptance, "plain_step_ms": plain_ms, "best_k": best,
            "speedup": round(by_k[best], 3), "speedup_by_k": {k: round(v, 3) for k, v in by_k.items()},
            "note": f"a computation from engine-measured step costs (random weights: nothing accepted, so each step "
                    f"is one draft of k tokens and one verification) and a per-token acceptance of {acceptance} "
                    "(the 1.5B/0.5B pair's greedy agreement on HumanEval, on a CPU), the 7B assumed to agree with "
                    "the 0.5B as the 1.5B does"}


def expected_speedup(target: dict[int, float], draft: dict[int, float], acceptance: float) -> dict:
    """Tokens per second of drafting k tokens with ``draft`` for ``target`` over plain decoding,
    each token accepted with probability ``acceptance``, on cost curves alone: (1 + a + ... + a^k)
    tokens for k draft forwards and one target forward of k + 1 rows. The best k, and the adaptive
    policy's choice on the same curves."""
    curve = CostModel(target)
    by_k = {}
    for k in range(1, max(target) - 1):
        tokens = sum(acceptance ** i for i in range(k + 1))
        by_k[k] = tokens * curve.forward(1) / (k * draft[1] + curve.forward(k + 1))
    best = max(by_k, key=by_k.get)
    policy = AdaptiveK(curve)
    chosen, gain = policy.plan.best(draft[1], acceptance, curve.step)
    return {"acceptance": acceptance, "best_k": best, "best_speedup": round(by_k[best], 3),
            "policy_k": chosen, "policy_speedup": round(by_k.get(chosen, 1.0), 3),
            "speedup_by_k": {k: round(v, 3) for k, v in by_k.items() if k <= 16 or k % 8 == 0}}


def architectures(args, device: str, dtype: torch.dtype, report: dict, save) -> dict:
    """Each architecture through the engine on graphs (see the module's docstring), into
    ``report["architectures"]`` as it goes."""
    archs = ARCHS
    results: dict = {}
    report["architectures"] = results
    kept: dict = {}  # the draft model, kept for the pair
    on_gpu = device.startswith("cuda")
    for name in [n for n in ARCH_NAMES if n in args.archs]:
        t0 = time.perf_counter()
        model = build(archs[name], device, dtype, args.toy)
        shared = StaticModel(model, compile=args.compile, attention=args.attention[0])
        vocab = model.config.vocab_size
        gen = torch.Generator().manual_seed(1)
        context = torch.randint(0, vocab, (200,), generator=gen).tolist()
        entry: dict = {"source": archs[name]["source"],
                       "params_b": round(sum(p.numel() for p in model.parameters()) / 1e9, 3)}
        results[name] = entry

        def step(key: str, run) -> None:
            try:
                entry[key] = run()
            except Exception as error:  # noqa: BLE001 - recorded: one failed measurement must not lose the rest
                entry[f"{key}_error"] = f"{type(error).__name__}: {error}"[:2000]
                print(f"{name} {key}: {entry[f'{key}_error']}", file=sys.stderr, flush=True)
            save()

        step("first_capture_s", lambda: first_capture_s(model, shared, context))
        entry["kernels"] = compile_state(shared)
        step("cost_ms", lambda: {str(n): round(s * 1e3, 3) for n, s in measure_forward_costs(
            engine_backend(model, shared), context, CURVE_SIZES, args.repeats).items()})
        long_prompt = torch.randint(0, vocab, (args.long_prompt,), generator=gen).tolist()
        step("plain_step", lambda: {"prompt_50": plain_step_ms(model, shared, context[:50], args.tokens),
                                    f"prompt_{args.long_prompt}": plain_step_ms(model, shared, long_prompt,
                                                                                args.tokens)})
        step("graph_replay_16_ms", lambda: bare_replay_ms(model, shared, context))
        if on_gpu:
            step("transformers_static_graph_16_ms", lambda: reference_graph_ms(model, context))
        plain = entry.get("plain_step", {})
        if "prompt_50" in plain:
            long_ms = plain[f"prompt_{args.long_prompt}"]["step_ms"]
            entry["long_over_short"] = round(long_ms / plain["prompt_50"]["step_ms"], 3)
            for ref in ("graph_replay_16_ms", "transformers_static_graph_16_ms"):
                if ref in entry:
                    entry[f"step_over_{ref[:-3]}"] = round(plain["prompt_50"]["step_ms"] / entry[ref], 3)
        prompts = [torch.randint(0, vocab, (32,), generator=gen).tolist() for _ in range(args.prompts)]
        if name != TARGET or args.toy:
            step("self_draft", lambda: self_draft(model, shared, prompts, args.tokens, args.k))
        if name == VARIANTS_ON:
            for attention in args.attention[1:]:
                step(f"attention_{attention}", lambda: attention_variant(
                    model, StaticModel(model, compile=args.compile, attention=attention), context, long_prompt,
                    prompts, args))
        if name == DRAFT:
            kept = {"model": model, "shared": shared}
        if name == TARGET and kept:
            step("pair_steps", lambda: pair_steps(model, shared, kept["model"], kept["shared"], context,
                                                  args.pair_tokens))
            if "pair_steps" in entry and "plain_step" in entry:
                report["pair_speedup"] = {f"{TARGET} drafted by {DRAFT}, engine on graphs": pair_speedup(
                    entry["plain_step"]["prompt_50"]["step_ms"], entry["pair_steps"], PAIR_ACCEPTANCE)}
        curve = entry.get("cost_ms")
        if curve:
            entry["rows16_over_1"] = round(curve["16"] / curve["1"], 3)
        entry["seconds"] = round(time.perf_counter() - t0, 1)
        save()
        print(f"{name}: {json.dumps({k: v for k, v in entry.items() if k not in ('source', 'cost_ms')})}", flush=True)
        if name != DRAFT:
            del model, shared
        if on_gpu:
            torch.cuda.empty_cache()
    curves = {n: {int(k): v / 1e3 for k, v in e["cost_ms"].items()} for n, e in results.items() if "cost_ms" in e}
    if TARGET in curves and DRAFT in curves:
        report["expected_speedups"] = {f"{TARGET} drafted by {DRAFT}, engine curves": expected_speedup(
            curves[TARGET], curves[DRAFT], PAIR_ACCEPTANCE)}
    return results


def smollm2(args, device: str, dtype_name: str, t0: float, save, report: dict) -> dict:
    """Spec-Bench on SmolLM2-135M's real weights: ours (plain, n-gram) and transformers' (plain,
    compiled static cache, prompt lookup) on the same GPU, per category."""
    import specdec
    from specdec.bench.questions import load_questions

    models = {}
    for attention in args.attention:  # one copy of the weights per attention (135M: nothing on a GPU)
        os.environ["SPECDEC_ATTENTION"] = attention  # read by the load (specdec.backends.hf_static)
        models[attention] = specdec.load(str(args.smollm2), backend="transformers", device=device,
                                         dtype=dtype_name, graphs=True)
    os.environ.pop("SPECDEC_ATTENTION")
    model = models[args.attention[0]]
    hf, codec = model.loaded.hf_model, model.loaded.codec
    eos = sorted(model.eos_token_ids)
    questions = load_questions("spec-bench", limit=args.offset + args.per_category)
    seen: Counter[str] = Counter()
    ranked = []
    for i, q in enumerate(questions):
        if seen[q.category] >= args.offset:  # the first --offset of each category are left out
            ranked.append((seen[q.category], -i if args.reverse else i, q))
        seen[q.category] += 1
    # Round-robin over the categories, so a run cut short by its budget still has every category.
    questions = [q for *_, q in sorted(ranked, key=lambda t: t[:2])]
    if args.toy:  # the code's every path, not a measurement: two categories
        questions = questions[:2]
    prompts = {q.question_id: codec.encode(q.prompt, True) for q in questions}

    def ours(drafter: str, ids: list[int], attention: str):
        out = models[attention].generate(ids, max_new_tokens=args.smollm2_tokens, drafter=drafter)
        return out.token_ids, out.stats.wall_s

    def theirs(extra: dict, ids: list[int], runs: int = 1):
        x = torch.tensor([ids], device=hf.device)
        for _ in range(runs):  # the static cache compiles for a new shape on its first run: the last is timed
            devices.synchronize(device)
            start = time.perf_counter()
            with torch.inference_mode():
                out = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=args.smollm2_tokens,
                                  do_sample=False, temperature=None, top_p=None, top_k=None, eos_token_id=eos,
                                  pad_token_id=eos[0], **extra)
            devices.synchronize(device)
        return out[0, len(ids):].tolist(), time.perf_counter() - start

    methods = {}
    for attention in args.attention:  # plain, ngram (the first attention); plain/split, ngram/split, ...
        tag = "" if attention == args.attention[0] else f"/{attention}"
        methods[f"plain{tag}"] = functools.partial(ours, "none", attention=attention)
        methods[f"ngram{tag}"] = functools.partial(ours, "ngram", attention=attention)
    first = list(methods) + ["hf-static"]  # every question runs these before the others
    methods |= {"hf-static": lambda ids: theirs({"cache_implementation": "static"}, ids, runs=2),
               "hf-plain": lambda ids: theirs({}, ids),
               "hf-lookup": lambda ids: theirs({"prompt_lookup_num_tokens": 10}, ids)}
    methods = {m: run for m, run in methods.items() if m.split("/")[0] in args.methods}
    # Warm-up on the longest prompt: CUDA start-up, compilation, the cost curve's calibration, and
    # our pooled sequences' caches sized once for every later prompt (a capacity never shrinks).
    warm = max(prompts.values(), key=len)
    for name, run in methods.items():
        started = time.perf_counter()
        run(warm)
        report.setdefault("smollm2_warmup_s", {})[name] = round(time.perf_counter() - started, 1)
        save()
    for attention, loaded in models.items():
        sequence = loaded.loaded.backend()
        report.setdefault("smollm2_engine", {})[attention] = {
            "backend": type(sequence).__name__, "pad_rows": sequence.pad_rows,
            "kernels": compile_state(sequence.shared) if hasattr(sequence, "shared") else "-"}
    rows: dict[str, dict[str, list]] = {}
    results: dict = {"question_ids": [q.question_id for q in questions]}
    report["smollm2_spec_bench"] = results
    # Ours and the compiled static cache over every question first, transformers' eager methods
    # (slow) after: a run cut short by its budget still compares what the issue compares.
    first = [m for m in methods if m in first]
    for group in (first, [m for m in methods if m not in first]):
        for i, q in enumerate(questions):
            if args.budget_s is not None and time.perf_counter() - t0 > args.budget_s:
                results.setdefault("cut_short", []).append(
                    f"{', '.join(group)}: {i} of {len(questions)} questions, the {args.budget_s:.0f} s budget ran out")
                break
            cat = rows.setdefault(q.category, {})
            for name in group:
                cat.setdefault(name, []).append(methods[name](prompts[q.question_id]))
            results.update(summarise(rows))
            save()
            r = results[q.category]
            print(f"smollm2 {q.category} ({time.perf_counter() - t0:.0f} s): {r['tokens_per_s']} "
                  f"ngram identical {r['ngram_identical']}", flush=True)
    return results


# Every server this check started and has not stopped: stopped, with their children, however the
# check ends (a part's failure, the device call's time limit sending SIGTERM, Ctrl-C).
_STARTED: list = []
_STOP_SIGNALS = (15, 2, 1)  # SIGTERM (the device call's time limit), SIGINT, SIGHUP
# A stop signal that came while a server was starting, kept for when it is on the list. Blocking the
# signals is not enough: torch's threads leave them unblocked, the kernel hands the signal to one of
# them, and Python runs the handler in the main thread anywhere, inside Popen too.
_STARTING: list[bool] = []
_PENDING: list[int] = []


def _server(command: list[str], log: Path) -> "subprocess.Popen":
    import subprocess

    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    # A process group of its own: stopping it stops whatever it started too.
    _STARTING.append(True)
    try:
        process = subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                                   start_new_session=True)
        _STARTED.append(process)
    finally:
        _STARTING.clear()
    if _PENDING:
        _stop_all(_PENDING[0])
    return process


def _stop(process, grace_s: float = 30) -> None:
    """Stop ``process`` and its group: SIGTERM, then SIGKILL after ``grace_s`` seconds."""
    import signal

    # Both waits are timed: an untimed wait holds the Popen's lock, and a stop signal's handler
    # waiting on the same process inside it would never get it.
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 30)):
        try:
            os.killpg(process.pid, sig)
        except (ProcessLookupError, PermissionError):
            break
        try:
            process.wait(wait)
            break
        except Exception:  # noqa: BLE001 - it would not stop: killed next
            continue
    if process in _STARTED:
        _STARTED.remove(process)


def _stop_all(*_signal) -> None:
    """Stop every server still running; as a signal handler, then end the check (its report was
    saved after its last step). A signal while a server is starting waits until it is listed."""
    if _signal and _STARTING:
        _PENDING.append(_signal[0])
        return
    for process in list(_STARTED):
        _stop(process, grace_s=5)
    if _signal:
        sys.exit(128 + _signal[0])


def _gpu_memory_mib(pid: int) -> float | None:
    """The GPU memory ``pid`` holds, as nvidia-smi reports it (None where it cannot tell)."""
    import subprocess

    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0] == str(pid):
            return float(parts[1])
    return None


def _batch_stats(url: str) -> dict | None:
    """The server's batch counters (``/health``'s ``batch``: ticks, rows, decode seconds), if any."""
    import httpx

    try:
        return httpx.get(url + "/health", timeout=10).json().get("batch")
    except (httpx.HTTPError, ValueError):
        return None


def serve(args, device: str, dtype_name: str, t0: float, save, report: dict, ours: bool = True,
          peers: bool = True) -> dict:
    """The load test of the GPU server (``ours``) and of transformers' continuous batching
    (``peers``; see the module): two parts, so that other parts can run between them."""
    import asyncio

    sys.path.insert(0, str(ROOT / "scripts"))
    from loadtest import mixed_prompts, run_load, wait_ready

    from specdec.models import resolve

    part_t0 = time.perf_counter()
    results: dict = report.setdefault("serve", {})
    results.update({"levels": args.levels, "requests": args.serve_requests, "max_tokens": args.smollm2_tokens,
                    "slots": args.slots})
    prompts = mixed_prompts(["humaneval", "spec-bench"])
    answers: dict[str, dict[int, dict[int, str]]] = report.setdefault("_answers", {})  # not saved: the texts
    hf_dir = str(resolve(str(args.smollm2)).hf_dir)
    logs = args.out

    def bodies(model: str, count: int, offset: int = 0, **extra) -> list[dict]:
        return [{"model": model, "messages": [{"role": "user", "content": prompts[(offset + i) % len(prompts)]}],
                 "max_tokens": args.smollm2_tokens, "temperature": 0, **extra} for i in range(count)]

    def warm(url: str, model: str, drafters: list[str | None]) -> None:
        """Every level's shape once, untimed, before the timed levels: as many requests as clients
        at that concurrency, with each drafter (first compilations and graph captures happen here)."""
        for clients in args.levels:
            for drafter in drafters:
                extra = {} if drafter is None else {"drafter": drafter}
                asyncio.run(run_load(url, bodies(model, clients, offset=len(prompts) // 2, **extra), clients,
                                     args.level_limit_s, "/v1/chat/completions", stream=True))

    def load(url: str, model: str, server: str, drafters: list[str | None]) -> None:
        """Every level, each drafter in turn (the order swapped at every level), after a warm-up of
        every level's shape."""
        started = time.perf_counter()
        warm(url, model, drafters)
        results.setdefault("warm_up_s", {})[server] = round(time.perf_counter() - started, 1)
        reference: dict[str, dict[int, str]] = {}
        for n, clients in enumerate(args.levels):
            for drafter in drafters if n % 2 == 0 else drafters[::-1]:
                label = server if drafter is None else f"{server}/{drafter}"
                extra = {} if drafter is None else {"drafter": drafter}
                before = _batch_stats(url)
                run = asyncio.run(run_load(url, bodies(model, args.serve_requests, **extra), clients,
                                           args.level_limit_s, "/v1/chat/completions", stream=True))
                after = _batch_stats(url)
                texts = run.texts()
                first = reference.setdefault(label, texts)
                line = {**run.summary(), "differ_from_alone": sum(first[i] != t for i, t in texts.items() if i in first),
                        "compared_with_alone": sum(i in first for i in texts)}
                if before and after and after["ticks"] > before["ticks"]:
                    ticks = after["ticks"] - before["ticks"]
                    line["ticks"] = ticks
                    line["rows_per_tick"] = round((after["rows"] - before["rows"]) / ticks, 2)
                    line["tick_ms"] = round(1e3 * (after["decode_s"] - before["decode_s"]) / ticks, 3)
                results.setdefault(label, {})[str(clients)] = line
                if drafter not in (None, "none") and f"{server}/none" in reference:
                    plain = reference[f"{server}/none"]
                    line["differ_from_none"] = sum(plain.get(i) != t for i, t in texts.items())
                ours_plain = answers.get("specdec/none", {}).get(clients)
                if server != "specdec" and ours_plain:  # a peer's answers against ours, request by request
                    line["differ_from_specdec_none"] = sum(ours_plain.get(i) != t for i, t in texts.items())
                answers.setdefault(label, {})[clients] = texts
                save()
                print(f"serve {label} at {clients} clients ({time.perf_counter() - t0:.0f} s): {json.dumps(line)}",
                      flush=True)
                if time.perf_counter() - part_t0 > args.budget_s_serve:
                    results.setdefault("cut_short", []).append(f"{label} after {clients} clients: the budget ran out")
                    return

    if ours:
        _serve_ours(args, device, dtype_name, results, save, load, bodies)
    if peers and "transformers-cb" in args.serve_peers:
        process = _server([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "hf-cb-server", "--model", hf_dir,
                           "--name", "smollm2", "--port", "8101", "--slots", str(args.slots), "--dtype", dtype_name,
                           "--device", device, "--max-tokens", str(args.smollm2_tokens)]
                          + ([] if device.startswith("cuda") else ["--no-graphs", "--compile-level", "0"]),
                          logs / "transformers-cb.log")
        try:
            started = time.perf_counter()
            model = wait_ready("http://127.0.0.1:8101", timeout=args.ready_s)
            results["transformers_cb_ready_s"] = round(time.perf_counter() - started, 1)
            load("http://127.0.0.1:8101", model, "transformers-cb", [None])
        finally:
            _stop(process)
    for clients in map(str, args.levels):
        theirs = results.get("transformers-cb", {}).get(clients, {})
        for drafter in ("ngram", "none"):
            ours_line = results.get(f"specdec/{drafter}", {}).get(clients, {})
            if ours_line.get("tokens_per_s") and theirs.get("tokens_per_s"):
                results.setdefault(f"{drafter}_over_transformers_cb", {})[clients] = {
                    "tokens_per_s": round(ours_line["tokens_per_s"] / theirs["tokens_per_s"], 3),
                    "p95_latency": round(ours_line["p95_s"] / theirs["p95_s"], 3)}
    return results


def _serve_ours(args, device: str, dtype_name: str, results: dict, save, load, bodies) -> None:
    import asyncio

    from loadtest import run_load, wait_ready

    ours = ["--model", str(args.smollm2), "--backend", "transformers", "--device", device, "--dtype", dtype_name,
            "--slots", str(args.slots), "--max-tokens", str(args.smollm2_tokens)]
    url = "http://127.0.0.1:8100"
    process = _server([sys.executable, "-c", "import sys; from specdec.cli import main; sys.exit(main())", "serve",
                       *ours, "--port", "8100"], args.out / "specdec-serve.log")
    try:
        started = time.perf_counter()
        model = wait_ready(url, timeout=args.ready_s)
        results["specdec_ready_s"] = round(time.perf_counter() - started, 1)
        load(url, model, "specdec", ["ngram", "none"])
        # Memory: after 20 requests, then after 200 (every page back in the pool between them).
        memory = {}
        done = 0
        for total in args.memory_requests:
            asyncio.run(run_load(url, bodies(model, total - done, offset=done), args.slots, 4 * args.level_limit_s,
                                 "/v1/chat/completions", stream=False))
            done = total
            memory[str(total)] = _gpu_memory_mib(process.pid)
            save()
        results["gpu_memory_mib_after_requests"] = memory
        first, last = (str(n) for n in (args.memory_requests[0], args.memory_requests[-1]))
        if memory.get(first) and memory.get(last):
            results[f"memory_{last}_over_{first}"] = round(memory[last] / memory[first], 4)
    finally:
        _stop(process)
    save()


def summarise(rows: dict[str, dict[str, list]]) -> dict:
    """Per category and overall: each method's tokens/s (end to end), the ratios the issue names,
    and whether outputs are identical."""
    def rates(runs: dict[str, list]) -> dict[str, float]:
        return {m: sum(len(t) for t, _ in r) / sum(s for _, s in r) for m, r in runs.items() if r}

    def same(runs, a: str, b: str) -> bool | None:
        if a not in runs or b not in runs:
            return None
        return all(x[0] == y[0] for x, y in zip(runs[a], runs[b]))

    def entry(runs: dict[str, list]) -> dict:
        rate = rates(runs)
        out = {"tokens_per_s": {m: round(v, 1) for m, v in rate.items()},
               "ours_equal_hf_plain": same(runs, "plain", "hf-plain"),
               "ours_equal_hf_static": same(runs, "plain", "hf-static"),
               "hf_lookup_identical": same(runs, "hf-lookup", "hf-plain")}
        ratios = {"hf_lookup_speedup": ("hf-lookup", "hf-plain")}
        for tag in sorted({m[len("plain"):] for m in runs if m.startswith("plain")}):  # "", "/split", ...
            out[f"ngram{tag}_identical"] = same(runs, f"ngram{tag}", f"plain{tag}")
            ratios |= {f"ngram{tag}_speedup": (f"ngram{tag}", f"plain{tag}"),
                       f"plain{tag}_over_hf_static": (f"plain{tag}", "hf-static"),
                       f"ngram{tag}_over_hf_static": (f"ngram{tag}", "hf-static")}
        for name, (a, b) in ratios.items():
            if a in rate and b in rate:
                out[name] = round(rate[a] / rate[b], 3)
        return out

    report = {category: entry(runs) for category, runs in rows.items()}
    every: dict[str, list] = {}
    for runs in rows.values():
        for m, r in runs.items():
            every.setdefault(m, []).extend(r)
    report["overall"] = entry(every)
    return report


# --- the serve part's peer: transformers' continuous batching behind the OpenAI chat API ------------
def hf_cb_app(model, tokenizer, manager, name: str, max_tokens: int = 256):
    """The OpenAI chat API over a started ``ContinuousBatchingManager``: a dispatcher thread takes every
    streamed result off the manager's output queue and hands it to its request."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, StreamingResponse

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


def hf_cb_manager(model, tokenizer, slots: int, graphs: bool, compile_level: int, max_tokens: int,
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


def hf_cb_server(argv: list[str]) -> int:
    """transformers' own continuous batching behind the OpenAI chat API, as the serve part's peer (the
    same load test runs against it): ``init_continuous_batching`` (paged KV cache, one batch of every
    running request a step) with CUDA graphs and its compiled forward, as its documentation recommends
    for speed (``--compile-level``: ``ContinuousBatchingConfig``'s ``default_compile_level``;
    ``--no-graphs`` turns the graphs off); greedy decoding.

        python scripts/gpu_check.py hf-cb-server --model /path/to/hf-folder --port 8101 --slots 16
    """
    parser = argparse.ArgumentParser(prog="gpu_check.py hf-cb-server", description=hf_cb_server.__doc__.splitlines()[0])
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
    manager = hf_cb_manager(model, tokenizer, args.slots, args.graphs and args.device.startswith("cuda"),
                          args.compile_level, args.max_tokens, args.max_batch_tokens)
    app = hf_cb_app(model, tokenizer, manager, args.name or args.model, args.max_tokens)
    try:
        uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")
    finally:
        manager.stop(block=False)
    return 0


def from_gguf(path: Path, name: str) -> dict:
    """A transformers config (as a dict) from a GGUF file's metadata and tensor shapes."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path))

    def field(key: str):
        f = reader.fields[key]
        value = f.parts[f.data[0]]
        return bytes(value).decode() if f.types and f.types[0].name == "STRING" else value.tolist()[0]

    arch = field("general.architecture")
    shapes = {t.name: [int(d) for d in t.shape] for t in reader.tensors}
    vocab = shapes["token_embd.weight"][1]  # GGUF lists dimensions innermost first
    return {
        "model_type": {"qwen2": "qwen2", "llama": "llama"}[arch],
        "vocab_size": vocab,
        "hidden_size": field(f"{arch}.embedding_length"),
        "intermediate_size": field(f"{arch}.feed_forward_length"),
        "num_hidden_layers": field(f"{arch}.block_count"),
        "num_attention_heads": field(f"{arch}.attention.head_count"),
        "num_key_value_heads": field(f"{arch}.attention.head_count_kv"),
        "max_position_embeddings": field(f"{arch}.context_length"),
        # float32 in the file: printed back at float32's precision
        "rope_theta": float(f"{field(f'{arch}.rope.freq_base'):.7g}"),
        "rms_norm_eps": float(f"{field(f'{arch}.attention.layer_norm_rms_epsilon'):.7g}"),
        "tie_word_embeddings": "output.weight" not in shapes,
        "source": f"GGUF metadata of {name} as shipped ({path.stat().st_size:,} bytes)",
    }


def check_archs() -> int:
    """Read the shipped models' configurations from their GGUF files again (fetched on first use) and
    say where :data:`ARCHS` differs from them."""
    from specdec.models import resolve

    differ = 0
    for name in SHIPPED_ARCHS:
        read = from_gguf(Path(resolve(name, None, need_hf=False).gguf), name)
        diff = {k: (ARCHS[name].get(k), v) for k, v in read.items() if k != "source" and ARCHS[name].get(k) != v}
        differ += bool(diff)
        print(f"{name}: " + (f"differs (ARCHS, GGUF): {diff}" if diff else "as in ARCHS"))
    return 1 if differ else 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["hf-cb-server"]:
        return hf_cb_server(argv[1:])
    if argv[:1] == ["--check-archs"]:
        return check_archs()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default=None, help="default: bfloat16 on a GPU, float32 on a CPU")
    parser.add_argument("--toy", action="store_true", help="toy sizes of the same architectures (a CPU test)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=4, help="random prompts of the self-draft check")
    parser.add_argument("--tokens", type=int, default=64, help="new tokens of the self-draft check and plain steps")
    parser.add_argument("--long-prompt", type=int, default=2000, help="tokens of the long prompt of the plain step")
    parser.add_argument("--pair-tokens", type=int, default=32, help="new tokens of each timed run of the pair")
    parser.add_argument("--k", type=int, default=8, help="draft tokens a step in the self-draft check")
    parser.add_argument("--attention", default="paged,sdpa",
                        help="the decoding steps' attention: the first runs everything, the others (comma-separated) "
                             f"the plain steps and self-drafting of {VARIANTS_ON} and ours on SmolLM2")
    parser.add_argument("--no-compile", dest="compile", action="store_false", default=None,
                        help="graphs of eager kernels (default: compiled on a GPU)")
    parser.add_argument("--smollm2", type=Path, default=None, help="SmolLM2-135M's GGUF: the real-weights part")
    parser.add_argument("--per-category", type=int, default=1)
    parser.add_argument("--offset", type=int, default=0, help="leave out the first N questions of each category")
    parser.add_argument("--smollm2-tokens", type=int, default=128)
    parser.add_argument("--methods", default="plain,ngram,hf-static,hf-plain,hf-lookup",
                        help="the SmolLM2 part's methods, in the order each question runs them")
    parser.add_argument("--code", default=None, help="what code this is (scripts/gpu_device.sh prepare records the commit)")
    parser.add_argument("--parts", default="serve,serve-peers,smollm2,arch",
                        help="which parts run, in this order: serve (the GPU server under load), serve-peers "
                             "(transformers' continuous batching under the same load), smollm2 (real weights, "
                             "one request at a time), arch (random-weight architectures)")
    parser.add_argument("--reverse", action="store_true",
                        help="categories in reverse order (a second run reaches first what a cut-short one missed)")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="stop taking new Spec-Bench questions past this many seconds (the report says so)")
    parser.add_argument("--archs", default=",".join(ARCH_NAMES), help="the arch part's architectures")
    parser.add_argument("--memory-requests", default="20,200",
                        help="the serve part's GPU memory is read after this many requests, and after this many")
    parser.add_argument("--levels", default="1,8,16", help="the serve part's concurrency levels")
    parser.add_argument("--slots", type=int, default=16, help="the serve part's slots (both servers)")
    parser.add_argument("--serve-requests", type=int, default=16, help="requests per level of the serve part")
    parser.add_argument("--serve-peers", default="transformers-cb", help="the serve part's peers (or none)")
    parser.add_argument("--ready-s", type=float, default=300.0, help="how long a server may take to answer first")
    parser.add_argument("--level-limit-s", type=float, default=120.0, help="how long one level may take at most")
    parser.add_argument("--budget-s-serve", type=float, default=1e9,
                        help="stop a serve part's levels past this many seconds of it")
    args = parser.parse_args(argv)
    args.methods = [m for m in args.methods.split(",") if m]
    args.attention = [a for a in args.attention.split(",") if a]
    args.levels = [int(c) for c in str(args.levels).split(",") if c]
    args.archs = [a for a in args.archs.split(",") if a]
    args.memory_requests = [int(c) for c in str(args.memory_requests).split(",") if c]
    device = devices.resolve(args.device)
    dtype_name = args.dtype or ("float32" if device == "cpu" else "bfloat16")
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype_name]
    args.out.mkdir(parents=True, exist_ok=True)
    if args.toy:
        args.repeats, args.prompts, args.tokens = min(args.repeats, 2), min(args.prompts, 2), min(args.tokens, 24)
        args.long_prompt, args.pair_tokens = min(args.long_prompt, 300), min(args.pair_tokens, 20)
        # The real-weights parts on a toy model of SmolLM2's architecture, so that they run here too.
        args.levels, args.serve_requests, args.smollm2_tokens = args.levels[:2], min(args.serve_requests, 2), 8
        args.memory_requests, args.slots, args.ready_s = [2, 4], min(args.slots, 2), min(args.ready_s, 120)
        if args.smollm2 is None:
            args.smollm2 = toy_model(args.out / "toy-model")
    import signal

    for sig in _STOP_SIGNALS:
        signal.signal(sig, _stop_all)
    t0 = time.perf_counter()
    compiled = device != "cpu" and args.compile is not False
    report: dict = {"device": devices.device_tag(device), "dtype": dtype_name, "toy": args.toy,
                    "torch": torch.__version__, "python": platform.python_version(),
                    "command": " ".join([Path(sys.argv[0]).name] + (argv or sys.argv[1:])),
                    "date": time.strftime("%Y-%m-%d %H:%M:%S"), "code": args.code or "not recorded",
                    "engine": ("static KV cache, every decoding forward replayed from a captured CUDA graph, "
                               + ("kernels compiled by torch.compile" if compiled else "eager kernels"))
                    if device != "cpu" else "static KV cache, forwards called directly (no CUDA on this device)"}
    try:
        import transformers

        report["transformers"] = transformers.__version__
    except ImportError:
        pass
    out = args.out / "report.json"

    def save() -> None:  # after every step: a run cut short by its time limit still leaves what it measured
        report["seconds"] = round(time.perf_counter() - t0, 1)
        out.write_text(json.dumps({k: v for k, v in report.items() if not k.startswith("_")}, indent=1) + "\n")

    def part(key: str, run) -> bool:
        """Run one part; a part that fails must not lose the others' minutes."""
        try:
            run()
            return True
        except Exception:  # noqa: BLE001 - recorded in the report and on stderr
            report[f"{key}_error"] = traceback.format_exc()
            print(report[f"{key}_error"], file=sys.stderr, flush=True)
            return False
        finally:
            save()

    ok = True
    runs = {"arch": ("architectures", lambda: architectures(args, device, dtype, report, save)),
            "serve": ("serve", lambda: serve(args, device, dtype_name, t0, save, report, peers=False)),
            "serve-peers": ("serve_peers", lambda: serve(args, device, dtype_name, t0, save, report, ours=False)),
            "smollm2": ("smollm2_spec_bench", lambda: smollm2(args, device, dtype_name, t0, save, report))}
    for name in args.parts.split(","):  # in the order given
        if name not in runs:
            parser.error(f"no part {name!r}: use {', '.join(runs)}")
        if name != "arch" and args.smollm2 is None:
            continue
        ok &= part(*runs[name])
    _stop_all()
    save()
    print(f"wrote {out} in {report['seconds']} s")
    return 0 if ok else 1


def toy_model(path: Path) -> Path:
    """A transformers folder at toy size (SmolLM2's architecture, a small byte-level tokenizer with
    a chat template, random weights): what ``--toy`` runs the real-weights parts on."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from specdec.bench.questions import load_questions

    corpus = [q.prompt[:400] for q in load_questions("spec-bench", limit=1)]
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(corpus, vocab_size=400, min_frequency=1, special_tokens=["<pad>", "<s>", "</s>"],
                            show_progress=False)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    tok.chat_template = ("{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                         "{% if add_generation_prompt %}<s>assistant:{% endif %}")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                         tie_word_embeddings=True)
    LlamaForCausalLM(config).save_pretrained(path)
    tok.save_pretrained(path)
    return path


if __name__ == "__main__":
    sys.exit(main())
