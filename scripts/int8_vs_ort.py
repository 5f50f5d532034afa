"""INT8 accuracy of onnxmlu's fused model against onnxruntime's own ``quantize_static`` of the
original model, with the same calibration samples and the same scheme, judged on other samples.

Both sides quantize with the accelerator's scheme (docs/precision.md): QDQ, per-channel
symmetric INT8 weights, symmetric INT8 activations, the chosen calibrator, on the same
``--calibration`` seeded samples (seeds 0..K-1, N(0, 1): the zoo's weights are seeded random,
so there is no real data to calibrate on). The accuracy is measured on ``--held-out`` other
seeded samples (seeds 1000..), never on a calibration sample, against the FP32 original in
onnxruntime with optimizations off (the project's reference):

* ``onnxruntime``: ``quantize_static`` of the original model (onnxruntime folds BN into the
  Conv itself when it pre-processes; here it quantizes the graph as given, BatchNormalization
  nodes and all, as ``quantize_static`` does), run at onnxruntime's default optimization level;
* ``onnxmlu fold``: ``fuse --precision int8`` (BatchNormalization folded, the default under INT8);
* ``onnxmlu substitute``: ``fuse --precision int8 --bn substitute`` (the former default).

Columns: mean and worst ``1 - cosine`` of the output over the held-out samples, top-1
agreement with FP32, and the fused model's simulated latency (µs, mlu100, dlfusion plan)::

    python scripts/int8_vs_ort.py [--models resnet18 mobilenetv2] [--calibration 8] [--held-out 16]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.quantization import quantize_static

from onnxmlu.sessions import new_options
from onnxmlu import api
from onnxmlu.precision.accuracy import cosine_similarity
from onnxmlu.precision.calibration import SampleReader
from onnxmlu.precision.int8 import Int8Options
from onnxmlu.runtime import InferenceSession, reference_session
from onnxmlu.tools.testing import zoo_model
from onnxmlu.tools.verify import random_inputs

HELD_OUT_SEED = 1000


def ort_quantized(model: onnx.ModelProto, samples: list[dict], folder: Path, method: str) -> ort.InferenceSession:
    """onnxruntime's ``quantize_static`` of the whole original model, with onnxmlu's INT8 scheme."""
    source, target = folder / "original.onnx", folder / "original.int8.onnx"
    onnx.save(model, source.as_posix())
    quantize_static(source, target, SampleReader(samples), **Int8Options(method=method).quantize_arguments())
    return ort.InferenceSession(target.as_posix(), new_options(), providers=["CPUExecutionProvider"])


def onnxmlu_quantized(model: onnx.ModelProto, folder: Path, bn_mode: str, method: str):
    result = api.fuse(model, precision="int8", calibration=folder, calibrator=method, bn_mode=bn_mode)
    return InferenceSession(result.model), sum(result.block_latency_us)


def figures(session, feeds: list[dict], expected: list[np.ndarray]) -> tuple[float, float, float]:
    got = [session.run(None, f)[0] for f in feeds]
    deficits = [1.0 - cosine_similarity(e, g) for e, g in zip(expected, got)]
    top1 = np.mean([np.array_equal(e.argmax(-1), g.argmax(-1)) for e, g in zip(expected, got)])
    return float(np.mean(deficits)), float(np.max(deficits)), float(top1)


def rows(name: str, calibration: int, held_out: int, method: str) -> list[str]:
    model = zoo_model(name)
    calib = [random_inputs(model, seed) for seed in range(calibration)]
    feeds = [random_inputs(model, HELD_OUT_SEED + k) for k in range(held_out)]
    reference = reference_session(model)
    expected = [reference.run(None, f)[0] for f in feeds]
    out = []
    with tempfile.TemporaryDirectory(prefix="int8-vs-ort-") as tmp:
        folder = Path(tmp)
        for k, sample in enumerate(calib):
            np.savez(folder / f"sample{k:03d}.npz", **sample)
        work = folder / "ort"
        work.mkdir()
        sides = [("onnxruntime quantize_static", ort_quantized(model, calib, work, method), None)]
        for bn in ("fold", "substitute"):
            session, latency = onnxmlu_quantized(model, folder, bn, method)
            sides.append((f"onnxmlu --bn {bn}", session, latency))
        for label, session, latency in sides:
            mean, worst, top1 = figures(session, feeds, expected)
            lat = "–" if latency is None else f"{latency:,.0f}"
            out.append(f"| {name} | {label} | {mean:.2e} | {worst:.2e} | {top1:.0%} | {lat} |")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=["resnet18", "mobilenetv2"])
    parser.add_argument("--calibration", type=int, default=8)
    parser.add_argument("--held-out", type=int, default=16)
    parser.add_argument("--calibrator", default="minmax")
    args = parser.parse_args()
    print(f"INT8 vs FP32 on {args.held_out} held-out seeded samples; both calibrated ({args.calibrator}) on the "
          f"same {args.calibration} other samples\n")
    print("| model | INT8 by | mean 1-cos | worst 1-cos | top-1 agreement | simulated µs |")
    print("|---|---|---|---|---|---|")
    for name in args.models:
        print("\n".join(rows(name, args.calibration, args.held_out, args.calibrator)), flush=True)


if __name__ == "__main__":
    main()
