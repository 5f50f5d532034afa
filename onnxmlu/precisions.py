"""The precisions a block can run at: one :class:`Precision` record each, and the operators INT8
computes.

Data, no transform (no onnx import), at the bottom of the layers so that every stage reads the
same record: the file format's label rule (:mod:`onnxmlu.schema`), the plan stage and the
performance model, which price a block at its precision, and :mod:`onnxmlu.precision`, which
makes the bodies (docs/architecture.md, "Layers") and re-exports these.
"""

from __future__ import annotations

from dataclasses import dataclass

from onnxmlu.errors import OnnxMluError


@dataclass(frozen=True)
class Precision:
    """One precision a block can run at: everything a stage needs of it, in one record.

    ``element_bytes``: one feature-map or weight element. ``peak``: the hardware profile's
    datasheet field for one core's peak at this precision (:meth:`Hardware.peak_per_core`).
    ``body``: the :class:`onnxmlu.precision.bodies.BlockBodies` method that turns a block's FP32
    body into this precision's (None: the FP32 body as it is). The label rule
    (:mod:`onnxmlu.plan.labels`, :func:`onnxmlu.schema.label_mismatch`): ``rounds_floats`` -- a
    block labelled so needs an FP32 tensor to round (else it is FP32); ``quantizes`` -- it needs
    an operator the quantizer quantizes (else FP32); ``body_holds`` -- what its body must hold,
    as the error that says it does not ends ("its body holds no ..."). ``calibrated``: its bodies are made from
    calibration samples of the block's inputs. Adding a precision is adding a record here,
    its body method, its body check, its profile values, its C++ label row and its tests;
    everything else derives from :data:`RECORDS` (docs/architecture.md, "Changing it")."""

    name: str
    element_bytes: int
    peak: str
    body: str | None = None
    rounds_floats: bool = False
    quantizes: bool = False
    body_holds: str = ""
    calibrated: bool = False


FP32 = Precision("fp32", 4, "peak_tflops_fp32_per_core")
FP16 = Precision("fp16", 2, "peak_tflops_fp16_per_core", "fp16_body", rounds_floats=True,
                 body_holds="float16 tensor")
INT8 = Precision("int8", 1, "peak_tops_int8_per_core", "int8_body", quantizes=True,
                 body_holds="quantized operator and no 8-bit integer weight cast to float", calibrated=True)

#: Every precision's record by name, in decreasing accuracy.
RECORDS: dict[str, Precision] = {p.name: p for p in (FP32, FP16, INT8)}
#: The precisions a block can run at, in decreasing accuracy.
PRECISIONS: tuple[str, ...] = tuple(RECORDS)
#: The precisions whose outputs cannot match FP32 to 1e-4: they round floats or quantize.
LOWER_PRECISIONS: tuple[str, ...] = tuple(p.name for p in RECORDS.values() if p.rounds_floats or p.quantizes)
#: What a block runs at when nothing says otherwise (and what files without the attribute mean).
DEFAULT_PRECISION = FP32.name
#: Bytes of one feature-map or weight element at each precision.
ELEMENT_BYTES: dict[str, int] = {p.name: p.element_bytes for p in RECORDS.values()}
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
    return DEFAULT_PRECISION if precision == INT8.name and op_type not in INT8_OPS else precision


def record(precision: str) -> Precision:
    """The record of ``precision`` (a name :func:`check_precision` accepts)."""
    return RECORDS[check_precision(precision)]


def check_precision(precision: object, what: str = "precision") -> str:
    """``precision`` when it is one of :data:`PRECISIONS`; an :class:`OnnxMluError` otherwise."""
    if precision not in PRECISIONS:
        raise OnnxMluError(f"{what} must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    return str(precision)

