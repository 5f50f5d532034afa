"""The precisions a block can run at: their names, element sizes and the operators INT8 computes.

Data, no transform (no onnx import): the plan stage and the performance model price a block at
its precision with these, below :mod:`onnxmlu.precision`, which makes the bodies
(docs/architecture.md, "Layers"); :mod:`onnxmlu.precision` re-exports them.
"""

from __future__ import annotations

from onnxmlu.errors import OnnxMluError

#: The precisions a block can run at, in decreasing accuracy.
PRECISIONS: tuple[str, ...] = ("fp32", "fp16", "int8")
#: What a block runs at when nothing says otherwise (and what files without the attribute mean).
DEFAULT_PRECISION = "fp32"
#: Bytes of one feature-map or weight element at each precision.
ELEMENT_BYTES: dict[str, int] = {"fp32": 4, "fp16": 2, "int8": 1}
#: Operators (default domain) that an INT8 block computes in INT8: those onnxruntime's static
#: quantizer has a QDQ or QLinear form for (its ``QDQRegistry`` and ``QLinearOpsRegistry``,
#: onnxruntime 1.17-1.22; tests/precision/test_labels.py compares). Any other operator stays FP32
#: between a DequantizeLinear and a QuantizeLinear inside an INT8 block, so it is priced at FP32
#: (:meth:`~onnxmlu.plan.perf.layers.Layer.at_precision`).
INT8_OPS: frozenset[str] = frozenset({
    "Add", "ArgMax", "AveragePool", "BatchNormalization", "Clip", "Concat", "Conv", "ConvTranspose", "CumSum",
    "Flatten", "Gather", "GatherElements", "Gemm", "GlobalAveragePool", "InstanceNormalization",
    "LayerNormalization", "LeakyRelu", "MatMul", "MaxPool", "Mul", "Pad", "Relu", "Reshape", "Resize", "Sigmoid",
    "Slice", "Softmax", "Split", "Squeeze", "TopK", "Transpose", "Unsqueeze", "Where"})

#: The operators of :data:`INT8_OPS` that the quantizer puts a QuantizeLinear/DequantizeLinear pair
#: on whenever they have a float input; the others it quantizes only after a quantized operator
#: (``Reshape``, ``MaxPool``, ``Resize``, ``Gather``...) or removes as activations (``Relu``,
#: ``Clip``). An INT8 block holding none of these with a float input would hold no quantized
#: arithmetic: it is an FP32 block, labelled and priced so (:mod:`onnxmlu.plan.labels`, rule 3;
#: tests/precision/test_labels.py runs the quantizer on each operator alone).
INT8_ANCHOR_OPS: frozenset[str] = frozenset({
    "Add", "ArgMax", "BatchNormalization", "Concat", "Conv", "ConvTranspose", "CumSum", "Gemm",
    "GlobalAveragePool", "InstanceNormalization", "LayerNormalization", "LeakyRelu", "MatMul", "Mul", "Pad",
    "Sigmoid", "Softmax", "Split"})


def runs_at(op_type: str, precision: str) -> str:
    """The precision an operator computes at inside a block at ``precision``: FP32 for an
    operator INT8 has no form for (:data:`INT8_OPS`), the block's otherwise."""
    return DEFAULT_PRECISION if precision == "int8" and op_type not in INT8_OPS else precision


def check_precision(precision: object, what: str = "precision") -> str:
    """``precision`` when it is one of :data:`PRECISIONS`; an :class:`OnnxMluError` otherwise."""
    if precision not in PRECISIONS:
        raise OnnxMluError(f"{what} must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    return str(precision)

