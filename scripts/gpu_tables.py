"""Markdown tables from the GPU check's reports (``bench-results/gpu-check/*.json``), for the docs and
for the folder's own README: generated, never copied by hand.

    python scripts/gpu_tables.py                  # print every table
    python scripts/gpu_tables.py --write          # bench-results/gpu-check/README.md from the reports

The docs build renders ``<!-- gpu: TABLE -->`` markers with :func:`table` (``scripts/docs_hooks.py``);
a test checks that the committed README is what the reports give.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDER = ROOT / "bench-results" / "gpu-check"
SHORT = {"qwen2.5-coder-1.5b": "1.5B", "qwen2.5-coder-0.5b": "0.5B", "qwen2.5-coder-7b": "7B"}


def _load(name: str, folder: Path = FOLDER) -> dict:
    return json.loads((folder / f"{name}.json").read_text(encoding="utf-8"))


def _n(value, digits: int = 2, suffix: str = "") -> str:
    return "-" if value is None else f"{value:.{digits}f}{suffix}"


def _machine(report: dict, engine: str | None = None) -> str:
    return (f"{report['device'].replace('_', ' ')}, PyTorch {report['torch']}, transformers "
            f"{report.get('transformers', '?')}, {report['dtype']}, {report['date'][:10]}; engine: "
            f"{engine or report['engine']}; code: {report.get('code', 'not recorded')}")


def architectures(folder: Path = FOLDER) -> str:
    """Per random-weight architecture: the engine's plain step, its graph alone, transformers' own
    forward captured the same way, the cost curve, exactness."""
    report = _load("architectures", folder)
    rows = ["| architecture (random weights) | params | compile + first capture | engine step, 50-token prompt | "
            "after a 2,000-token prompt | long / short | its graph alone (16 rows) | step / graph | "
            "transformers' forward in a graph (16 rows, eager kernels) | curve: 1 / 16 / 17 / 64 rows | "
            "self-drafting: identical, accepted |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for name, e in report["architectures"].items():
        step = e.get("plain_step", {})
        long = next((v for k, v in step.items() if k != "prompt_50"), {})
        curve = e.get("cost_ms", {})
        draft = e.get("self_draft")
        exact = f"{draft['identical_rate']:.0%}, {draft['acceptance_rate']:.0%}" if draft else "-"
        rows.append(f"| {SHORT.get(name, name)} | {e['params_b']:.2f} B | {_n(e.get('first_capture_s'), 1, ' s')} | "
                    f"{_n(step.get('prompt_50', {}).get('step_ms'), suffix=' ms')} | "
                    f"{_n(long.get('step_ms'), suffix=' ms')} | {_n(e.get('long_over_short'), suffix='x')} | "
                    f"{_n(e.get('graph_replay_16_ms'), suffix=' ms')} | {_n(e.get('step_over_graph_replay_16'), suffix='x')} | "
                    f"{_n(e.get('transformers_static_graph_16_ms'), suffix=' ms')} | "
                    f"{' / '.join(_n(curve.get(k)) for k in ('1', '16', '17', '64'))} ms | {exact} |")
    variants = [(name, key[len("attention_"):], v) for name, e in report["architectures"].items()
                for key, v in e.items() if key.startswith("attention_") and isinstance(v, dict)]
    out = f"{_machine(report)}. Command: `{report['command']}`.\n\n" + "\n".join(rows) + "\n"
    if variants:
        out += ("\nThe same steps with the decoding steps' attention split into chunks "
                "(`SPECDEC_ATTENTION=split`, `specdec.backends.decode_attention`):\n\n"
                "| architecture | attention | engine step, 50-token prompt | after a 2,000-token prompt | long / short | "
                "step / graph | self-drafting: identical, accepted |\n|---|---|---:|---:|---:|---:|---|\n")
        for name, attention, v in variants:
            step = v["plain_step"]
            long = next(x for k, x in step.items() if k != "prompt_50")
            draft = v["self_draft"]
            out += (f"| {SHORT.get(name, name)} | {attention} | {_n(step['prompt_50']['step_ms'], suffix=' ms')} | "
                    f"{_n(long['step_ms'], suffix=' ms')} | {_n(v['long_over_short'], suffix='x')} | "
                    f"{_n(v['step_over_graph_replay_16'], suffix='x')} | "
                    f"{draft['identical_rate']:.0%}, {draft['acceptance_rate']:.0%} |\n")
    return out


def pair(folder: Path = FOLDER) -> str:
    """The 7B drafted by the 0.5B: the engine's measured step costs and the speed-up computed from them."""
    report = _load("architectures", folder)
    steps = report["architectures"]["qwen2.5-coder-7b"].get("pair_steps", {})
    computed = next(iter(report.get("pair_speedup", {}).values()), None)
    if not steps or computed is None:
        return "No pair was measured in this report.\n"
    rows = ["| draft tokens k | drafting k tokens (0.5B) | verifying k + 1 (7B) | computed speed-up |",
            "|---:|---:|---:|---:|"]
    for k, cost in steps.items():
        rows.append(f"| {k} | {_n(cost['draft_ms'])} ms | {_n(cost['verify_ms'])} ms | "
                    f"{_n(computed['speedup_by_k'][str(k)], suffix='x')} |")
    return (f"Plain decoding step of the 7B: {_n(computed['plain_step_ms'])} ms; per-token acceptance "
            f"{computed['acceptance']} (a computation, not a run: {computed['note']}).\n\n" + "\n".join(rows) + "\n")


def smollm2(folder: Path = FOLDER) -> str:
    """SmolLM2-135M on Spec-Bench: tokens/s of every method per category, the ratios, identical outputs."""
    report = _load("smollm2", folder)
    results = report["smollm2_spec_bench"]
    categories = [c for c in results if isinstance(results[c], dict) and "tokens_per_s" in results[c]]
    methods = list(results["overall"]["tokens_per_s"])
    tags = sorted({m[len("plain"):] for m in methods if m.startswith("plain")})
    head = ["category", *methods, *(f"ngram{t} / hf-static" for t in tags), *(f"ngram{t} identical" for t in tags)]
    rows = ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]
    for category in [c for c in categories if c != "overall"] + ["overall"]:
        r = results[category]
        cells = [f"**{category}**" if category == "overall" else category]
        cells += [_n(r["tokens_per_s"].get(m), 1) for m in methods]
        cells += [_n(r.get(f"ngram{t}_over_hf_static"), suffix="x") for t in tags]
        cells += ["yes" if r.get(f"ngram{t}_identical") else "no" for t in tags]
        rows.append("| " + " | ".join(cells) + " |")
    overall = results["overall"]
    ratios = ", ".join(f"`{k}` {v}x" for k, v in overall.items() if k.endswith(("over_hf_static", "speedup")))
    return (f"{_machine(report)}; {len(results.get('question_ids', []))} questions, "
            f"{report['command'].split('--smollm2-tokens')[-1].split()[0] if '--smollm2-tokens' in report['command'] else 128} "
            f"new tokens each, tokens/s end to end (prompt included). Command: `{report['command']}`.\n\n"
            + "\n".join(rows) + f"\n\nOverall: {ratios}.\n")


def paged(folder: Path = FOLDER) -> str:
    """The 1.5B architecture's plain step with the paged attention (:mod:`specdec.backends.paged_attention`):
    a step after a long prompt against one after a short one."""
    report = _load("arch-paged", folder)
    rows = ["| architecture (random weights) | attention | compile + first capture | engine step, 50-token prompt | "
            "after a 2,000-token prompt | long / short | its graph alone (16 rows) | self-drafting: identical, accepted |",
            "|---|---|---:|---:|---:|---:|---:|---|"]
    for name, e in report["architectures"].items():
        step = e.get("plain_step", {})
        long = next((v for k, v in step.items() if k != "prompt_50"), {})
        draft = e.get("self_draft")
        exact = f"{draft['identical_rate']:.0%}, {draft['acceptance_rate']:.0%}" if draft else "-"
        rows.append(f"| {SHORT.get(name, name)} | paged | {_n(e.get('first_capture_s'), 1, ' s')} | "
                    f"{_n(step.get('prompt_50', {}).get('step_ms'), suffix=' ms')} | "
                    f"{_n(long.get('step_ms'), suffix=' ms')} | {_n(e.get('long_over_short'), suffix='x')} | "
                    f"{_n(e.get('graph_replay_16_ms'), suffix=' ms')} | {exact} |")
    return f"{_machine(report)}. Command: `{report['command']}`.\n\n" + "\n".join(rows) + "\n"


def serve(folder: Path = FOLDER) -> str:
    """The GPU server under load: tokens/s and p95 latency per concurrency level, with and without
    drafting, against transformers' continuous batching; answers against each request alone; memory."""
    report = _load("serve", folder)
    s = report["serve"]
    servers = [k for k in ("specdec/ngram", "specdec/none", "transformers-cb") if k in s]
    head = ["clients"] + [f"{name} {what}" for name in servers for what in ("tokens/s", "p95 latency")]
    head += ["ngram / none", "answers differing from alone", "rows per tick (ngram / none)"]
    rows = ["| " + " | ".join(head) + " |", "|---:" + "|---:" * (len(head) - 2) + "|---|"]
    for level in map(str, s["levels"]):
        cells = [level]
        for name in servers:
            line = s[name].get(level, {})
            cells += [_n(line.get("tokens_per_s"), 1), _n(line.get("p95_s"), 2, " s")]
        ours, plain = s.get("specdec/ngram", {}).get(level, {}), s.get("specdec/none", {}).get(level, {})
        ratio = ours.get("tokens_per_s") / plain["tokens_per_s"] if ours.get("tokens_per_s") and plain.get(
            "tokens_per_s") else None
        differ = sum(s[name].get(level, {}).get("differ_from_alone", 0) for name in servers if name.startswith("specdec"))
        cells += [_n(ratio, suffix="x"), str(differ),
                  f"{_n(ours.get('rows_per_tick'), 1)} / {_n(plain.get('rows_per_tick'), 1)}"]
        rows.append("| " + " | ".join(cells) + " |")
    memory = s.get("gpu_memory_mib_after_requests", {})
    notes = []
    if memory:
        first, last = sorted(memory, key=int)[0], sorted(memory, key=int)[-1]
        notes.append(f"GPU memory of the server (nvidia-smi) after {first} requests {_n(memory[first], 0)} MiB, "
                     f"after {last} {_n(memory[last], 0)} MiB ({_n(memory[last] / memory[first], 3)}x).")
    if "transformers-cb" not in s:
        notes.append("transformers' continuous batching: not measured in this run (its warm-up ran out of memory "
                     "with its default KV sizing; scripts/gpu_check.py hf-cb-server now sizes it).")
    for cut in s.get("cut_short", []):  # levels the part's time budget left out are "-" above, said here
        ready = s.get("transformers_cb_ready_s") if cut.startswith("transformers-cb") else None
        notes.append(f"Cut short: {cut}" + (f" (its server took {_n(ready, 0)} s to start)." if ready else "."))
    engine = ("every running request's rows in one padded forward a tick, replayed from a CUDA graph, over a "
              "paged KV pool, kernels compiled by torch.compile")
    return (f"{_machine(report, engine)}; SmolLM2-135M, {s['slots']} slots, {s['requests']} chat requests a level "
            f"(HumanEval problems and Spec-Bench questions), {s['max_tokens']} new tokens, greedy, streamed. "
            f"Command: `{report['command']}`.\n\n" + "\n".join(rows) + "\n\n" + " ".join(notes) + "\n")


TABLES = {"architectures": architectures, "pair": pair, "smollm2": smollm2, "paged": paged, "serve": serve}


def table(name: str, folder: Path = FOLDER) -> str:
    if name not in TABLES:
        raise ValueError(f"no GPU table {name!r}: use one of {', '.join(TABLES)}")
    return TABLES[name](folder)


def readme(folder: Path = FOLDER) -> str:
    """The folder's README: what it holds, and every table."""
    return ("# The GPU check\n\nGenerated by `python scripts/gpu_tables.py --write` from the reports in this folder "
            "(`architectures.json`, `smollm2.json`, `arch-paged.json`, `serve.json`; the logs of the last two "
            "beside them). The commands are in [DEVELOPERS.md](../../DEVELOPERS.md) (the GPU check); the same tables "
            "are in [docs/reference/results.md](../../docs/reference/results.md).\n\n"
            "## The engine on random-weight architectures\n\n" + architectures(folder) +
            "\n## A 7B target drafted by the 0.5B\n\n" + pair(folder) +
            "\n## SmolLM2-135M on Spec-Bench\n\n" + smollm2(folder) +
            "\n## The 1.5B architecture with paged attention\n\n" + paged(folder) +
            "\n## The GPU server under load\n\n" + serve(folder))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="write bench-results/gpu-check/README.md")
    parser.add_argument("--folder", type=Path, default=FOLDER)
    args = parser.parse_args(argv)
    text = readme(args.folder)
    if args.write:
        (args.folder / "README.md").write_text(text, encoding="utf-8")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
