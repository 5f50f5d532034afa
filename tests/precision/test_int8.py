"""INT8 blocks: the fused block equals onnxruntime.quantization's own QDQ model of the same
subgraph, the scheme is the documented one, the fused model runs in plain onnxruntime."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, numpy_helper
from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

from onnxmlu.sessions import new_options
from onnxmlu import api
from onnxmlu.collapse.blocks import collapse
from onnxmlu.errors import OnnxMluError
from onnxmlu.precision.bodies import BlockBodies
from onnxmlu.precision.calibration import SampleReader, capture_tensors, random_calibration
from onnxmlu.precision.int8 import CALIBRATION_KEY, Int8Options, float_nodes, to_int8
from onnxmlu.runtime import InferenceSession
from onnxmlu.schema import block_precision, body_model, is_fusion_block
from onnxmlu.tools.verify import random_inputs
from precision_models import fuse, residual_model, run_plain_and_reference, two_block_plan

METHODS = {"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy,
           "percentile": CalibrationMethod.Percentile}


def _blocks(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if is_fusion_block(n)]


def _own_qdq_model(model: onnx.ModelProto, inputs: list[str], outputs: list[str], samples, method: str,
                   extra: dict | None = None) -> onnx.ModelProto:
    """onnxruntime's static quantizer on the subgraph ``inputs -> outputs`` of ``model``, with
    the scheme docs/precision.md states, written out here rather than taken from onnxmlu."""
    subgraph = _fc_as_gemm(onnx.utils.Extractor(onnx.shape_inference.infer_shapes(model)).extract_model(inputs, outputs))
    options = {"WeightSymmetric": True, "ActivationSymmetric": True, **(extra or {})}
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "q.onnx"
        quantize_static(subgraph, path, SampleReader(samples), quant_format=QuantFormat.QDQ, per_channel=True,
                        weight_type=QuantType.QInt8, activation_type=QuantType.QInt8,
                        calibrate_method=METHODS[method], extra_options=options)
        return onnx.load(path.as_posix())


def _fc_as_gemm(model: onnx.ModelProto) -> onnx.ModelProto:
    """The residual model's FC layer ``MatMul(f, fc) + fc_b`` as the one Gemm the part runs (its
    bias added in INT32), as docs/precision.md states INT8 quantizes it."""
    nodes = list(model.graph.node)
    matmul = next(n for n in nodes if n.op_type == "MatMul")
    add = next(n for n in nodes if n.op_type == "Add" and matmul.output[0] in n.input)
    gemm = onnx.helper.make_node("Gemm", [matmul.input[0], matmul.input[1], "fc_b"], list(add.output))
    del model.graph.node[:]
    model.graph.node.extend(gemm if n is matmul else n for n in nodes if n is not add)
    return model


@pytest.mark.parametrize("method", ["minmax", "entropy", "percentile"])
def test_int8_block_equals_onnxruntimes_own_qdq_model_of_the_subgraph(library, method):
    model = residual_model(seed=4)
    calibration = random_calibration(model, count=6, seed=11)
    analysis = api.inspect(model, rewrite=True)
    bodies = BlockBodies(analysis, calibration, Int8Options(method=method))
    fused = collapse(analysis, two_block_plan(("fp32", "int8")), bodies=bodies)
    assert [block_precision(n) for n in _blocks(fused)] == ["fp32", "int8"]
    # the block's calibration inputs: the tensor h entering block 1, on the same samples
    samples = capture_tensors(analysis.model, ["h"], calibration.samples)
    extra = {"CalibPercentile": 99.999} if method == "percentile" else None
    reference = _own_qdq_model(analysis.model, ["h"], ["y"], samples, method, extra)
    fused_session, reference_session_ = InferenceSession(fused), ort.InferenceSession(
        reference.SerializeToString(), new_options(), providers=["CPUExecutionProvider"])
    for seed in range(3):
        h, y = fused_session.run(["h", "y"], random_inputs(model, 100 + seed))
        np.testing.assert_array_equal(y, reference_session_.run(["y"], {"h": h})[0])


def test_int8_scheme_is_per_channel_symmetric_int8_weights_and_symmetric_int8_activations():
    model = residual_model(seed=5)
    calibration = random_calibration(model, count=4)
    samples = capture_tensors(model, ["x"], calibration.samples)
    body = to_int8(onnx.shape_inference.infer_shapes(model), samples, note="test")
    graph = body.graph
    inits = {t.name: t for t in graph.initializer}
    dequantize = [n for n in graph.node if n.op_type == "DequantizeLinear"]
    weights = {"w1": 8, "w2": 8, "w3": 8, "fc": 10}
    for node in dequantize:
        data, scale, zero = (node.input[k] for k in range(3))
        if data in inits and inits[data].data_type == TensorProto.INT8 and len(inits[data].dims) > 1:
            axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
            assert numpy_helper.to_array(inits[scale]).shape == (inits[data].dims[axis],)  # per channel
            weights.pop(next(w for w in weights if data.startswith(w)))
        assert not np.any(numpy_helper.to_array(inits[zero]))  # symmetric: every zero point 0
        assert inits[zero].data_type in (TensorProto.INT8, TensorProto.INT32)
    assert not weights, f"weights not quantized per channel: {weights}"
    activations = [n for n in graph.node if n.op_type == "QuantizeLinear"]
    assert activations and all(inits[n.input[2]].data_type == TensorProto.INT8 for n in activations)
    props = {e.key: e.value for e in body.metadata_props}
    assert props["onnxmlu.precision"] == "int8" and "minmax" in props[CALIBRATION_KEY]
    assert float_nodes(body) == []  # every layer of this model has a QDQ form


def test_uint8_activations_are_asymmetric():
    model = residual_model(seed=5)
    samples = capture_tensors(model, ["x"], random_calibration(model, count=2).samples)
    body = to_int8(onnx.shape_inference.infer_shapes(model), samples, Int8Options(activations="uint8"))
    inits = {t.name: t for t in body.graph.initializer}
    zeros = [inits[n.input[2]] for n in body.graph.node if n.op_type == "QuantizeLinear"]
    assert {z.data_type for z in zeros} == {TensorProto.UINT8}
    assert any(np.any(numpy_helper.to_array(z)) for z in zeros)


def test_fused_int8_model_runs_in_plain_onnxruntime_with_the_library(library):
    model = residual_model(seed=6)
    fused = fuse(model, two_block_plan(("int8", "int8"))).model
    (y, h), (y_ref, h_ref) = run_plain_and_reference(model, fused, library, 3)
    # h: an INT8 tensor dequantized (symmetric: integer multiples of one scale, |q| <= 127)
    # within two steps of FP32 (the input's, the weights' and its own rounding)
    step = np.diff(np.unique(h)).min()
    codes = h / step
    assert np.abs(codes - np.round(codes)).max() < 1e-3 and np.abs(codes).max() <= 127.5
    assert np.abs(h - h_ref).max() <= 2 * step
    cosine = float(y.ravel() @ y_ref.ravel() / np.linalg.norm(y) / np.linalg.norm(y_ref))
    assert cosine > 0.99
    assert all("int8" in n.doc_string and "random" in n.doc_string for n in _blocks(fused))
    props = {e.key: e.value for e in body_model(_blocks(fused)[1]).metadata_props}
    assert "seeded random samples" in props[CALIBRATION_KEY]


def test_bad_options_are_refused():
    with pytest.raises(OnnxMluError, match="calibration method"):
        Int8Options(method="distribution")
    with pytest.raises(OnnxMluError, match="activations"):
        Int8Options(activations="int4")

