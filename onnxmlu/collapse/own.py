"""Blocks that arrive quantized: their bodies keep the model's own quantization, marked INT8.

A block holding quantized arithmetic of the model's own (``Layer.int8_arithmetic``: its QDQ
pairs, ``QLinearConv``/``QLinearMatMul``, ``ConvInteger``/``MatMulInteger`` with
``DynamicQuantizeLinear``, a reader of INT8 weights; :mod:`onnxmlu.plan.labels`) is never
re-quantized by :mod:`onnxmlu.precision.int8`: its scales, zero points and INT8/INT32 weights
are the model's, copied bit for bit, and its float layers stay float as the model's author had
them. Only the body's metadata says what it is
(:func:`mark_own_int8`). Collapse writes such bodies itself, so the metadata keys every body at
a precision carries live here, below :mod:`onnxmlu.precision`, whose transforms write them too.
"""

from __future__ import annotations

import onnx

from onnxmlu.sessions import unshare_dequantized_weights

#: The body metadata key of its precision (what the custom-op library and the readers check).
PRECISION_KEY = "onnxmlu.precision"
#: The body metadata key of where an INT8 body's quantization parameters came from.
CALIBRATION_KEY = "onnxmlu.calibration"
#: What the body and the node of a block arriving quantized say about its parameters.
OWN_INT8_NOTE = "the model's own quantization parameters, not calibrated by onnxmlu"


def mark_own_int8(body: onnx.ModelProto) -> None:
    """Mark the body of a block arriving quantized as INT8 with the model's own parameters
    (in place). Its arithmetic is not touched; only a quantized weight that several readers
    share is copied per reader (the same bits), so that onnxruntime's exact INT8 kernels can
    load the body (:func:`onnxmlu.sessions.unshare_dequantized_weights`)."""
    unshare_dequantized_weights(body.graph)
    set_int8_metadata(body, OWN_INT8_NOTE)


def set_int8_metadata(body: onnx.ModelProto, calibration: str) -> None:
    """Record an INT8 body's precision and where its quantization parameters came from."""
    for key, value in ((PRECISION_KEY, "int8"), (CALIBRATION_KEY, calibration)):
        entry = body.metadata_props.add()
        entry.key, entry.value = key, value
    body.producer_name = "onnxmlu"
    body.doc_string = f"{body.doc_string} (int8)".strip()
