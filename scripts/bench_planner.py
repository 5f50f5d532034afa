"""Planning time of every strategy on every zoo CNN (median of a few runs), as a table.

    .venv/bin/python scripts/bench_planner.py [--runs N] [--hw NAME] [--synthetic] [--nodes 1000,5000]

Each run builds a fresh cost function (``make_cost``), so the model's caches start empty and
the time includes pricing every block the strategy looks at.  The layer tables come from
the real pipeline (zoo -> rewrite -> analyze; not timed) unless ``--synthetic`` is given,
which uses the architecture tables of ``tests/perf/zoo_layers.py``.  Also prints each plan's
simulated latency and speedup over ``none``.  Target: ``optimal`` < 1 s on ResNet-50.
``planner_timings`` returns the same figures as rows, for ``scripts/bench.py``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "perf")]

from onnxmlu.plan.perf.hardware import load_hardware  # noqa: E402
from onnxmlu.plan.perf.model import make_cost, plan_latency_us  # noqa: E402
from onnxmlu.plan.strategies import BUILTIN_ORDER, get_strategy  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.synthetic:
        os.environ["ONNXMLU_SYNTHETIC_ZOO"] = "1"
    from zoo_layers import CNN_NAMES, using_real_pipeline

    hw = load_hardware(args.hw)
    source = "real pipeline" if using_real_pipeline() else "synthetic tables"
    print(f"planner benchmark · hardware {hw.name} · layers from the {source} · "
          f"median of {args.runs} runs\n")
    models: list = list(CNN_NAMES)
    models += [(f"chain{n}", synthetic_graph_layers(n)) for n in args.nodes]
    rows = planner_timings(models, BUILTIN_ORDER, hw=hw, runs=args.runs)
    header = f"{'network':12s} {'layers':>6s}  " + "  ".join(f"{s:>15s}" for s in BUILTIN_ORDER)
    times, speedups = [header], [header.replace("layers", "      ")]
    for name in dict.fromkeys(r["network"] for r in rows):
        mine = {r["strategy"]: r for r in rows if r["network"] == name}
        base = mine["none"]["sim_latency_us"]
        times.append(f"{name:12s} {mine['none']['layers']:6d}  "
                     + "  ".join(f"{mine[s]['median_s'] * 1e3:13.1f}ms" for s in BUILTIN_ORDER))
        cells = [f"{mine[s]['sim_latency_us'] / 1e3:6.2f}ms {base / mine[s]['sim_latency_us']:5.2f}x"
                 for s in BUILTIN_ORDER]
        speedups.append(f"{name:12s} {'':6s}  " + "  ".join(f"{c:>15s}" for c in cells))
    print("planning time (ms)\n" + "\n".join(times))
    print("\nsimulated latency and speedup over none\n" + "\n".join(speedups))
    return 0


def planner_timings(models, strategies=BUILTIN_ORDER, *, hw="mlu100", runs: int = 3) -> list[dict]:
    """One row per (model, strategy): planning time (median/min/max over ``runs``, seconds)
    and the plan's simulated latency.

    ``models``: zoo names (layers via ``tests/perf/zoo_layers.zoo_layers``, not timed) or
    ``(name, layers)`` pairs; ``hw``: a profile name or :class:`Hardware`.  Each run builds a
    fresh cost function, so the time includes pricing every block the strategy looks at.
    Row keys: network, layers, strategy, median_s, min_s, max_s, runs, sim_latency_us.
    """
    from zoo_layers import zoo_layers

    hw = load_hardware(hw) if isinstance(hw, str) else hw
    rows = []
    for model in models:
        name, layers = (model, zoo_layers(model)) if isinstance(model, str) else model
        for strategy in strategies:
            samples, latency = _time(strategy, layers, hw, runs)
            rows.append({"network": name, "layers": len(layers), "strategy": strategy,
                         "median_s": statistics.median(samples), "min_s": min(samples),
                         "max_s": max(samples), "runs": runs, "sim_latency_us": latency})
    return rows


def synthetic_graph_layers(nodes: int, topology: str = "chain") -> list:
    """The planner's layers of ``onnxmlu.tools.testing.synthetic_model(nodes, topology)`` (prepare
    + analyze, as ``fuse`` sees them; not timed)."""
    from onnxmlu.analyze import analyze
    from onnxmlu.api import prepare
    from onnxmlu.tools.testing import synthetic_model

    return list(analyze(prepare(synthetic_model(nodes, topology))[0]).layers)


def _time(strategy: str, layers, hw, runs: int) -> tuple[list[float], float]:
    fn = get_strategy(strategy)
    samples, latency = [], 0.0
    for _ in range(runs):
        cost = make_cost(hw)
        start = time.perf_counter()
        plan = fn(layers, hw, cost)
        samples.append(time.perf_counter() - start)
        plan.validate(layers, hw.cores)
        latency = plan_latency_us(plan, layers, hw, cost)
    return samples, latency


def _parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--hw", default="mlu100")
    parser.add_argument("--synthetic", action="store_true")
    parser.add_argument("--nodes", type=lambda v: [int(x) for x in v.split(",") if x], default=[],
                        help="also time synthetic conv/bn/relu chains of these node counts, e.g. 1000,5000")
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main())
