"""Precision, the third knob after fusion and MP: FP32, FP16 and INT8 blocks.

A block runs at one precision. Its *numerics* are emulated in the fused model, which still
runs in plain onnxruntime with the custom-op library (the body is an ordinary ONNX model):

* ``fp16`` (:mod:`onnxmlu.precision.fp16`): weights stored as FP16 in the body, every layer's
  output rounded to FP16, accumulation inside a layer in FP32;
* ``int8`` (:mod:`onnxmlu.precision.int8`): the body in QDQ form made by
  ``onnxruntime.quantization.quantize_static`` -- weights per-channel symmetric INT8,
  activations per-tensor symmetric INT8, calibrated on the block's own input tensors
  (:mod:`onnxmlu.precision.calibration`).

Its *price* comes from the performance model (:mod:`onnxmlu.plan.perf.model`): the profile's
peak per core at that precision, and feature maps and weights at its element size.
:mod:`onnxmlu.precision.bodies` gives collapse the per-block body transform. docs/precision.md
states the numeric and the pricing model.

The names and element sizes live in :mod:`onnxmlu.precisions` (the performance model
prices with them, a layer below this package) and are re-exported here; the transforms live in
the submodules.
"""

from onnxmlu.precisions import (
    DEFAULT_PRECISION,
    ELEMENT_BYTES,
    INT8_ANCHOR_OPS,
    INT8_OPS,
    PRECISIONS,
    RECORDS,
    Precision,
    check_precision,
    record,
    runs_at,
)

__all__ = ["DEFAULT_PRECISION", "ELEMENT_BYTES", "INT8_ANCHOR_OPS", "INT8_OPS", "PRECISIONS", "RECORDS", "Precision",
           "check_precision", "record", "runs_at"]
