"""scripts/profile_boundaries.py finds the Convs whose fused residual Add must copy its tensor
because it crosses a session's edge (no figure is asserted: the script measures, tests do not)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import onnx
from onnx import helper

from onnxmlu import api
from onnxmlu.runtime.layouts import optimize_block_layouts
from onnxmlu.schema import body_model, is_fusion_block
from onnxmlu.tools.zoo import build_model

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("profile_boundaries", ROOT / "scripts" / "profile_boundaries.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _conv(name: str, inputs: list[str], output: str) -> onnx.NodeProto:
    return helper.make_node("Conv", inputs, [output], name=name, domain="com.microsoft.nchwc")


def test_convs_are_sorted_by_which_edge_their_added_tensor_crosses():
    script = _script()
    graph = helper.make_graph(
        [_conv("added_input", ["x", "w", "b", "x"], "a"),
         _conv("inner", ["a", "w", "b", "a"], "c"),
         _conv("plain", ["c", "w", "b"], "d"),
         _conv("empty_sum", ["d", "w", "b", ""], "e"),
         _conv("result_output", ["e", "w", "b", "d"], "y")],
        "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)])
    assert script.copying_convs(graph) == {"added_input": script.COPIED_IN, "result_output": script.COPIED_OUT}


def test_onnxruntime_leaves_such_convs_in_the_bodies_it_optimizes():
    """The classification reads onnxruntime's own graphs: ResNet-18 at batch 8, cut between
    residual blocks, has Convs that add a block input once its bodies exchange NCHWc."""
    script = _script()
    fused = api.fuse(build_model("resnet18", batch=8), strategy="dlfusion").model
    optimized, _ = optimize_block_layouts(fused, inner_threads=1)  # at 2 threads the copies are made parallel
    found = {}
    for node in optimized.graph.node:
        if is_fusion_block(node):
            found.update(script.copying_convs(body_model(node).graph))
    assert script.COPIED_IN in found.values()
