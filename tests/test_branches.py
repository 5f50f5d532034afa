"""Blocks inside control flow (onnxmlu/collapse/branches.py, the ``branches`` pass).

The models are built in the forms exporters write: a ``torch.cond``-style ``If`` whose two
branches hold the convolutions and read the main graph's weights and tensors from the outer
scope; an ``If`` nested in a branch; a ``Loop`` with a constant trip count whose body holds a
recurrence's matrix products (tf2onnx's form of a Keras RNN); a ``Scan`` whose body holds an op
the accelerator lacks (so the Scan itself stays on the host). Each is fused, its subgraphs must
hold the blocks, and the fused model must match the original in onnxruntime (optimizations off)
on every path through the control flow.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxmlu import api
from onnxmlu.ir import is_fusion_block, iter_graphs
from onnxmlu.runtime import InferenceSession, reference_session
from onnxmlu.tools.testing import make_model

RTOL = ATOL = 1e-4


def _w(rng, *shape):
    return numpy_helper.from_array((rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32))


def _branch(name: str, source: str, weight: str, out: str, nested: onnx.GraphProto | None = None) -> onnx.GraphProto:
    """Conv(outer weight) -> Relu -> Conv -> ReduceMean: an If branch with no inputs of its own."""
    nodes = [helper.make_node("Conv", [source, weight], [f"{name}_c0"], pads=[1, 1, 1, 1], name=f"{name}_conv0"),
             helper.make_node("Relu", [f"{name}_c0"], [f"{name}_r0"], name=f"{name}_relu0"),
             helper.make_node("Conv", [f"{name}_r0", "w_shared"], [f"{name}_c1"], pads=[1, 1, 1, 1],
                              name=f"{name}_conv1"),
             helper.make_node("ReduceMean", [f"{name}_c1"], [out if nested is None else f"{name}_m"], axes=[2, 3],
                              keepdims=0, name=f"{name}_mean")]
    if nested is not None:
        nodes += [helper.make_node("ReduceSum", [f"{name}_m"], [f"{name}_s"], keepdims=0, name=f"{name}_sum"),
                  helper.make_node("Greater", [f"{name}_s", "zero"], [f"{name}_pos"], name=f"{name}_pos"),
                  helper.make_node("If", [f"{name}_pos"], [out], name=f"{name}_if", then_branch=nested,
                                   else_branch=_identity(f"{name}_m", f"{name}_else_out"))]
    return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)])


def _identity(source: str, out: str) -> onnx.GraphProto:
    return helper.make_graph([helper.make_node("Identity", [source], [out], name=f"id_{out}")], out, [],
                             [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)])


def _scaled(source: str, out: str) -> onnx.GraphProto:
    """A nested branch: MatMul by the outer weight, then Tanh."""
    nodes = [helper.make_node("MatMul", [source, "fc"], [f"{out}_mm"], name=f"{out}_mm"),
             helper.make_node("Tanh", [f"{out}_mm"], [out], name=f"{out}_tanh")]
    return helper.make_graph(nodes, out, [], [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)])


def cond_model(nested: bool = False) -> onnx.ModelProto:
    """x [N, 3, 8, 8], flag bool -> stem Conv+Relu -> If(flag) {conv branch A | conv branch B}."""
    rng = np.random.default_rng(0)
    inits = [_w(rng, 4, 3, 3, 3), _w(rng, 4, 4, 3, 3), _w(rng, 4, 4, 3, 3), _w(rng, 4, 4, 3, 3), _w(rng, 4, 4),
             numpy_helper.from_array(np.float32(0), "zero")]
    for t, name in zip(inits, ("w_stem", "w_a", "w_b", "w_shared", "fc")):
        t.name = name
    then_g = _branch("then", "stem", "w_a", "y_then", _scaled("then_m", "then_nested") if nested else None)
    else_g = _branch("else", "stem", "w_b", "y_else")
    nodes = [helper.make_node("Conv", ["x", "w_stem"], ["stem_c"], pads=[1, 1, 1, 1], name="stem_conv"),
             helper.make_node("Relu", ["stem_c"], ["stem_r"], name="stem_relu"),
             helper.make_node("Mul", ["stem_r", "stem_r"], ["stem"], name="stem_square"),
             helper.make_node("If", ["flag"], ["y"], name="cond", then_branch=then_g, else_branch=else_g)]
    graph = helper.make_graph(nodes, "cond", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8]),
                                              helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return make_model(graph, opset=13)


def loop_model(steps: int = 5) -> onnx.ModelProto:
    """h [1, 8] -> Loop(steps) { h = tanh(h @ R + x_t @ W) with x_t = Gather(xs, i) } -> h, and the
    hidden states as scan outputs."""
    rng = np.random.default_rng(1)
    inits = [_w(rng, 8, 8), _w(rng, 6, 8), numpy_helper.from_array(np.array(steps, np.int64), "trips")]
    inits[0].name, inits[1].name = "R", "W"
    body = helper.make_graph(
        [helper.make_node("Gather", ["xs", "i"], ["x_t"], axis=0, name="step_x"),
         helper.make_node("MatMul", ["h_in", "R"], ["hr"], name="step_hr"),
         helper.make_node("MatMul", ["x_t", "W"], ["xw"], name="step_xw"),
         helper.make_node("Add", ["hr", "xw"], ["pre"], name="step_add"),
         helper.make_node("Tanh", ["pre"], ["h_out"], name="step_tanh"),
         helper.make_node("Identity", ["c_in"], ["c_out"], name="step_cond"),
         helper.make_node("Identity", ["h_out"], ["h_scan"], name="step_scan")],
        "rnn_body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []), helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_in", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_out", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("h_scan", TensorProto.FLOAT, None)])
    loop = helper.make_node("Loop", ["trips", "", "h0"], ["h", "hs"], name="rnn", body=body)
    graph = helper.make_graph([loop], "loop", [helper.make_tensor_value_info("xs", TensorProto.FLOAT, [steps, 1, 6]),
                                               helper.make_tensor_value_info("h0", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("h", TensorProto.FLOAT, [1, 8]),
                               helper.make_tensor_value_info("hs", TensorProto.FLOAT, None)], inits)
    return make_model(graph, opset=13)


def scan_model() -> onnx.ModelProto:
    """xs [T, 4, 8] -> Scan { s = CumSum(s + relu(x_t @ W)) / 8 } -- CumSum, which the
    accelerator lacks, keeps the Scan on the host."""
    rng = np.random.default_rng(2)
    w = _w(rng, 8, 8)
    w.name = "W"
    axis = numpy_helper.from_array(np.array(1, np.int64), "axis")
    eighth = numpy_helper.from_array(np.float32(0.125), "eighth")
    body = helper.make_graph(
        [helper.make_node("MatMul", ["x_t", "W"], ["xw"], name="scan_mm"),
         helper.make_node("Relu", ["xw"], ["xr"], name="scan_relu"),
         helper.make_node("Add", ["s_in", "xr"], ["pre"], name="scan_add"),
         helper.make_node("CumSum", ["pre", "axis"], ["summed"], name="scan_cumsum"),
         helper.make_node("Mul", ["summed", "eighth"], ["s_out"], name="scan_scale"),
         helper.make_node("Identity", ["s_out"], ["y_t"], name="scan_y")],
        "scan_body",
        [helper.make_tensor_value_info("s_in", TensorProto.FLOAT, [4, 8]),
         helper.make_tensor_value_info("x_t", TensorProto.FLOAT, [4, 8])],
        [helper.make_tensor_value_info("s_out", TensorProto.FLOAT, [4, 8]),
         helper.make_tensor_value_info("y_t", TensorProto.FLOAT, [4, 8])])
    scan = helper.make_node("Scan", ["s0", "xs"], ["s", "ys"], num_scan_inputs=1, name="scan", body=body)
    graph = helper.make_graph([scan], "scan", [helper.make_tensor_value_info("s0", TensorProto.FLOAT, [4, 8]),
                                               helper.make_tensor_value_info("xs", TensorProto.FLOAT, ["T", 4, 8])],
                              [helper.make_tensor_value_info("s", TensorProto.FLOAT, [4, 8]),
                               helper.make_tensor_value_info("ys", TensorProto.FLOAT, ["T", 4, 8])], [w, axis, eighth])
    return make_model(graph, opset=13)


def _blocks_by_graph(model: onnx.ModelProto) -> dict[str, int]:
    return {g.name: sum(is_fusion_block(n) for n in g.node) for g in iter_graphs(model.graph)}


def _matches(original: onnx.ModelProto, fused: onnx.ModelProto, library: str, feeds: dict) -> None:
    want = reference_session(original).run(None, feeds)
    got = InferenceSession(fused.SerializeToString(), library=library).run(None, feeds)
    for w, g in zip(want, got):
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL)


def test_if_branches_hold_blocks_and_match_on_both_paths(library):
    model = cond_model()
    result = api.fuse(model, input_shapes={"x": [2, 3, 8, 8]})
    blocks = _blocks_by_graph(result.model)
    assert blocks["then"] >= 1 and blocks["else"] >= 1, blocks
    host_if = next(n for n in result.model.graph.node if n.op_type == "If")
    assert host_if.name == "cond"  # the control flow stays on the host
    assert sorted(r["graph"] for r in result.to_dict()["branches"]) == ["cond.else_branch", "cond.then_branch"]
    names = [n.name for g in iter_graphs(result.model.graph) for n in g.node if is_fusion_block(n)]
    assert len(names) == len(set(names)) and any(n.startswith("cond.then_branch/block_0") for n in names)
    assert result.coverage.heavy_share == 1.0  # both branches' convolutions are in blocks
    onnx.checker.check_model(result.model)
    rng = np.random.default_rng(3)
    for flag in (True, False):
        for batch in (2, 5):  # the pinned batch and another
            feeds = {"x": rng.standard_normal((batch, 3, 8, 8)).astype(np.float32), "flag": np.array(flag)}
            _matches(model, result.model, library, feeds)


def test_outer_weights_read_by_a_branch_are_not_duplicated(library):
    """A weight only the branches read travels in their blocks' bodies and leaves the main graph."""
    result = api.fuse(cond_model(), input_shapes={"x": [1, 3, 8, 8]})
    main = {t.name for t in result.model.graph.initializer}
    assert not main & {"w_a", "w_b", "w_shared"}, main


def test_nested_if_gets_blocks_at_every_depth(library):
    model = cond_model(nested=True)
    result = api.fuse(model, input_shapes={"x": [1, 3, 8, 8]})
    rows = result.to_dict()["branches"]
    nested = [r for r in rows if r["parent"] == "cond.then_branch"]
    assert [r["graph"] for r in nested] == ["then_if.then_branch"], rows  # the Identity branch is left alone
    assert _blocks_by_graph(result.model)["then_nested"] >= 1
    rng = np.random.default_rng(4)
    for flag in (True, False):
        for _ in range(3):  # the nested condition takes both values over a few draws
            feeds = {"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32), "flag": np.array(flag)}
            _matches(model, result.model, library, feeds)


def test_loop_body_holds_blocks_priced_per_iteration(library):
    model = loop_model(steps=5)
    result = api.fuse(model)
    (row,) = result.to_dict()["branches"]
    assert (row["graph"], row["op_type"], row["runs"]) == ("rnn.body", "Loop", 5)
    assert _blocks_by_graph(result.model)["rnn_body"] >= 1
    rng = np.random.default_rng(5)
    feeds = {"xs": rng.standard_normal((5, 1, 6)).astype(np.float32), "h0": rng.standard_normal((1, 8)).astype(np.float32)}
    _matches(model, result.model, library, feeds)


def test_scan_on_the_host_gets_blocks_in_its_body(library):
    model = scan_model()
    result = api.fuse(model, input_shapes={"xs": [6, 4, 8]})
    (row,) = result.to_dict()["branches"]
    assert (row["op_type"], row["runs"]) == ("Scan", 6)
    assert _blocks_by_graph(result.model)["scan_body"] >= 1
    assert any(n.op_type == "CumSum" for n in next(n for n in result.model.graph.node if n.op_type == "Scan")
               .attribute[0].g.node)  # the op the accelerator lacks stays in the body, on the host
    rng = np.random.default_rng(6)
    for steps in (6, 9):
        feeds = {"s0": rng.standard_normal((4, 8)).astype(np.float32),
                 "xs": rng.standard_normal((steps, 4, 8)).astype(np.float32)}
        _matches(model, result.model, library, feeds)


def test_int8_runs_plan_branches_at_fp32_and_say_so():
    result = api.fuse(cond_model(), input_shapes={"x": [1, 3, 8, 8]}, precision="int8")
    assert all(b["precision"] == "fp32" for r in result.to_dict()["branches"] for b in r["blocks"])
    assert any(d.rule == "branch-fp32" for d in result.diagnostics)


def test_fused_file_with_branches_loads_and_matches(library, tmp_path):
    """The streamed writer (fuse_to_file) carries the grafted subgraphs and their bodies."""
    model = cond_model(nested=True)
    src, out = tmp_path / "cond.onnx", tmp_path / "fused.onnx"
    onnx.save(model, src)
    result = api.fuse_to_file(src, out, input_shapes={"x": [1, 3, 8, 8]})
    assert len(result.branches) == 2
    fused = onnx.load(out)
    feeds = {"x": np.ones((1, 3, 8, 8), np.float32), "flag": np.array(True)}
    _matches(model, fused, library, feeds)


def test_cli_lists_the_branches(tmp_path):
    from typer.testing import CliRunner

    from onnxmlu.cli import app

    src = tmp_path / "cond.onnx"
    onnx.save(cond_model(), src)
    result = CliRunner().invoke(app, ["fuse", str(src), str(tmp_path / "f.onnx"), "--input-shape", "x:1,3,8,8"])
    assert result.exit_code == 0, result.output
    assert "inside cond.then_branch (If, runs 1× per run of its graph)" in result.output
    assert "inside control flow" in result.output


def test_a_model_with_blocks_only_in_branches_reads_as_fused(tmp_path):
    """inspect lists the blocks inside control flow; fusing the fused model again is refused."""
    from onnxmlu.errors import OnnxMluError
    from onnxmlu.tools.fused_info import summarize_fused

    result = api.fuse(cond_model(), input_shapes={"x": [1, 3, 8, 8]})
    rows = summarize_fused(result.model).to_dict()["blocks"]
    assert {r["graph"] for r in rows} == {"", "then", "else"}
    main_graph_only = onnx.ModelProto()
    main_graph_only.CopyFrom(result.model)
    for node in [n for n in main_graph_only.graph.node if is_fusion_block(n)]:
        node.op_type = "Relu"  # only the branches' blocks are left
    with pytest.raises(OnnxMluError, match="already fused"):
        api.fuse(main_graph_only)


def test_the_html_report_lists_the_blocks_inside_control_flow(tmp_path):
    """Both kinds of report: a plan fused now (per subgraph) and a fused file (per block)."""
    from onnxmlu.tools.html_report import render

    result = api.fuse(cond_model(), input_shapes={"x": [1, 3, 8, 8]})
    plan_page, file_page = render(result.to_dict(), "t"), render(_inspected(result.model), "t")
    assert "Blocks inside control flow" in plan_page and "cond.then_branch" in plan_page
    assert "Blocks inside control flow" in file_page and "cond.then_branch/block_0" in file_page
    assert plan_page.count('class="block"') == len(result.plan.blocks)  # the timeline is the main graph's


def _inspected(model: onnx.ModelProto) -> dict:
    from onnxmlu.tools.fused_info import summarize_fused

    return summarize_fused(model).to_dict()


def test_portable_turns_the_blocks_inside_branches_into_functions_too(tmp_path):
    """fuse --portable: no MLUFusionBlock is left at any depth; plain onnxruntime runs it."""
    from onnxmlu.tools.view import explode

    model = cond_model(nested=True)
    portable = explode(api.fuse(model, input_shapes={"x": [1, 3, 8, 8]}).model)
    assert not any(is_fusion_block(n) for g in iter_graphs(portable.graph) for n in g.node)
    feeds = {"x": np.random.default_rng(7).standard_normal((1, 3, 8, 8)).astype(np.float32), "flag": np.array(True)}
    want = reference_session(model).run(None, feeds)
    got = reference_session(portable).run(None, feeds)
    np.testing.assert_allclose(got[0], want[0], rtol=RTOL, atol=ATOL)
