"""INT8 quantizes what the part quantizes: BatchNormalization folded into its convolution before
INT8 or auto planning, what cannot fold quantized per channel, an FC bias kept in INT32; and
the INT8 model as accurate as onnxruntime's own ``quantize_static`` of the original, judged on
samples that did not calibrate either."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import quantize_static

from onnxmlu.sessions import new_options
from onnxmlu import api
from onnxmlu.pipeline import Options
from onnxmlu.precision.accuracy import cosine_similarity
from onnxmlu.precision.calibration import SampleReader
from onnxmlu.precision.int8 import Int8Options, fc_bias_as_gemm, per_channel_constants, to_int8
from onnxmlu.runtime import InferenceSession, reference_session
from onnxmlu.tools.testing import make_model, synthetic_model, zoo_model
from onnxmlu.tools.verify import random_inputs


def test_bn_folds_by_default_under_int8_and_auto_only():
    assert Options.of(precision="int8").rewrite.bn_mode == "fold" and Options.of(precision="auto").rewrite.bn_mode == "fold"
    assert Options().rewrite.bn_mode == Options.of(precision="fp16").rewrite.bn_mode == "substitute"
    assert Options.of(precision="int8", bn_mode="substitute").rewrite.bn_mode == "substitute"  # asked: kept
    model = synthetic_model(9, "chain")  # Conv -> BN -> Relu, three times
    folded = api.fuse(model, precision="int8", strategy="all-fusion")
    substituted = api.fuse(model, precision="int8", strategy="all-fusion", bn_mode="substitute")
    assert len(folded.analysis.layers) == 6 and len(substituted.analysis.layers) > 6
    assert not [n for n in folded.analysis.model.graph.node if n.op_type == "BatchNormalization"]


def _scale_layer_model() -> onnx.ModelProto:
    """x -> Mul([C,1,1]) -> Add([C,1,1]): a normalization that had no producer to fold into,
    one channel's factor 1000x smaller than another's."""
    a = np.array([1.0, 0.5, 0.001, 2.0], np.float32).reshape(4, 1, 1)
    b = np.array([0.1, -3.0, 0.002, 0.0], np.float32).reshape(4, 1, 1)
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "a"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])], "scale",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 3, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 3, 3])],
        [numpy_helper.from_array(a, "a"), numpy_helper.from_array(b, "b")])
    return make_model(graph, 17)


def test_an_unfolded_normalization_is_quantized_per_channel():
    model = _scale_layer_model()
    assert per_channel_constants(model.graph) == {"a": [{"axis": 0}], "b": [{"axis": 0}]}
    rng = np.random.default_rng(0)
    samples = [{"x": rng.standard_normal((1, 4, 3, 3)).astype(np.float32)} for _ in range(4)]
    body = to_int8(model, samples)
    inits = {t.name: numpy_helper.to_array(t) for t in body.graph.initializer}
    for name, original in (("a", model.graph.initializer[0]), ("b", model.graph.initializer[1])):
        scale, codes = inits[f"{name}_scale"], inits[f"{name}_quantized"]
        assert scale.shape == (4,)  # one scale per channel, not one for the vector
        # one value per channel is its channel's maximum: stored exactly (code +-127 or 0)
        np.testing.assert_allclose(codes.reshape(4) * scale, numpy_helper.to_array(original).reshape(4), rtol=1e-6)


def test_fc_bias_is_merged_into_a_gemm_only_for_a_2d_fc():
    w = numpy_helper.from_array(np.ones((4, 3), np.float32), "w")
    bias = numpy_helper.from_array(np.ones(3, np.float32), "bias")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "bias"], ["y"])], "fc",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], [w, bias])
    model = make_model(graph, 17)
    merged = fc_bias_as_gemm(model)
    assert [n.op_type for n in merged.graph.node] == ["Gemm"] and [n.op_type for n in model.graph.node] == [
        "MatMul", "Add"]
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    run = lambda m: ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(  # noqa: E731
        None, {"x": x})[0]
    np.testing.assert_array_equal(run(merged), run(model))
    graph.input[0].type.tensor_type.shape.dim.insert(0, onnx.TensorShapeProto.Dimension(dim_value=1))  # rank 3
    assert fc_bias_as_gemm(make_model(graph, 17)).graph.node[0].op_type == "MatMul"


def _deficits(session, feeds, expected) -> float:
    return float(np.mean([1.0 - cosine_similarity(e, session.run(None, f)[0]) for f, e in zip(feeds, expected)]))


def test_resnet18_int8_is_at_least_as_accurate_as_onnxruntimes_quantize_static(tmp_path):
    """Both calibrated on the same 4 seeded samples with the same scheme, judged on 4 others
    (scripts/int8_vs_ort.py publishes the full comparison)."""
    model = zoo_model("resnet18")
    calibration = [random_inputs(model, seed) for seed in range(4)]
    held_out = [random_inputs(model, 1000 + k) for k in range(4)]
    reference = reference_session(model)
    expected = [reference.run(None, f)[0] for f in held_out]
    for k, sample in enumerate(calibration):
        np.savez(tmp_path / f"s{k}.npz", **sample)
    fused = InferenceSession(api.fuse(model, precision="int8", calibration=tmp_path).model)
    with tempfile.TemporaryDirectory() as folder:
        source, target = Path(folder) / "m.onnx", Path(folder) / "m.int8.onnx"
        onnx.save(model, source.as_posix())
        quantize_static(source, target, SampleReader(calibration), **Int8Options().quantize_arguments())
        theirs = ort.InferenceSession(target.as_posix(), new_options(), providers=["CPUExecutionProvider"])
        ours_deficit, their_deficit = _deficits(fused, held_out, expected), _deficits(theirs, held_out, expected)
    assert 0 < ours_deficit <= their_deficit * 1.02, (ours_deficit, their_deficit)
