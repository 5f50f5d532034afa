"""Viewing fused models in Netron.

``explode`` writes a *view copy* in which every MLUFusionBlock node becomes a call of a
model-local ONNX function (domain ``com.onnxmlu.view``) whose definition is the block's
body, with its weights turned into ``Constant`` nodes (functions hold no initializers). Netron
then opens a block with "Show Function Definition". The copy is for viewing only: its
metadata says so, and it is not meant to be run.
"""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import helper

from onnxmlu.errors import OnnxMluError
from onnxmlu.schema import body_model, is_fusion_block

VIEW_DOMAIN = "com.onnxmlu.view"


def explode(model: onnx.ModelProto) -> onnx.ModelProto:
    """A view copy of a fused model with each block as a model-local function call."""
    view = onnx.ModelProto()
    view.CopyFrom(model)
    functions = []
    for i, node in enumerate(view.graph.node):
        if not is_fusion_block(node):
            continue
        name = f"block_{i}"
        functions.append(_function_of(name, body_model(node)))
        _as_function_call(node, name)
    if not functions:
        raise OnnxMluError("model has no MLUFusionBlock nodes to explode")
    view.functions.extend(functions)
    view.opset_import.append(helper.make_opsetid(VIEW_DOMAIN, 1))
    helper.set_model_props(view, {**{p.key: p.value for p in view.metadata_props},
                                  "onnxmlu.view_only": "true: blocks are functions for Netron; do not run"})
    return view


def _function_of(name: str, body: onnx.ModelProto) -> onnx.FunctionProto:
    graph = body.graph
    constants = [helper.make_node("Constant", [], [t.name], name=f"{t.name}/const", value=t)
                 for t in graph.initializer]
    return helper.make_function(
        VIEW_DOMAIN, name, [i.name for i in graph.input], [o.name for o in graph.output],
        constants + list(graph.node), list(body.opset_import),
    )


def _as_function_call(node: onnx.NodeProto, function_name: str) -> None:
    keep = [a for a in node.attribute if a.name != "body"]
    del node.attribute[:]
    node.attribute.extend(keep)
    node.op_type, node.domain = function_name, VIEW_DOMAIN


def serve(path: str | Path, port: int = 8080, browse: bool = True) -> None:
    """Serve a model with Netron on 127.0.0.1 until interrupted."""
    try:
        import netron
    except ImportError:
        raise OnnxMluError("viewing needs netron: pip install 'onnxmlu[view]'") from None
    netron.start(str(path), address=("127.0.0.1", port), browse=browse)
    netron.wait()
