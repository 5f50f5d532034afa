"""INT8 blocks: a block body in QDQ form, made by onnxruntime's own static quantizer.

:func:`to_int8` hands the FP32 body and samples of its inputs to
``onnxruntime.quantization.quantize_static`` with the accelerator's scheme:

* weights: INT8, per output channel, symmetric (zero point 0) -- ``per_channel=True``,
  ``weight_type=QInt8``, ``WeightSymmetric``; biases INT32 at ``input scale x weight scale``
  (the quantizer's default);
* activations: one scale per tensor, calibrated on the samples with onnxruntime's MinMax,
  Entropy or Percentile calibrator. By default signed INT8, symmetric (zero point 0):
  the MLU's INT8 units multiply signed 8-bit operands scaled without an offset, so that is
  what runs on the part. It costs a ReLU output its sign bit (7 bits of magnitude);
  ``activations="uint8"`` gives the asymmetric UINT8 alternative for comparison.

In the fused model the body's ``QuantizeLinear``/``DequantizeLinear`` pairs are the numerics:
onnxruntime runs the body as any other model (at its usual optimization level it fuses
``DQ -> Conv -> Q`` into integer kernels, as a quantized model run by itself would be).
Operators the quantizer has no QDQ form for stay FP32 between a DQ and a Q
(:func:`float_nodes` lists them). The body's inputs and outputs keep their names and FP32
types, so the fused graph around the block does not change.

A per-channel constant of an element-wise layer (a normalization's scale ``Mul(x, a)`` and shift
``Add(y, b)`` with ``a, b`` of shape ``[C, 1, ..., 1]``, what BatchNormalization becomes when it
cannot fold into its producer) is quantized **per channel** (:func:`per_channel_constants`), as
the part quantizes any layer's parameters: the quantizer's default would give the whole vector
one INT8 scale, rounding a small channel's factor to a few codes (or to zero). With one value per
channel, each is its channel's maximum and is stored exactly (code ±127).

A fully connected layer that arrives as ``MatMul(x, W) + b`` (constant ``W``, constant ``b`` of
shape ``[N]``, 2-D ``x``: what the ``gemm`` rewrite makes of a Gemm) is quantized as the one
``Gemm(x, W, b)`` it is (:func:`fc_bias_as_gemm`): the part adds a layer's bias in its INT32
accumulator, where the two-node form would round the product to INT8 before the bias is added
(on ResNet-18's logits that extra rounding costs more than BatchNormalization folding gains).

A block that holds layers arriving quantized (the model's own QDQ pairs, QLinear or Integer
operators) is never re-quantized: :func:`~onnxmlu.collapse.own.mark_own_int8` only records in its body's metadata
that the parameters are the model's own, not calibrated by onnxmlu (:mod:`onnxmlu.collapse.own`).
"""

from __future__ import annotations

import contextlib
import io
import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping, Sequence

import numpy as np
import onnx

from onnxmlu.errors import OnnxMluError, first_line
from onnxmlu.ir import copy_model
from onnxmlu.precision.calibration import SampleReader
from onnxmlu.collapse.own import CALIBRATION_KEY, set_int8_metadata
from onnxmlu.sessions import unshare_dequantized_weights
from onnxmlu.optional import optional_import

__all__ = ["CALIBRATION_KEY", "Int8Options", "float_nodes", "per_channel_constants", "to_int8"]

#: Calibration methods by the name users give (``--calibrator``) -> the member of onnxruntime's
#: ``CalibrationMethod`` (named, not imported: the quantizer loads only when a block quantizes).
CALIBRATION_METHODS: dict[str, str] = {"minmax": "MinMax", "entropy": "Entropy", "percentile": "Percentile"}
#: Activation encodings: (the member of onnxruntime's ``QuantType``, symmetric).
ACTIVATION_TYPES: dict[str, tuple[str, bool]] = {"int8": ("QInt8", True), "uint8": ("QUInt8", False)}
#: The channel axis of the weights whose default axis in onnxruntime's quantizer is not their
#: output channels: a normalization's 1-D scale (default 1: out of range), a MatMul's B of any
#: rank (default 1: right for 2-D only).
PER_CHANNEL_AXES: dict[str, int] = {"BatchNormalization": 0, "InstanceNormalization": 0,
                                    "LayerNormalization": -1, "MatMul": -1}
#: Element-wise operators whose per-channel constant operands get one scale per channel.
ELEMENTWISE_PER_CHANNEL = frozenset({"Mul", "Add", "Sub"})
#: Per-channel QDQ (DequantizeLinear's ``axis``) needs opset 13.
MIN_OPSET = 13
#: The IR version that goes with opset 13 (onnx 1.8); below IR 4 a converted body would need its
#: initializers listed as graph inputs.
_IR_OF_OPSET_13 = 7
_QDQ = frozenset({"QuantizeLinear", "DequantizeLinear"})


@dataclass(frozen=True)
class Int8Options:
    """How an INT8 block is quantized (see the module docstring)."""

    method: str = "minmax"       # "minmax" | "entropy" | "percentile"
    activations: str = "int8"    # "int8" (symmetric, the accelerator's) | "uint8" (asymmetric)
    percentile: float = 99.999   # the percentile calibrator's cut

    def __post_init__(self) -> None:
        if self.method not in CALIBRATION_METHODS:
            raise OnnxMluError(f"calibration method must be one of {', '.join(CALIBRATION_METHODS)}, "
                               f"not {self.method!r}")
        if self.activations not in ACTIVATION_TYPES:
            raise OnnxMluError(f"INT8 activations must be one of {', '.join(ACTIVATION_TYPES)}, "
                               f"not {self.activations!r}")

    def quantize_arguments(self) -> dict:
        """The keyword arguments of ``quantize_static`` for this scheme."""
        quantization = optional_import("onnxruntime.quantization")
        activation_type, symmetric = ACTIVATION_TYPES[self.activations]
        extra = {"WeightSymmetric": True, "ActivationSymmetric": symmetric,
                 "QDQOpTypePerChannelSupportToAxis": dict(PER_CHANNEL_AXES)}
        if self.method == "percentile":
            extra["CalibPercentile"] = self.percentile
        return {"quant_format": quantization.QuantFormat.QDQ, "per_channel": True,
                "weight_type": quantization.QuantType.QInt8,
                "activation_type": getattr(quantization.QuantType, activation_type),
                "calibrate_method": getattr(quantization.CalibrationMethod, CALIBRATION_METHODS[self.method]),
                "extra_options": extra}

    def describe(self) -> str:
        kind = "symmetric INT8" if self.activations == "int8" else "asymmetric UINT8"
        return f"{self.method} calibration, per-channel INT8 weights, {kind} activations"


def to_int8(body: onnx.ModelProto, samples: Sequence[Mapping[str, np.ndarray]],
            int8: Int8Options | None = None, note: str = "", warnings: list[str] | None = None
            ) -> onnx.ModelProto:
    """The QDQ form of ``body`` (a block body, left unchanged), calibrated on ``samples`` of
    its inputs with ``int8`` (default :class:`Int8Options`); the quantizer's own warnings
    (e.g. a bias it could not quantize) go to ``warnings`` instead of the log; ``note`` (where the samples
    came from) is recorded in the body's metadata."""
    int8 = int8 or Int8Options()
    if not samples:
        raise OnnxMluError(f"INT8 block {body.graph.name!r} has no calibration samples")
    feeds = [{v.name: np.asarray(s[v.name]) for v in body.graph.input} for s in samples]
    source = fc_bias_as_gemm(_at_least_opset(body, MIN_OPSET))
    arguments = int8.quantize_arguments()
    overrides = per_channel_constants(source.graph)
    if overrides:
        arguments["extra_options"]["TensorQuantOverrides"] = overrides
    with tempfile.TemporaryDirectory(prefix="onnxmlu-int8-") as folder, _quiet_quantizer(warnings):
        path = Path(folder) / "body.int8.onnx"
        try:
            optional_import("onnxruntime.quantization").quantize_static(source, path, SampleReader(feeds), **arguments)
        except Exception as exc:  # noqa: BLE001 - the quantizer raises many kinds; one line for the user
            raise OnnxMluError(f"onnxruntime's quantizer failed on block {body.graph.name!r}: "
                               f"{first_line(exc)}") from None
        quantized = onnx.load(path.as_posix())
    _check_interface(body, quantized)
    unshare_dequantized_weights(quantized.graph)  # else onnxruntime's exact-INT8 pass fails on it
    _mark(quantized, int8, note)
    return quantized


def fc_bias_as_gemm(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with each ``MatMul(x, W) + b`` fully connected layer as one ``Gemm(x, W, b)``
    (module docstring): the same values, the form whose bias the quantizer keeps in INT32.
    ``model`` itself is left unchanged; returned as it is when there is nothing to merge."""
    graph = model.graph
    constants = {t.name: tuple(t.dims) for t in graph.initializer}
    ranks = {v.name: len(v.type.tensor_type.shape.dim) for v in (*graph.input, *graph.value_info)
             if v.type.tensor_type.HasField("shape")}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    outputs = {o.name for o in graph.output}
    merged: dict[int, onnx.NodeProto] = {}  # id(MatMul) -> its Add
    for node in graph.node:
        if node.op_type != "MatMul" or len(constants.get(node.input[1], ())) != 2 or ranks.get(node.input[0]) != 2:
            continue
        out, width = node.output[0], constants[node.input[1]][1]
        after = readers.get(out, [])
        if out in outputs or len(after) != 1 or after[0].op_type != "Add":
            continue
        bias = next((i for i in after[0].input if i != out), None)
        if bias in constants and constants[bias] == (width,) and list(after[0].input).count(out) == 1:
            merged[id(node)] = after[0]
    if not merged:
        return model
    result = copy_model(model)
    adds = {id(add) for add in merged.values()}
    del result.graph.node[:]
    for node in graph.node:
        if id(node) in adds:
            continue
        add = merged.get(id(node))
        if add is None:
            result.graph.node.append(node)
            continue
        bias = next(i for i in add.input if i != node.output[0])
        result.graph.node.append(onnx.helper.make_node("Gemm", [node.input[0], node.input[1], bias],
                                                       list(add.output), name=node.name or add.name))
    return result


def per_channel_constants(graph: onnx.GraphProto) -> dict[str, list[dict]]:
    """``TensorQuantOverrides`` giving one INT8 scale per channel to the constant operands of
    element-wise layers (:data:`ELEMENTWISE_PER_CHANNEL`) that vary along one axis only, e.g.
    ``[C, 1, 1]`` (module docstring): ``{name: [{"axis": k}]}``."""
    constants = {t.name: tuple(t.dims) for t in graph.initializer}
    overrides = {}
    for node in graph.node:
        if node.op_type not in ELEMENTWISE_PER_CHANNEL:
            continue
        for name in node.input:
            axes = [k for k, d in enumerate(constants.get(name, ())) if d > 1]
            if len(axes) == 1:
                overrides[name] = [{"axis": axes[0]}]
    return overrides


def float_nodes(quantized: onnx.ModelProto) -> list[onnx.NodeProto]:
    """Nodes of a QDQ body that compute in FP32: a floating-point input that no
    ``DequantizeLinear`` produces (the quantizer had no QDQ form for them)."""
    graph = quantized.graph
    dequantized = {o for n in graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    floats = {t.name for t in graph.initializer if t.data_type == onnx.TensorProto.FLOAT}
    floats |= {v.name for v in (*graph.input, *graph.value_info, *graph.output)
               if v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT}
    floats |= {o for n in graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    return [n for n in graph.node if n.op_type not in _QDQ
            and any(i in floats and i not in dequantized for i in n.input if i)]


def _at_least_opset(body: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    current = next((o.version for o in body.opset_import if o.domain in ("", "ai.onnx")), opset)
    if current >= opset:
        return body
    if body.ir_version < _IR_OF_OPSET_13:  # IR < 4 wants initializers listed as inputs: the converter refuses
        body = copy_model(body)
        body.ir_version = _IR_OF_OPSET_13
    try:
        return onnx.version_converter.convert_version(body, opset)
    except Exception as exc:  # noqa: BLE001 - onnx's converter raises several kinds
        raise OnnxMluError(f"INT8 block {body.graph.name!r} is opset {current}; per-channel QDQ needs "
                           f"{opset} and onnx cannot convert it: {first_line(exc)}") from None


def _check_interface(body: onnx.ModelProto, quantized: onnx.ModelProto) -> None:
    """The QDQ body must read and write what the FP32 body did (names and element types)."""
    def signature(values):
        return [(v.name, v.type.tensor_type.elem_type) for v in values]

    for what in ("input", "output"):
        before, after = signature(getattr(body.graph, what)), signature(getattr(quantized.graph, what))
        if before != after:
            raise OnnxMluError(f"onnxruntime's quantizer changed the {what}s of block {body.graph.name!r}: "
                               f"{before} became {after}")


def _mark(quantized: onnx.ModelProto, int8: Int8Options, note: str) -> None:
    set_int8_metadata(quantized, "; ".join(filter(None, [int8.describe(), note])))


class _QuantizerWarnings(logging.Filter):
    """Drops the quantizer's advice to pre-process the model (blocks come from a normalized
    model with every shape inferred) and keeps its other warnings, off the log, in ``kept``."""

    def __init__(self, kept: list[str] | None) -> None:
        super().__init__()
        self.kept = kept

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "pre-process" in message:
            return False
        if self.kept is not None and record.levelno >= logging.WARNING:
            self.kept.append(message)
            return False
        return True


@contextlib.contextmanager
def _quiet_quantizer(kept: list[str] | None = None) -> Iterator[None]:
    """The quantizer without its pre-processing advice, its warnings collected in ``kept`` (when
    given), and without the progress its histogram calibrators (entropy, percentile) print to
    stdout, which ``--json -`` owns."""
    root, quiet = logging.getLogger(), _QuantizerWarnings(kept)
    root.addFilter(quiet)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        root.removeFilter(quiet)
