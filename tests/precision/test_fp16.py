"""FP16 blocks: the body transform, its rounding against numpy's float16 rounding of the
reference layer outputs, and the fused model in plain onnxruntime with the library."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnxmlu import api
from onnxmlu.plan.plan import with_precision
from onnxmlu.precision.fp16 import PRECISION_KEY, VALUE_PRESERVING_OPS, to_fp16
from onnxmlu.runtime import InferenceSession, reference_session
from onnxmlu.schema import block_precision, body_model, is_fusion_block
from onnxmlu.tools.testing import conv_chain_model, make_model
from onnxmlu.tools.verify import random_inputs
from precision_models import fp16_reference, fuse, residual_model, round16, run_plain_and_reference, two_block_plan


def _fp16_ulp(x: np.ndarray) -> np.ndarray:
    """The spacing of FP16 values at |x| (the subnormal spacing below the normal range)."""
    return np.maximum(np.spacing(np.abs(x).astype(np.float16)).astype(np.float32), np.float32(2.0**-24))


def _blocks(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if is_fusion_block(n)]


def test_body_keeps_its_interface_and_stores_weights_as_fp16():
    model = onnx.shape_inference.infer_shapes(residual_model())
    body = onnx.ModelProto()
    body.CopyFrom(model)
    to_fp16(body)
    signature = lambda values: [(v.name, v.type.tensor_type.elem_type) for v in values]  # noqa: E731
    assert signature(body.graph.input) == signature(model.graph.input)
    assert signature(body.graph.output) == signature(model.graph.output)
    assert {t.data_type for t in body.graph.initializer} == {TensorProto.FLOAT16}
    assert {e.key: e.value for e in body.metadata_props}[PRECISION_KEY] == "fp16"
    raw = lambda m: sum(len(t.raw_data) for t in m.graph.initializer)  # noqa: E731
    assert raw(body) == raw(model) // 2  # weights at half the bytes
    onnx.checker.check_model(body, full_check=True)
    # one rounding pair after every layer that can make a value FP16 does not hold, none after the others
    casts = [n for n in body.graph.node if n.op_type == "Cast" and n.attribute[0].i == TensorProto.FLOAT16]
    rounded = [n for n in model.graph.node if n.op_type not in VALUE_PRESERVING_OPS]
    assert len(casts) == len(rounded) + 1  # + the body input


def test_body_rounding_equals_numpy_float16_rounding_of_each_layer():
    model = residual_model(seed=3)
    body = onnx.ModelProto()
    body.CopyFrom(onnx.shape_inference.infer_shapes(model))
    to_fp16(body)
    for seed in range(3):
        feeds = random_inputs(model, seed)
        expected = fp16_reference(model, feeds)
        got = reference_session(body).run(["y", "h"], feeds)
        np.testing.assert_array_equal(got[0], expected["y"])  # bit for bit: same kernels, same roundings
        np.testing.assert_array_equal(got[1], expected["h"])


@pytest.mark.parametrize("precisions", [("fp16", "fp16"), ("fp32", "fp16"), ("fp16", "fp32")])
def test_fused_fp16_blocks_run_in_plain_onnxruntime_with_the_library(library, precisions):
    model = residual_model(seed=1)
    fused = fuse(model, two_block_plan(precisions)).model
    assert [block_precision(n) for n in _blocks(fused)] == list(precisions)
    (y, h), (y_ref, h_ref) = run_plain_and_reference(model, fused, library, 7)
    # an FP16 block's outputs are FP16 values; an FP32 block's are not rounded
    assert np.array_equal(h, round16(h)) == (precisions[0] == "fp16")
    assert np.array_equal(y, round16(y)) == (precisions[1] == "fp16")
    # close to FP32 at FP16's precision: a few units in the last place of FP16, not more
    np.testing.assert_allclose(y, y_ref, rtol=2e-2, atol=2e-3)
    assert np.abs(y - y_ref).max() > 1e-6  # and it is not the FP32 result


def test_fused_fp16_model_follows_the_layer_by_layer_rounding(library):
    """The whole fused model (inner sessions optimized, block layouts on) against the FP16
    reference: every output an FP16 value, equal to the reference up to the last FP16 bit
    that a different FP32 summation order can flip."""
    model = residual_model(seed=2)
    fused = fuse(model, two_block_plan(("fp16", "fp16"))).model
    session = InferenceSession(fused)
    for seed in range(3):
        feeds = random_inputs(model, seed)
        expected = fp16_reference(model, feeds)
        y, h = session.run(["y", "h"], feeds)
        for got, want in ((y, expected["y"]), (h, expected["h"])):
            assert np.array_equal(got, round16(got))
            assert np.all(np.abs(got - want) <= 2 * _fp16_ulp(want))
            assert np.mean(got == want) > 0.99


def test_fp16_bodies_stay_fp16_through_the_block_layout_pass(library):
    """A model the layout pass rewrites (NCHWc between blocks, a host TopK in between)."""
    model = conv_chain_model(convs=4, channels=16, size=16)
    base = api.fuse(model)
    fused = api.fuse(model, plan=with_precision(base.plan, "fp16")).model
    feeds = random_inputs(model, 0)
    pooled = InferenceSession(fused).run(["pooled"], feeds)[0]
    assert np.array_equal(pooled, round16(pooled))
    np.testing.assert_allclose(pooled, reference_session(model).run(["pooled"], feeds)[0], rtol=2e-2, atol=2e-3)
    assert all("fp16" in n.doc_string for n in _blocks(fused))
    assert {e.key: e.value for e in body_model(_blocks(fused)[0]).metadata_props}[PRECISION_KEY] == "fp16"


def test_rounding_matches_numpy_at_ties_subnormals_and_overflow():
    graph = helper.make_graph([helper.make_node("Mul", ["x", "one"], ["y"])], "mul",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8])],
                              [onnx.numpy_helper.from_array(np.ones(1, np.float32), "one")])
    body = to_fp16(make_model(graph))
    x = np.array([1 + 2**-11, 1 + 3 * 2**-11, -(1 + 2**-11), 1e-7, 3e-8, 2.0**-26, 65519.0, 70000.0], np.float32)
    y = reference_session(body).run(None, {"x": x})[0]
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(y, x.astype(np.float16).astype(np.float32))
    assert y[0] == 1.0 and y[1] == 1 + 2**-9 and y[5] == 0.0 and y[6] == 65504.0 and np.isinf(y[7])
