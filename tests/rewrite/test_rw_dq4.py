"""4-bit DequantizeLinear (INT4/UINT4, per tensor, per axis, blocked) rewritten to packed uint8
bytes dequantized in the body, against onnxruntime 1.32 and onnx.reference. Exact: every step
is integer arithmetic in float32 and one multiply by the scale, as the kernel computes
(tolerance 1e-6 relative for that multiply's operand order).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from rw_util import assert_close, full_check, op_types, run_ort

from onnxmlu.rewrite import rewrite_model

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)


def dq_model(shape, signed, mode, axis, block, zp, matmul, rng, dtype=np.float32):
    """One DequantizeLinear of a 4-bit constant ``x`` (into ``MatMul(a, w)`` when ``matmul``);
    ``dtype``: the scales' type, and so ``w``'s and ``a``'s."""
    kind, low, high = (TensorProto.INT4, -8, 8) if signed else (TensorProto.UINT4, 0, 16)
    x = rng.integers(low, high, shape)
    rank = len(shape)
    if mode == "tensor":
        param_shape = []
    elif mode == "axis":
        param_shape = [shape[axis]]
    else:
        param_shape = [-(-d // block) if i == axis % rank else d for i, d in enumerate(shape)]  # ceil
    inits = [helper.make_tensor("x", kind, shape, x.reshape(-1).tolist()),
             numpy_helper.from_array(rng.uniform(0.01, 0.1, param_shape).astype(dtype), "s")]
    names = ["x", "s"]
    if zp:
        inits.append(helper.make_tensor("zp", kind, param_shape, rng.integers(low, high, param_shape).reshape(-1).tolist()))
        names.append("zp")
    attrs = {} if mode == "tensor" else {"axis": axis} | ({"block_size": block} if mode == "block" else {})
    nodes = [helper.make_node("DequantizeLinear", names, ["w"], **attrs)]
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    inputs, feeds = [], {}
    if matmul:  # a linear layer's weight [K, N]
        nodes.append(helper.make_node("MatMul", ["a", "w"], ["y"]))
        inputs = [helper.make_tensor_value_info("a", elem, [3, shape[0]])]
        feeds = {"a": rng.standard_normal((3, shape[0])).astype(dtype)}
    out = "y" if matmul else "w"
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info(out, elem, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model, feeds


@settings(max_examples=40, **SETTINGS)
@given(rank=st.integers(1, 3), signed=st.booleans(), mode=st.sampled_from(["tensor", "axis", "block"]),
       block=st.sampled_from([2, 4, 16]), zp=st.booleans(), seed=st.integers(0, 2**16))
def test_dq4_property(rank, signed, mode, block, zp, seed):
    rng = np.random.default_rng(seed)
    shape = [int(d) for d in rng.integers(1, 6, rank)]
    axis = int(rng.integers(-rank, rank))
    if mode == "block":
        shape[axis % rank] = block * int(rng.integers(2, 4))  # one block reads as per tensor
    model, feeds = dq_model(shape, signed, mode, axis, block, zp, False, rng)
    rewritten, report = rewrite_model(model, only=["dq4"])
    assert report.applied["dq4"] == 1, report.skipped
    assert "DequantizeLinear" not in op_types(rewritten)
    full_check(onnx.shape_inference.infer_shapes(rewritten))
    got = run_ort(rewritten, feeds)
    assert_close(got, run_ort(model, feeds), rtol=1e-6, atol=0)
    assert_close(got, ReferenceEvaluator(model).run(None, feeds), rtol=1e-6, atol=0, what="vs reference")


@pytest.mark.parametrize(("shape", "axis", "block", "signed"), [
    ([10, 6], 0, 4, True), ([3, 33], -1, 16, False), ([7, 3, 5], 1, 2, True), ([5, 3], 0, 8, False)])
def test_partial_last_block(shape, axis, block, signed):
    """The operator's last block covers what is left of the axis (ceil(D / block_size) scales);
    it was refused as 'not a multiple of block_size'."""
    model, feeds = dq_model(shape, signed, "block", axis, block, True, False, np.random.default_rng(3))
    rewritten, report = rewrite_model(model, only=["dq4"])
    assert report.applied["dq4"] == 1, report.skipped
    full_check(onnx.shape_inference.infer_shapes(rewritten))
    got = run_ort(rewritten, feeds)
    assert_close(got, run_ort(model, feeds), rtol=1e-6, atol=0)
    assert_close(got, ReferenceEvaluator(model).run(None, feeds), rtol=1e-6, atol=0, what="vs reference")


def test_blocked_int4_weight_keeps_its_size():
    """onnxruntime's QDQ 4-bit form: a blocked INT4 [K, N] weight into a MatMul. The rewritten
    file holds the same packed bytes (no int8 or float copy)."""
    rng = np.random.default_rng(2)
    model, feeds = dq_model([256, 64], True, "block", 0, 32, True, True, rng)
    rewritten, report = rewrite_model(model)
    assert report.applied["dq4"] == 1
    assert rewritten.ByteSize() <= 1.02 * model.ByteSize() + 4096
    assert_close(run_ort(rewritten, feeds), run_ort(model, feeds))


@pytest.mark.parametrize("kind", [TensorProto.INT8, TensorProto.UINT8])
def test_eight_bit_dequantize_is_not_its_business(kind):
    x = helper.make_tensor("x", kind, [4], [1, 2, 3, 4])
    graph = helper.make_graph([helper.make_node("DequantizeLinear", ["x", "s"], ["y"])], "g", [],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [x, numpy_helper.from_array(np.float32(0.5), "s")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    rewritten, report = rewrite_model(model)
    assert report.total == 0 and report.skipped == []


def test_eight_bit_qdq_model_is_not_imported(monkeypatch):
    """A QDQ model with only 8-bit DequantizeLinear nodes is never imported into graphsurgeon:
    no round trip (a copy of every weight) for nodes the rewriter does not own."""
    import onnxmlu.rewrite as rewrite

    def no_import(*_):
        raise AssertionError("imported a model with nothing to rewrite")

    monkeypatch.setattr(rewrite, "import_graph", no_import)
    x = helper.make_tensor("x", TensorProto.INT8, [4], [1, 2, 3, 4])
    graph = helper.make_graph([helper.make_node("DequantizeLinear", ["x", "s"], ["y"])], "g", [],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [x, numpy_helper.from_array(np.float32(0.5), "s")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    rewritten, report = rewrite.rewrite_owned(model)
    assert rewritten is model and report.total == 0


@pytest.mark.parametrize(("shape", "mode", "axis", "block", "signed", "zp"), [
    ([64, 8], "block", 0, 16, True, True), ([10, 6], "block", 0, 4, False, True), ([3, 33], "block", -1, 16, True, False),
    ([7, 3, 5], "axis", 1, 0, False, True), ([6, 4], "tensor", 0, 0, True, False)])
def test_float16_scales_dequantize_bit_for_bit(shape, mode, axis, block, signed, zp):
    """A float16 scale (y float16) was refused. Rewritten, the scales stay stored as float16 --
    no float32 copy -- and are widened in the body: equal to onnxruntime's kernel bit for bit
    (the product of a 4-bit integer and a float16 scale is exact in float32; one rounding)."""
    rng = np.random.default_rng(7)
    model, feeds = dq_model(shape, signed, mode, axis, block, zp, False, rng, dtype=np.float16)
    scale = next(t for t in model.graph.initializer if t.name == "s")
    scale.CopyFrom(numpy_helper.from_array(  # scales of every float16 binade a model holds
        (rng.uniform(0.5, 2, tuple(scale.dims)) * 2.0 ** rng.integers(-14, 4, tuple(scale.dims))).astype(np.float16), "s"))
    rewritten, report = rewrite_model(model, only=["dq4"])
    assert report.applied.get("dq4") == 1, report.skipped
    full_check(onnx.shape_inference.infer_shapes(rewritten))
    stored = {t.data_type for t in rewritten.graph.initializer if int(np.prod(t.dims)) == int(np.prod(scale.dims))}
    assert TensorProto.FLOAT not in stored or int(np.prod(scale.dims)) <= 1, "the scales were widened in the file"
    (got,), (expected,) = run_ort(rewritten, feeds), run_ort(model, feeds)
    assert got.dtype == expected.dtype == np.float16
    np.testing.assert_array_equal(got.view(np.uint16), expected.view(np.uint16))


def linear_stack(dtype, k: int, n: int, block: int, layers: int) -> onnx.ModelProto:
    """``layers`` x (MatMul by a blocked INT4 [k, n] weight with zero points, Relu), the values
    stored packed as ONNX packs them; ``dtype``: the scales', activations' and outputs' type."""
    from onnxmlu.rewrite.dq4 import packed_bytes

    rng = np.random.default_rng(5)
    nodes, inits, x = [], [], "a"
    packed = lambda name, dims: helper.make_tensor(  # noqa: E731
        name, TensorProto.INT4, dims, packed_bytes(rng.integers(-8, 8, dims)).tobytes(), raw=True)
    for i in range(layers):
        inits += [packed(f"w{i}", [k, n]), packed(f"z{i}", [k // block, n]),
                  numpy_helper.from_array(rng.uniform(0.01, 0.02, (k // block, n)).astype(dtype), f"s{i}")]
        nodes += [helper.make_node("DequantizeLinear", [f"w{i}", f"s{i}", f"z{i}"], [f"wf{i}"], axis=0,
                                   block_size=block),
                  helper.make_node("MatMul", [x, f"wf{i}"], [f"m{i}"], name=f"linear{i}"),
                  helper.make_node("Relu", [f"m{i}"], [f"r{i}"])]
        x = f"r{i}"
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("a", elem, ["batch", 4, k])],
                              [helper.make_tensor_value_info(x, elem, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


def test_float16_blocked_weights_fuse_into_one_int8_block_at_their_stored_size():
    """onnxruntime's QDQ 4-bit form in float16: every MatMul in one INT8 block (labelled so by
    the label rule), the fused file within 5 % of the original (the float16 scales stored as
    such), each MatMul priced at the stored bytes (4 bits a value, 2 bytes a scale, 4 bits a
    zero point), and the output within one float16 ulp of onnxruntime's (the MatMuls sum in
    another order; the dequantized weights are equal, test above)."""
    from onnxmlu import api
    from onnxmlu.runtime import InferenceSession
    from onnxmlu.schema import block_precision, body_model, is_fusion_block, label_mismatch

    k = n = 512
    block = 32
    model = linear_stack(np.float16, k, n, block, 3)
    fused = api.fuse(model, input_shapes={"a": [1, 4, k]}).model
    assert [node.op_type for node in fused.graph.node] == ["MLUFusionBlock"]
    (node,) = [node for node in fused.graph.node if is_fusion_block(node)]
    assert block_precision(node) == "int8" and label_mismatch("int8", body_model(node)) is None
    assert fused.ByteSize() <= 1.05 * model.ByteSize(), (fused.ByteSize(), model.ByteSize())
    matmuls = [layer for layer in api.inspect(model, rewrite=True).layers if layer.op_type == "MatMul"]
    assert [layer.weight_bytes for layer in matmuls] == [k * n // 2 + (k // block) * n * (2 + 1 / 2)] * 3
    feeds = {"a": np.random.default_rng(1).standard_normal((2, 4, k)).astype(np.float16)}
    (got,), (expected,) = InferenceSession(fused).run(None, feeds), run_ort(model, feeds)
    np.testing.assert_allclose(got, expected, rtol=2.0**-10, atol=2.0**-10 * float(np.abs(expected).max()))
