"""Figures of the precision knob (docs/precision.md), printed as Markdown tables.

1. Simulated latency of zoo CNNs at fp32 / fp16 / int8 from the performance model: the
   fp32 DLFusion plan priced at each precision (same blocks, same MPs), and a plan made for
   each precision (the strategy run on the layers at that precision).
2. Accuracy of fused fp16 / int8 models against the fp32 original (onnxruntime, optimizations
   off) on seeded random inputs: cosine similarity and relative error of the output, top-1
   agreement. The zoo's weights are seeded random ones, and without a calibration folder INT8
   is calibrated on seeded random inputs, so these are figures of the emulation, not of a
   trained network.

    python scripts/precision_figures.py [--latency resnet18 vgg19] [--accuracy resnet18] [--inputs 16]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from onnxmlu import api
from onnxmlu.plan.perf.hardware import load_hardware
from onnxmlu.plan.perf.layers import layers_at_precision
from onnxmlu.plan.perf.model import make_cost, plan_block_latencies_us
from onnxmlu.plan.plan import with_precision
from onnxmlu.plan.strategies import get_strategy
from onnxmlu.precision import PRECISIONS
from onnxmlu.runtime import InferenceSession, reference_session
from onnxmlu.tools.testing import zoo_model
from onnxmlu.tools.verify import random_inputs


def latency_rows(name: str, hw, strategies=("dlfusion", "optimal")) -> list[str]:
    analysis = api.inspect(zoo_model(name), rewrite=True)
    layers, cost = analysis.layers, make_cost(hw)
    rows = []
    for strategy in strategies:
        base = get_strategy(strategy)(layers, hw, cost)
        repriced = [sum(plan_block_latencies_us(with_precision(base, p), layers, cost)) for p in PRECISIONS]
        replanned = []
        for p in PRECISIONS:
            plan = get_strategy(strategy)(layers_at_precision(layers, p), hw, cost)
            replanned.append((sum(plan_block_latencies_us(with_precision(plan, p), layers, cost)), len(plan.blocks)))
        cells = [f"{t:,.0f}" for t in repriced] + [f"{t:,.0f} ({n})" for t, n in replanned]
        rows.append(f"| {name} | {strategy} ({len(base.blocks)} blocks) | " + " | ".join(cells) + " |")
    return rows


def accuracy_rows(name: str, inputs: int) -> list[str]:
    model = zoo_model(name)
    base = api.fuse(model)
    reference = reference_session(model)
    feeds = [random_inputs(model, 1000 + k) for k in range(inputs)]
    expected = [reference.run(None, f)[0] for f in feeds]
    rows = []
    for precision in ("fp16", "int8"):
        start = time.perf_counter()
        fused = api.fuse(model, plan=with_precision(base.plan, precision)).model
        seconds = time.perf_counter() - start
        session = InferenceSession(fused)
        got = [session.run(None, f)[0] for f in feeds]
        cos = [float(g.ravel() @ e.ravel() / np.linalg.norm(g) / np.linalg.norm(e)) for g, e in zip(got, expected)]
        rel = [float(np.linalg.norm(g - e) / np.linalg.norm(e)) for g, e in zip(got, expected)]
        top1 = np.mean([np.array_equal(g.argmax(-1), e.argmax(-1)) for g, e in zip(got, expected)])
        rows.append(f"| {name} | {precision} | {len(base.plan.blocks)} | {min(cos):.6f} | {np.mean(rel):.2e} | "
                    f"{max(rel):.2e} | {top1:.0%} | {seconds:.1f} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", nargs="*", default=["resnet18", "vgg19"])
    parser.add_argument("--accuracy", nargs="*", default=["resnet18"])
    parser.add_argument("--inputs", type=int, default=16)
    parser.add_argument("--hardware", default="mlu100")
    args = parser.parse_args()
    hw = load_hardware(args.hardware)
    if args.latency:
        print(f"Simulated latency (µs, {hw.name}); same plan: the fp32 plan priced at each precision; "
              "own plan: the strategy run at that precision (blocks)\n")
        print("| model | strategy | fp32 | fp16 | int8 | fp32 own plan | fp16 own plan | int8 own plan |")
        print("|---|---|---|---|---|---|---|---|")
        for name in args.latency:
            print("\n".join(latency_rows(name, hw)))
    if args.accuracy:
        print(f"\nFused model output vs fp32 original, {args.inputs} seeded random inputs (dlfusion plan)\n")
        print("| model | precision | blocks | min cosine | mean rel. error | max rel. error | top-1 agreement "
              "| fuse s |")
        print("|---|---|---|---|---|---|---|---|")
        for name in args.accuracy:
            print("\n".join(accuracy_rows(name, args.inputs)))


if __name__ == "__main__":
    main()
