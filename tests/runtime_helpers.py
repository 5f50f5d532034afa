"""Hand-built block bodies and fused models for the runtime tests (no onnxmlu compiler needed)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

DOMAIN = "com.onnxmlu"
OPSET = 17


def body_model(nodes, inputs, outputs, initializers=(), opset=OPSET, extra_opsets=()) -> onnx.ModelProto:
    """A block body: a small standalone model (ir_version pinned for onnxruntime)."""
    graph = helper.make_graph(list(nodes), "body", list(inputs), list(outputs), initializer=list(initializers))
    opsets = [helper.make_opsetid("", opset), *extra_opsets]
    return helper.make_model(graph, opset_imports=opsets, ir_version=8)


def block_node(name, inputs, outputs, body=None, mp=1, *, body_as="tensor", **extra_attrs) -> onnx.NodeProto:
    """An MLUFusionBlock node. ``mp=None`` / ``body=None`` leave the attribute out."""
    attrs = dict(extra_attrs)
    if mp is not None:
        attrs["mp"] = mp
    if body is not None:
        data = body if isinstance(body, bytes) else body.SerializeToString()
        if body_as == "tensor":
            attrs["body"] = helper.make_tensor("body", TensorProto.UINT8, [len(data)], data, raw=True)
        else:
            attrs["body"] = data  # bytes -> a STRING attribute
    return helper.make_node("MLUFusionBlock", list(inputs), list(outputs), name=name, domain=DOMAIN, **attrs)


def fused_model(nodes, inputs, outputs, value_info=(), initializers=(), opset=OPSET) -> onnx.ModelProto:
    """Outer model importing com.onnxmlu; value_info must type every block output."""
    graph = helper.make_graph(
        list(nodes), "fused", list(inputs), list(outputs), initializer=list(initializers), value_info=list(value_info)
    )
    opsets = [helper.make_opsetid("", opset), helper.make_opsetid(DOMAIN, 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=8)


def vi(name, elem_type, shape):
    return helper.make_tensor_value_info(name, elem_type, shape)


def conv_relu_body(seed=0, in_ch=3, out_ch=4, batch=1, hw=8, in_name="x", out_name="y") -> onnx.ModelProto:
    """Conv(3x3, pad 1) + bias + Relu with random weights."""
    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array(rng.standard_normal((out_ch, in_ch, 3, 3)).astype(np.float32), f"{out_name}_w")
    b = numpy_helper.from_array(rng.standard_normal(out_ch).astype(np.float32), f"{out_name}_b")
    nodes = [
        helper.make_node("Conv", [in_name, w.name, b.name], [f"{out_name}_conv"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", [f"{out_name}_conv"], [out_name]),
    ]
    return body_model(
        nodes,
        [vi(in_name, TensorProto.FLOAT, [batch, in_ch, hw, hw])],
        [vi(out_name, TensorProto.FLOAT, [batch, out_ch, hw, hw])],
        [w, b],
    )


def conv_relu_fused(mp=2, seed=0, name="block_0 (mp=2)", body_as="tensor", **attrs):
    """One block holding conv_relu_body; returns (fused model, body model)."""
    body = conv_relu_body(seed)
    node = block_node(name, ["x"], ["y"], body, mp=mp, body_as=body_as, **attrs)
    model = fused_model(
        [node],
        [vi("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [vi("y", TensorProto.FLOAT, [1, 4, 8, 8])],
    )
    return model, body
