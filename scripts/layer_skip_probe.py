"""How often does the target with layers skipped pick the target's own greedy token?

Measures the draft acceptance a layer-skipping self-drafter (Draft & Verify, SWIFT) would get
without training, on the target's own greedy continuations of Spec-Bench prompts: the full model's
argmax at each generated position vs the argmax after skipping a set of layers (full LM head).
Usage: python scripts/layer_skip_probe.py [--model gemma3-270m] [--questions N] [--tokens N]

Measured (8 prompts, 64 greedy tokens): Gemma-3-270M skipping its last 2 of 18 layers agrees 63%,
every 4th layer 3%; SmolLM2-135M skipping one middle layer of 30 agrees 77%, its last one 62%,
a middle third 23%, every 4th 6.5%. A small model has no layers to spare.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import specdec


def skipped_logits(hf, ids: torch.Tensor, skip: set[int]) -> torch.Tensor:
    """Logits of a full-sequence forward with the layers in ``skip`` left out (no cache: the
    sliding and full masks agree below the 512-token window, so the layer list can be cut)."""
    layers = hf.model.layers
    keep = [layer for i, layer in enumerate(layers) if i not in skip]
    old_n = hf.config.num_hidden_layers
    old_types = list(hf.config.layer_types) if getattr(hf.config, "layer_types", None) else None
    try:
        hf.model.layers = torch.nn.ModuleList(keep)
        hf.config.num_hidden_layers = len(keep)
        if old_types:
            hf.config.layer_types = [t for i, t in enumerate(old_types) if i not in skip]
        with torch.inference_mode():
            return hf(input_ids=ids, use_cache=False).logits[0]
    finally:
        hf.model.layers = layers
        hf.config.num_hidden_layers = old_n
        if old_types:
            hf.config.layer_types = old_types


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gemma3-270m")
    ap.add_argument("--questions", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()
    model = specdec.load(args.model, backend="transformers")  # it edits the transformers model's layers
    hf = model.loaded.hf_model
    n = hf.config.num_hidden_layers
    path = Path(__file__).resolve().parents[2] / "shared/data/spec_bench/questions.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    by_cat: dict[str, list] = {}
    for row in rows:
        by_cat.setdefault(row["category"], []).append(row)
    prompts = [qs[0]["turns"][0] for qs in by_cat.values()][:args.questions]
    configs = {
        "none (check)": set(),
        "one middle layer": {n // 2},
        f"last 1 of {n}": {n - 1},
        f"last 2 of {n}": set(range(n - 2, n)),
        f"last 4 of {n}": set(range(n - 4, n)),
        "every 4th": set(range(1, n, 4)),
        "every 3rd": set(range(1, n, 3)),
        "every 2nd (half)": set(range(1, n, 2)),
        "middle third": set(range(n // 3, 2 * n // 3)),
    }
    hits = {name: 0 for name in configs}
    total = 0
    for prompt in prompts:
        ids = model.encode(prompt, chat=model.has_chat_template)
        out = model.generate(ids, max_new_tokens=args.tokens, drafter="none")
        seq = torch.tensor([ids + out.token_ids])
        full = seq[0, len(ids):]  # the greedy tokens at positions len(ids)..
        for name, skip in configs.items():
            logits = skipped_logits(hf, seq, skip)
            pred = logits[len(ids) - 1:-1].argmax(-1)
            hits[name] += int((pred == full).sum())
        total += len(full)
    for name, skip in configs.items():
        print(f"{name:>18}: {len(skip):2d} of {n} layers skipped, agreement with the target's greedy token "
              f"{hits[name] / total:.3f} ({total} positions)")


if __name__ == "__main__":
    main()
