"""Models too large for one protobuf message: size accounting and shape inference.

protobuf cannot serialize a message of 2 GB or more, and onnx's shape inference and checker
serialize the model they are given. A model whose weights come from external data can still
be *held* in memory above that size (``onnx.load`` fills the tensors in), so the pipeline
asks :func:`tensor_payload_bytes` (cheap: nothing is serialized) before doing anything that
serializes, and runs shape inference on a *skeleton* of large models: the same graph with
every large initializer turned into a typed graph input. Inference needs the weights' types
and shapes, never their values, so the skeleton gives the same value infos at a fraction
of the size.
"""

from __future__ import annotations

from typing import Callable, Iterable

import onnx

#: Initializers at least this large become graph inputs in the skeleton; smaller ones stay
#: (shape tensors such as a Reshape's target must keep their values for inference). Every
#: model is inferred on its skeleton, so the bound is low: a 3x3x64x64 conv weight is 147 KB.
SKELETON_MIN_TENSOR_BYTES = 2**14


def tensor_payload_bytes(model: onnx.ModelProto) -> int:
    """Bytes held by the model's tensors (initializers, tensor attributes, subgraphs included)."""
    return sum(tensor_bytes(t) for t in all_tensors(model.graph))


def all_tensors(graph: onnx.GraphProto) -> Iterable[onnx.TensorProto]:
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR:
                yield attr.t
            yield from attr.tensors
            subgraphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
            for sub in subgraphs:
                yield from all_tensors(sub)


def tensor_bytes(t: onnx.TensorProto) -> int:
    """The payload of one tensor as stored (raw bytes, or 8 bytes per typed-field element)."""
    fields = (t.float_data, t.int32_data, t.int64_data, t.double_data, t.uint64_data)
    return len(t.raw_data) + sum(8 * len(f) for f in fields) + sum(len(s) for s in t.string_data)


def skeleton(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` without its large initializers, each replaced by a typed graph input."""
    out = onnx.ModelProto()
    for name in ("ir_version", "producer_name", "producer_version", "domain", "model_version"):
        setattr(out, name, getattr(model, name))
    out.opset_import.extend(model.opset_import)
    out.functions.extend(model.functions)
    graph, light = model.graph, out.graph
    light.name = graph.name
    light.node.extend(graph.node)
    light.input.extend(graph.input)
    light.output.extend(graph.output)
    light.value_info.extend(graph.value_info)
    declared = {i.name for i in graph.input}
    for t in graph.initializer:
        if tensor_bytes(t) < SKELETON_MIN_TENSOR_BYTES:
            light.initializer.append(t)
        elif t.name not in declared:
            light.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    return out


def infer_on_skeleton(model: onnx.ModelProto,
                      infer: Callable[[onnx.ModelProto], onnx.ModelProto]) -> onnx.ModelProto:
    """Run ``infer`` on the skeleton and copy the inferred types into ``model`` (in place:
    copying the model would double the memory of the weights); returns ``model``.

    The skeleton keeps every node in order, so subgraphs (If/Loop bodies) pair up by position
    and get their inferred value infos too."""
    inferred = infer(skeleton(model)).graph
    _copy_types(model.graph, inferred)
    for sub, done in zip(_nested_graphs(model.graph), _nested_graphs(inferred)):
        _copy_types(sub, done)
    return model


def _copy_types(graph: onnx.GraphProto, inferred: onnx.GraphProto) -> None:
    del graph.value_info[:]
    graph.value_info.extend(inferred.value_info)
    typed = {o.name: o for o in inferred.output}
    for o in graph.output:
        if o.name in typed:
            o.type.CopyFrom(typed[o.name].type)


def _nested_graphs(graph: onnx.GraphProto) -> Iterable[onnx.GraphProto]:
    """Every subgraph below ``graph``, depth first in node and attribute order."""
    for node in graph.node:
        for attr in node.attribute:
            subs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
            for sub in subs:
                yield sub
                yield from _nested_graphs(sub)
