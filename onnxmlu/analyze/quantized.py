"""Models that arrive quantized: which layers compute in INT8, and which constants ride along.

What onnxruntime's quantization tool writes (``quantize_static`` in QDQ or QOperator format,
``quantize_dynamic``), and exporters that store INT8 weights, run inside INT8 blocks with the
model's own quantization parameters (docs/precision.md, "Models that arrive quantized"). Two
facts analysis needs for that:

* **Weight dequantizations.** A ``DequantizeLinear`` of a stored constant (INT8 weights, an
  INT32 bias) computes a constant, and so does a ``Cast`` of a stored 8-bit integer constant
  to float (how some exporters write INT8 weights, a scale ``Mul`` after it) and a
  ``QuantizeLinear`` of a stored float weight (a QDQ export that keeps FP32 weights and
  quantizes them in the graph), with the constant-only nodes that follow (the
  ``DequantizeLinear`` after such a ``QuantizeLinear``, a ``Transpose`` the Gemm rewrite added),
  and the constant-only nodes read by nothing else (the ``Cast`` widening a float16 scale that
  the 4-bit ``DequantizeLinear`` rewrite keeps stored as float16). Folding would store
  FP32 weights (normalization never folds them); on the host they would send FP32 weights
  into the block. So such an expression is *carried* into the block of the first layer that
  reads it: placed right before that layer in the node order, owned by its block, and its
  INT8 constants are copied into the body bit for bit. It is not a layer of its own: a plan
  could then cut it off from its reader (a block of constants alone reads nothing) and the
  model would price a layer the accelerator does not run; the reader counts the weights as
  its weight bytes. An expression whose first reader runs on the host stays on the host.
* **Layers that arrive quantized** (``Layer.quantized``): a node of ``QUANTIZED_OPS``; the
  float operator of a QDQ unit (every non-constant input made by a ``DequantizeLinear`` and
  every output read only by ``QuantizeLinear`` nodes -- how onnxruntime itself delimits QDQ
  node units); an operator whose every non-constant input is an 8-bit integer tensor made by
  such a layer or by a quantized operator left on the host (a ``MaxPool`` between two
  ``QLinearConv``, a ``Flatten`` after com.microsoft's ``QLinearGlobalAveragePool``); a layer
  that reads INT8 weights through a carried dequantization. Of these, the quantized
  operators and the readers of carried dequantizations are *quantized arithmetic*
  (``Layer.int8_arithmetic``, :func:`is_int8_arithmetic`): the body of any block holding one
  holds a quantized operator or an INT8 weight cast to float, so it is an INT8 block.
* **Block-quantized weights** (:func:`stored_weight_bytes`): a weight dequantized from values
  packed below 8 bits (what the ``MatMulNBits`` and 4-bit ``DequantizeLinear`` rewrites unpack
  in the body, :mod:`onnxmlu.rewrite.matmulnbits`) or with a scale or zero point per block of a
  row (``MatMulNBits``, ``DequantizeLinear`` with ``block_size``) is read from DRAM as the file
  stores it: ``bits / 8`` bytes a value plus the per-block scales and zero points, i.e. for
  ``W [K, N]`` in blocks of ``b``: ``K N bits / 8 + (K / b) N (4 + bits / 8)`` bytes with
  float32 scales and packed zero points. Its reader counts those bytes as weights that keep
  their size at every precision (``Layer.fixed_bytes``); the accelerator expands the values on
  chip and computes on its INT8 path (the reader is quantized arithmetic).
"""

from __future__ import annotations

import math
from typing import Callable, Iterable

import onnx

from onnxmlu.analyze.optable import QUANTIZED_OPS
from onnxmlu.ir import is_default_domain
from onnxmlu.ir.index import GraphIndex, tensor_nbytes

INT8_TYPES = frozenset({onnx.TensorProto.INT8, onnx.TensorProto.UINT8})
_FLOATS = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16,
                     onnx.TensorProto.DOUBLE})


def weight_expressions(graph: onnx.GraphProto, index: GraphIndex, constant_nodes: Iterable[int]) -> set[int]:
    """Among ``constant_nodes`` (accelerator nodes computing constants, in topological
    order): those that (de)quantize stored weights, or compute from what they give, and those
    whose every output is read only by such nodes (a float16 scale widened in the graph for
    the dequantization: left out, it would run on the host and send the block its widened
    copy, which pricing could not trace to the stored bytes)."""
    constant_nodes = list(constant_nodes)
    found: set[int] = set()
    derived: set[str] = set()
    for i in constant_nodes:
        if _quantizes_weight(graph.node[i], index) or any(n in derived for n in index.inputs[i]):
            found.add(i)
            derived.update(index.outputs[i])
    for i in reversed(constant_nodes):  # readers first: a chain of such nodes joins from its end
        if i not in found and _read_only_by(index, i, found):
            found.add(i)
    return found


def _read_only_by(index: GraphIndex, i: int, nodes: set[int]) -> bool:
    """Whether node ``i``'s outputs are read, and only by ``nodes`` (a graph output is read
    by the caller)."""
    outputs = [o for o in index.outputs[i] if o]
    readers = [c for o in outputs for c in index.consumers.get(o, [])]
    return bool(readers) and all(c in nodes for c in readers) and not any(o in index.graph_outputs for o in outputs)


def _quantizes_weight(node: onnx.NodeProto, index: GraphIndex) -> bool:
    if not is_default_domain(node.domain):
        return False
    if node.op_type in ("DequantizeLinear", "QuantizeLinear"):
        return True
    if node.op_type != "Cast" or index.elem_type(node.input[0]) not in INT8_TYPES:
        return False
    return any(a.name == "to" and a.i in _FLOATS for a in node.attribute)


def carry_weight_expressions(order: list[int], index: GraphIndex, expressions: set[int],
                             is_layer: Callable[[int], bool]) -> tuple[list[int], dict[int, int], list[int]]:
    """``order`` with every weight expression moved right before the first node that reads it
    (directly or through another one); the carried ones (node -> the layer node that carries
    it); and the left ones (first read by a host node, or by nothing: they stay on the host)."""
    placed: set[int] = set()
    new_order: list[int] = []
    carried: dict[int, int] = {}
    left: list[int] = []
    for i in order:
        if i in expressions:
            continue
        for j in _chain(i, index, expressions, placed):
            new_order.append(j)
            if is_layer(i):
                carried[j] = i
            else:
                left.append(j)
        new_order.append(i)
    rest = [i for i in order if i in expressions and i not in placed]  # graph outputs, unread
    return new_order + rest, carried, left + rest


def _chain(reader: int, index: GraphIndex, expressions: set[int], placed: set[int]) -> list[int]:
    """The weight expressions ``reader`` needs that are not placed yet, producers first
    (marked placed)."""
    chain: list[int] = []

    def visit(i: int) -> None:
        for name in index.inputs[i]:
            producer = index.producer.get(name)
            if producer in expressions and producer not in placed:
                placed.add(producer)
                visit(producer)
                chain.append(producer)

    visit(reader)
    return chain


def arrives_quantized(node: onnx.NodeProto, index: GraphIndex, carried: set[str], quantized: set[str]) -> bool:
    """Whether the model computes ``node`` (an accelerator node) in INT8 (see the module
    docstring); ``carried`` names the outputs of carried weight dequantizations, ``quantized``
    the outputs of the layers before it that arrive quantized (an 8-bit model input cast to
    float, an image, is not a quantized value)."""
    if node.op_type in QUANTIZED_OPS:
        return True
    dynamic = [n for n in node.input if n and not index.is_constant(n)]
    if any(n in carried for n in dynamic):
        return True
    if dynamic and all(n in quantized and index.elem_type(n) in INT8_TYPES for n in dynamic):
        return True
    return _in_qdq_unit(node, index, dynamic)


def is_int8_arithmetic(node: onnx.NodeProto, carried: set[str]) -> bool:
    """Whether ``node`` (an accelerator node arriving quantized) is quantized arithmetic itself,
    whatever block it lands in: a standard quantized operator (``QUANTIZED_OPS``), or a reader
    of a weight dequantization carried into its block (``carried``: their outputs), which
    always rides with it. The other layers arriving quantized (a QDQ unit's float operator, an
    operator on 8-bit values) depend on neighbours a plan may put in another block."""
    return node.op_type in QUANTIZED_OPS or any(name in carried for name in node.input)


def is_quantized_operator(node: onnx.NodeProto) -> bool:
    """A quantized operator of any domain: the standard ones, and contrib ones named as
    onnxruntime names them (``QLinearAdd``, ``QGemm``, ``QAttention``, ``DynamicQuantizeLSTM``)."""
    op = node.op_type
    return op in QUANTIZED_OPS or "Quantize" in op or (len(op) > 1 and op[0] == "Q" and op[1].isupper())


def _in_qdq_unit(node: onnx.NodeProto, index: GraphIndex, dynamic: list[str]) -> bool:
    nodes = index.graph.node
    if not dynamic or not all(_producer_op(index, n) == "DequantizeLinear" for n in dynamic):
        return False
    outputs = [o for o in node.output if o]
    return all(o not in index.graph_outputs and index.consumers.get(o)
               and all(nodes[c].op_type == "QuantizeLinear" for c in index.consumers[o]) for o in outputs)


def _producer_op(index: GraphIndex, name: str) -> str | None:
    producer = index.producer.get(name)
    return None if producer is None else index.graph.node[producer].op_type


def stored_weight_bytes(index: GraphIndex, carried: Iterable[int]) -> dict[str, int]:
    """The bytes the file stores for each block-quantized weight among the outputs of the
    ``carried`` weight expressions (the module docstring's "Block-quantized weights"): every
    8-bit integer and float constant the expression reads, at its stored width (scalars --
    an unpacking radix, a default zero point -- are immediates, not traffic). Weights
    quantized per tensor or per axis are not in the map: their reader counts them at one
    byte a value, as before, their parameters being a few bytes per row at most."""
    carried = set(carried)
    leaves: dict[str, frozenset[str]] = {}

    def leaves_of(name: str) -> frozenset[str]:
        if name not in leaves:
            producer = index.producer.get(name)
            if producer in carried:
                leaves[name] = frozenset().union(*(leaves_of(n) for n in index.inputs[producer] if n))
            else:
                leaves[name] = frozenset({name}) if index.is_constant(name) else frozenset()
        return leaves[name]

    found: dict[str, int] = {}
    for i in sorted(carried):
        for name in index.outputs[i]:
            stored = [n for n in leaves_of(name) if _stored_param(index, n)]
            if stored and _block_quantized(index, name, stored):
                found[name] = sum(tensor_nbytes(index.elem_type(n), index.static_shape(n) or [1]) for n in stored)
    return found


def _stored_param(index: GraphIndex, name: str) -> bool:
    """An 8-bit integer or float constant of more than one value."""
    shape = index.static_shape(name) or []
    return index.elem_type(name) in INT8_TYPES | _FLOATS and math.prod(shape) > 1


def _block_quantized(index: GraphIndex, name: str, stored: list[str]) -> bool:
    """Whether the weight ``name`` computed from the constants ``stored`` is quantized in
    blocks: its integers are packed below 8 bits (they hold fewer values than the weight has),
    or a parameter beside the largest constant (the values) varies along two axes (one scale
    or zero point per block of a row, not one per row)."""
    values = max(stored, key=lambda n: math.prod(index.static_shape(n) or [1]))
    integers = sum(math.prod(index.static_shape(n) or [1]) for n in stored if index.elem_type(n) in INT8_TYPES)
    if integers and integers < math.prod(index.static_shape(name) or [0]):
        return True
    return any(sum(d > 1 for d in index.static_shape(n) or []) >= 2 for n in stored if n != values)
