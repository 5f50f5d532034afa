"""Charts for reports (matplotlib, the optional ``plot`` extra).

* :func:`speedup_chart`: grouped bars of speedup over ``none`` per network and strategy,
  the layout of [DLFusion] Fig. 10;
* :func:`plan_chart`: one bar per block, width = simulated latency, coloured and labelled
  with its MP;
* :func:`pareto_chart`: the plans ``--precision auto`` considered, simulated latency against
  measured accuracy, the budget as a line and the chosen plan marked.

A leaf of the package (it imports only :mod:`onnxmlu.optional`): the API draws plans and
comparisons with it, and :mod:`onnxmlu.precision.auto` the plans it considered. matplotlib is
imported when a chart is drawn (:func:`~onnxmlu.optional.optional_import`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Mapping, Sequence

from onnxmlu.optional import optional_import, require
from onnxmlu.wording import plural


def require_plotting() -> None:
    """Raise the one-line error now when matplotlib is missing: a command asked for a chart
    checks before any work, not after it (compare --plot spent 20 s first)."""
    require("matplotlib")


def _pyplot():
    optional_import("matplotlib").use("Agg")
    return optional_import("matplotlib.pyplot")


def speedup_chart(report: Mapping[str, Sequence[dict]], path: str | Path) -> Path:
    """``report[network] = [{"strategy", "speedup"}, ...]`` -> a PNG at ``path``."""
    plt = _pyplot()
    networks = list(report)
    strategies = [r["strategy"] for r in report[networks[0]]]
    width = 0.8 / len(strategies)
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(networks) + 2), 4))
    top = 0.0
    for s, strategy in enumerate(strategies):
        values = [next(r["speedup"] for r in report[n] if r["strategy"] == strategy) for n in networks]
        xs = [i + (s - (len(strategies) - 1) / 2) * width for i in range(len(networks))]
        ax.bar(xs, values, width, label=strategy)
        top = max(top, *values)
    ax.set_xticks(range(len(networks)), networks)
    ax.set_ylabel("speedup over 'none' (simulated)")
    ax.set_title("Fusion / MP strategies on the simulated accelerator")
    ax.set_ylim(0, top * 1.3)  # headroom: the legend sits above the tallest bars, not on them
    ax.legend(ncol=4, fontsize="small", loc="upper left")
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, plt, path)


def plan_chart(rows: Sequence[dict], path: str | Path, title: str = "", max_mp: int = 32) -> Path:
    """``rows`` as from ``FuseResult.block_rows()`` or ``plan``'s report -> a timeline PNG at
    ``path``: one bar per block, as wide as its simulated latency, coloured by log2(MP)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10, 2.8))
    cmap, norm = plt.get_cmap("viridis"), optional_import("matplotlib.colors").Normalize(0, math.log2(max_mp))
    total = sum(r["sim_latency_us"] for r in rows)
    start = 0.0
    for row in rows:
        width = row["sim_latency_us"]
        ax.barh(0, width, left=start, color=cmap(norm(math.log2(row["mp"]))), edgecolor="white")
        if width > 0.06 * total:  # a label only where it fits
            ax.text(start + width / 2, 0, _block_label(row), ha="center", va="center", fontsize=9, color="white")
        start += width
    ax.set_yticks([])
    ax.set_xlabel("simulated time (µs)")
    ax.set_title(title or f"{plural(len(rows), 'block')}, {start:.0f} µs")
    bar = fig.colorbar(plt.cm.ScalarMappable(norm=norm, cmap=cmap), ax=ax, pad=0.01)
    ticks = [2**k for k in range(int(math.log2(max_mp)) + 1)]
    bar.set_ticks([math.log2(t) for t in ticks], labels=[str(t) for t in ticks])
    bar.set_label("MP (cores)")
    return _save(fig, plt, path)


def pareto_chart(points: Sequence[dict], path: str | Path, *, metric: str, threshold: float,
                 title: str = "") -> Path:
    """``points``: ``{"latency_us", "accuracy", "label", "chosen"}`` per measured plan -> a PNG."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ordered = sorted(points, key=lambda p: p["latency_us"])
    ax.plot([p["latency_us"] for p in ordered], [p["accuracy"] for p in ordered], "o-", color="tab:blue",
            label="plans considered (measured)", zorder=2)
    for p in ordered:
        ax.annotate(p["label"], (p["latency_us"], p["accuracy"]), textcoords="offset points", xytext=(4, 4),
                    fontsize="x-small")
    chosen = [p for p in ordered if p["chosen"]]
    ax.scatter([p["latency_us"] for p in chosen], [p["accuracy"] for p in chosen], s=180, marker="*",
               color="tab:red", label="chosen", zorder=3)
    ax.axhline(threshold, color="tab:gray", linestyle="--", label=f"budget {metric} >= {threshold:g}")
    ax.set_xlabel("simulated latency (µs)")
    ax.set_ylabel(f"measured {metric}")
    ax.set_title(title or f"--precision auto: latency against {metric}")
    ax.legend(fontsize="small", loc="lower right")
    ax.grid(alpha=0.3)
    return _save(fig, plt, path)


def _block_label(row: dict) -> str:
    """'block 0 · mp=12' and, when the row says, its layer range and latency."""
    lines = [f"block {row['block']} · mp={row['mp']}"]
    if "start" in row:
        lines.append(f"layers {row['start']}–{row['stop'] - 1}")
    lines.append(f"{row['sim_latency_us']:.0f} µs")
    return "\n".join(lines)


def _save(fig, plt, path: str | Path) -> Path:
    out = Path(path)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
