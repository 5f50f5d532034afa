"""normalize as real exporters need it: exact and bounded folding, sound subgraphs, inlined
functions, rewrites inside If branches (see onnxmlu/frontend and onnxmlu/graph.normalize)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from onnxmlu import api
from onnxmlu.analyze import CONSTANT_REASON, analyze
from onnxmlu.frontend.normalize import normalize
from onnxmlu.ir import iter_graphs, unresolved_names
from onnxmlu.ir.weights import tensor_payload_bytes
from onnxmlu.runtime import InferenceSession

FLOAT, INT64 = TensorProto.FLOAT, TensorProto.INT64


def _model(nodes, inputs, outputs, inits=(), opset=17, functions=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], functions=list(functions))
    model.ir_version = 8
    return model


def _run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(None, feeds)


def _all_ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for g in iter_graphs(model.graph) for n in g.node]


# ------------------------------------------------------------------------------ exact folding
def _shape_slice_model(start: int | None, end: int | None, dims=("N", "C", "H", "W")) -> onnx.ModelProto:
    """x -> Shape(x, start, end) -> s; and c expanded to Concat([1], Shape(x, 0, 1), [4])."""
    attrs = {k: v for k, v in (("start", start), ("end", end)) if v is not None}
    x = helper.make_tensor_value_info("x", FLOAT, list(dims))
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], **attrs),
        helper.make_node("Shape", ["x"], ["batch"], start=0, end=1),
        helper.make_node("Concat", ["one", "batch", "four"], ["target"], axis=0),
        helper.make_node("Expand", ["c"], ["y"]),
    ]
    nodes[-1].input.append("target")
    inits = [numpy_helper.from_array(np.array([1], np.int64), "one"),
             numpy_helper.from_array(np.array([4], np.int64), "four"),
             numpy_helper.from_array(np.arange(4, dtype=np.float32), "c")]
    outputs = [helper.make_tensor_value_info("s", INT64, None), helper.make_tensor_value_info("y", FLOAT, None)]
    return _model(nodes, [x], outputs, inits)


@settings(max_examples=25, deadline=None)
@given(dims=st.lists(st.integers(1, 5), min_size=4, max_size=4),
       start=st.one_of(st.none(), st.integers(-6, 6)), end=st.one_of(st.none(), st.integers(-6, 6)))
def test_folding_shape_with_start_and_end_gives_what_onnxruntime_computes(dims, start, end):
    """x's dims fixed by the model: both Shape nodes fold. With the same dims only pinned, the
    graph stays symbolic: the batch's Shape reads a symbolic dim and stays."""
    model = _shape_slice_model(start, end, dims)
    folded = normalize(model)
    assert "Shape" not in _all_ops(folded)
    pinned = normalize(_shape_slice_model(start, end), {"x": dims})
    assert "Shape" in _all_ops(pinned)
    feeds = {"x": np.zeros(dims, np.float32)}
    for want, got in zip(_run(model, feeds), _run(folded, feeds)):
        assert want.shape == got.shape and np.array_equal(want, got)


def test_the_expand_of_a_sliced_shape_keeps_its_shape_through_fuse(library):
    """The issue's example: x pinned to 3,8,16 gives y of shape [1,3,4], not [1,3,8,16,4]."""
    model = _shape_slice_model(0, 1)
    model.graph.input[0].type.tensor_type.shape.dim.pop()  # x: [N, C, H]
    fused = api.fuse(model, input_shapes={"x": [3, 8, 16]}).model
    x = np.ones((3, 8, 16), np.float32)
    y = InferenceSession(fused).run(["y"], {"x": x})[0]
    assert y.shape == (1, 3, 4)
    assert np.array_equal(y, _run(model, {"x": x})[1])


def test_a_broadcast_is_not_materialized_and_stays_on_the_host():
    """ConstantOfShape of 4 MiB from an 8-byte shape: folding it would bloat the file."""
    x = helper.make_tensor_value_info("x", FLOAT, [256, 256, 16])
    y = helper.make_tensor_value_info("y", FLOAT, [256, 256, 16])
    nodes = [helper.make_node("ConstantOfShape", ["shape"], ["ones"],
                              value=numpy_helper.from_array(np.ones(1, np.float32))),
             helper.make_node("Add", ["x", "ones"], ["y"])]
    model = _model(nodes, [x], [y], [numpy_helper.from_array(np.array([256, 256, 16], np.int64), "shape")])
    normal = normalize(model)
    assert tensor_payload_bytes(normal) < 1024
    analysis = analyze(normal)
    [fill] = [i for i, n in enumerate(normal.graph.node) if n.op_type == "ConstantOfShape"]
    assert "ConstantOfShape is not in" in analysis.host_reasons[fill] or analysis.host_reasons[fill] == CONSTANT_REASON


def test_a_small_computed_weight_folds_and_the_block_reads_the_input():
    """Unsqueeze(ConstantOfShape) weights as caffe2 exports write them: folded into a constant."""
    x = helper.make_tensor_value_info("x", FLOAT, [1, 4, 2, 2])
    y = helper.make_tensor_value_info("y", FLOAT, [1, 4, 2, 2])
    nodes = [helper.make_node("ConstantOfShape", ["shape"], ["s"], value=numpy_helper.from_array(np.full(1, 2.0, np.float32))),
             helper.make_node("Unsqueeze", ["s", "axes"], ["s3"]),
             helper.make_node("Mul", ["x", "s3"], ["y"])]
    inits = [numpy_helper.from_array(np.array([4], np.int64), "shape"),
             numpy_helper.from_array(np.array([1, 2], np.int64), "axes")]
    normal = normalize(_model(nodes, [x], [y], inits))
    assert _all_ops(normal) == ["Mul"]


def _weight_read_twice(gather: bool) -> onnx.ModelProto:
    """W [512, 256] (512 KiB) reordered as exporters write an LSTM's gates (two Slices and a
    Concat) before a MatMul; with ``gather`` a Gather of rows reads W too (a tied embedding)."""
    w = np.random.default_rng(5).standard_normal((512, 256)).astype(np.float32)
    nodes = [helper.make_node("Slice", ["W", "s0", "s1"], ["top"]), helper.make_node("Slice", ["W", "s1", "s2"], ["low"]),
             helper.make_node("Concat", ["low", "top"], ["Wr"], axis=0), helper.make_node("Transpose", ["Wr"], ["Wt"]),
             helper.make_node("MatMul", ["x", "Wt"], ["y"])]
    outputs = [helper.make_tensor_value_info("y", FLOAT, [2, 512])]
    if gather:
        nodes.append(helper.make_node("Gather", ["W", "ids"], ["rows"]))
        outputs.append(helper.make_tensor_value_info("rows", FLOAT, [2, 256]))
    inputs = [helper.make_tensor_value_info("x", FLOAT, [2, 256]), helper.make_tensor_value_info("ids", INT64, [2])]
    inits = [numpy_helper.from_array(w, "W")] + [numpy_helper.from_array(np.array([v], np.int64), f"s{i}")
                                                 for i, v in enumerate((0, 256, 512))]
    return _model(nodes, inputs[: 1 + gather], outputs, inits)


def test_a_weight_whose_every_reader_folds_is_folded_into_one_copy():
    """The Slices each write half of W (256 KiB, above what folding writes freely) and free
    nothing alone, but every reader of W folds: the reordered weight replaces W."""
    normal = normalize(_weight_read_twice(gather=False))
    assert _all_ops(normal) == ["MatMul"]
    assert tensor_payload_bytes(normal) == 512 * 256 * 4


def test_a_weight_a_gather_keeps_is_not_folded_into_a_second_copy():
    """A tied embedding: the Gather keeps W, so folding its transposed reorder would store W twice;
    those nodes stay and the model holds W once."""
    model = _weight_read_twice(gather=True)
    normal = normalize(model)
    assert tensor_payload_bytes(normal) < 512 * 256 * 4 * 1.05
    feeds = {"x": np.ones((2, 256), np.float32), "ids": np.array([3, 7], np.int64)}
    for got, want in zip(_run(normal, feeds), _run(model, feeds)):
        np.testing.assert_array_equal(got, want)


# ------------------------------------------------------------------------------ subgraphs
def _branch(name: str, nodes: list, out: str) -> onnx.GraphProto:
    return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(out, FLOAT, None)])


def test_a_constant_if_whose_outputs_an_outer_branch_reads_folds_soundly():
    """If_1 (constant condition) has two outputs; If_0's branches read them from the outer
    scope. Flattening If_1 must leave both names produced (graphsurgeon's did not)."""
    x = helper.make_tensor_value_info("x", FLOAT, [2, 3])
    inner = helper.make_node("If", ["yes"], ["a", "b"], name="If_1",
                             then_branch=helper.make_graph(
                                 [helper.make_node("Relu", ["x"], ["ta"]), helper.make_node("Neg", ["x"], ["tb"])],
                                 "then1", [], [helper.make_tensor_value_info(n, FLOAT, None) for n in ("ta", "tb")]),
                             else_branch=helper.make_graph(
                                 [helper.make_node("Abs", ["x"], ["ea"]), helper.make_node("Sigmoid", ["x"], ["eb"])],
                                 "else1", [], [helper.make_tensor_value_info(n, FLOAT, None) for n in ("ea", "eb")]))
    outer = helper.make_node("If", ["positive"], ["y"], name="If_0",
                             then_branch=_branch("then0", [helper.make_node("Identity", ["b"], ["t0"])], "t0"),
                             else_branch=_branch("else0", [helper.make_node("Identity", ["a"], ["e0"])], "e0"))
    nodes = [helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
             helper.make_node("Greater", ["total", "zero"], ["positive"]), inner, outer]
    inits = [numpy_helper.from_array(np.array(True), "yes"), numpy_helper.from_array(np.array(0, np.float32), "zero")]
    model = _model(nodes, [x], [helper.make_tensor_value_info("y", FLOAT, [2, 3])], inits)
    diagnostics = []
    normal = normalize(model, diagnostics=diagnostics)
    assert unresolved_names(normal.graph) == [] and diagnostics == []
    assert "If_1" not in [n.name for n in normal.graph.node]
    for sign in (1, -1):
        x_value = sign * np.abs(np.random.default_rng(0).standard_normal((2, 3))).astype(np.float32)
        assert np.array_equal(_run(model, {"x": x_value})[0], _run(normal, {"x": x_value})[0])


def _lstm_branch(tag: str, direction: str, rng) -> onnx.GraphProto:
    """An LSTM on outer-scope x, its weights in the branch."""
    hidden = 5
    w, r = (numpy_helper.from_array(rng.standard_normal(s).astype(np.float32) * 0.3, f"{tag}_{n}")
            for n, s in (("W", (1, 4 * hidden, 8)), ("R", (1, 4 * hidden, hidden))))
    squeeze = helper.make_node("Squeeze", [f"{tag}_yh", f"{tag}_axes"], [f"{tag}_out"])
    lstm = helper.make_node("LSTM", ["x", w.name, r.name], ["", f"{tag}_yh"], hidden_size=hidden,
                            direction=direction, name=f"{tag}_lstm")
    axes = numpy_helper.from_array(np.array([0], np.int64), f"{tag}_axes")
    return helper.make_graph([lstm, squeeze], tag, [], [helper.make_tensor_value_info(f"{tag}_out", FLOAT, None)],
                             [w, r, axes])


def test_an_lstm_in_an_if_branch_is_rewritten_once_inputs_are_pinned(library):
    """The If comes first in the file, before the nodes computing its condition (onnxruntime
    accepts that order in a main graph; onnx's inference and checker do not)."""
    rng = np.random.default_rng(3)
    x = helper.make_tensor_value_info("x", FLOAT, ["T", 1, 8])
    nodes = [helper.make_node("If", ["positive"], ["y"], name="branchy",
                              then_branch=_lstm_branch("fw", "forward", rng),
                              else_branch=_lstm_branch("bw", "reverse", rng)),
             helper.make_node("Greater", ["total", "zero"], ["positive"]),
             helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0)]
    model = _model(nodes, [x], [helper.make_tensor_value_info("y", FLOAT, None)],
                   [numpy_helper.from_array(np.array(0, np.float32), "zero")])
    result = api.fuse(model, input_shapes={"x": [4, 1, 8]})
    assert "LSTM" not in _all_ops(result.model)
    assert result.rewrite_report.applied["rnn"] == 2
    session = InferenceSession(result.model)
    for sign in (1, -1):
        x_value = sign * np.abs(rng.standard_normal((4, 1, 8))).astype(np.float32)
        np.testing.assert_allclose(session.run(["y"], {"x": x_value})[0], _run(model, {"x": x_value})[0],
                                   rtol=1e-4, atol=1e-5)


def test_layers_in_model_local_functions_reach_the_planner(library):
    domain = "tests.local"
    conv_relu = helper.make_function(domain, "ConvRelu", ["x", "w"], ["y"],
                                     [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                                      helper.make_node("Relu", ["c"], ["y"])],
                                     [helper.make_opsetid("", 17)])
    x = helper.make_tensor_value_info("x", FLOAT, [1, 3, 8, 8])
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    model = _model([helper.make_node("ConvRelu", ["x", "w"], ["y"], domain=domain)], [x],
                   [helper.make_tensor_value_info("y", FLOAT, [1, 4, 8, 8])], [w], functions=[conv_relu])
    model.opset_import.append(helper.make_opsetid(domain, 1))
    result = api.fuse(model, strategy="all-fusion")
    assert [l.op_type for l in result.analysis.layers] == ["Conv", "Relu"]
    x_value = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(InferenceSession(result.model).run(["y"], {"x": x_value})[0],
                               _run(model, {"x": x_value})[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("equation", ["bij,jk->bik", "...j,jk->...k"])
def test_einsum_is_priced_by_its_index_space(equation):
    x = helper.make_tensor_value_info("x", FLOAT, [2, 3, 4])
    w = numpy_helper.from_array(np.ones((4, 5), np.float32), "w")
    model = _model([helper.make_node("Einsum", ["x", "w"], ["y"], equation=equation)], [x],
                   [helper.make_tensor_value_info("y", FLOAT, [2, 3, 5])], [w])
    [layer] = analyze(normalize(model)).layers
    assert layer.ops == 2 * 2 * 3 * 4 * 5


def test_an_int4_embedding_lookup_is_typed_and_sized_for_what_follows():
    """com.microsoft GatherBlockQuantized of 4-bit rows packed two a byte ([V, d/2] uint8) gives
    [B, S, d] in the scales' type: onnxruntime's symbolic rule gave [B, S, d/2] and stopped at
    the residual Add, leaving every later op (GQA, MatMulNBits) untyped and on the host."""
    from onnxmlu.frontend.symbolic import symbolic_infer

    vocab, d = 16, 64
    nodes = [helper.make_node("GatherBlockQuantized", ["q", "ids", "s"], ["h"], domain="com.microsoft", bits=4,
                              block_size=32, gather_axis=0, quantize_axis=1),
             helper.make_node("Add", ["h", "bias"], ["r"]), helper.make_node("MatMul", ["r", "w"], ["y"])]
    inits = [numpy_helper.from_array(np.zeros((vocab, d // 2), np.uint8), "q"),
             numpy_helper.from_array(np.ones((vocab, d // 32), np.float32), "s"),
             numpy_helper.from_array(np.zeros((1, 1, d), np.float32), "bias"),
             numpy_helper.from_array(np.zeros((d, 4), np.float32), "w")]
    model = _model(nodes, [helper.make_tensor_value_info("ids", INT64, ["B", "S"])],
                   [helper.make_tensor_value_info("y", FLOAT, None)], inits)
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    inferred = {v.name: v.type.tensor_type for v in symbolic_infer(model).graph.value_info}
    for name, width in (("h", d), ("r", d)):
        assert inferred[name].elem_type == FLOAT
        assert [x.dim_value or x.dim_param for x in inferred[name].shape.dim] == ["B", "S", width]
