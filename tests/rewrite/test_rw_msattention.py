"""com.microsoft Attention rewritten, against onnxruntime 1.32's CPU kernel over random shapes,
masks ([B] lengths, [B, T], [B, S, T]), past/present, unidirectional, attention bias, scale and
unequal Q/K/V hidden sizes. Tolerance 1e-4 (float32).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from rw_util import assert_close, full_check, op_types, run_ort, to_half

from onnxmlu.rewrite import rewrite_model

MS = "com.microsoft"
SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)


def attention_model(rng, mask, past, causal, attn_bias, scale, wide_v, opset=17):
    b, s, n, h, din = 2, int(rng.integers(1, 5)), int(rng.integers(1, 4)), int(rng.integers(1, 5)), 6
    p = int(rng.integers(1, 4)) if past else 0
    t = s + p
    dv = n * (h + 1) if wide_v else n * h
    arrays = {"input": rng.standard_normal((b, s, din)).astype(np.float32)}
    inits = {"weights": (rng.standard_normal((din, 2 * n * h + dv)) * 0.5).astype(np.float32),
             "bias": rng.standard_normal(2 * n * h + dv).astype(np.float32)}
    names = ["input", "weights", "bias"]
    if mask == "lengths":
        arrays["mask"] = rng.integers(1, t + 1, b).astype(np.int32)
    elif mask in ("bt", "bst"):
        m = rng.integers(0, 2, (b, t) if mask == "bt" else (b, s, t)).astype(np.int32)
        m[..., 0] = 1
        arrays["mask"] = m
    names.append("mask" if mask != "none" else "")
    if past:
        arrays["past"] = rng.standard_normal((2, b, n, p, h)).astype(np.float32)
    names.append("past" if past else "")
    if attn_bias:
        arrays["attn_bias"] = rng.standard_normal((1, n, s, t)).astype(np.float32)
        names.append("attn_bias")
    while names[-1] == "":
        names.pop()
    attrs = {"num_heads": n, "unidirectional": int(causal)} | ({"scale": scale} if scale else {})
    if wide_v:
        attrs["qkv_hidden_sizes"] = [n * h, n * h, dv]
    outputs = ["y", "present"] if past else ["y"]
    node = helper.make_node("Attention", names, outputs, domain=MS, **attrs)
    inputs = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
              for k, v in arrays.items()]
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                                                     for o in outputs],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)])
    model.ir_version = 8
    return model, arrays


@settings(max_examples=50, **SETTINGS)
@given(mask=st.sampled_from(["none", "lengths", "bt", "bst"]), past=st.booleans(), causal=st.booleans(),
       attn_bias=st.booleans(), scale=st.sampled_from([None, 0.25]), wide_v=st.booleans(),
       opset=st.sampled_from([13, 17, 21]), seed=st.integers(0, 2**16))
def test_attention_property(mask, past, causal, attn_bias, scale, wide_v, opset, seed):
    if past:  # with a past the kernel needs one hidden size and takes no attention bias
        wide_v = attn_bias = False
    rng = np.random.default_rng(seed)
    model, feeds = attention_model(rng, mask, past, causal, attn_bias, scale, wide_v, opset)
    rewritten, report = rewrite_model(model, only=["msattention"])
    assert report.applied["msattention"] == 1, report.skipped
    assert "Attention" not in op_types(rewritten)
    full_check(onnx.shape_inference.infer_shapes(rewritten))
    assert_close(run_ort(rewritten, feeds), run_ort(model, feeds), what=f"mask={mask} past={past}")


def test_left_padding_mask_is_refused():
    rng = np.random.default_rng(1)
    model, _ = attention_model(rng, "lengths", False, False, False, None, False)
    graph = model.graph
    mask = next(i for i in graph.input if i.name == "mask")
    mask.type.tensor_type.shape.dim[0].dim_value = 4  # [2 * batch]: left padding
    rewritten, report = rewrite_model(model, only=["msattention"])
    assert report.total == 0 and "left padding" in report.skipped[0].message


def test_unidirectional_with_a_small_mask_filter_value():
    """Future keys get the lowest float in the kernel, padded keys mask_filter_value (-3 here)."""
    model, feeds = attention_model(np.random.default_rng(9), "bt", True, True, False, None, False)
    model.graph.node[0].attribute.append(helper.make_attribute("mask_filter_value", -3.0))
    rewritten, report = rewrite_model(model, only=["msattention"])
    assert report.applied["msattention"] == 1, report.skipped
    assert_close(run_ort(rewritten, feeds), run_ort(model, feeds))


def test_past_with_a_wider_value_is_refused():
    """One past [2, B, N, P, H] holds K and V: a V hidden size other than K's is invalid (the
    kernel rejects it); the rewrite built a graph that failed at load."""
    model, _ = attention_model(np.random.default_rng(0), "none", True, False, False, None, True)
    rewritten, report = rewrite_model(model, only=["msattention"])
    assert report.total == 0 and "V hidden size" in report.skipped[0].message


def test_a_shared_buffer_refusal_names_only_the_buffer():
    model, _ = attention_model(np.random.default_rng(0), "none", True, True, False, None, False)
    model.graph.node[0].attribute.append(helper.make_attribute("past_present_share_buffer", 1))
    rewritten, report = rewrite_model(model, only=["msattention"])
    assert report.total == 0 and report.skipped[0].message == "a shared past/present buffer is not rewritten"


@pytest.mark.parametrize(("mask", "past"), [("bt", True), ("lengths", False)])
def test_float16_is_the_float32_rewrite_between_casts(mask, past):
    """The CPU kernel computes float16 Attention in float32 and rounds each output once: the
    rewrite casts around its float32 graph (it left float16 on the host). One float16 ulp."""
    model, feeds = to_half(*attention_model(np.random.default_rng(13), mask, past, True, not past, None, False))
    rewritten, report = rewrite_model(model, only=["msattention"])
    assert report.applied["msattention"] == 1, report.skipped
    got = run_ort(rewritten, feeds)
    assert all(y.dtype == np.float16 for y in got)
    assert_close(got, run_ort(model, feeds), rtol=2.0**-10, atol=1e-4)
