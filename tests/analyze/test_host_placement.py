"""Host nodes that are on no path between two accelerator layers never cut a run of layers:
the node order puts them before (no layer among their ancestors) or after (none among their
descendants) the layers. A host node on such a path still separates the layers around it."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnxmlu import api

F = TensorProto.FLOAT
C = 4


def _model(nodes, extra_inputs=(), extra_outputs=()) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((C, C, 3, 3)) * 0.2).astype(np.float32), f"w{i}")
             for i in range(3)] + [numpy_helper.from_array(np.array(0, np.int32), "axis")]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", F, [1, C, 8, 8]), *extra_inputs],
        [helper.make_tensor_value_info("y", F, None), *extra_outputs], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _conv(i, x, y):
    return helper.make_node("Conv", [x, f"w{i}"], [y], pads=[1, 1, 1, 1], name=f"conv{i}")


def _segments(model) -> int:
    analysis = api.inspect(model)
    return len({layer.segment for layer in analysis.layers})


def _fuses_and_matches(model, tmp_path, inputs=None) -> None:
    result = api.fuse_to_file(model, tmp_path / "f.onnx", check=api.CheckOptions(inputs=inputs))
    assert result.check.ok


def test_host_work_on_an_input_goes_before_the_layers(tmp_path):
    """CumSum (host) reads only a graph input and feeds the last layer: Kahn's order reached
    it only when no layer was ready, between the Convs."""
    nodes = [_conv(0, "x", "a"), helper.make_node("Relu", ["a"], ["b"]), _conv(1, "b", "c"),
             helper.make_node("CumSum", ["bias", "axis"], ["t"], name="host"),
             helper.make_node("Add", ["c", "t"], ["d"]), _conv(2, "d", "y")]
    model = _model(nodes, [helper.make_tensor_value_info("bias", F, [1, C, 8, 8])])
    assert _segments(model) == 1
    _fuses_and_matches(model, tmp_path)


def test_a_host_side_branch_gathers_after_the_layers(tmp_path):
    """An independent host branch (no layer after it) waits while layers are ready."""
    nodes = [_conv(0, "x", "a"), helper.make_node("CumSum", ["a", "axis"], ["side"], name="host"),
             helper.make_node("Relu", ["a"], ["b"]), _conv(1, "b", "c"), _conv(2, "c", "y")]
    model = _model(nodes, extra_outputs=[helper.make_tensor_value_info("side", F, None)])
    assert _segments(model) == 1
    _fuses_and_matches(model, tmp_path)


def test_a_host_node_on_the_path_still_separates_the_layers():
    nodes = [_conv(0, "x", "a"), helper.make_node("CumSum", ["a", "axis"], ["b"], name="host"),
             _conv(1, "b", "c"), _conv(2, "c", "y")]
    assert _segments(_model(nodes)) == 2
