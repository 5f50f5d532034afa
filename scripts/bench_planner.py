"""Planning time of every strategy on every zoo CNN (median of a few runs), as a table.

    .venv/bin/python scripts/bench_planner.py [--runs N] [--hw NAME] [--synthetic]

Each run builds a fresh cost function (``make_cost``), so the model's caches start empty and
the time includes pricing every block the strategy looks at.  The layer tables come from
the real pipeline (zoo -> rewrite -> analyze; not timed) unless ``--synthetic`` is given,
which uses the architecture tables of ``tests/perf/zoo_layers.py``.  Also prints each plan's
simulated latency and speedup over ``none``.  Target: ``optimal`` < 1 s on ResNet-50.
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

from onnxmlu.perf.hardware import load_hardware  # noqa: E402
from onnxmlu.perf.model import make_cost, plan_latency_us  # noqa: E402
from onnxmlu.strategies import BUILTIN_ORDER, get_strategy  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.synthetic:
        os.environ["ONNXMLU_SYNTHETIC_ZOO"] = "1"
    from zoo_layers import CNN_NAMES, using_real_pipeline, zoo_layers

    hw = load_hardware(args.hw)
    source = "real pipeline" if using_real_pipeline() else "synthetic tables"
    print(f"planner benchmark · hardware {hw.name} · layers from the {source} · "
          f"median of {args.runs} runs\n")
    header = f"{'network':12s} {'layers':>6s}  " + "  ".join(f"{s:>15s}" for s in BUILTIN_ORDER)
    times, speedups = [header], [header.replace("layers", "      ")]
    for name in CNN_NAMES:
        layers = zoo_layers(name)
        row_t, row_s, base = [], [], None
        for strategy in BUILTIN_ORDER:
            seconds, latency = _time(strategy, layers, hw, args.runs)
            base = latency if strategy == "none" else base
            row_t.append(f"{seconds * 1e3:13.1f}ms")
            row_s.append(f"{latency / 1e3:6.2f}ms {base / latency:5.2f}x")
        times.append(f"{name:12s} {len(layers):6d}  " + "  ".join(row_t))
        speedups.append(f"{name:12s} {'':6s}  " + "  ".join(f"{s:>15s}" for s in row_s))
    print("planning time (ms)\n" + "\n".join(times))
    print("\nsimulated latency and speedup over none\n" + "\n".join(speedups))
    return 0


def _time(strategy: str, layers, hw, runs: int) -> tuple[float, float]:
    fn = get_strategy(strategy)
    samples, latency = [], 0.0
    for _ in range(runs):
        cost = make_cost(hw)
        start = time.perf_counter()
        plan = fn(layers, hw, cost)
        samples.append(time.perf_counter() - start)
        plan.validate(layers, hw.cores)
        latency = plan_latency_us(plan, layers, hw, cost)
    return statistics.median(samples), latency


def _parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--hw", default="mlu100")
    parser.add_argument("--synthetic", action="store_true")
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main())
