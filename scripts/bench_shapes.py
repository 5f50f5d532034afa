"""Runtime of a model fused once, at every shape it runs at: fused / original latency.

A model with symbolic dims is fused once at its pins (``--pin``); the fused model keeps its
symbolic dims, so it runs at other shapes too. At each shape (``--at``, the pin first) the
original (plain onnxruntime, all graph optimizations, ``T`` intra-op threads) and the fused
model (``onnxmlu.InferenceSession`` with the same options) are timed in turns in one process;
the ratio is fused median / original median. Without a model: the zoo ResNet-18 with a
symbolic batch, fused at batch 1, run at batch 1 and 8.

    .venv/bin/python scripts/bench_shapes.py [MODEL --pin NAME:DIMS --at NAME:DIMS ...]
"""

from __future__ import annotations

import argparse
import os
import time

import onnx

from onnxmlu import api
from onnxmlu.frontend.pins import concrete_shapes, parse_input_shapes
from onnxmlu.tools.timing import plain_session, time_in_turns
from onnxmlu.tools.verify import random_inputs
from onnxmlu.tools.zoo import build_model
from bench_runtime import fused_session


def bench(model: onnx.ModelProto, pin: list[str], shapes: list[list[str]], threads: int, runs: int) -> list[tuple]:
    """Rows (shape, original ms, fused ms, ratio), printed as they come."""
    pins = parse_input_shapes(pin)
    fused = api.fuse(model, input_shapes=pins).model
    original, candidate = plain_session(model, threads), fused_session(fused, threads)
    rows = []
    for spec in [pin, *shapes]:
        at = concrete_shapes(model, parse_input_shapes(spec))
        feeds = random_inputs(model, seed=0, shapes=at)
        t = time_in_turns({"original": original, "fused": candidate}, feeds, rounds=max(3, runs // 5))
        ratio = t["fused"].median_ms / t["original"].median_ms
        rows.append((" ".join(spec), t["original"].median_ms, t["fused"].median_ms, ratio))
        print(f"| {rows[-1][0]} | {rows[-1][1]:.3f} | {rows[-1][2]:.3f} | {ratio:.3f} |", flush=True)
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", help="an ONNX model with symbolic dims (default: zoo ResNet-18, batch N)")
    parser.add_argument("--pin", action="append", help="the shape to fuse at, NAME:DIMS (repeatable)")
    parser.add_argument("--at", action="append", default=[], help="another shape to run at, NAME:DIMS; "
                        "separate inputs of one shape with '+' (a+b)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args(argv)
    if args.model is None:
        model, pin, shapes = build_model("resnet18", batch="N"), ["input:1,3,224,224"], [["input:8,3,224,224"]]
    else:
        model, pin, shapes = onnx.load(args.model), args.pin or [], [spec.split("+") for spec in args.at]
    print(f"# fused once at {' '.join(pin)} · {os.cpu_count()} cores · {args.threads} thread(s) · median of "
          f"{args.runs} runs in turns · {time.strftime('%Y-%m-%d')}")
    print("| shape | original ms | fused ms | fused / original |")
    print("|---|---|---|---|")
    bench(model, pin, shapes, args.threads, args.runs)


if __name__ == "__main__":
    main()
