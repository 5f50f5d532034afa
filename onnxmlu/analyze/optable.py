"""The simulated accelerator's op set: which ONNX nodes may run inside an MLUFusionBlock.

One table, data not scattered ifs: ``OP_KINDS`` maps an op type of the standard domain to
its layer kind (which the performance model prices). A few ops need more than their type
to be accepted; ``support_reason`` gives the reason a node stays on the host, or None.

What stays on the host, and why:

* what a rewriter of :data:`onnxmlu.rewrite.REWRITERS` rewrites (Gemm, LSTM/GRU/RNN,
  InstanceNormalization, ...): it is turned into primitives first, so what is left of it the
  rewriter refused, with its reason. No such op is in the table, save BatchNormalization, whose
  normalization-only form (scale 1, B 0) the accelerator runs while a weighted one is rewritten
  (``_batchnorm_reason``); tests/test_registries.py keeps the table and the rewriters agreeing;
* control flow (If/Loop): a block is straight-line code. A ``Scan`` whose body holds only ops
  of this table (the recurrence over time of an LSTM/GRU/RNN of symbolic length) is the
  accelerator running its cell block once per step, and runs in a block;
* data-dependent selections (NonZero, TopK, NonMaxSuppression, Unique, Compress): the
  accelerator has no unit for them.

Shape arithmetic (Shape, Size, ConstantOfShape, Range) runs inside blocks: on a symbolic dim it
must stay computed at run time (pins never fold it, docs/architecture.md "Dynamic shapes"), and
a block whose output size follows from it hands the output on at the size the run gives.
* quantized operators outside the standard domain (com.microsoft's QLinearAdd, QGemm,
  QLinearGlobalAveragePool, DynamicQuantizeLSTM, ...), and standard ones whose integers are not
  8-bit (a QuantizeLinear to INT16, INT4 or FP8): the accelerator's quantized units are INT8.
  A 4-bit DequantizeLinear of a constant and com.microsoft's MatMulNBits are rewritten first
  (:mod:`onnxmlu.rewrite.dq4`, :mod:`onnxmlu.rewrite.matmulnbits`: the packed bytes
  dequantized in the body), so what is left of them here the rewriters refused;
  The standard INT8 ones -- QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear,
  QLinearConv, QLinearMatMul, ConvInteger, MatMulInteger -- run inside INT8 blocks with the
  model's own quantization parameters (docs/precision.md, "Models that arrive quantized");
* onnxruntime's own operators in the standard domain below the opset ONNX adopted them at
  (:mod:`onnxmlu.frontend.extensions`);
* random ops, string ops, sequences and anything outside the standard domain.
"""

from __future__ import annotations

import numpy as np
import onnx

from onnxmlu.frontend.extensions import extension_reason
from onnxmlu.ir import GraphIndex
from onnxmlu.ir import is_default_domain, subgraph, subgraphs

OP_KINDS: dict[str, str] = {
    # convolution and matrix products ([DLFusion] Eq. 1-2)
    "Conv": "conv",
    "ConvTranspose": "conv",
    "MatMul": "fc",
    # normalization: BatchNormalization only in its normalization-only form (scale=1, B=0)
    "BatchNormalization": "norm",
    "LRN": "norm",
    "LayerNormalization": "norm",
    "GroupNormalization": "norm",
    "MeanVarianceNormalization": "norm",
    # a contraction priced like MatMul: 2 ops per point of its whole index space
    "Einsum": "fc",
    # a recurrence over time: its body's matrix products and element-wise ops once per step
    "Scan": "fc",
    # element-wise arithmetic and activations
    **{op: "eltwise" for op in (
        "Add", "Sub", "Mul", "Div", "Max", "Min", "Pow", "Sqrt", "Reciprocal", "Neg", "Abs",
        "Exp", "Log", "Erf", "Relu", "LeakyRelu", "PRelu", "Sigmoid", "HardSigmoid",
        "HardSwish", "Tanh", "Clip", "Elu", "Selu", "Celu", "Gelu", "Softplus", "Softsign",
        "ThresholdedRelu", "Mish", "Identity", "Where", "Cast", "Equal", "Greater", "Less",
        "Not", "And", "Or", "Xor", "GreaterOrEqual", "LessOrEqual", "Sum", "Mean", "Floor", "Ceil",
        "Round", "Sign", "Sin", "Cos", "Mod", "CastLike", "Dropout", "IsNaN", "IsInf",
    )},
    # pooling
    "MaxPool": "pool",
    "AveragePool": "pool",
    "GlobalAveragePool": "global_pool",
    "GlobalMaxPool": "global_pool",
    # reductions (priced like global pooling: one op per input element)
    **{op: "global_pool" for op in ("ReduceMean", "ReduceMax", "ReduceMin", "ReduceSum", "ReduceProd",
                                     "ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSumExp",
                                     "ArgMax", "ArgMin")},
    # softmax family
    "Softmax": "softmax",
    "LogSoftmax": "softmax",
    "Hardmax": "softmax",
    # quantized operators as onnxruntime's quantization tool writes them (docs/precision.md):
    # the integer convolutions and matrix products, and the conversions, one op per element
    "QLinearConv": "conv",
    "ConvInteger": "conv",
    "QLinearMatMul": "fc",
    "MatMulInteger": "fc",
    "QuantizeLinear": "eltwise",
    "DequantizeLinear": "eltwise",
    "DynamicQuantizeLinear": "eltwise",
    # data movement
    **{op: "data" for op in (
        "Concat", "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Slice", "Split",
        "Pad", "Gather", "Expand", "Tile", "Resize", "Upsample", "DepthToSpace", "SpaceToDepth",
        "GatherElements", "ScatterElements", "Trilu", "GatherND", "ScatterND", "TensorScatter",
        # shape arithmetic: computed from a symbolic dim at run time (module docstring)
        "Shape", "Size", "ConstantOfShape", "Range",
    )},
}

#: Operators that compute on quantized values: a layer made of one arrives quantized.
QUANTIZED_OPS: frozenset[str] = frozenset({
    "QLinearConv", "ConvInteger", "QLinearMatMul", "MatMulInteger",
    "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear",
})
#: The input holding a convolution's weight (its sizes set the work).
CONV_WEIGHT_INPUT: dict[str, int] = {"Conv": 1, "ConvTranspose": 1, "ConvInteger": 1, "QLinearConv": 3}
#: Matrix products: their work is set by the first input's last dim.
MATMUL_OPS: frozenset[str] = frozenset({"MatMul", "QLinearMatMul", "MatMulInteger"})
#: Integer types of the accelerator's quantized units (INT32: a bias a DequantizeLinear reads).
_INT8_TYPES = frozenset({onnx.TensorProto.INT8, onnx.TensorProto.UINT8})
_STRING = onnx.TensorProto.STRING


def support_reason(node: onnx.NodeProto, index: GraphIndex, opset: int | None = None) -> str | None:
    """Why ``node`` must stay on the host, or None if the accelerator runs it (``opset``: the
    model's standard opset, to tell onnxruntime's own operators from ONNX's)."""
    if not is_default_domain(node.domain):
        return f"op {node.domain}::{node.op_type} is outside the standard domain"
    if node.op_type not in OP_KINDS:
        return f"{node.op_type} is not in the accelerator's op table"
    if any(subgraphs(a) for a in node.attribute):
        return _scan_reason(node) if node.op_type == "Scan" else "nodes with subgraphs run on the host"
    extension = extension_reason(node, opset)
    if extension is not None:
        return extension
    return _tensor_reason(node, index) or _special_reason(node, index)


def _scan_reason(node: onnx.NodeProto) -> str | None:
    """A Scan runs in a block when its body is straight-line code of the accelerator's ops."""
    body = subgraph(node, "body")
    if body is None:  # the checker refuses such a Scan; no block repeats what is not there
        return "it has no body graph"
    for inner in body.node:
        if not is_default_domain(inner.domain) or inner.op_type not in OP_KINDS or inner.op_type == "Scan" \
                or any(subgraphs(a) for a in inner.attribute):
            return f"its body holds {inner.domain or 'ai.onnx'}::{inner.op_type}, which the accelerator cannot repeat"
    return None


def _special_reason(node: onnx.NodeProto, index: GraphIndex) -> str | None:
    special = _SPECIAL_CHECKS.get(node.op_type)
    return special(node, index) if special else None


def _tensor_reason(node: onnx.NodeProto, index: GraphIndex) -> str | None:
    """A block boundary needs the type of every tensor that may cross it, and the rank of
    every tensor a block produces (the library allocates outputs from the declared shape)."""
    for role, names in (("input", node.input), ("output", node.output)):
        for name in names:
            reason = _boundary_reason(role, name, index) if name else None
            if reason is not None:
                return reason
    return None


def _boundary_reason(role: str, name: str, index: GraphIndex) -> str | None:
    elem = index.elem_type(name)
    if elem == _STRING:
        return f"string tensor {name!r} cannot cross an accelerator block"
    if not elem and role == "input":
        return f"input {name!r} has no known type ({_producer_text(index, name)})"
    if not elem:
        return f"output {name!r} has no inferred type ({index.sizing_hint})"
    if role == "output" and index.shape(name) is None:
        return f"output {name!r} has an unknown rank ({index.sizing_hint})"
    return None


def _producer_text(index: GraphIndex, name: str) -> str:
    producer = index.producer.get(name)
    if producer is None:
        return "a model input without a type"
    node = index.graph.node[producer]
    return f"its producer {node.name or node.op_type!r} is {node.domain or 'ai.onnx'}::{node.op_type}"


#: The B operand of each MatMul op (A is input 0).
MATMUL_B_INPUT = {"MatMul": 1, "MatMulInteger": 1, "QLinearMatMul": 3}


def _known(dims, axis: int) -> int | None:
    """``dims[axis]`` when it is a size, else None."""
    if dims is None or not -len(dims) <= axis < len(dims):
        return None
    d = dims[axis]
    return d if isinstance(d, int) and d > 0 else None


def matmul_dims(node: onnx.NodeProto, index: GraphIndex) -> tuple[int | None, int | None]:
    """A MatMul's contracted length K and output width N, each read from either side that
    knows it: K is A's last dim and B's second to last (B's only one when B is 1-D), N the
    output's last dim and B's last. Inference can lose one side -- a broadcast that cannot hold
    at the pricing shape, as in the ``If`` branch of a merged decoder that the pins never take
    (its attention mask spans the cached length, its keys do not) -- while the other stays."""
    def dims(name):
        return index.concrete_shape(name) or index.shape(name)

    a, b, y = dims(node.input[0]), dims(node.input[MATMUL_B_INPUT[node.op_type]]), dims(node.output[0])
    b_rank = len(b) if b is not None else 0
    k = _known(a, -1) or _known(b, -2 if b_rank >= 2 else 0)
    n = _known(y, -1) if b_rank < 2 else _known(y, -1) or _known(b, -1)
    return k, n


def _sizing_reason(node: onnx.NodeProto, index: GraphIndex) -> str | None:
    """Conv and MatMul need the dims that set their work per sample ([DLFusion] Eq. 1-2): a
    symbolic or unknown one (beyond the batch) would make the plan price 1x1 images. A MatMul
    needs its K and N (:func:`matmul_dims`)."""
    if node.op_type in MATMUL_OPS:
        k, n = matmul_dims(node, index)
        needed = [("input", node.input[0], -1)] if k is None else []
        needed += [("output", node.output[0], -1)] if n is None else []
    else:
        needed = [("output", node.output[0], 1), ("weight", node.input[CONV_WEIGHT_INPUT[node.op_type]], 0)]
    for role, name, first in needed:
        dims = index.concrete_shape(name) or index.shape(name)
        if dims is None or not all(isinstance(d, int) and d > 0 for d in dims[first:]):
            return f"cannot size it: its {role} {name!r} has dims {dims_text(dims)} ({index.sizing_hint})"
    return None


def dims_text(dims) -> str:
    return "of unknown rank" if dims is None else "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def _batchnorm_reason(node: onnx.NodeProto, index: GraphIndex) -> str | None:
    if len([o for o in node.output if o]) > 1:
        return "BatchNormalization in training mode (running statistics are outputs)"
    for attr in node.attribute:
        if attr.name == "training_mode" and attr.i:
            return "BatchNormalization with training_mode=1"
    scale, bias = (index.constant(n) for n in node.input[1:3])
    if scale is None or bias is None:
        return "BatchNormalization with non-constant scale or B"
    if not (np.all(scale == 1) and np.all(bias == 0)):
        return "weighted BatchNormalization (rewrite it first: scale and B must be 1 and 0)"
    return None


def _maxpool_reason(node: onnx.NodeProto, index: GraphIndex) -> str | None:
    if len([o for o in node.output if o]) > 1:
        return "MaxPool with an Indices output"
    return None


def _dropout_reason(node: onnx.NodeProto, index: GraphIndex) -> str | None:
    if len([o for o in node.output if o]) > 1:
        return "Dropout with a mask output"
    return None


def _einsum_reason(node: onnx.NodeProto, index: GraphIndex) -> str | None:
    for name in node.input:
        dims = index.concrete_shape(name) or index.shape(name)
        if dims is None or not all(isinstance(d, int) and d > 0 for d in dims):
            return f"cannot size it: its input {name!r} has dims {dims_text(dims)} ({index.sizing_hint})"
    return None


def _quantized_type_reason(node: onnx.NodeProto, index: GraphIndex) -> str | None:
    """QuantizeLinear/DequantizeLinear of other integers (INT16, INT4, FP8) stay on the host;
    a DequantizeLinear of INT32 is a quantized bias and runs in the block."""
    name = node.output[0] if node.op_type == "QuantizeLinear" else node.input[0]
    allowed = _INT8_TYPES | ({onnx.TensorProto.INT32} if node.op_type == "DequantizeLinear" else set())
    elem = index.elem_type(name)
    if elem not in allowed:
        type_name = onnx.TensorProto.DataType.Name(elem) if elem else "an unknown type"
        return f"{node.op_type} of {type_name}: the accelerator's quantized units are INT8"
    return None


_SPECIAL_CHECKS = {
    "BatchNormalization": _batchnorm_reason,
    "MaxPool": _maxpool_reason,
    "Conv": _sizing_reason,
    "ConvTranspose": _sizing_reason,
    "MatMul": _sizing_reason,
    "Einsum": _einsum_reason,
    "Dropout": _dropout_reason,
    "QLinearConv": _sizing_reason,
    "ConvInteger": _sizing_reason,
    "QLinearMatMul": _sizing_reason,
    "MatMulInteger": _sizing_reason,
    "QuantizeLinear": _quantized_type_reason,
    "DequantizeLinear": _quantized_type_reason,
}
