"""Analysis: the layer table the planner works on.

Every node of the main graph is placed in a topological order (host nodes gathered between
runs of accelerator nodes, see :func:`onnxmlu.ir.topological_order`; host nodes that no layer
precedes before every layer, see :func:`hoisted_host_nodes`). Accelerator nodes
become :class:`~onnxmlu.plan.perf.layers.Layer` records; consecutive ones share a ``segment``.

Operation counts (``ops``; GOPs = ops / 1e9), with N the batch and symbolic dims taken as 1:

* Conv ([DLFusion] Eq. 1): ``2 * N * H_out * W_out * K_h * K_w * C_in/groups * C_out``
* ConvTranspose: ``2 * N * H_in * W_in * K_h * K_w * C_in * C_out/groups`` (per input pixel)
* MatMul (Eq. 2): ``2 * M * K * N``, batch dimensions folded into M
* element-wise and normalization: one op per output element (BN-norm: two, sub and mul)
* pooling: ``K_h * K_w`` per output element; global pooling / reductions: one per input
  element; softmax: five per element (max, sub, exp, sum, div); data movement: zero.

Bytes are the sizes of the dynamic inputs, the outputs and the constant (weight) inputs, at
their stored element types (an unknown type counts as FP32).

Models that arrive quantized (:mod:`onnxmlu.analyze.quantized`): QLinearConv and ConvInteger
are counted as the Conv, QLinearMatMul and MatMulInteger as the MatMul they compute; a layer
that arrives quantized is analysed at INT8 (its FP32 tensors -- a QDQ unit's dequantized
values -- at one byte an element, its integer tensors as stored) with ``quantized`` set. A
weight dequantization is carried into the block of the layer reading it (``Analysis.carried``)
and counted as that layer's weights.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

import onnx

from onnxmlu.diagnostics import Diagnostic
from onnxmlu.ir import opset_version, subgraph
from onnxmlu.analyze.epilogues import epilogue_heads, epilogues_after_producers
from onnxmlu.ir.graphs import kahn_order
from onnxmlu.ir.index import GraphIndex, tensor_nbytes, topological_order
from onnxmlu.ir.weights import WeightStore
from onnxmlu.analyze.optable import CONV_WEIGHT_INPUT, MATMUL_OPS, OP_KINDS, matmul_dims, support_reason
from onnxmlu.analyze.quantized import (
    arrives_quantized,
    carry_weight_expressions,
    is_int8_arithmetic,
    is_quantized_operator,
    stored_weight_bytes,
    weight_expressions,
)
from onnxmlu.plan.perf.layers import Layer


@dataclass
class Analysis:
    """A normalized model, its node order, its layers and why the other nodes stay on the host."""

    model: onnx.ModelProto
    index: GraphIndex
    order: list[int]
    layers: list[Layer]
    layer_nodes: list[int]
    host_reasons: dict[int, str] = field(default_factory=dict)
    #: Weight dequantizations carried into a block: node -> the layer node whose block holds it
    #: (:mod:`onnxmlu.analyze.quantized`). Neither layers nor host nodes.
    carried: dict[int, int] = field(default_factory=dict)
    #: The fed inputs' shapes the layers are priced at (the pins' ``opt``; empty: as declared).
    input_shapes: dict[str, list[int]] = field(default_factory=dict)
    #: With ``--input-shape`` ranges, :func:`onnxmlu.api.inspect`'s fed input shapes at their
    #: min, opt and max (point -> input -> shape: ``fuse``'s profile); None without ranges.
    profile_inputs: dict[str, dict[str, list[int]]] | None = None

    def node(self, layer: Layer) -> onnx.NodeProto:
        return self.model.graph.node[self.layer_nodes[layer.index]]

    def host_nodes(self) -> list[dict[str, str]]:
        """Each node left on the host with its reason, in node order."""
        nodes = self.model.graph.node
        return [{"node": node_label(nodes[i]), "op_type": nodes[i].op_type, "reason": reason}
                for i, reason in sorted(self.host_reasons.items())]

    def host_diagnostics(self) -> list[Diagnostic]:
        return [Diagnostic("analyze", "host", row["node"], row["reason"]) for row in self.host_nodes()]

    @property
    def total_gops(self) -> float:
        return sum(layer.gops for layer in self.layers)

    def to_dict(self) -> dict:
        """The ``inspect`` report (docs/json.md): the layer table and the host nodes."""
        return {"layers": [layer_row(layer) for layer in self.layers], "host_nodes": self.host_nodes(),
                "total_gops": self.total_gops}


def node_label(node: onnx.NodeProto) -> str:
    """A node's name, or ``OP->first output`` for an unnamed one (as the rewriters label it):
    a diagnostic names one node, never every node of an op type."""
    if node.name:
        return node.name
    return f"{node.op_type}->{next((o for o in node.output if o), '?')}"


def layer_row(layer: Layer) -> dict:
    return {"index": layer.index, "name": layer.name, "op_type": layer.op_type, "kind": layer.kind,
            "gops": layer.gops, "in_channels": layer.in_channels, "out_channels": layer.out_channels,
            "out_hw": [layer.out_height, layer.out_width], "input_bytes": layer.input_bytes,
            "output_bytes": layer.output_bytes, "weight_bytes": layer.weight_bytes, "segment": layer.segment}


def analyze(model: onnx.ModelProto, weights: WeightStore | None = None,
            sizes: dict[str, tuple[int, list[int]]] | None = None,
            input_shapes: dict[str, list[int]] | None = None, sizing_hint: str | None = None) -> Analysis:
    """Layer table of a normalized model (see :func:`onnxmlu.frontend.normalize.normalize`);
    ``weights`` holds the data of its marker initializers; ``sizes`` the tensors' concrete
    dims at the pricing shape (:func:`onnxmlu.frontend.shapes.priced_shapes`), which the
    layers are priced at while the graph keeps its symbolic dims. ``sizing_hint``: what the
    reason of a node whose output could not be sized advises (:attr:`GraphIndex.sizing_hint`)."""
    if sizes:
        declare_ranks(model.graph, sizes)
    index = GraphIndex.build(model.graph, weights, sizes)
    if sizing_hint is not None:
        index.sizing_hint = sizing_hint
    nodes = model.graph.node
    opset = opset_version(model)
    host_reasons = {i: r for i, n in enumerate(nodes) if (r := support_reason(n, index, opset))}
    constants = [i for i in constant_expressions(model.graph, index) if i not in host_reasons]
    expressions = weight_expressions(model.graph, index, constants)
    host_reasons.update((i, CONSTANT_REASON) for i in constants if i not in expressions)
    is_layer = lambda i: i not in host_reasons  # noqa: E731
    order = topological_order(model.graph, prefer=is_layer, index=index, early=hoisted_host_nodes(index, is_layer))
    order, carried, left = carry_weight_expressions(order, index, expressions, lambda i: i not in host_reasons)
    host_reasons.update((i, CONSTANT_REASON) for i in left)
    producer_of = epilogue_heads(order, index, lambda i: i not in host_reasons and i not in carried)
    order = epilogues_after_producers(order, producer_of)
    layers, layer_nodes = _layer_table(nodes, index, order, host_reasons, carried, set(producer_of))
    return Analysis(model, index, order, layers, layer_nodes, host_reasons, carried, dict(input_shapes or {}))


def declare_ranks(graph: onnx.GraphProto, sizes: dict[str, tuple[int, list[int]]]) -> int:
    """Give each node output that inference left without a type or a rank the type and rank
    it has at the pricing shape, every dim unknown: a block boundary needs both, and no size
    seen at one shape may be written as if it held at all (the count)."""
    typed = {vi.name: vi for vi in (*graph.value_info, *graph.output)}
    count = 0
    for node in graph.node:
        for name in node.output:
            vi = typed.get(name)
            if not name or name not in sizes or (vi is not None and _typed_with_rank(vi)):
                continue
            elem, dims = sizes[name]
            if vi is None:
                vi = typed[name] = graph.value_info.add(name=name)
            vi.type.tensor_type.elem_type = elem
            shape = vi.type.tensor_type.shape
            shape.Clear()
            for _ in dims:
                shape.dim.add()
            count += 1
    return count


def _typed_with_rank(vi: onnx.ValueInfoProto) -> bool:
    tt = vi.type.tensor_type
    return vi.type.WhichOneof("value") != "tensor_type" or bool(tt.elem_type and tt.HasField("shape"))


def _layer_table(nodes, index: GraphIndex, order: list[int], host_reasons: dict[int, str],
                 carried: dict[int, int], epilogues: set[int]) -> tuple[list[Layer], list[int]]:
    """The layers in ``order`` (segments split by host nodes; carried nodes are neither);
    ``epilogues`` (node indices) follow their producer's layer and are marked so."""
    carried_names = {o for i in carried for o in index.outputs[i]}
    stored = stored_weight_bytes(index, carried)
    quantized_names: set[str] = set()
    layers: list[Layer] = []
    layer_nodes: list[int] = []
    segment, previous_was_host = -1, True
    for i in order:
        if i in carried:
            continue
        if i in host_reasons:
            previous_was_host = True
            if is_quantized_operator(nodes[i]):
                quantized_names.update(index.outputs[i])
            continue
        if previous_was_host:
            segment, previous_was_host = segment + 1, False
        layer = describe_layer(nodes[i], index, len(layers), segment, carried_names, stored)
        if i in epilogues:
            layer = replace(layer, epilogue=True)
        if arrives_quantized(nodes[i], index, carried_names, quantized_names):
            layer = replace(layer.at_precision("int8"), quantized=True,
                            int8_arithmetic=is_int8_arithmetic(nodes[i], carried_names))
            quantized_names.update(index.outputs[i])
        layers.append(layer)
        layer_nodes.append(i)
    return layers, layer_nodes


def hoisted_host_nodes(index: GraphIndex, is_layer) -> Callable[[int], bool]:
    """The host nodes no layer precedes (a weight generator, a constant-only chain, work on an
    input alone): the node order takes them before every layer, so they never cut a run of
    layers in two (the planner's blocks live inside such runs). Host nodes that no layer
    follows (an independent branch) already gather after the runs (Kahn's preference);
    only host nodes on a path between two layers stay between them."""
    producers = [[index.producer[name] for name in names if name in index.producer] for names in index.inputs]
    after_layer = [False] * len(producers)
    for i in kahn_order(producers):  # a cycle leaves nodes out: topological_order reports it
        after_layer[i] = any(is_layer(p) or after_layer[p] for p in producers[i])
    return lambda i: not is_layer(i) and not after_layer[i]


CONSTANT_REASON = ("computes a constant that folding left (a large broadcast, or an op onnxruntime "
                   "could not fold): it runs once on the host")


def constant_expressions(graph: onnx.GraphProto, index: GraphIndex) -> list[int]:
    """Nodes whose every input (subgraph reads included) is a constant or another such node's
    output. A block made of them would read nothing from outside. The node order is
    topological (normalize sorts every graph)."""
    constant = set(index.initializers)
    found = []
    for i in range(len(graph.node)):
        if all(name in constant for name in index.inputs[i]):
            constant.update(index.outputs[i])
            found.append(i)
    return found


def describe_layer(node: onnx.NodeProto, index: GraphIndex, position: int, segment: int,
                   carried: frozenset[str] | set[str] = frozenset(), stored: dict[str, int] | None = None) -> Layer:
    """``node`` as a FP32 layer; tensors named in ``carried`` (dequantized weights carried into
    its block) count as its weights, a block-quantized one at the bytes ``stored`` gives it
    (:func:`~onnxmlu.analyze.quantized.stored_weight_bytes`), which no precision changes."""
    kind = OP_KINDS[node.op_type]
    out_shape = _first_shape(index, node.output)
    is_weight = lambda n: index.is_constant(n) or n in carried  # noqa: E731
    in_name = next((n for n in node.input if n and not is_weight(n)), node.input[0])
    in_shape = index.static_shape(in_name) or out_shape
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    kernel, stride = _window(node, index, attrs)
    groups = int(attrs.get("group", 1))
    inputs = [n for n in node.input if n and not is_weight(n)]
    outputs = [n for n in node.output if n]
    stored = stored or {}
    packed = sum(stored[n] for n in node.input if n in stored)
    weights = [n for n in node.input if n and is_weight(n) and n not in stored]
    body = subgraph(node, "body")  # a Scan's: its cell weights are read every step
    body_weight_bytes = sum(tensor_nbytes(t.data_type, t.dims) for t in body.initializer) if body else 0
    return Layer(
        index=position,
        name=node.name or f"{node.op_type}_{position}",
        op_type=node.op_type,
        kind=kind,  # type: ignore[arg-type]
        ops=float(_op_count(node, index, kind, in_shape, out_shape, kernel, groups)),
        in_channels=_channels(node, in_shape),
        out_channels=_channels(node, out_shape),
        out_height=out_shape[2] if len(out_shape) >= 4 else 1,
        out_width=out_shape[3] if len(out_shape) >= 4 else 1,
        kernel=kernel,
        stride=stride,
        groups=groups,
        input_bytes=_bytes(index, inputs),
        output_bytes=_bytes(index, outputs),
        weight_bytes=_bytes(index, weights) + body_weight_bytes + packed,
        segment=segment,
        fixed_bytes=(_bytes(index, inputs, fixed=True), _bytes(index, outputs, fixed=True),
                     _bytes(index, weights, fixed=True) + packed),
    )


def _first_shape(index: GraphIndex, names: Sequence[str]) -> list[int]:
    for name in names:
        shape = index.static_shape(name) if name else None
        if shape is not None:
            return shape
    return [1]


def _window(node: onnx.NodeProto, index: GraphIndex, attrs: dict) -> tuple[tuple[int, int], tuple[int, int]]:
    if node.op_type in CONV_WEIGHT_INPUT:
        weight = index.static_shape(node.input[CONV_WEIGHT_INPUT[node.op_type]]) or [1, 1, 1, 1]
        kernel = list(attrs.get("kernel_shape", weight[2:])) or [1]
    else:
        kernel = list(attrs.get("kernel_shape", [1, 1]))
    stride = list(attrs.get("strides", [1] * len(kernel)))
    pair = lambda v: (int(v[0]), int(v[1]) if len(v) > 1 else 1)  # noqa: E731 - 1-D convs
    return pair(kernel), pair(stride)


def _op_count(node, index, kind, in_shape, out_shape, kernel, groups) -> float:
    out_elems = float(math.prod(out_shape))  # math.prod: np.prod on short lists dominated analyze
    if node.op_type in CONV_WEIGHT_INPUT and node.op_type != "ConvTranspose":
        weight = index.static_shape(node.input[CONV_WEIGHT_INPUT[node.op_type]]) or [1, 1]
        return 2.0 * out_elems * float(math.prod(weight[1:]))  # N*C_out*HW_out * C_in/g*K
    if node.op_type == "ConvTranspose":
        weight = index.static_shape(node.input[1]) or [1, 1]
        in_elems = float(math.prod(in_shape))  # N*C_in*HW_in
        return 2.0 * in_elems * float(math.prod(weight[1:]))  # * C_out/g * K
    if node.op_type in MATMUL_OPS:
        return _matmul_ops(node, index, in_shape, out_shape)
    if node.op_type == "Einsum":
        return 2.0 * _einsum_points(node, index)
    if node.op_type == "Scan":
        return _scan_ops(node, index)
    if kind == "global_pool":
        return float(math.prod(in_shape))
    if kind == "pool":
        return out_elems * kernel[0] * kernel[1]
    return out_elems * _PER_ELEMENT[kind]


def _matmul_ops(node: onnx.NodeProto, index: GraphIndex, in_shape, out_shape) -> float:
    """``2 * M * K * N``: K the input's last dim, N the output's; one that inference lost is
    read from the other operand (:func:`~onnxmlu.analyze.optable.matmul_dims`)."""
    k_in, n_in = matmul_dims(node, index)
    read = lambda name: index.concrete_shape(name) or index.shape(name) or [None]  # noqa: E731
    in_name = next((n for n in node.input if n and not index.is_constant(n)), node.input[0])
    k = (in_shape[-1] if in_shape else 1) if _is_size(read(in_name)[-1]) or k_in is None else k_in
    width = n_in if not _is_size(read(node.output[0])[-1]) and n_in else 1
    return 2.0 * float(math.prod(out_shape)) * width * k


def _is_size(d) -> bool:
    return isinstance(d, int) and d > 0


def _scan_ops(node: onnx.NodeProto, index: GraphIndex) -> float:
    """A Scan's work: the steps (its first scan input's length along its scan axis, at the
    pricing shape) times one step's work, each body MatMul by a constant [K, N] at
    ``2 * rows * K * N`` (rows: one step's slice over its last dim) and every other body node at
    one op per element of the step's slice."""
    attrs = {a.name: a for a in node.attribute}
    body = subgraph(node, "body")
    scanned = node.input[len(node.input) - attrs["num_scan_inputs"].i]
    axis = attrs["scan_input_axes"].ints[0] if "scan_input_axes" in attrs and attrs["scan_input_axes"].ints else 0
    shape = index.static_shape(scanned) or [1]
    steps = shape[axis] if axis < len(shape) else 1
    step_elems = math.prod(shape) / max(steps, 1)
    rows = step_elems / max(shape[-1], 1)
    weights = {t.name: list(t.dims) for t in body.initializer}
    per_step = 0.0
    for inner in body.node:
        dims = weights.get(inner.input[1]) if inner.op_type == "MatMul" and len(inner.input) > 1 else None
        per_step += 2.0 * rows * math.prod(dims) if dims and len(dims) == 2 else step_elems
    return steps * per_step


def _einsum_points(node: onnx.NodeProto, index: GraphIndex) -> float:
    """The size of an Einsum's index space: the product of the sizes of its distinct letters,
    and of the broadcast dims an ellipsis stands for (aligned from the right)."""
    equation = next(a.s.decode() for a in node.attribute if a.name == "equation").replace(" ", "")
    sizes: dict[str, int] = {}
    for term, name in zip(equation.split("->")[0].split(","), node.input):
        dims = index.static_shape(name) or []
        head, ellipsis, tail = term.partition("...")
        middle = dims[len(head): len(dims) - len(tail)] if ellipsis else []
        sizes.update(zip(head, dims))
        sizes.update(zip(tail, dims[len(dims) - len(tail):]))
        for k, d in enumerate(reversed(middle)):
            sizes[f"...{k}"] = max(sizes.get(f"...{k}", 1), d)
    return float(math.prod(sizes.values()))


_PER_ELEMENT = {"eltwise": 1.0, "norm": 2.0, "softmax": 5.0, "data": 0.0}


def _channels(node: onnx.NodeProto, shape: Sequence[int]) -> int:
    """Channel axis: 1 for NC... tensors, the last (feature) axis for MatMul."""
    if not shape:
        return 1
    if node.op_type in MATMUL_OPS or len(shape) < 2:
        return int(shape[-1])
    return int(shape[1])


def _bytes(index: GraphIndex, names: Sequence[str], fixed: bool = False) -> int:
    """Bytes of the tensors ``names`` (an unknown type counts as FP32); with ``fixed``, only
    of those whose type is known and not FP32, which keep their size at every precision."""
    total = 0
    for name in names:
        shape = index.static_shape(name)
        elem_type = index.elem_type(name)
        if shape is not None and not (fixed and elem_type in (0, onnx.TensorProto.FLOAT)):
            total += tensor_nbytes(elem_type, shape)
    return total
