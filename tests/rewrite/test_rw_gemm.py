"""Gemm rewriter against onnxruntime and ONNX's reference evaluator over random attributes.

Draws M, K, N, transA/transB, alpha, beta (incl. 0 and 1), every legal C shape (none from
opset 11, scalar, [1], [N], [1, N], [M, 1], [M, N]), constant or dynamic B / C (and A), and the
opset (7, 9, 11, 13). Tolerance rtol = atol = 1e-4 (float32; folding alpha/beta into
constants changes rounding only).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from rw_util import assert_close, full_check, initializer_values, op_types, run_ort

from onnxmlu.rewrite import REWRITER_NAMES, rewrite_model

F = TensorProto.FLOAT
C_SHAPES = ["none", "scalar", "one", "n", "1n", "m1", "mn"]


def gemm_model(m, k, n, trans_a, trans_b, alpha, beta, c_kind, const, opset, rng):
    a = rng.uniform(-1, 1, (k, m) if trans_a else (m, k)).astype(np.float32)
    b = rng.uniform(-1, 1, (n, k) if trans_b else (k, n)).astype(np.float32)
    c_shape = {"scalar": (), "one": (1,), "n": (n,), "1n": (1, n), "m1": (m, 1), "mn": (m, n)}.get(c_kind)
    arrays = {"a": a, "b": b}
    if c_shape is not None:
        arrays["c"] = rng.uniform(-1, 1, c_shape).astype(np.float32)
    node = helper.make_node("Gemm", list(arrays), ["y"], name="fc", alpha=alpha, beta=beta, transA=trans_a, transB=trans_b)
    inputs = [helper.make_tensor_value_info(k_, F, v.shape) for k_, v in arrays.items() if k_ not in const]
    inits = [numpy_helper.from_array(v, k_) for k_, v in arrays.items() if k_ in const]
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", F, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    return model, {k_: v for k_, v in arrays.items() if k_ not in const}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(
    m=st.integers(1, 4),
    k=st.integers(1, 4),
    n=st.integers(1, 4),
    trans_a=st.sampled_from([0, 1]),
    trans_b=st.sampled_from([0, 1]),
    alpha=st.sampled_from([1.0, 0.5, -2.0, 0.0]),
    beta=st.sampled_from([1.0, 0.25, 0.0, -1.5]),
    c_kind=st.sampled_from(C_SHAPES),
    const=st.sampled_from([(), ("b",), ("b", "c"), ("c",), ("a",)]),
    opset=st.sampled_from([7, 9, 11, 13, 26]),
    seed=st.integers(0, 2**16),
)
def test_gemm_property(m, k, n, trans_a, trans_b, alpha, beta, c_kind, const, opset, seed):
    if c_kind == "none" and opset < 11:
        c_kind = "n"  # C is required before opset 11
    rng = np.random.default_rng(seed)
    model, feeds = gemm_model(m, k, n, trans_a, trans_b, alpha, beta, c_kind, set(const), opset, rng)
    rewritten, report = rewrite_model(model, only=["gemm"])
    assert report.applied == {"gemm": 1}, report.skipped
    ops = op_types(rewritten)
    assert "Gemm" not in ops and "MatMul" in ops
    full_check(rewritten)
    got = run_ort(rewritten, feeds)
    assert_close(got, run_ort(model, feeds), what="vs onnxruntime")
    assert_close(got, ReferenceEvaluator(model).run(None, feeds), what="vs reference")
    if "b" in const:  # transpose and alpha folded into the weight: no Transpose of B, no alpha Mul
        matmul = next(nd for nd in rewritten.graph.node if nd.op_type == "MatMul")
        assert matmul.input[1] in initializer_values(rewritten)
        assert ops.count("Transpose") == trans_a
        assert not any(nd.op_type == "Mul" and matmul.output[0] in nd.input for nd in rewritten.graph.node)


def test_constant_weights_are_pre_transposed_and_scaled():
    rng = np.random.default_rng(0)
    model, feeds = gemm_model(3, 4, 5, 0, 1, 0.5, 2.0, "n", {"b", "c"}, 13, rng)
    rewritten, _ = rewrite_model(model)
    assert op_types(rewritten) == ["MatMul", "Add"]
    values = initializer_values(rewritten)
    b = numpy_helper.to_array(model.graph.initializer[0])
    c = numpy_helper.to_array(model.graph.initializer[1])
    matmul, add = rewritten.graph.node
    np.testing.assert_allclose(values[matmul.input[1]], 0.5 * b.T, rtol=1e-6)
    np.testing.assert_allclose(values[add.input[1]], 2.0 * c, rtol=1e-6)
    assert [n.name for n in rewritten.graph.node] == ["fc/matmul", "fc/bias"]
    assert rewritten.graph.output[0].name == "y"


def test_integer_gemm_is_refused():
    node = helper.make_node("Gemm", ["a", "b"], ["y"], name="g")
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info("a", TensorProto.INT32, [2, 2]), helper.make_tensor_value_info("b", TensorProto.INT32, [2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, None)],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    rewritten, report = rewrite_model(model)
    assert report.total == 0 and "float" in report.skipped[0].message
    assert op_types(rewritten) == ["Gemm"]


@pytest.mark.parametrize("bn_mode", ["substitute", "fold"])
def test_gemm_then_bn_pipeline(bn_mode):
    """BN after a Gemm: bn runs first (folding into the Gemm in fold mode), then gemm."""
    rng = np.random.default_rng(1)
    w = rng.uniform(-1, 1, (4, 3)).astype(np.float32)
    params = {k: rng.uniform(0.5, 1.5, 4).astype(np.float32) for k in ("s", "bb", "mu", "var")}
    nodes = [
        helper.make_node("Gemm", ["x", "w"], ["t"], name="fc", transB=1, alpha=1.5),
        helper.make_node("BatchNormalization", ["t", "s", "bb", "mu", "var"], ["y"], name="bn"),
    ]
    inits = [numpy_helper.from_array(w, "w")] + [numpy_helper.from_array(v, k) for k, v in params.items()]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [2, 3])],
                              [helper.make_tensor_value_info("y", F, None)], inits)  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    feeds = {"x": rng.uniform(-1, 1, (2, 3)).astype(np.float32)}
    rewritten, report = rewrite_model(model, bn_mode=bn_mode)
    assert report.applied == {**dict.fromkeys(REWRITER_NAMES, 0), "bn": 1, "gemm": 1}
    full_check(rewritten)
    expected_ops = ["MatMul", "Add"] if bn_mode == "fold" else ["MatMul", "BatchNormalization", "Mul", "Add"]
    assert op_types(rewritten) == expected_ops
    assert_close(run_ort(rewritten, feeds), run_ort(model, feeds))


@pytest.mark.parametrize("opset", range(7, onnx.defs.onnx_opset_version() + 1))
def test_every_opset(opset):
    rng = np.random.default_rng(opset)
    for const in (set(), {"b", "c"}):
        model, feeds = gemm_model(3, 2, 4, 1, 1, 0.5, 2.0, "1n", const, opset, rng)
        rewritten, report = rewrite_model(model)
        assert report.total == 1 and rewritten.opset_import[0].version == opset
        full_check(rewritten)
        if opset <= 26:  # the newest opset onnxruntime 1.31 runs
            assert_close(run_ort(rewritten, feeds), run_ort(model, feeds))


@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_gemms_sharing_a_weight_share_its_one_transposed_copy(alpha):
    """An unrolled RNN applies one Linear at every step: 8 Gemms read one B. The rewrite writes
    one transposed (and scaled) copy, not one per node, and no other weight."""
    rng = np.random.default_rng(0)
    b = numpy_helper.from_array(rng.standard_normal((6, 4)).astype(np.float32), "B")
    steps = [helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, [2, 4]) for i in range(8)]
    nodes = [helper.make_node("Gemm", [f"x{i}", "B"], [f"y{i}"], transB=1, alpha=alpha) for i in range(8)]
    outputs = [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [2, 6]) for i in range(8)]
    model = helper.make_model(helper.make_graph(nodes, "steps", steps, outputs, [b]),
                              opset_imports=[helper.make_opsetid("", 17)])
    rewritten, report = rewrite_model(model)
    assert report.applied["gemm"] == 8
    weights = [t for t in rewritten.graph.initializer if len(t.dims) == 2]
    assert [list(t.dims) for t in weights] == [[4, 6]]
    feeds = {f"x{i}": rng.standard_normal((2, 4)).astype(np.float32) for i in range(8)}
    assert_close(run_ort(rewritten, feeds), run_ort(model, feeds))
