"""onnxruntime's contrib transformer ops (FusedMatMul, SkipLayerNormalization,
SkipSimplifiedLayerNormalization, SimplifiedLayerNormalization, Gelu, BiasGelu, FastGelu,
QuickGelu, BiasAdd) rewritten, against onnxruntime 1.32's CPU kernels over random shapes and
attributes. Tolerance 1e-4 (float32): the rewrites reorder no sum beyond what a LayerNorm's
mean/variance pass does.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from rw_util import assert_close, full_check, op_types, run_ort

from onnxmlu.rewrite import rewrite_model

MS = "com.microsoft"
SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)


def one_node_model(node, arrays: dict, const: set, opset: int, out_dtype=TensorProto.FLOAT, outputs=None):
    """A model of ``node`` whose inputs ``arrays`` are graph inputs, or initializers when named in ``const``."""
    def info(name, value):
        return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(value.dtype), value.shape)
    inputs = [info(k, v) for k, v in arrays.items() if k not in const]
    inits = [numpy_helper.from_array(v, k) for k, v in arrays.items() if k in const]
    outs = [helper.make_tensor_value_info(o, out_dtype, None) for o in (outputs or node.output)]
    graph = helper.make_graph([node], "g", inputs, outs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)])
    model.ir_version = 8
    return model, {k: v for k, v in arrays.items() if k not in const}


def check_rewrite(model, feeds, rewriter, gone, rtol=1e-4, atol=1e-4):
    rewritten, report = rewrite_model(model, only=[rewriter])
    assert report.applied[rewriter] == 1, report.skipped
    assert not [n for n in rewritten.graph.node if n.op_type == gone and n.domain in (MS, "", "ai.onnx")
                and not (gone == "Gelu" and n.domain != MS)]
    full_check(onnx.shape_inference.infer_shapes(rewritten))  # the contrib op hid the output's shape
    assert_close(run_ort(rewritten, feeds), run_ort(model, feeds), rtol=rtol, atol=atol, what=gone)
    return rewritten


def _rand(rng, shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


# ------------------------------------------------------------------------------ FusedMatMul


@settings(max_examples=40, **SETTINGS)
@given(rank_a=st.integers(2, 4), rank_b=st.integers(2, 4), trans_a=st.booleans(), trans_b=st.booleans(),
       batch_a=st.booleans(), batch_b=st.booleans(), alpha=st.sampled_from([1.0, 0.125, -2.0]),
       const=st.sampled_from([(), ("b",), ("a",)]), opset=st.sampled_from([11, 13, 17, 21]),
       seed=st.integers(0, 2**16))
def test_fusedmatmul_property(rank_a, rank_b, trans_a, trans_b, batch_a, batch_b, alpha, const, opset, seed):
    from onnxmlu.rewrite.fusedmatmul import operand_perm
    rng = np.random.default_rng(seed)
    if batch_a or batch_b:  # the kernel takes them only for equal ranks >= 3
        rank_a = rank_b = max(rank_a, rank_b, 3)
    batch = [2, 3][: max(rank_a, rank_b) - 2]
    m, k, n = rng.integers(1, 5, 3)
    # the shapes after FusedMatMul's permutations, mapped back to what the inputs hold
    after_a, after_b = batch[len(batch) - (rank_a - 2):] + [m, k], batch[len(batch) - (rank_b - 2):] + [k, n]
    shape_a, shape_b = (_unpermuted(after, operand_perm(len(after), t, tb))
                        for after, t, tb in ((after_a, trans_a, batch_a), (after_b, trans_b, batch_b)))
    node = helper.make_node("FusedMatMul", ["a", "b"], ["y"], domain=MS, alpha=alpha, transA=int(trans_a),
                            transB=int(trans_b), transBatchA=int(batch_a), transBatchB=int(batch_b))
    model, feeds = one_node_model(node, {"a": _rand(rng, shape_a), "b": _rand(rng, shape_b)}, set(const), opset)
    rewritten = check_rewrite(model, feeds, "fusedmatmul", "FusedMatMul")
    if "b" in const:  # alpha and the permutation folded into the weight
        assert "Mul" not in op_types(rewritten) and op_types(rewritten).count("Transpose") <= 1


def _unpermuted(after: list[int], perm: list[int] | None) -> list[int]:
    if perm is None:
        return list(after)
    shape = [0] * len(after)
    for i, p in enumerate(perm):
        shape[p] = after[i]
    return shape


def test_fusedmatmul_unknown_rank_transposed_is_refused():
    node = helper.make_node("FusedMatMul", ["a", "b"], ["y"], domain=MS, transA=1)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", TensorProto.FLOAT, None),
                                            helper.make_tensor_value_info("b", TensorProto.FLOAT, [3, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    rewritten, report = rewrite_model(model, only=["fusedmatmul"])
    assert report.total == 0 and "rank is unknown" in report.skipped[0].message
    assert op_types(rewritten) == ["FusedMatMul"]


# ------------------------------------------------------------------------------ norms


@settings(max_examples=30, **SETTINGS)
@given(simplified=st.booleans(), beta=st.booleans(), bias=st.booleans(), skip_kind=st.sampled_from(["full", "bcast"]),
       sum_out=st.booleans(), epsilon=st.sampled_from([None, 1e-5, 0.1]), opset=st.sampled_from([13, 17, 18, 21]),
       seed=st.integers(0, 2**16))
def test_skip_layernorm_property(simplified, beta, bias, skip_kind, sum_out, epsilon, opset, seed):
    rng = np.random.default_rng(seed)
    b, s, h = 2, int(rng.integers(1, 6)), int(rng.integers(2, 17))
    arrays = {"x": _rand(rng, (b, s, h)), "skip": _rand(rng, (b, s, h) if skip_kind == "full" else (1, s, h)),
              "gamma": _rand(rng, (h,))}
    names = ["x", "skip", "gamma"]
    if not simplified:
        arrays["beta"] = _rand(rng, (h,))
        names.append("beta" if beta else "")
    if bias:
        arrays["bias"] = _rand(rng, (h,))
        names.append("bias")
    outputs = ["y", "", "", "sum"] if sum_out else ["y"]
    attrs = {} if epsilon is None else {"epsilon": epsilon}
    op = "SkipSimplifiedLayerNormalization" if simplified else "SkipLayerNormalization"
    node = helper.make_node(op, names, outputs, domain=MS, **attrs)
    arrays = {k: v for k, v in arrays.items() if k in names}
    model, feeds = one_node_model(node, arrays, {"gamma", "beta", "bias"}, opset, outputs=[o for o in outputs if o])
    rewritten = check_rewrite(model, feeds, "skipnorm", op)
    assert ("LayerNormalization" in op_types(rewritten)) == (not simplified and opset >= 17)


def test_skip_layernorm_mean_output_is_refused():
    node = helper.make_node("SkipLayerNormalization", ["x", "x", "g"], ["y", "mean"], domain=MS)
    arrays = {"x": np.ones((1, 2, 4), np.float32), "g": np.ones(4, np.float32)}
    model, _ = one_node_model(node, arrays, {"g"}, 17)
    rewritten, report = rewrite_model(model, only=["skipnorm"])
    assert report.total == 0 and "mean output" in report.skipped[0].message


@settings(max_examples=25, **SETTINGS)
@given(rank=st.integers(2, 4), axis=st.sampled_from([-1, -2, 1]), epsilon=st.sampled_from([None, 1e-6, 0.5]),
       half=st.booleans(), opset=st.sampled_from([13, 17, 18, 21]), seed=st.integers(0, 2**16))
def test_simplified_layernorm_property(rank, axis, epsilon, half, opset, seed):
    rng = np.random.default_rng(seed)
    shape = [int(d) for d in rng.integers(1, 6, rank)]
    dtype = np.float16 if half else np.float32
    norm_shape = shape[axis % rank:]
    attrs = {"axis": axis} | ({} if epsilon is None else {"epsilon": epsilon})
    node = helper.make_node("SimplifiedLayerNormalization", ["x", "scale"], ["y"], **attrs)
    arrays = {"x": _rand(rng, shape, dtype), "scale": _rand(rng, norm_shape, dtype)}
    out_type = TensorProto.FLOAT16 if half else TensorProto.FLOAT
    model, feeds = one_node_model(node, arrays, {"scale"}, opset, out_dtype=out_type)
    tol = 2e-3 if half else 1e-4  # float16 output: one rounding of the same float32 value
    check_rewrite(model, feeds, "simplifiednorm", "SimplifiedLayerNormalization", rtol=tol, atol=tol)


@settings(max_examples=25, **SETTINGS)
@given(rank=st.integers(2, 4), axis=st.sampled_from([-1, -2, 1]), epsilon=st.sampled_from([None, 1e-12, 0.5]),
       bias=st.booleans(), half=st.booleans(), opset=st.sampled_from([11, 13, 14, 16]), seed=st.integers(0, 2**16))
def test_onnxruntime_layernorm_below_opset_17_property(rank, axis, epsilon, bias, half, opset, seed):
    """onnxruntime's own LayerNormalization, which its optimizer writes into opset-14 exports."""
    rng = np.random.default_rng(seed)
    shape = [int(d) for d in rng.integers(1, 6, rank)]
    dtype = np.float16 if half else np.float32
    norm_shape = shape[axis % rank:]
    attrs = {"axis": axis} | ({} if epsilon is None else {"epsilon": epsilon})
    node = helper.make_node("LayerNormalization", ["x", "scale"] + (["b"] if bias else []), ["y"], **attrs)
    arrays = {"x": _rand(rng, shape, dtype), "scale": _rand(rng, norm_shape, dtype)}
    if bias:
        arrays["b"] = _rand(rng, norm_shape, dtype)
    model, feeds = one_node_model(node, arrays, {"scale", "b"}, opset,
                                  out_dtype=TensorProto.FLOAT16 if half else TensorProto.FLOAT)
    tol = 2e-3 if half else 1e-4  # float16 output: one rounding of the same float32 value
    check_rewrite(model, feeds, "ortlayernorm", "LayerNormalization", rtol=tol, atol=tol)


def test_onnx_layernorm_from_opset_17_is_left_as_it_is():
    node = helper.make_node("LayerNormalization", ["x", "scale"], ["y"])
    model, _ = one_node_model(node, {"x": np.ones((2, 3), np.float32), "scale": np.ones(3, np.float32)},
                              {"scale"}, 17)
    _, report = rewrite_model(model, only=["ortlayernorm"])
    assert report.total == 0 and "opset 17+" in report.skipped[0].message


# ------------------------------------------------------------------------------ activations


@settings(max_examples=40, **SETTINGS)
@given(op=st.sampled_from(["Gelu", "BiasGelu", "FastGelu", "FastGeluBias", "QuickGelu"]),
       alpha=st.sampled_from([None, 1.0, 1.702, -0.5]), const_bias=st.booleans(),
       opset=st.sampled_from([11, 13, 17, 20, 21]), seed=st.integers(0, 2**16))
def test_gelu_family_property(op, alpha, const_bias, opset, seed):
    rng = np.random.default_rng(seed)
    b, s, c = 2, int(rng.integers(1, 5)), int(rng.integers(1, 9))
    arrays = {"x": _rand(rng, (b, s, c)) * 3}
    if op in ("BiasGelu", "FastGeluBias"):
        arrays["bias"] = _rand(rng, (c,))
    attrs = {"alpha": alpha} if op == "QuickGelu" and alpha is not None else {}
    real_op = "FastGelu" if op == "FastGeluBias" else op
    node = helper.make_node(real_op, list(arrays), ["y"], domain=MS, **attrs)
    model, feeds = one_node_model(node, arrays, {"bias"} if const_bias else set(), opset)
    rewritten = check_rewrite(model, feeds, "contribgelu", real_op)
    if opset >= 20 and real_op in ("Gelu", "BiasGelu", "FastGelu"):
        assert "Gelu" in op_types(rewritten)


def test_bias_add_against_its_definition():
    """onnxruntime has BiasAdd for CUDA only; its definition is ``(X + bias) + skip``."""
    rng = np.random.default_rng(3)
    arrays = {"x": _rand(rng, (2, 3, 8)), "bias": _rand(rng, (8,)), "skip": _rand(rng, (2, 3, 8))}
    node = helper.make_node("BiasAdd", list(arrays), ["y"], domain=MS)
    model, feeds = one_node_model(node, arrays, {"bias"}, 17)
    rewritten, report = rewrite_model(model, only=["contribgelu"])
    assert report.applied["contribgelu"] == 1 and op_types(rewritten) == ["Add", "Add"]
    expected = (arrays["x"] + arrays["bias"]) + arrays["skip"]
    np.testing.assert_array_equal(run_ort(rewritten, feeds)[0], expected)


@pytest.mark.parametrize("op", ["Gelu", "QuickGelu"])
def test_integer_activation_is_refused(op):
    node = helper.make_node(op, ["x"], ["y"], domain=MS)
    model, _ = one_node_model(node, {"x": np.ones((2, 2), np.int32)}, set(), 17, out_dtype=TensorProto.INT32)
    rewritten, report = rewrite_model(model, only=["contribgelu"])
    assert report.total == 0 and "not float" in report.skipped[0].message


def test_types_hidden_by_contrib_ops_are_found():
    """onnx infers no type behind a contrib op: SkipLayerNormalization -> FusedMatMul ->
    QuickGelu leaves FusedMatMul's and QuickGelu's inputs untyped. Each rewrite finds the type
    up the chain (float32 here; a float64 scalar made the Mul invalid) and the model runs."""
    rng = np.random.default_rng(7)
    arrays = {"x": _rand(rng, (2, 3, 8)), "skip": _rand(rng, (2, 3, 8)), "g": _rand(rng, (8,)),
              "w": _rand(rng, (4, 8))}
    nodes = [helper.make_node("SkipLayerNormalization", ["x", "skip", "g"], ["n"], domain=MS),
             helper.make_node("FusedMatMul", ["n", "w"], ["m"], domain=MS, transB=1, alpha=0.5),
             helper.make_node("QuickGelu", ["m"], ["y"], domain=MS, alpha=1.5)]
    inputs = [helper.make_tensor_value_info(k, TensorProto.FLOAT, v.shape) for k, v in arrays.items() if k in "x skip"]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(arrays[k], k) for k in ("g", "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    feeds = {k: arrays[k] for k in ("x", "skip")}
    rewritten, report = rewrite_model(model)
    assert report.total == 3, report.skipped
    assert_close(run_ort(rewritten, feeds), run_ort(model, feeds))


@pytest.mark.parametrize("opset", [17, 21])
@pytest.mark.parametrize("op, names", [
    ("SkipLayerNormalization", ["x", "skip", "g", "b", "bias"]), ("SkipSimplifiedLayerNormalization", ["x", "skip", "g", "bias"]),
    ("FastGelu", ["x", "bias"]), ("BiasGelu", ["x", "bias"]), ("QuickGelu", ["x"])])
def test_float16_forms(op, names, opset):
    """float16 models: the rewrite computes the residual sum in float16 where the kernel keeps it
    in float before normalizing, so outputs may differ by one float16 rounding (2e-3 relative)."""
    rng = np.random.default_rng(9)
    arrays = {n: rng.standard_normal((2, 5, 16) if n in ("x", "skip") else (16,)).astype(np.float16) for n in names}
    node = helper.make_node(op, names, ["y"], domain=MS)
    model, feeds = one_node_model(node, arrays, {"g", "b", "bias"}, opset, out_dtype=TensorProto.FLOAT16)
    rewriter = "skipnorm" if "Layer" in op else "contribgelu"
    check_rewrite(model, feeds, rewriter, op, rtol=2e-3, atol=2e-3)


def test_float16_skip_layernorm_sums_in_float32():
    """The kernels keep input + skip + bias in float32 for the normalization (and round the sum
    output once); rounding the sum to float16 first lost the small parts of rows with a large
    common part (values near 1000: a float16 ulp of 0.5; up to 0.5 off). Tolerance: a float16 ulp
    at the outputs' size (4e-3 at 2-4; the sums of 1000 + small parts are float32-exact only to
    6e-5 relative, the kernel's and LayerNormalization's statistics round differently)."""
    rng = np.random.default_rng(7)
    arrays = {"x": (1000 + rng.standard_normal((2, 3, 32))).astype(np.float16),
              "skip": (0.1 * rng.standard_normal((2, 3, 32))).astype(np.float16),
              "g": rng.standard_normal(32).astype(np.float16), "bias": (0.1 * rng.standard_normal(32)).astype(np.float16)}
    node = helper.make_node("SkipLayerNormalization", ["x", "skip", "g", "", "bias"], ["y", "", "", "sum"], domain=MS)
    model, feeds = one_node_model(node, arrays, {"g", "bias"}, 17, out_dtype=TensorProto.FLOAT16, outputs=["y", "sum"])
    check_rewrite(model, feeds, "skipnorm", "SkipLayerNormalization", rtol=2.0**-9, atol=4e-3)
