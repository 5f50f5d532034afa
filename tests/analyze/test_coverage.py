"""Coverage: heavy nodes in blocks, heavy nodes on the host (main graph and inside branches)
with their reasons, and the GOPs shares."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxmlu import api
from onnxmlu.analyze.layers import node_label

F = TensorProto.FLOAT


def _model():
    """Conv (sized, in a block) -> Relu -> If(cond) with a MatMul in each branch, and a
    MatMul of a vendor's domain (heavy, outside the standard domain, no rewriter for it) on the input."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((4, 4, 3, 3)) * 0.2).astype(np.float32), "w")
    m = numpy_helper.from_array(np.eye(8, dtype=np.float32), "m")

    def branch(name):
        return helper.make_graph([helper.make_node("MatMul", ["flat", "m"], [f"{name}_out"], name=f"{name}_mm")],
                                 name, [], [helper.make_tensor_value_info(f"{name}_out", F, [16, 8])])

    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Reshape", ["r", "shape"], ["flat"], name="reshape"),
             helper.make_node("If", ["cond"], ["y"], name="if", then_branch=branch("then"), else_branch=branch("else")),
             helper.make_node("MatMul", ["flat", "m"], ["z"], name="fmm", domain="com.example.vendor")]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", F, [1, 4, 4, 8]),
                     helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", F, [16, 8]), helper.make_tensor_value_info("z", F, [16, 8])],
        [w, m, numpy_helper.from_array(np.array([16, 8], np.int64), "shape")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example.vendor", 1)])
    model.ir_version = 8
    return model


def test_heavy_nodes_on_the_host_are_listed_with_their_reasons():
    result = api.fuse(_model())
    cov = result.coverage
    assert (cov.heavy_nodes, cov.heavy_in_blocks) == (4, 3)  # the branches' MatMuls are in their own blocks
    assert cov.heavy_share == pytest.approx(0.75)
    rows = {row["node"]: row for row in cov.heavy_on_host}
    assert set(rows) == {"fmm"}
    assert "outside the standard domain" in rows["fmm"]["reason"] and rows["fmm"]["graph"] == ""
    assert cov.unpriced == 1 and cov.gops_share == 1.0  # the priced heavy work is all in blocks
    assert result.to_dict()["coverage"]["heavy_share"] == pytest.approx(0.75)


def test_heavy_nodes_of_a_subgraph_left_on_the_host_name_their_parent(monkeypatch):
    """A subgraph the branches pass leaves alone counts as host work, with its parent's reason."""
    from onnxmlu.collapse import branches

    monkeypatch.setattr(branches, "CONTROL_FLOW", frozenset())  # no subgraph is lifted
    cov = api.fuse(_model()).coverage
    assert (cov.heavy_nodes, cov.heavy_in_blocks) == (4, 1)
    rows = {row["node"]: row for row in cov.heavy_on_host}
    assert set(rows) == {"then_mm", "else_mm", "fmm"}
    assert rows["then_mm"]["graph"] == "then" and "inside if (If)" in rows["then_mm"]["reason"]
    assert cov.unpriced == 3


def test_an_unnamed_node_is_labelled_by_its_output():
    assert node_label(helper.make_node("Gemm", ["a", "b"], ["out"])) == "Gemm->out"
    assert node_label(helper.make_node("Gemm", ["a", "b"], ["out"], name="fc")) == "fc"
