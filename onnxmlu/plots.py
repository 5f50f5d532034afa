"""Charts for reports (matplotlib, the optional ``plot`` extra).

* :func:`speedup_chart`: grouped bars of speedup over ``none`` per network and strategy,
  the layout of DLFusion's Fig. 10;
* :func:`plan_chart`: one bar per block, width = simulated latency, labelled with its MP.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

from onnxmlu.errors import OnnxMluError


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise OnnxMluError("plots need matplotlib: pip install 'onnxmlu[plot]'") from None
    return plt


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


def plan_chart(rows: Sequence[dict], path: str | Path, title: str = "") -> Path:
    """``rows`` as from ``FuseResult.block_rows()`` -> a timeline PNG at ``path``."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10, 2.6))
    start = 0.0
    cmap = plt.get_cmap("viridis")
    for row in rows:
        shade = cmap(min(1.0, (row["mp"].bit_length() - 1) / 5))
        ax.barh(0, row["sim_latency_us"], left=start, color=shade, edgecolor="white")
        if row["sim_latency_us"] > 0.03 * sum(r["sim_latency_us"] for r in rows):
            ax.text(start + row["sim_latency_us"] / 2, 0, f"b{row['block']}\nmp={row['mp']}",
                    ha="center", va="center", fontsize=7, color="white")
        start += row["sim_latency_us"]
    ax.set_yticks([])
    ax.set_xlabel("simulated time (µs)")
    ax.set_title(title or f"{len(rows)} blocks, {start:.0f} µs")
    return _save(fig, plt, path)


def _save(fig, plt, path: str | Path) -> Path:
    out = Path(path)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
