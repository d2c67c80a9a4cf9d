"""PNG plots of a benchmark (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from specdec.files import atomic_open  # noqa: E402


def plot_speedups(results: dict, path: Path) -> None:
    """Grouped bars: speed-up over each method's own plain baseline, by category."""
    from specdec.bench.methods import baselines

    # The plain methods are 1.0 by definition: the dashed line stands for them.
    methods = [m for m, r in results["methods"].items()
               if r["overall"]["speedup"] is not None and m not in baselines().values()]
    categories = sorted({c for m in methods for c in results["methods"][m]["categories"]}) + ["overall"]
    fig, ax = plt.subplots(figsize=(min(16, max(8, 0.35 * len(categories) * max(1, len(methods)))), 5))
    width = 0.8 / max(1, len(methods))
    for j, m in enumerate(methods):
        r = results["methods"][m]
        values = [(r["categories"].get(c) or {}).get("speedup") if c != "overall" else r["overall"]["speedup"]
                  for c in categories]
        ax.bar([i + j * width for i in range(len(categories))], [v or 0 for v in values], width, label=m)
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--", label="plain (each backend's own)")
    ax.set_xticks([i + width * (len(methods) - 1) / 2 for i in range(len(categories))])
    ax.set_xticklabels(categories, rotation=30, ha="right")
    ax.set_ylabel("speed-up over plain (same backend)")
    ax.set_title(f"{results['model']} ({results['backend']}, {results.get('dtype', '')}): speed-up by category")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    with atomic_open(path, "wb") as f:
        fig.savefig(f, format="png", dpi=120)
    plt.close(fig)


def plot_tokens_per_s(results: dict, path: Path) -> None:
    """Bars: overall tokens/s per method."""
    methods = list(results["methods"])
    values = [results["methods"][m]["overall"]["tokens_per_s"] for m in methods]
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(methods)), 4))
    ax.bar(methods, values, color="tab:blue")
    for i, v in enumerate(values):
        ax.text(i, v, f"{v:.1f}", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("tokens/s (overall)")
    ax.set_title(f"{results['model']} ({results['backend']}): throughput")
    plt.setp(ax.get_xticklabels(), rotation=30, ha="right")
    fig.tight_layout()
    with atomic_open(path, "wb") as f:
        fig.savefig(f, format="png", dpi=120)
    plt.close(fig)


def plot_cost_curve(curve: dict, path: Path, title: str) -> None:
    """Forward time and time per token against the number of new tokens."""
    ks = sorted(int(k) for k in curve)
    ms = [curve[str(k)] * 1000 if str(k) in curve else curve[k] * 1000 for k in ks]
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.6))
    a.plot(ks, ms, marker="o")
    a.set_xlabel("new tokens in one forward (K)")
    a.set_ylabel("ms per forward")
    a.set_xscale("log", base=2)
    b.plot(ks, [m / k for m, k in zip(ms, ks)], marker="o", color="tab:orange")
    b.set_xlabel("K")
    b.set_ylabel("ms per token")
    b.set_xscale("log", base=2)
    fig.suptitle(title)
    fig.tight_layout()
    with atomic_open(path, "wb") as f:
        fig.savefig(f, format="png", dpi=120)
    plt.close(fig)
