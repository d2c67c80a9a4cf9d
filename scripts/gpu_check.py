"""The GPU check: specdec on one CUDA GPU, in minutes, with what that machine has (PyTorch and
transformers; no network). Writes OUT/report.json and prints a summary.

1. Architectures with random weights, built on the device from the shipped models' configurations
   (scripts/gpu_archs.json: Qwen2.5-Coder 1.5B and 0.5B from their GGUF metadata, the 7B from its
   published config): each one's cost curve (seconds of a forward of n new tokens, plain shapes and
   padded to one shape as exact runs them), and the exactness check: the model drafting for itself
   must accept every token and give plain decoding's output (random weights give near-uniform
   logits, the hardest case). Unpadded, the share of identical outputs and the top-2 logit margin
   where they part are reported.
2. The expected speed-up of a target drafted by a smaller model (the Qwen pair, and the 7B drafted
   by the 0.5B), *computed* from the measured curves and a per-token acceptance measured elsewhere,
   beside the adaptive policy's choice of draft length on those curves. A computation, not a run.
3. With ``--smollm2 GGUF`` (SmolLM2-135M's real weights): Spec-Bench, per category, our plain
   decoding and n-gram drafter against transformers' plain ``generate`` and its prompt lookup on the
   same GPU, the outputs compared.

    python scripts/gpu_check.py --device cuda --smollm2 /path/SmolLM2-135M-Instruct.Q4_1.gguf --out OUT
    python scripts/gpu_check.py --device cpu --toy --out OUT     # the same code at toy size (the tests)
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import traceback
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # runs from a copied working tree, specdec not installed

import torch  # noqa: E402

from specdec import devices  # noqa: E402
from specdec.backends.hf import PAD_ROWS, HFBackend  # noqa: E402
from specdec.costs import CALIBRATION_SIZES, CostModel, measure_forward_costs  # noqa: E402
from specdec.drafters.model import ModelDrafter  # noqa: E402
from specdec.engine import DecodeConfig, decode  # noqa: E402
from specdec.policies.adaptive import AdaptiveK  # noqa: E402
from specdec.policies.fixed import FixedK  # noqa: E402

ARCHS = Path(__file__).with_name("gpu_archs.json")
ARCH_NAMES = ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "qwen2.5-coder-7b")
# Per-token acceptance of the 0.5B drafting for the 1.5B: their greedy agreement on HumanEval,
# measured on the CPU with llama.cpp (../shared/MODELS.md; bench-results/qwen-humaneval).
PAIR_ACCEPTANCE = 0.979
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


def cost_curve(model, pad: int, sizes, context: list[int], repeats: int) -> dict[int, float]:
    backend = HFBackend(model, pad)
    measure_forward_costs(backend, context, sizes, 1)  # warm-up: kernels chosen, memory allocated
    return measure_forward_costs(backend, context, sizes, repeats)


GRAPH_SIZES = (1, 2, 4, 8, 16, 32, 64)


def graphed_curve(model, context: list[int], sizes=GRAPH_SIZES, repeats: int = 20) -> dict:
    """Milliseconds of a forward of n new tokens after ``context`` on a static KV cache, eager and
    replayed from a captured CUDA graph (launch overhead gone), median of ``repeats``. A measurement
    beside the engine, which runs eager: it shows what graphs would give the curve and the pair."""
    from transformers import StaticCache

    device = model.device
    cache = StaticCache(config=model.config, max_cache_len=len(context) + max(sizes) + 8)
    with torch.inference_mode():
        model(torch.tensor([context], device=device), past_key_values=cache,
              position_ids=torch.arange(len(context), device=device)[None], use_cache=True)
    # transformers 5.x's static layers write where a device-side counter says; set it back to the
    # context's end before every forward (inside the graph too), so each forward rewrites the same slots.
    counters = [layer.cumulative_length for layer in getattr(cache, "layers", [])
                if isinstance(getattr(layer, "cumulative_length", None), torch.Tensor)]
    result: dict = {"eager_ms": {}, "graph_ms": {}}
    for n in sizes:
        ids = torch.randint(0, model.config.vocab_size, (1, n), device=device)
        pos = torch.arange(len(context), len(context) + n, device=device)[None]

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
            result["eager_ms"][str(n)] = _median_ms(forward, repeats)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                forward()
            result["graph_ms"][str(n)] = _median_ms(graph.replay, repeats)
        del graph
    result["graph_rows16_over_1"] = round(result["graph_ms"]["16"] / result["graph_ms"]["1"], 3)
    return result


def _median_ms(run, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        run()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return round(sorted(times)[len(times) // 2] * 1e3, 3)


def top2_margin(model, pad: int, ids: list[int]) -> float:
    """The gap between the best two logits after ``ids`` (how near a tie the parting token was)."""
    backend = HFBackend(model, pad)
    backend.prefill(ids[:-1])
    top = backend.extend(ids[-1:])[-1].float().topk(2).values
    return float(top[0] - top[1])


def self_draft(model, pad: int, prompts: list[list[int]], new_tokens: int, k: int) -> dict:
    """The model drafting for itself, k tokens a step, against plain decoding, on each prompt."""
    config = DecodeConfig(max_new_tokens=new_tokens)
    identical, accepted, drafted, margins, parted_at = 0, 0, 0, [], []
    for prompt in prompts:
        plain = decode(HFBackend(model, pad), prompt, config)
        spec = decode(HFBackend(model, pad), prompt, config, ModelDrafter(HFBackend(model, pad)), FixedK(k))
        accepted += spec.stats.accepted
        drafted += spec.stats.drafted
        if spec.token_ids == plain.token_ids:
            identical += 1
            continue
        at = next(i for i, (a, b) in enumerate(zip(spec.token_ids, plain.token_ids)) if a != b)
        parted_at.append(at)
        margins.append(top2_margin(model, pad, prompt + plain.token_ids[:at]))
    return {"prompts": len(prompts), "new_tokens": new_tokens, "k": k, "identical": identical == len(prompts),
            "identical_rate": identical / len(prompts),
            "acceptance_rate": round(accepted / drafted, 4) if drafted else None,
            "parted_at": parted_at, "top2_margins_where_parted": margins}


def expected_speedup(target: dict[int, float], draft: dict[int, float], acceptance: float) -> dict:
    """Tokens per second of drafting k tokens with ``draft`` for ``target`` over plain decoding,
    each token accepted with probability ``acceptance``: (1 + a + ... + a^k) tokens for k draft
    forwards and one target forward of k + 1 rows. The best k, and the adaptive policy's choice on
    the same curves."""
    curve = CostModel(target)
    by_k = {}
    for k in range(1, max(target) - 1):
        tokens = sum(acceptance ** i for i in range(k + 1))
        by_k[k] = tokens * curve.forward(1) / (k * draft[1] + curve.forward(k + 1))
    best = max(by_k, key=by_k.get)
    policy = AdaptiveK(curve)
    chosen, gain = policy._plan(draft[1], acceptance)
    return {"acceptance": acceptance, "best_k": best, "best_speedup": round(by_k[best], 3),
            "policy_k": chosen, "policy_speedup": round(by_k.get(chosen, 1.0), 3),
            "speedup_by_k": {k: round(v, 3) for k, v in by_k.items() if k <= 16 or k % 8 == 0}}


def graphs(args, device: str, dtype: torch.dtype) -> dict:
    """Each architecture's curve eager and from captured CUDA graphs (its own process in the device
    script: a capture that fails can leave the CUDA context unusable), and the expected speed-ups on
    the graphed curves."""
    archs = json.loads(ARCHS.read_text())
    report: dict = {}
    for name in ARCH_NAMES:
        model = build(archs[name], device, dtype, args.toy)
        context = torch.randint(0, model.config.vocab_size, (200,), generator=torch.Generator().manual_seed(1)).tolist()
        try:
            report[name] = graphed_curve(model, context)
        except Exception as error:  # noqa: BLE001 - recorded: the reason graphs do not run here
            report[name] = {"error": f"{type(error).__name__}: {error}"[:2000]}
        print(f"{name} graphs: {report[name]}", flush=True)
        del model
        torch.cuda.empty_cache()
    report["expected_speedups"] = graphed_speedups(report)
    return report


def graphed_speedups(archs: dict) -> dict:
    """The pairs' expected speed-up computed on the CUDA-graph curves (where they were measured): what
    drafting would give with launch overhead gone."""
    curves = {}
    for name, entry in archs.items():
        graph = entry.get("graph_ms") if isinstance(entry, dict) else None
        if graph:
            curves[name] = {int(n): ms / 1e3 for n, ms in graph.items()}
    # Sizes between the measured ones: CostModel interpolates its curve linearly.
    return {f"{target} drafted by 0.5b, CUDA graphs": expected_speedup(
                curves[target], curves["qwen2.5-coder-0.5b"], PAIR_ACCEPTANCE)
            for target in ("qwen2.5-coder-1.5b", "qwen2.5-coder-7b")
            if target in curves and "qwen2.5-coder-0.5b" in curves}


def architectures(args, device: str, dtype: torch.dtype) -> tuple[dict, dict]:
    archs = json.loads(ARCHS.read_text())
    sizes = CALIBRATION_SIZES if not args.toy else (1, 2, 4, 8, 16, 17, 32)
    report, curves = {}, {}
    for name in ARCH_NAMES:
        t0 = time.perf_counter()
        model = build(archs[name], device, dtype, args.toy)
        vocab = model.config.vocab_size
        gen = torch.Generator().manual_seed(1)
        context = torch.randint(0, vocab, (200,), generator=gen).tolist()
        fast = cost_curve(model, 0, sizes, context, args.repeats)
        padded = cost_curve(model, PAD_ROWS, sizes, context, args.repeats)
        curves[name] = padded
        entry = {"source": archs[name]["source"], "params_b": round(sum(p.numel() for p in model.parameters()) / 1e9, 3),
                 "cost_ms": {str(n): round(s * 1e3, 3) for n, s in padded.items()},
                 "cost_ms_unpadded": {str(n): round(s * 1e3, 3) for n, s in fast.items()},
                 "rows16_over_1": round(padded[16] / fast[1], 3),
                 "rows16_over_1_unpadded": round(fast[16] / fast[1], 3)}
        if name != "qwen2.5-coder-7b" or args.toy:  # the 7B is here for its cost curve
            prompts = [torch.randint(0, vocab, (32,), generator=gen).tolist() for _ in range(args.prompts)]
            entry["self_draft"] = self_draft(model, PAD_ROWS, prompts, args.tokens, args.k)
            entry["self_draft_unpadded"] = self_draft(model, 0, prompts, args.tokens, args.k)
        entry["seconds"] = round(time.perf_counter() - t0, 1)
        report[name] = entry
        print(f"{name}: 1 row {entry['cost_ms']['1']} ms (unpadded {entry['cost_ms_unpadded']['1']}), "
              f"16 rows {entry['rows16_over_1']}x one; self-draft "
              f"{entry.get('self_draft', {}).get('identical', '-')}", flush=True)
        del model
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    return report, curves


def smollm2(args, device: str, dtype_name: str, t0: float, save, report: dict) -> dict:
    """Spec-Bench on SmolLM2-135M's real weights: ours (plain, n-gram) and transformers' (plain,
    prompt lookup) on the same GPU, per category."""
    import specdec
    from specdec.bench.questions import load_questions

    model = specdec.load(str(args.smollm2), backend="transformers", device=device, dtype=dtype_name)
    hf, codec = model.loaded.hf_model, model.loaded.codec
    eos = sorted(model.eos_token_ids)
    questions = load_questions("spec-bench", limit=args.per_category)
    # Round-robin over the categories, so a run cut short by its budget still has every category.
    seen: Counter[str] = Counter()
    ranked = []
    for i, q in enumerate(questions):
        ranked.append((seen[q.category], -i if args.reverse else i, q))
        seen[q.category] += 1
    questions = [q for *_, q in sorted(ranked, key=lambda t: t[:2])]

    def ours(drafter: str, ids: list[int]):
        out = model.generate(ids, max_new_tokens=args.smollm2_tokens, drafter=drafter)
        return out.token_ids, out.stats.wall_s

    def theirs(extra: dict, ids: list[int]):
        x = torch.tensor([ids], device=hf.device)
        devices.synchronize(device)
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=args.smollm2_tokens,
                              do_sample=False, temperature=None, top_p=None, top_k=None, eos_token_id=eos,
                              pad_token_id=eos[0], **extra)
        devices.synchronize(device)
        return out[0, len(ids):].tolist(), time.perf_counter() - t0

    methods = {"plain": lambda ids: ours("none", ids), "ngram": lambda ids: ours("ngram", ids),
               "hf-plain": lambda ids: theirs({}, ids),
               "hf-lookup": lambda ids: theirs({"prompt_lookup_num_tokens": 10}, ids)}
    warm = codec.encode(questions[0].prompt, True)
    for run in methods.values():  # CUDA start-up, the cost curve's calibration
        run(warm)
    rows: dict[str, dict[str, list]] = {}
    results: dict = {}
    report["smollm2_spec_bench"] = results
    for i, q in enumerate(questions):
        if args.budget_s is not None and time.perf_counter() - t0 > args.budget_s:
            results["cut_short"] = f"{i} of {len(questions)} questions: the {args.budget_s:.0f} s budget ran out"
            break
        ids = codec.encode(q.prompt, True)
        cat = rows.setdefault(q.category, {m: [] for m in methods})
        for name, run in methods.items():
            cat[name].append(run(ids))
        results.update(summarise(rows))
        save()
        r = results[q.category]
        print(f"smollm2 {q.category} ({time.perf_counter() - t0:.0f} s): ngram {r['ngram_speedup']}x "
              f"(identical {r['ngram_identical']}), hf-lookup {r['hf_lookup_speedup']}x", flush=True)
    return results


def summarise(rows: dict[str, dict[str, list]]) -> dict:
    """Per category: each method's tokens/s, the two speed-ups, and whether outputs are identical."""
    report = {}
    for category, runs in rows.items():
        rate = {m: sum(len(t) for t, _ in r) / sum(s for _, s in r) for m, r in runs.items()}
        report[category] = {
            "tokens_per_s": {m: round(v, 1) for m, v in rate.items()},
            "ngram_speedup": round(rate["ngram"] / rate["plain"], 3),
            "hf_lookup_speedup": round(rate["hf-lookup"] / rate["hf-plain"], 3),
            "ngram_identical": all(a[0] == b[0] for a, b in zip(runs["ngram"], runs["plain"])),
            "hf_lookup_identical": all(a[0] == b[0] for a, b in zip(runs["hf-lookup"], runs["hf-plain"])),
            "ours_equal_hf_plain": all(a[0] == b[0] for a, b in zip(runs["plain"], runs["hf-plain"])),
        }
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default=None, help="default: bfloat16 on a GPU, float32 on a CPU")
    parser.add_argument("--toy", action="store_true", help="toy sizes of the same architectures (a CPU test)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=4, help="random prompts of the self-draft check")
    parser.add_argument("--tokens", type=int, default=64, help="new tokens of the self-draft check")
    parser.add_argument("--k", type=int, default=8, help="draft tokens a step in the self-draft check")
    parser.add_argument("--smollm2", type=Path, default=None, help="SmolLM2-135M's GGUF: the real-weights part")
    parser.add_argument("--per-category", type=int, default=2)
    parser.add_argument("--smollm2-tokens", type=int, default=128)
    parser.add_argument("--parts", default="arch,smollm2",
                        help="which parts run: arch (random-weight architectures), graphs (their curves from CUDA graphs, "
                             "a GPU only), smollm2 (real weights)")
    parser.add_argument("--reverse", action="store_true",
                        help="categories in reverse order (a second run reaches first what a cut-short one missed)")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="stop taking new Spec-Bench questions past this many seconds (the report says so)")
    args = parser.parse_args(argv)
    device = devices.resolve(args.device)
    dtype_name = args.dtype or ("float32" if device == "cpu" else "bfloat16")
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype_name]
    if args.toy:
        args.repeats, args.prompts, args.tokens = min(args.repeats, 2), min(args.prompts, 2), min(args.tokens, 24)
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    report: dict = {"device": devices.device_tag(device), "dtype": dtype_name, "toy": args.toy,
                    "torch": torch.__version__, "python": platform.python_version(),
                    "command": " ".join([Path(sys.argv[0]).name] + (argv or sys.argv[1:])),
                    "date": time.strftime("%Y-%m-%d %H:%M:%S"), "graphs": "eager (no CUDA graphs, no torch.compile)"}
    try:
        import transformers

        report["transformers"] = transformers.__version__
    except ImportError:
        pass
    out = args.out / "report.json"

    def save() -> None:  # after every part: a run cut short by its time limit still leaves what it measured
        report["seconds"] = round(time.perf_counter() - t0, 1)
        out.write_text(json.dumps(report, indent=1) + "\n")

    def part(key: str, run) -> bool:
        """Run one part into report[key]; a part that fails must not lose the others' minutes."""
        try:
            report[key] = run()
            return True
        except Exception:  # noqa: BLE001 - recorded in the report and on stderr
            report[f"{key}_error"] = traceback.format_exc()
            print(report[f"{key}_error"], file=sys.stderr, flush=True)
            return False
        finally:
            save()

    def arch() -> dict:
        archs, curves = architectures(args, device, dtype)
        report["expected_speedups"] = {
            "qwen2.5-coder-1.5b drafted by 0.5b": expected_speedup(
                curves["qwen2.5-coder-1.5b"], curves["qwen2.5-coder-0.5b"], PAIR_ACCEPTANCE),
            "qwen2.5-coder-7b drafted by 0.5b": expected_speedup(
                curves["qwen2.5-coder-7b"], curves["qwen2.5-coder-0.5b"], PAIR_ACCEPTANCE),
            "note": f"a computation from the measured cost curves (padded, as exact runs) and a per-token "
                    f"acceptance of {PAIR_ACCEPTANCE} (the pair's greedy agreement on HumanEval, on a CPU); "
                    "the 7B assumed to agree with the 0.5B as the 1.5B does",
        }
        return archs

    ok = True
    if "arch" in args.parts:
        ok &= part("architectures", arch)
    if "graphs" in args.parts:
        ok &= part("cuda_graphs", lambda: graphs(args, device, dtype))
    if "smollm2" in args.parts and args.smollm2 is not None:
        ok &= part("smollm2_spec_bench", lambda: smollm2(args, device, dtype_name, t0, save, report))
    save()
    print(f"wrote {out} in {report['seconds']} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
