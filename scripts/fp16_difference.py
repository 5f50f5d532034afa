"""What an FP16 block's output differs in, at the optimization level the block really runs at.

The custom-op library runs every body at onnxruntime's ``ORT_ENABLE_ALL``. An FP16 body
(docs/precision.md) rounds each layer's FP32 output to FP16; run with optimizations off it equals
the layer-by-layer numeric model bit for bit (tests/precision/test_fp16.py). At ``ORT_ENABLE_ALL``
onnxruntime fuses and re-blocks the FP32 arithmetic between the roundings (NCHWc convolutions,
fused activations), which changes FP32 summation order, so a rounding to FP16 may land one unit
in the last place (ulp) away. This script measures, per block of the fused model (dlfusion
plan), on seeded inputs captured at the block's entry: the share of output elements that differ
between the two levels, the share that differ by more than one FP16 ulp, the largest difference
relative to the output's largest magnitude, and the cosine of the whole model's output at FP16
against FP32::

    python scripts/fp16_difference.py [--models resnet18 mobilenetv2] [--inputs 4]
"""

from __future__ import annotations

import argparse

import numpy as np
import onnxruntime as ort

from onnxmlu.sessions import new_options
from onnxmlu import api
from onnxmlu.plan.plan import with_precision
from onnxmlu.precision.accuracy import cosine_similarity
from onnxmlu.precision.calibration import capture_tensors
from onnxmlu.runtime import InferenceSession, reference_session
from onnxmlu.schema import body_model, is_fusion_block
from onnxmlu.tools.testing import zoo_model
from onnxmlu.tools.verify import random_inputs


def session(body, level) -> ort.InferenceSession:
    options = new_options()
    options.graph_optimization_level = level
    return ort.InferenceSession(body.SerializeToString(), options, providers=["CPUExecutionProvider"])


def ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance in FP16 units in the last place between two arrays of FP16 values (as FP32)."""
    def ordered(x):
        bits = x.astype(np.float16).view(np.int16).astype(np.int32)
        return np.where(bits < 0, -32768 - bits, bits)
    return np.abs(ordered(a) - ordered(b))


def rows(name: str, inputs: int) -> list[str]:
    model = zoo_model(name)
    base = api.fuse(model)
    result = api.fuse(model, plan=with_precision(base.plan, "fp16"))
    analysis = api.inspect(model, rewrite=True)
    feeds = [random_inputs(model, 2000 + k) for k in range(inputs)]
    nodes = [n for n in result.model.graph.node if is_fusion_block(n)]
    names = sorted({i for n in nodes for i in n.input if i})
    captured = capture_tensors(analysis.model, [n for n in names if n not in feeds[0]], feeds)
    out = []
    for k, node in enumerate(nodes):
        body = body_model(node)
        exact, optimized = (session(body, level) for level in (ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
                                                               ort.GraphOptimizationLevel.ORT_ENABLE_ALL))
        differ, beyond, total, worst = 0, 0, 0, 0.0
        for feed, more in zip(feeds, captured):
            values = {**feed, **more}
            block_feed = {i.name: values[i.name] for i in exact.get_inputs()}
            for a, b in zip(exact.run(None, block_feed), optimized.run(None, block_feed)):
                distance = ulps(a, b)
                differ, beyond, total = differ + int((distance > 0).sum()), beyond + int((distance > 1).sum()), total + a.size
                worst = max(worst, float(np.abs(a - b).max() / max(np.abs(a).max(), 1e-30)))
        out.append(f"| {name} | {k} | {total // inputs:,} | {differ / total:.1%} | {beyond / total:.2%} | {worst:.1e} |")
    reference, fused = reference_session(model), InferenceSession(result.model)
    cosine = min(cosine_similarity(reference.run(None, f)[0], fused.run(None, f)[0]) for f in feeds)
    out.append(f"| {name} | whole model: worst cosine vs FP32 over {inputs} inputs {cosine:.7f} | | | | |")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=["resnet18", "mobilenetv2"])
    parser.add_argument("--inputs", type=int, default=4)
    args = parser.parse_args()
    print("FP16 block outputs at ORT_ENABLE_ALL (as the library runs them) against ORT_DISABLE_ALL "
          f"(the exact numeric model), {args.inputs} seeded inputs\n")
    print("| model | block | output elements | elements that differ | differ by > 1 FP16 ulp | "
          "largest difference / largest value |")
    print("|---|---|---|---|---|---|")
    for name in args.models:
        print("\n".join(rows(name, args.inputs)), flush=True)


if __name__ == "__main__":
    main()
