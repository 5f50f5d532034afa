"""BatchNormalization rewriter: substitution, folding into producers, refusals.

Oracle: onnxruntime (optimizations off) on the original model, plus ONNX's ReferenceEvaluator
from opset 14 on: its opset 7 kernel (BatchNormalization_6) treats the missing ``is_test`` as
training and crashes, and its opset 9 kernel uses batch statistics whenever ``momentum`` is set,
which the evaluator always fills with the default 0.9. Its ConvTranspose also fails on grouped
weights with C_in/group > 1 (a reshape error), so grouped ConvTranspose cases use ORT only. Tolerance rtol = atol = 1e-4 (float32;
folding changes rounding only).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from rw_util import all_nodes, assert_close, full_check, initializer_values, op_types, run_ort

from onnxmlu.rewrite import rewrite_model

F = TensorProto.FLOAT


def _bn_params(rng, c, shape=None):
    shape = shape or (c,)
    return {
        "scale": rng.uniform(0.5, 1.5, shape).astype(np.float32),
        "bias": rng.uniform(-1, 1, shape).astype(np.float32),
        "mean": rng.uniform(-1, 1, shape).astype(np.float32),
        "var": rng.uniform(0.2, 2, shape).astype(np.float32),
    }


def _model(nodes, inputs, outputs, inits, opset):
    graph = helper.make_graph(nodes, "g", inputs, outputs, [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _bn_node(opset, x="t", y="y", **attrs):
    return helper.make_node("BatchNormalization", [x, "scale", "bias", "mean", "var"], [y], name="bn1", **attrs)


def producer_model(kind, rng, opset, c, extra_use=False, eps=1e-5):
    """x -> producer(kind) -> t -> BN -> y (plus t as a second output when extra_use)."""
    inits = _bn_params(rng, c)
    n, k = 2, 3
    if kind == "Conv":
        g = int(rng.choice([g for g in (1, 2, c) if c % g == 0]))
        cin = g * int(rng.integers(1, 3))
        inits["w"] = rng.uniform(-1, 1, (c, cin // g, 3, 3)).astype(np.float32)
        inits["b"] = rng.uniform(-1, 1, (c,)).astype(np.float32)
        node = helper.make_node("Conv", ["x", "w", "b"], ["t"], group=g, pads=[1, 1, 1, 1])
        x_shape = [n, cin, 5, 4]
    elif kind == "ConvTranspose":
        g = int(rng.choice([g for g in (1, 2, c) if c % g == 0]))
        cin = g * int(rng.integers(1, 3))
        inits["w"] = rng.uniform(-1, 1, (cin, c // g, 2, 3)).astype(np.float32)
        node = helper.make_node("ConvTranspose", ["x", "w"], ["t"], group=g, strides=[2, 1])
        x_shape = [n, cin, 3, 4]
    elif kind == "Gemm":
        trans_b = int(rng.integers(0, 2))
        inits["w"] = rng.uniform(-1, 1, (c, k) if trans_b else (k, c)).astype(np.float32)
        inits["b"] = rng.uniform(-1, 1, [(), (c,), (n, 1), (n, c)][int(rng.integers(0, 4))]).astype(np.float32)
        node = helper.make_node("Gemm", ["x", "w", "b"], ["t"], transB=trans_b, alpha=0.7, beta=1.3)
        x_shape = [n, k]
    else:  # MatMul
        inits["w"] = rng.uniform(-1, 1, (k, c)).astype(np.float32)
        node = helper.make_node("MatMul", ["x", "w"], ["t"])
        x_shape = [n, k]
    outputs = [helper.make_tensor_value_info("y", F, None)]
    if extra_use:
        outputs.append(helper.make_tensor_value_info("t", F, None))
    model = _model(
        [node, _bn_node(opset, epsilon=eps)], [helper.make_tensor_value_info("x", F, x_shape)], outputs, inits, opset
    )
    return model, {"x": rng.uniform(-1, 1, x_shape).astype(np.float32)}


def check_equivalent(model, feeds, bn_mode, *, expect_applied=1, reference=True):
    rewritten, report = rewrite_model(model, bn_mode=bn_mode, only=["bn"])
    assert report.applied == {"bn": expect_applied}, report.skipped
    full_check(rewritten)
    want = run_ort(model, feeds)
    got = run_ort(rewritten, feeds)
    assert_close(got, want, what=f"{bn_mode} vs onnxruntime")
    if reference and model.opset_import[0].version >= 14:
        assert_close(got, ReferenceEvaluator(model).run(None, feeds), what=f"{bn_mode} vs reference")
    return rewritten


def assert_no_weighted_bn(model):
    values = initializer_values(model)
    for node in all_nodes(model.graph):
        if node.op_type == "BatchNormalization":
            assert np.all(values[node.input[1]] == 1) and np.all(values[node.input[2]] == 0)


PROPERTY = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)


@PROPERTY
@given(
    kind=st.sampled_from(["Conv", "ConvTranspose", "Gemm", "MatMul", "none"]),
    opset=st.sampled_from([7, 9, 14, 15, 26]),
    c=st.integers(1, 4),
    mode=st.sampled_from(["substitute", "fold"]),
    extra_use=st.booleans(),
    eps=st.sampled_from([1e-5, 1e-3, 0.1]),
    seed=st.integers(0, 2**16),
)
def test_bn_property(kind, opset, c, mode, extra_use, eps, seed):
    rng = np.random.default_rng(seed)
    if kind == "none":
        rank = int(rng.integers(2, 6))
        shape = [2, c] + [int(s) for s in rng.integers(1, 4, rank - 2)]
        model = _model(
            [_bn_node(opset, x="x", epsilon=eps)],
            [helper.make_tensor_value_info("x", F, shape)],
            [helper.make_tensor_value_info("y", F, None)],
            _bn_params(rng, c),
            opset,
        )
        feeds = {"x": rng.uniform(-2, 2, shape).astype(np.float32)}
    else:
        model, feeds = producer_model(kind, rng, opset, c, extra_use, eps)
    rewritten = check_equivalent(model, feeds, mode, reference=kind != "ConvTranspose")
    assert_no_weighted_bn(rewritten)
    ops = op_types(rewritten)
    if mode == "fold":
        assert "BatchNormalization" not in ops
        if kind in ("Conv", "ConvTranspose", "Gemm") and not extra_use:
            assert ops == [kind], ops  # folded entirely into the producer
        if kind == "MatMul" and not extra_use:
            assert ops == ["MatMul", "Add"], ops
    else:
        assert ops.count("BatchNormalization") == 1 and ops[-2:] == ["Mul", "Add"]


def test_fold_keeps_producer_when_its_output_is_also_used():
    model, feeds = producer_model("Conv", np.random.default_rng(0), 15, 4, extra_use=True)
    rewritten = check_equivalent(model, feeds, "fold")
    assert op_types(rewritten) == ["Conv", "Mul", "Add"]


def test_depthwise_conv_fold():
    rng = np.random.default_rng(1)
    c = 6
    inits = _bn_params(rng, c)
    inits["w"] = rng.uniform(-1, 1, (c, 1, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["t"], group=c), _bn_node(15)]
    model = _model(nodes, [helper.make_tensor_value_info("x", F, [1, c, 5, 5])],
                   [helper.make_tensor_value_info("y", F, None)], inits, 15)  # fmt: skip
    rewritten = check_equivalent(model, {"x": rng.uniform(-1, 1, (1, c, 5, 5)).astype(np.float32)}, "fold")
    assert op_types(rewritten) == ["Conv"]


def test_substitute_shapes_and_names():
    model, _ = producer_model("Conv", np.random.default_rng(2), 15, 3)
    rewritten, _ = rewrite_model(model)
    values = initializer_values(rewritten)
    mul = next(n for n in rewritten.graph.node if n.op_type == "Mul")
    assert values[mul.input[1]].shape == (3, 1, 1)
    assert all(n.name.startswith("bn1/") for n in rewritten.graph.node if n.op_type != "Conv")
    assert rewritten.graph.output[0].name == "y"


def test_spatial0_opset7():
    """Opset 7 spatial=0: per-activation statistics [C, H, W] broadcast as they are."""
    rng = np.random.default_rng(3)
    shape = (2, 3, 2, 2)
    model = _model(
        [_bn_node(7, x="x", spatial=0)],
        [helper.make_tensor_value_info("x", F, list(shape))],
        [helper.make_tensor_value_info("y", F, None)],
        _bn_params(rng, 3, shape[1:]),
        7,
    )
    feeds = {"x": rng.uniform(-1, 1, shape).astype(np.float32)}
    for mode in ("substitute", "fold"):
        rewritten, report = rewrite_model(model, bn_mode=mode)
        assert report.applied["bn"] == 1
        full_check(rewritten)
        assert_close(run_ort(rewritten, feeds), run_ort(model, feeds))


def test_weights_behind_constant_and_identity_nodes():
    rng = np.random.default_rng(4)
    params = _bn_params(rng, 2)
    nodes = [helper.make_node("Constant", [], [f"{k}_c"], value=numpy_helper.from_array(v)) for k, v in params.items()]
    nodes += [helper.make_node("Identity", [f"{k}_c"], [k]) for k in params]
    nodes.append(_bn_node(15, x="x"))
    model = _model(nodes, [helper.make_tensor_value_info("x", F, [1, 2, 3])],
                   [helper.make_tensor_value_info("y", F, None)], {}, 15)  # fmt: skip
    feeds = {"x": rng.uniform(-1, 1, (1, 2, 3)).astype(np.float32)}
    for mode in ("substitute", "fold"):
        check_equivalent(model, feeds, mode)


@pytest.mark.parametrize("source", ["inputs", "constant_of_shape"])
def test_non_constant_parameters_give_the_affine_form(source):
    """Parameters computed by nodes (caffe2 exports' ConstantOfShape weights) or fed as inputs:
    ``a`` and ``b`` are computed by nodes, ``x * a + b`` matches onnxruntime's BN."""
    rng = np.random.default_rng(6)
    c, params = 3, _bn_params(rng, 3)
    nodes, inputs, inits = [_bn_node(15, x="x")], [helper.make_tensor_value_info("x", F, [2, c, 4, 4])], {}
    feeds = {"x": rng.uniform(-1, 1, (2, c, 4, 4)).astype(np.float32)}
    if source == "inputs":
        inputs += [helper.make_tensor_value_info(k, F, [c]) for k in params]
        feeds.update(params)
    else:  # ConstantOfShape of a constant shape: a constant that folding did not produce
        inits["shape_c"] = np.array([c], np.int64)
        nodes = [helper.make_node("ConstantOfShape", ["shape_c"], [k], value=numpy_helper.from_array(
                 np.array([float(v[0])], np.float32))) for k, v in params.items()] + nodes
    model = _model(nodes, inputs, [helper.make_tensor_value_info("y", F, None)], inits, 15)
    for mode in ("substitute", "fold"):
        rewritten = check_equivalent(model, feeds, mode)
        assert "BatchNormalization" not in op_types(rewritten)


@pytest.mark.parametrize(
    ("case", "reason"),
    [("training", "training"), ("dynamic", "another element type"), ("rank", "rank"),
     ("outputs", "training outputs"), ("trivial", "already normalization-only")],
)  # fmt: skip
def test_refusals(case, reason):
    rng = np.random.default_rng(5)
    params = _bn_params(rng, 2)
    opset, attrs, outputs = 15, {}, ["y"]
    inputs = [helper.make_tensor_value_info("x", F, [1, 2, 3] if case != "rank" else None)]
    if case == "training":
        attrs, outputs = {"training_mode": 1}, ["y", "rm", "rv"]
    if case == "dynamic":  # mean/var (T2) of float16 for a float input: the affine form needs casts
        inputs += [helper.make_tensor_value_info(n, TensorProto.FLOAT16, [2]) for n in ("mean", "var")]
        del params["var"], params["mean"]
    if case == "outputs":
        opset, outputs = 9, ["y", "rm"]
    if case == "trivial":
        params["scale"][:] = 1
        params["bias"][:] = 0
    node = helper.make_node("BatchNormalization", ["x", "scale", "bias", "mean", "var"], outputs, name="bn1", **attrs)
    model = _model([node], inputs, [helper.make_tensor_value_info(o, F, None) for o in outputs], params, opset)
    rewritten, report = rewrite_model(model)
    assert report.total == 0
    assert (report.skipped[0].rule, report.skipped[0].node) == ("bn", "bn1") and reason in report.skipped[0].message, report.skipped
    assert op_types(rewritten) == ["BatchNormalization"]


def test_bn_inside_if_branch_with_outer_weights():
    """Subgraph BN reading outer-scope initializers: rewritten in place, weights not duplicated."""
    rng = np.random.default_rng(6)
    params = _bn_params(rng, 2)

    def branch(tag, scale):
        nodes = [
            helper.make_node("Mul", ["x", scale], [f"{tag}_s"]),
            helper.make_node("BatchNormalization", [f"{tag}_s", "scale", "bias", "mean", "var"], [f"{tag}_y"], name=f"bn_{tag}"),
        ]
        return helper.make_graph(nodes, tag, [], [helper.make_tensor_value_info(f"{tag}_y", F, None)])

    params["two"] = np.float32(2.0)
    params["three"] = np.float32(3.0)
    if_node = helper.make_node("If", ["cond"], ["y"], then_branch=branch("then", "two"), else_branch=branch("else", "three"))
    model = _model(
        [if_node],
        [helper.make_tensor_value_info("cond", TensorProto.BOOL, []), helper.make_tensor_value_info("x", F, [1, 2, 2])],
        [helper.make_tensor_value_info("y", F, None)],
        params,
        15,
    )
    for mode in ("substitute", "fold"):
        rewritten, report = rewrite_model(model, bn_mode=mode)
        assert report.applied["bn"] == 2
        full_check(rewritten)
        sub_inits = [i.name for n in rewritten.graph.node for a in n.attribute for i in a.g.initializer]
        assert not {"scale", "bias", "mean", "var"} & set(sub_inits), sub_inits
        assert_no_weighted_bn(rewritten)
        for cond in (True, False):
            feeds = {"cond": np.array(cond), "x": rng.uniform(-1, 1, (1, 2, 2)).astype(np.float32)}
            assert_close(run_ort(rewritten, feeds), run_ort(model, feeds))


def test_float16_and_mixed_param_type():
    """Opset 15 allows float32 scale/stats with a float16 input."""
    rng = np.random.default_rng(7)
    params = _bn_params(rng, 3)
    x16 = rng.uniform(-1, 1, (2, 3, 4)).astype(np.float16)
    model = _model([_bn_node(15, x="x")], [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [2, 3, 4])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)], params, 15)  # fmt: skip
    want = ReferenceEvaluator(model).run(None, {"x": x16})[0].astype(np.float32)
    for mode in ("substitute", "fold"):
        rewritten, report = rewrite_model(model, bn_mode=mode)
        assert report.applied["bn"] == 1
        full_check(rewritten)
        got = run_ort(rewritten, {"x": x16})[0].astype(np.float32)
        np.testing.assert_allclose(got, want, rtol=3e-3, atol=3e-3)  # float16: ~3 ulp at |y| < 4


@pytest.mark.parametrize("opset", range(7, onnx.defs.onnx_opset_version() + 1))
@pytest.mark.parametrize("mode", ["substitute", "fold"])
def test_every_opset(opset, mode):
    rng = np.random.default_rng(opset)
    for kind in ("Conv", "ConvTranspose", "Gemm", "MatMul"):
        model, feeds = producer_model(kind, rng, opset, 2)
        rewritten, report = rewrite_model(model, bn_mode=mode, only=["bn"])
        assert report.total == 1 and rewritten.opset_import[0].version == opset
        full_check(rewritten)
        if opset <= 26:  # the newest opset onnxruntime 1.31 runs
            assert_close(run_ort(rewritten, feeds), run_ort(model, feeds))
