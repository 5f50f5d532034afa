"""RMSNormalization (opset 23) rewriter against onnxruntime's kernel and ONNX's reference evaluator.

Draws ranks 1-4, every ``axis`` (negative and positive), ``epsilon``, the scale's broadcast shape
(the whole normalized shape or its last dims), constant or fed scale and fixed or symbolic
dims; float32 at rtol = atol = 1e-4 against both. float16 with ``stash_type`` 1 (statistics in
float32, cast back before the scale) against onnxruntime at 1e-3 (the kernel casts at the same
places: the results agree to within one float16 ulp); float64 with ``stash_type`` 11 against the
reference at 1e-10.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from rw_util import rewritten_once, assert_close, op_types, run_ort

from onnxmlu.rewrite import rewrite_model


def rms_model(shape, axis, *, epsilon=None, scale_dims=None, const_scale=False, stash=None, symbolic=False,
              elem=TensorProto.FLOAT, seed=0):
    rng = np.random.default_rng(seed)
    dtype = helper.tensor_dtype_to_np_dtype(elem)
    first = axis % len(shape)
    scale_shape = list(shape[first:] if scale_dims is None else shape[len(shape) - scale_dims:])
    scale = rng.uniform(0.5, 2, scale_shape).astype(dtype)
    attrs = {"axis": axis, **({} if epsilon is None else {"epsilon": epsilon}),
             **({} if stash is None else {"stash_type": stash})}
    node = helper.make_node("RMSNormalization", ["x", "s"], ["y"], name="rms", **attrs)
    dims = [f"d{i}" if symbolic and i < first else d for i, d in enumerate(shape)]
    inputs = [helper.make_tensor_value_info("x", elem, dims)]
    inputs += [] if const_scale else [helper.make_tensor_value_info("s", elem, scale_shape)]
    inits = [numpy_helper.from_array(scale, "s")] if const_scale else []
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", elem, dims)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)], ir_version=10)
    feeds = {"x": rng.normal(0.2, 2.0, shape).astype(dtype), **({} if const_scale else {"s": scale})}
    return model, feeds


def _rewritten(model):
    return rewritten_once(model, "rmsnorm", "RMSNormalization")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=4), data=st.data(),
       epsilon=st.sampled_from([None, 1e-3, 0.5]), const_scale=st.booleans(), symbolic=st.booleans(),
       seed=st.integers(0, 2**16))
def test_rmsnorm_property(shape, data, epsilon, const_scale, symbolic, seed):
    rank = len(shape)
    axis = data.draw(st.integers(-rank, rank - 1), label="axis")
    scale_dims = data.draw(st.integers(1, rank - axis % rank), label="scale_dims")
    model, feeds = rms_model(shape, axis, epsilon=epsilon, scale_dims=scale_dims, const_scale=const_scale,
                             symbolic=symbolic, seed=seed)
    got = run_ort(_rewritten(model), feeds)
    assert_close(got, run_ort(model, feeds), what="vs onnxruntime")
    assert_close(got, ReferenceEvaluator(model).run(None, feeds), what="vs reference")


def test_float16_statistics_in_float32():
    model, feeds = rms_model([2, 5, 64], -1, elem=TensorProto.FLOAT16, stash=TensorProto.FLOAT)
    rewritten = _rewritten(model)
    assert op_types(rewritten) == ["Cast", "Pow", "ReduceMean", "Add", "Sqrt", "Div", "Cast", "Mul"]
    assert_close(run_ort(rewritten, feeds), run_ort(model, feeds), rtol=1e-3, atol=1e-3, what="float16")


def test_float64_matches_the_reference_evaluator():
    model, feeds = rms_model([2, 3, 8], 1, elem=TensorProto.DOUBLE, stash=TensorProto.DOUBLE, epsilon=1e-4)
    rewritten = _rewritten(model)
    assert "Cast" not in op_types(rewritten)
    expected = ReferenceEvaluator(_as_stash1(model)).run(None, feeds)
    assert_close(run_ort(rewritten, feeds), expected, rtol=1e-10, atol=1e-10, what="float64")


def _as_stash1(model):
    """The reference evaluator only implements stash_type 1; on float64 input it computes in
    float64 all the same (numpy keeps the input's type), which is what stash_type 11 asks."""
    copy = type(model)()
    copy.CopyFrom(model)
    for attr in copy.graph.node[0].attribute:
        if attr.name == "stash_type":
            attr.i = TensorProto.FLOAT
    return copy


@pytest.mark.parametrize(("change", "reason"), [
    ("rank", "unknown rank"),
    ("stash", "stash_type 16"),
    ("mixed", "mixed types"),
])
def test_refusals_are_diagnostics(change, reason):
    model, _ = rms_model([2, 3, 8], -1)
    if change == "rank":
        model.graph.input[0].type.tensor_type.ClearField("shape")
    elif change == "mixed":
        model.graph.input[1].type.tensor_type.elem_type = TensorProto.FLOAT16
    else:
        model.graph.node[0].attribute.append(helper.make_attribute("stash_type", TensorProto.BFLOAT16))
    rewritten, report = rewrite_model(model, only=["rmsnorm"])
    assert report.total == 0 and op_types(rewritten) == ["RMSNormalization"]
    [diagnostic] = report.skipped
    assert diagnostic.rule == "rmsnorm" and reason in diagnostic.message
