"""Dynamic shapes: a model fused at one pinned shape runs and matches at every shape the
original accepts (docs/architecture.md, "Dynamic shapes").

The models are built in code in the classes real exporters write: a paddle2onnx-style
recognizer head (a Reshape whose target is computed from ``Shape``/``Gather``/``Concat`` of a
symbolic width), a detector-style CNN with symbolic batch, height and width, and a recurrent
tail of symbolic length. Each is fused once, pinned, and run in onnxruntime with the library
against the original (optimizations off) at the pin and at other batches and sizes.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxmlu import api
from onnxmlu.collapse.outputs import FOLLOW_INPUT_SHAPES, SHAPES_KEY, output_shapes_follow_inputs
from onnxmlu.errors import OnnxMluError
from onnxmlu.frontend.pins import DimRange, parse_input_shapes
from onnxmlu.runtime import InferenceSession, reference_session
from onnxmlu.schema import body_model, is_fusion_block
from onnxmlu.tools.testing import make_model

RTOL = ATOL = 1e-4


def _weights(rng, *shape):
    return (rng.standard_normal(shape) * np.sqrt(2 / np.prod(shape[1:]))).astype(np.float32)


def recognizer(hidden: int = 8, height: int = 8) -> onnx.ModelProto:
    """x [N, 3, height, W] -> (MaxPool height/8 in H) -> Conv(stride 2 in H) x2 -> [N, C, 2, W] ->
    Reshape to [N, C*2, W] (target from Shape/Gather/Concat) -> Transpose [W, N, C*2] -> MatMul ->
    LSTM over W: only heights that reduce to 2 rows run."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(_weights(rng, 8, 3, 3, 3), "w0"),
             numpy_helper.from_array(_weights(rng, 8, 8, 3, 3), "w1"),
             numpy_helper.from_array(np.array([0], np.int64), "i0"),
             numpy_helper.from_array(np.array([3], np.int64), "i3"),
             numpy_helper.from_array(np.array([16], np.int64), "c16"),
             numpy_helper.from_array(_weights(rng, 16, hidden), "fc"),
             numpy_helper.from_array(_weights(rng, 1, 4 * hidden, hidden), "W"),
             numpy_helper.from_array(_weights(rng, 1, 4 * hidden, hidden), "R")]
    pool = height // 8
    head = [helper.make_node("MaxPool", ["x"], ["xp"], kernel_shape=[pool, 1], strides=[pool, 1], name="pool")]
    nodes = [*(head if pool > 1 else []),
             helper.make_node("Conv", ["xp" if pool > 1 else "x", "w0"], ["c0"], pads=[1, 1, 1, 1], strides=[2, 1],
                              name="conv0"),
             helper.make_node("Relu", ["c0"], ["r0"], name="relu0"),
             helper.make_node("Conv", ["r0", "w1"], ["c1"], pads=[1, 1, 1, 1], strides=[2, 1], name="conv1"),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Shape", ["r1"], ["shape"], name="shape"),
             helper.make_node("Gather", ["shape", "i0"], ["n"], axis=0, name="n"),
             helper.make_node("Gather", ["shape", "i3"], ["w"], axis=0, name="w"),
             helper.make_node("Concat", ["n", "c16", "w"], ["target"], axis=0, name="target"),
             helper.make_node("Reshape", ["r1", "target"], ["seq"], name="reshape"),
             helper.make_node("Transpose", ["seq"], ["steps"], perm=[2, 0, 1], name="to_time"),  # [W, N, 16]
             helper.make_node("MatMul", ["steps", "fc"], ["proj"], name="proj"),
             helper.make_node("LSTM", ["proj", "W", "R"], ["y"], hidden_size=hidden, name="lstm"),
             helper.make_node("Relu", ["y"], ["out"], name="out")]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, height, "W"])
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, None)
    return make_model(helper.make_graph(nodes, "recognizer", [x], [out], inits), 17)


def detector() -> onnx.ModelProto:
    """x [N, 3, H, W] -> Conv -> Relu -> MaxPool -> Conv -> Sigmoid, every dim but C symbolic."""
    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array(_weights(rng, 8, 3, 3, 3), "w0"),
             numpy_helper.from_array(_weights(rng, 4, 8, 1, 1), "w1")]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1], name="conv0"),
             helper.make_node("Relu", ["c0"], ["r0"], name="relu0"),
             helper.make_node("MaxPool", ["r0"], ["p0"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
             helper.make_node("Conv", ["p0", "w1"], ["c1"], name="conv1"),
             helper.make_node("Sigmoid", ["c1"], ["y"], name="sigmoid")]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, "H", "W"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 16, 16])  # traced at 32x32: stale
    return make_model(helper.make_graph(nodes, "detector", [x], [y], inits), 17)


def _matches(original: onnx.ModelProto, fused: onnx.ModelProto, shapes: list[tuple[int, ...]]) -> None:
    ref, sess = reference_session(original), InferenceSession(fused)
    rng = np.random.default_rng(5)
    for shape in shapes:
        x = rng.standard_normal(shape).astype(np.float32)
        want, got = ref.run(None, {"x": x}), sess.run(None, {"x": x})
        for w, g in zip(want, got):
            np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL, err_msg=f"at {shape}")


def _symbolic_dims(vi: onnx.ValueInfoProto) -> list:
    return [d.dim_param or (d.dim_value if d.HasField("dim_value") else "?") for d in vi.type.tensor_type.shape.dim]


def test_a_pinned_recognizer_runs_at_every_width_and_batch(library):
    model = recognizer()
    result = api.fuse(model, input_shapes={"x": [1, 3, 8, 32]})
    fused = result.model
    assert _symbolic_dims(fused.graph.input[0]) == ["N", 3, 8, "W"]
    ops = {n.op_type for n in fused.graph.node}
    assert ops == {"MLUFusionBlock"}, ops  # shape arithmetic and the Scan over time run in blocks
    bodies = [body_model(n) for n in fused.graph.node if is_fusion_block(n)]
    assert any(n.op_type == "Scan" for b in bodies for n in b.graph.node)
    for body in bodies:  # no pinned size is baked into a block's interface
        for vi in (*body.graph.input, *body.graph.output):
            assert 32 not in _symbolic_dims(vi), (vi.name, _symbolic_dims(vi))
    _matches(model, fused, [(1, 3, 8, 32), (1, 3, 8, 17), (3, 3, 8, 96), (2, 3, 8, 1)])


def test_a_pinned_detector_runs_at_other_sizes_despite_a_stale_traced_output_shape(library):
    model = detector()
    fused = api.fuse(model, input_shapes={"x": [1, 3, 32, 32]}).model
    _matches(model, fused, [(1, 3, 32, 32), (2, 3, 64, 48), (1, 3, 10, 6)])


def test_pins_price_the_plan_and_leave_the_same_graph():
    """The pin changes the layers' prices, not which nodes are blocks or the graph's dims."""
    small = api.inspect(detector(), input_shapes={"x": [1, 3, 32, 32]})
    large = api.inspect(detector(), input_shapes={"x": [4, 3, 256, 256]})
    assert [layer.name for layer in small.layers] == [layer.name for layer in large.layers]
    conv = next(layer for layer in small.layers if layer.name == "conv0")
    conv_large = next(layer for layer in large.layers if layer.name == "conv0")
    assert conv_large.ops == pytest.approx(conv.ops * 4 * 64)


def test_an_unpinned_model_is_planned_as_if_pinned_at_the_stated_defaults(library):
    unpinned = api.fuse(detector())
    pinned = api.fuse(detector(), input_shapes={"x": [1, 3, 224, 224]})
    assert unpinned.plan.blocks == pinned.plan.blocks
    assert unpinned.block_latency_us == pinned.block_latency_us
    assert unpinned.analysis.input_shapes == {"x": [1, 3, 224, 224]}


def test_a_model_that_does_not_run_at_the_defaults_is_planned_at_a_size_it_runs(library):
    """A recognizer built for 32-row lines: 224 rows do not reduce to the 2 its Reshape needs,
    32 does (the first fallback size), and a diagnostic names the shape taken."""
    model = recognizer(height=32)
    model.graph.input[0].type.tensor_type.shape.dim[2].dim_param = "H"
    result = api.fuse(model)
    notes = [d for d in result.diagnostics if d.rule == "default-shape"]
    assert notes and "planned at x:1x3x32x32" in notes[0].message
    assert result.analysis.input_shapes == {"x": [1, 3, 32, 32]}
    assert not result.analysis.host_reasons


def test_ranges_price_the_plan_at_min_opt_and_max(library):
    pins = {"x": [1, 3, 8, DimRange(16, 32, 512)]}
    result = api.fuse(recognizer(), input_shapes=pins)
    profile = result.profile
    assert list(profile.latency_us) == ["min", "opt", "max"]
    assert profile.latency_us["min"] < profile.latency_us["opt"] < profile.latency_us["max"]
    assert profile.latency_us["opt"] == pytest.approx(sum(result.block_latency_us))
    assert profile.inputs["max"] == {"x": [1, 3, 8, 512]}
    assert all(set(b.best_mp) == {"min", "opt", "max"} for b in profile.blocks)


def test_check_runs_at_several_shapes_and_skips_those_the_original_refuses(library, tmp_path):
    model = recognizer()
    model.graph.input[0].type.tensor_type.shape.dim[2].dim_param = "H"  # only H = 5..8 reshapes
    original, fused = tmp_path / "rec.onnx", tmp_path / "rec.fused.onnx"
    onnx.save(model, original)
    api.fuse_to_file(original, fused, input_shapes={"x": [1, 3, 8, 20]})
    report = api.check(original, fused, input_shapes={"x": [1, 3, 8, 20]})
    assert report.ok
    runs = {run.label: run for run in report.shapes}
    assert runs["pinned"].status == "ok" and runs["other batch"].shapes == {"x": [2, 3, 8, 20]}
    assert runs["other W (x[3])"].status == "ok" and runs["other W (x[3])"].shapes == {"x": [1, 3, 8, 40]}
    assert runs["other H (x[2])"].status == "skipped" and "refuses" in runs["other H (x[2])"].note


def test_check_doubles_dims_together_where_they_are_sums_of_others(library, tmp_path):
    """A decoder step's mask spans past + sequence, each dim named on its own: the original refuses
    each one-dim change, so before only the pinned shape and the batch ran; all doubled together
    they add up again and run."""
    nodes = [helper.make_node("Concat", ["past", "x"], ["keys"], axis=1),
             helper.make_node("Add", ["keys", "mask"], ["scores"]),
             helper.make_node("Relu", ["scores"], ["y"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence"]),
              helper.make_tensor_value_info("past", TensorProto.FLOAT, ["batch", "past"]),
              helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["batch", "total"])]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    original, fused = tmp_path / "step.onnx", tmp_path / "step.fused.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), original)
    pins = {"x": [1, 2], "past": [1, 3], "mask": [1, 5]}
    api.fuse_to_file(original, fused, input_shapes=pins)
    runs = {run.label: run for run in api.check(original, fused, input_shapes=pins).shapes}
    assert runs["other sizes together"].status == "ok"
    assert runs["other sizes together"].shapes == {"x": [1, 4], "past": [1, 6], "mask": [1, 10]}


def test_check_fails_where_the_fused_model_fails_and_the_original_runs(library, tmp_path):
    """A fused model made static at the pin (what pins used to do) fails the check."""
    model = detector()
    original, fused = tmp_path / "det.onnx", tmp_path / "det.fused.onnx"
    onnx.save(model, original)
    static = api.fuse(model, input_shapes={"x": [1, 3, 32, 32]}).model
    for dim, size in zip(static.graph.input[0].type.tensor_type.shape.dim, (1, 3, 32, 32)):
        dim.dim_value = size
    onnx.save(static, fused)
    report = api.check(original, fused, input_shapes={"x": [1, 3, 32, 32]})
    assert not report.ok
    assert {run.status for run in report.shapes} == {"ok", "failed"}


@pytest.mark.parametrize("pin, why", [("x:1,3,8", "rank 4"), ("x:1,4,8,32", "fixes it at 3"),
                                      ("x:1,3,8,-5", "at least 1"), ("y:1", "not a model input")])
def test_pins_the_model_contradicts_are_one_line_errors(pin, why):
    with pytest.raises(OnnxMluError, match=why):
        api.fuse(recognizer(), input_shapes=parse_input_shapes([pin]))


# ------------------------------------------------------------------------------ outputs in place
def _graph(nodes, inputs, inits=()):
    outs = [helper.make_tensor_value_info(nodes[-1].output[0], TensorProto.FLOAT, None)]
    return helper.make_graph(nodes, "body", inputs, outs, list(inits))


def test_output_shapes_follow_input_shapes_unless_a_size_reads_an_input_value():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    t = helper.make_tensor_value_info("t", TensorProto.INT64, [2])
    two = numpy_helper.from_array(np.array([-1, 2], np.int64), "two")
    from_shape = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Reshape", ["x", "s"], ["y"])]
    from_constant = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Reshape", ["r", "two"], ["y"])]
    from_input = [helper.make_node("Reshape", ["x", "t"], ["y"])]
    from_values = [helper.make_node("Cast", ["x"], ["i"], to=TensorProto.INT64),
                   helper.make_node("ReduceMax", ["i"], ["m"], keepdims=0),
                   helper.make_node("Range", ["zero", "m", "one"], ["y"])]
    scalars = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in (("zero", 0), ("one", 1))]
    assert output_shapes_follow_inputs(_graph(from_shape, [x]))
    assert output_shapes_follow_inputs(_graph(from_constant, [x], [two]))
    assert not output_shapes_follow_inputs(_graph(from_input, [x, t]))
    assert not output_shapes_follow_inputs(_graph(from_values, [x], scalars))


def test_a_dynamic_block_learns_its_output_shapes_and_stays_exact_as_shapes_change(library):
    """Bodies of the recognizer are marked; one session run at alternating shapes (the second
    run at a shape writes in place at the learned shapes) matches the original every time."""
    model = recognizer()
    fused = api.fuse(model, input_shapes={"x": [1, 3, 8, 32]}).model
    marks = [p.value for n in fused.graph.node if is_fusion_block(n) for p in body_model(n).metadata_props
             if p.key == SHAPES_KEY]
    assert marks and set(marks) == {FOLLOW_INPUT_SHAPES}
    ref, sess = reference_session(model), InferenceSession(fused)
    rng = np.random.default_rng(9)
    for shape in [(1, 3, 8, 32), (1, 3, 8, 32), (2, 3, 8, 7), (1, 3, 8, 32), (2, 3, 8, 7), (2, 3, 8, 64)]:
        x = rng.standard_normal(shape).astype(np.float32)
        for want, got in zip(ref.run(None, {"x": x}), sess.run(None, {"x": x})):
            np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=f"at {shape}")


def test_a_static_body_carries_no_mark(chain_model):
    fused = api.fuse(chain_model).model
    assert not [p for n in fused.graph.node if is_fusion_block(n) for p in body_model(n).metadata_props]


def test_threads_sharing_a_dynamic_session_at_different_shapes_stay_exact(library):
    from concurrent.futures import ThreadPoolExecutor

    model = detector()
    fused = api.fuse(model, input_shapes={"x": [1, 3, 32, 32]}).model
    ref, sess = reference_session(model), InferenceSession(fused)
    rng = np.random.default_rng(3)
    inputs = [rng.standard_normal(s).astype(np.float32) for s in [(1, 3, 32, 32), (2, 3, 16, 24)] * 8]
    wants = [ref.run(None, {"x": x})[0] for x in inputs]
    with ThreadPoolExecutor(4) as pool:
        gots = list(pool.map(lambda x: sess.run(None, {"x": x})[0], inputs))
    for want, got in zip(wants, gots):
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
