"""Models that onnxruntime runs and the toolkit once refused or mis-fused, each a few nodes:
an onnxruntime operator onnx has no schema for at the model's opset, a float16 model whose
host nodes onnxruntime runs in float, string inputs, a graph that folds to constants, and a
length read from an input. Each fused model must load, match and check."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxmlu import api
from onnxmlu.errors import OnnxMluError
from onnxmlu.runtime import InferenceSession, reference_session

RNG = np.random.default_rng(7)


def _model(nodes, inputs, outputs, inits=(), opset=17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _weight(name, *shape, dtype=np.float32):
    return numpy_helper.from_array((RNG.standard_normal(shape) * 0.3).astype(dtype), name)


def _host_reasons(result) -> dict[str, str]:
    return {row["op_type"]: row["reason"] for row in result.analysis.host_nodes()}


def test_onnxruntime_layernorm_below_opset_17_is_rewritten_into_the_block(tmp_path):
    """onnxruntime's optimizer writes LayerNormalization into opset-14 models; onnx has no
    schema for it before 17, onnxruntime runs it. Rewritten into its arithmetic, it joins the
    MatMuls in one block (before, it stayed on the host between two)."""
    d = 8
    model = _model(
        [helper.make_node("MatMul", ["x", "W"], ["h"]),
         helper.make_node("LayerNormalization", ["h", "g", "b"], ["n"], axis=-1, epsilon=1e-5),
         helper.make_node("MatMul", ["n", "W2"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, d])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, d])],
        [_weight("W", d, d), _weight("W2", d, d), numpy_helper.from_array(np.full(d, 1.5, np.float32), "g"),
         numpy_helper.from_array(np.full(d, 0.1, np.float32), "b")], opset=14)
    result = api.fuse_to_file(model, tmp_path / "f.onnx", check=api.CheckOptions())
    assert result.check.ok
    assert "LayerNormalization" not in _host_reasons(result)
    assert len(result.plan.blocks) == 1


def test_a_contrib_op_whose_domain_the_file_does_not_import_fuses(tmp_path):
    """``onnx.save(optimize_model(...).model)`` writes no opset import for com.microsoft (the
    optimizer's own save adds one); onnxruntime runs the file, the checker refused it. The import
    is added on load: the model fuses into one block and checks, the file is left as it was."""
    d = 8
    model = _model(
        [helper.make_node("MatMul", ["x", "W"], ["h"]),
         helper.make_node("BiasGelu", ["h", "b"], ["g"], domain="com.microsoft"),
         helper.make_node("MatMul", ["g", "W2"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, d])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, d])],
        [_weight("W", d, d), _weight("W2", d, d), _weight("b", d)], opset=14)
    src = tmp_path / "m.onnx"
    onnx.save(model, src)
    result = api.fuse_to_file(api.load_model(src), tmp_path / "f.onnx", check=api.CheckOptions())
    assert result.check.ok and len(result.plan.blocks) == 1 and not _host_reasons(result)
    assert [imp.domain for imp in onnx.load(src).opset_import] == [""]


def test_an_operator_nobody_defines_is_still_refused(tmp_path):
    model = _model([helper.make_node("Cnov", ["x"], ["y"])],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    with pytest.raises(OnnxMluError, match="ONNX checker"):
        api.fuse_to_file(model, tmp_path / "f.onnx")


def _fp16_host_op_model() -> onnx.ModelProto:
    """Relu -> CumSum -> Relu -> CumSum -> Relu in float16 with a symbolic length: the CumSums
    stay on the host (not in the accelerator's table), and onnxruntime's CPU provider, which has
    no float16 CumSum, runs them in float between Casts."""
    half = TensorProto.FLOAT16
    axis = numpy_helper.from_array(np.array(2, np.int64), "axis")
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("CumSum", ["a", "axis"], ["b"]),
             helper.make_node("Relu", ["b"], ["c"]), helper.make_node("CumSum", ["c", "axis"], ["d"]),
             helper.make_node("Relu", ["d"], ["y"])]
    return _model(nodes, [helper.make_tensor_value_info("x", half, [1, 4, "L"])],
                  [helper.make_tensor_value_info("y", half, [1, 4, "L"])], [axis])


def test_fp16_model_with_host_ops_loads_and_matches(tmp_path):
    """The blocks next to a Conv onnxruntime runs in float get float where their bodies read and
    write float16 (onnxruntime dropped the Casts): the library converts as those Casts would.
    Tolerance: one float16 ulp, since onnxruntime's reference keeps CumSum -> Relu -> CumSum in float
    where the fused model rounds at the block boundary."""
    model = _fp16_host_op_model()
    out = tmp_path / "f.onnx"
    result = api.fuse_to_file(model, out)
    assert len(result.plan.blocks) == 3 and set(_host_reasons(result)) == {"CumSum"}
    x = RNG.standard_normal((1, 4, 16)).astype(np.float16)
    got = InferenceSession(str(out)).run(None, {"x": x})[0]
    want = reference_session(model).run(None, {"x": x})[0]
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2e-3, atol=2e-3)


def test_fuse_removes_a_model_onnxruntime_refuses(tmp_path, monkeypatch):
    """A float16 model is loaded after writing; a refusal is the error and no file is left."""
    import onnxmlu.tools.verify as verify

    monkeypatch.setattr(verify, "load_error", lambda path: "refused for the test")
    out = tmp_path / "f.onnx"
    with pytest.raises(OnnxMluError, match="does not load in onnxruntime.*refused for the test"):
        api.fuse_to_file(_fp16_host_op_model(), out)
    assert not out.exists()


def test_check_takes_string_inputs_from_the_user(tmp_path):
    model = _model(
        [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Relu", ["h"], ["y"]),
         helper.make_node("Identity", ["s"], ["t"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4]),
         helper.make_tensor_value_info("s", TensorProto.STRING, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4]),
         helper.make_tensor_value_info("t", TensorProto.STRING, [1])], [_weight("W", 4, 4)])
    onnx.save(model, tmp_path / "m.onnx")
    api.fuse_to_file(tmp_path / "m.onnx", tmp_path / "f.onnx")
    report = api.check(tmp_path / "m.onnx", tmp_path / "f.onnx", inputs={"s": np.array(["hello"])})
    assert report.ok and [d.name for d in report.diffs] == ["y", "t"]


def test_check_takes_a_model_that_folded_to_constants(tmp_path):
    ones = numpy_helper.from_array(np.ones((2, 2), np.float32), "c")
    model = _model([helper.make_node("Add", ["c", "c"], ["y"])], [],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])], [ones])
    onnx.save(model, tmp_path / "m.onnx")
    api.fuse_to_file(tmp_path / "m.onnx", tmp_path / "f.onnx")
    assert not onnx.load(tmp_path / "f.onnx").graph.node
    assert api.check(tmp_path / "m.onnx", tmp_path / "f.onnx").ok


def test_the_shape_probe_runs_the_users_values(tmp_path):
    """A length read from an input sets the Conv's size: with zeros it is 0 (the Conv stays on
    the host); with the user's value the Conv is sized and fused."""
    model = _model(
        [helper.make_node("Slice", ["x", "zero", "n", "axis"], ["s"]),
         helper.make_node("Conv", ["s", "w"], ["c"], pads=[1, 1]), helper.make_node("Relu", ["c"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 32]),
         helper.make_tensor_value_info("n", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [_weight("w", 4, 4, 3), numpy_helper.from_array(np.array([0], np.int64), "zero"),
         numpy_helper.from_array(np.array([2], np.int64), "axis")])
    values = {"n": np.array([16], np.int64)}
    assert "Conv" in _host_reasons(api.fuse_to_file(model, tmp_path / "zeros.onnx"))
    result = api.fuse_to_file(model, tmp_path / "f.onnx", check=api.CheckOptions(inputs=values))
    assert result.check.ok and not _host_reasons(result)
    assert len(result.plan.blocks) == 1
