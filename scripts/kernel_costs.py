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

    python scripts/kernel_costs.py --out bench-results/qwen-kernels-stock --users-lib .peers/llama.cpp/build/bin
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import subprocess
import sys
from pathlib import Path

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
    command = [sys.executable, __file__, "--worker", setting, "--model", model, "--sizes",
               ",".join(map(str, sizes)), "--repeats", str(repeats)] + (["--bits"] if bits else [])
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _commit() -> str | None:
    """The checkout's commit, ``+dirty`` with uncommitted changes (what reproduces the file)."""
    try:
        return subprocess.run(["git", "-C", str(Path(__file__).parent), "describe", "--always", "--dirty=+dirty",
                               "--abbrev=12"], capture_output=True, text=True, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
    args = parser.parse_args()
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
        "command": "python scripts/kernel_costs.py " + " ".join(sys.argv[1:]),
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


if __name__ == "__main__":
    main()
