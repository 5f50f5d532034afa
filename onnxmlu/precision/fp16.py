"""FP16 blocks: a block body rewritten so that it computes what an FP16 accelerator computes.

The numeric model (docs/precision.md): every value that lives in memory is FP16 -- the
weights, the block's inputs as it reads them, every layer's output -- while the arithmetic
inside one layer (a convolution's multiply-accumulates, a softmax's sums) is done in FP32 and
rounded once, to the nearest FP16 (ties to even), when the layer writes its output.

onnxruntime's CPU provider has FP16 kernels for few operators, so the body keeps computing in
FP32 and the rounding is explicit:

* each FP32 initializer is stored as FP16 (half the bytes in the file) and widened back by a
  ``Cast`` to FP32 where it is used -- exact, since every FP16 value is an FP32 value;
* each FP32 body input goes through ``Cast`` to FP16 and back before any layer reads it;
* each FP32 output of a layer goes through the same pair; the layer's own output is renamed,
  the pair's output takes its name, so consumers and the body's outputs are unchanged.

The body's inputs and outputs keep their names and FP32 types, so the fused model around
the block does not change. onnxruntime keeps the pairs at every optimization level (a
narrowing ``Cast`` is never removed as redundant).

Layers that only move or select values (``Reshape``, ``Transpose``, ``Concat``, ``MaxPool``,
``Relu``...) cannot make a value that FP16 does not hold when all their inputs are FP16
values, so their outputs are not rounded again (it would change no bit).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnxmlu.collapse.own import PRECISION_KEY
from onnxmlu.precisions import FP16
from onnxmlu.ir.graphs import nested_graphs

#: Operators whose outputs are FP16 values whenever their inputs are: no rounding after them.
VALUE_PRESERVING_OPS = frozenset({
    "Abs", "Concat", "DepthToSpace", "Expand", "Flatten", "Gather", "GatherElements", "GatherND", "GlobalMaxPool",
    "Identity", "Max", "MaxPool", "Min", "Neg", "ReduceMax", "ReduceMin", "Relu", "Reshape", "Slice",
    "SpaceToDepth", "Split", "Squeeze", "Tile", "TopK", "Transpose", "Unsqueeze", "Where",
})



def to_fp16(body: onnx.ModelProto) -> onnx.ModelProto:
    """Rewrite ``body`` (a block body, changed in place) into its FP16 emulation; returns it."""
    graph = body.graph
    names = _NameSource(graph)
    types = tensor_types(body)
    infos = {v.name: v for v in (*graph.output, *graph.value_info)}
    new_infos: list[onnx.ValueInfoProto] = []
    head = _store_weights_as_fp16(graph, names)
    head += _round_float_inputs(graph, names, new_infos)
    nodes = list(graph.node)  # detached copies once the field is cleared: edited, then added back
    del graph.node[:]
    graph.node.extend(head)
    for node in nodes:
        pairs = []
        for k, name in enumerate(node.output):
            if name and types.get(name) == TensorProto.FLOAT and node.op_type not in VALUE_PRESERVING_OPS:
                raw = names.fresh(f"{name}__fp32")
                node.output[k] = raw
                pairs += _round_pair(raw, name, names, node.name or node.op_type)
                new_infos += _renamed_info(infos.get(name), raw)
        graph.node.append(node)
        graph.node.extend(pairs)
    graph.value_info.extend(new_infos)
    _mark(body, FP16.name)
    return body


def _store_weights_as_fp16(graph: onnx.GraphProto, names: "_NameSource") -> list[onnx.NodeProto]:
    """FP32 initializers become FP16 ones, each widened back to FP32 under its old name."""
    casts = []
    for tensor in graph.initializer:
        if tensor.data_type != TensorProto.FLOAT:
            continue
        name = tensor.name
        half = numpy_helper.to_array(tensor).astype(np.float16)  # round to nearest, ties to even
        tensor.CopyFrom(numpy_helper.from_array(half, names.fresh(f"{name}__fp16")))
        casts.append(helper.make_node("Cast", [tensor.name], [name], name=names.fresh(f"{name}/to_fp32"),
                                      to=TensorProto.FLOAT))
    return casts


def _round_float_inputs(graph: onnx.GraphProto, names: "_NameSource",
                        new_infos: list[onnx.ValueInfoProto]) -> list[onnx.NodeProto]:
    """Each FP32 body input rounded to FP16 before any layer reads it."""
    pairs = []
    for value in graph.input:
        if value.type.tensor_type.elem_type != TensorProto.FLOAT:
            continue
        rounded = names.fresh(f"{value.name}__fp16r")
        _rename_uses(graph, value.name, rounded)
        pairs += _round_pair(value.name, rounded, names, value.name)
        new_infos += _renamed_info(value, rounded)
    return pairs


def _round_pair(source: str, target: str, names: "_NameSource", label: str) -> list[onnx.NodeProto]:
    """``target = float32(float16(source))``: one rounding to FP16."""
    half = names.fresh(f"{source}__fp16")
    return [helper.make_node("Cast", [source], [half], name=names.fresh(f"{label}/to_fp16"), to=TensorProto.FLOAT16),
            helper.make_node("Cast", [half], [target], name=names.fresh(f"{label}/from_fp16"), to=TensorProto.FLOAT)]


def _rename_uses(graph: onnx.GraphProto, old: str, new: str) -> None:
    """Every read of ``old`` in ``graph`` and its subgraphs (outer-scope reads) becomes ``new``."""
    for g in (graph, *nested_graphs(graph)):
        for node in g.node:
            for k, name in enumerate(node.input):
                if name == old:
                    node.input[k] = new


def _renamed_info(info: onnx.ValueInfoProto | None, name: str) -> list[onnx.ValueInfoProto]:
    """A copy of ``info`` (type and shape: symbolic dims survive) named ``name``; [] without one."""
    if info is None:
        return []
    copy = onnx.ValueInfoProto()
    copy.CopyFrom(info)
    copy.name = name
    return [copy]


def tensor_types(body: onnx.ModelProto) -> dict[str, int]:
    """Element type of every tensor of the body's main graph. The body's value infos give
    most; onnx's type inference, run on a weight-free copy, fills in the rest."""
    graph = body.graph
    types = {t.name: t.data_type for t in graph.initializer}
    for v in (*graph.input, *graph.output, *graph.value_info):
        if v.type.tensor_type.elem_type:
            types[v.name] = v.type.tensor_type.elem_type
    if all(o in types for node in graph.node for o in node.output if o):
        return types
    inferred = onnx.shape_inference.infer_shapes(_weight_free(body), strict_mode=False)
    for v in (*inferred.graph.value_info, *inferred.graph.output):
        if v.type.tensor_type.elem_type and v.name not in types:
            types[v.name] = v.type.tensor_type.elem_type
    return types


def _weight_free(body: onnx.ModelProto) -> onnx.ModelProto:
    """``body`` with its large initializers turned into typed inputs: types need no values
    (small ones -- shapes, axes -- stay, inference reads them)."""
    skeleton = onnx.ModelProto(ir_version=body.ir_version)
    skeleton.opset_import.extend(body.opset_import)
    src, graph = body.graph, skeleton.graph
    for field in ("node", "input", "output", "value_info"):
        getattr(graph, field).extend(getattr(src, field))
    for t in src.initializer:
        if t.ByteSize() < 1 << 14:
            graph.initializer.append(t)
        else:
            graph.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    return skeleton


def _mark(body: onnx.ModelProto, precision: str) -> None:
    entry = body.metadata_props.add()
    entry.key, entry.value = PRECISION_KEY, precision
    body.doc_string = f"{body.doc_string} ({precision})".strip()


class _NameSource:
    """Fresh tensor and node names: the wanted name, or it with a numeric suffix."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self.used = {v.name for v in (*graph.input, *graph.output, *graph.value_info)}
        self.used |= {t.name for t in graph.initializer}
        for g in (graph, *nested_graphs(graph)):
            for node in g.node:
                self.used.update(node.input)
                self.used.update(node.output)
                self.used.add(node.name)

    def fresh(self, wanted: str) -> str:
        name, k = wanted, 1
        while name in self.used:
            name, k = f"{wanted}_{k}", k + 1
        self.used.add(name)
        return name
