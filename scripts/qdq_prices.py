"""What an imported QDQ model is priced at, against its float original's plans.

Quantizes MODEL with ``onnxruntime.quantization.quantize_static`` (QDQ, INT8 weights, UINT8
activations, calibrated on 8 seeded N(0, 1) samples: the prices depend on the graph, not on the
scales), once after onnxruntime's ``quant_pre_process`` (which folds BatchNormalization) and once
without it, and prints the simulated latency (µs, ``optimal`` plans, mlu100) of both QDQ models,
of the float model's FP32 optimum and of onnxmlu's own INT8 plan of the float model::

    python scripts/qdq_prices.py MODEL.onnx [--pin x:1,3,224,224]
"""

from __future__ import annotations

import argparse
import logging
import tempfile
from pathlib import Path

import onnx
from onnxruntime.quantization import QuantFormat, QuantType, quantize_static
from onnxruntime.quantization.shape_inference import quant_pre_process

from onnxmlu import api
from onnxmlu.precision.calibration import SampleReader, random_calibration


def latency(model, **options) -> str:
    result = api.fuse(str(model), strategy="optimal", **options)
    return f"{sum(result.block_latency_us):,.0f} µs ({len(result.plan.blocks)} blocks)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--pin", help="NAME:D1,D2,... for a symbolic input (the batch is pinned to 1 otherwise)")
    args = parser.parse_args()
    logging.getLogger().setLevel(logging.ERROR)  # the quantizer's advice to pre-process, shown by this script
    model = onnx.load(args.model)
    for value in model.graph.input:
        dims = value.type.tensor_type.shape.dim
        pinned = args.pin.split(":")[1].split(",") if args.pin and args.pin.split(":")[0] == value.name else None
        for k, dim in enumerate(dims):
            if pinned or not dim.HasField("dim_value"):
                dim.dim_value = int(pinned[k]) if pinned else 1
    with tempfile.TemporaryDirectory() as folder:
        src, pre = Path(folder, "float.onnx"), Path(folder, "pre.onnx")
        onnx.save(model, src)
        quant_pre_process(str(src), str(pre))
        samples = random_calibration(model, 8).samples
        rows = [("float model, FP32 optimum", latency(src)), ("float model, onnxmlu --precision int8",
                                                             latency(src, precision="int8"))]
        for label, source in (("QDQ after quant_pre_process", pre), ("QDQ without pre-processing", src)):
            target = Path(folder, f"{source.stem}.qdq.onnx")
            quantize_static(source, target, SampleReader(samples), quant_format=QuantFormat.QDQ,
                            weight_type=QuantType.QInt8, activation_type=QuantType.QUInt8)
            rows.append((label, latency(target)))
    print("| model | simulated latency (mlu100, optimal) |\n|---|---|")
    for label, value in rows:
        print(f"| {label} | {value} |")


if __name__ == "__main__":
    main()
