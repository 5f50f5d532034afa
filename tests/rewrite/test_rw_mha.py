"""com.microsoft MultiHeadAttention rewritten, against onnxruntime 1.32's CPU kernel over random
shapes, forms (separate Q/K/V with bias, packed QKV, packed KV, 4-D key/value), key padding
masks ([B] lengths, [B, T], [B, S, T]), attention bias, past/present key and value,
unidirectional and scale. Tolerance 1e-4 (float32).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from rw_util import assert_close, full_check, op_types, run_ort, to_half

from onnxmlu.rewrite import rewrite_model

MS = "com.microsoft"
SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)


def _info(name, value):
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(value.dtype), value.shape)


def mha_case(rng, form, bias, mask, attn_bias, past, causal, scale, opset, symbolic=False):
    """(model, feeds, reference model, its feeds): the reference is the separate-Q/K/V form of the
    same attention (onnxruntime's CPU kernel has no packed forms; they mean the same by definition)."""
    b, s, n, h = 2, int(rng.integers(1, 5)), int(rng.integers(1, 4)), int(rng.integers(1, 5))
    kv_len = s if causal or form == "qkv" else int(rng.integers(1, 5))
    p = int(rng.integers(1, 4)) if past else 0
    t = kv_len + p
    q, k, v = (rng.standard_normal((b, length, n, h)).astype(np.float32) for length in (s, kv_len, kv_len))
    separate = {"query": q.reshape(b, s, n * h), "key": k.reshape(b, kv_len, n * h),
                "value": v.reshape(b, kv_len, n * h)}
    packed = {"qkv": lambda: {"query": np.stack([q, k, v], axis=3)},
              "kv": lambda: {"query": separate["query"], "key": np.stack([k, v], axis=3)},
              "bnsh": lambda: {"query": separate["query"], "key": k.transpose(0, 2, 1, 3),
                               "value": v.transpose(0, 2, 1, 3)},
              "separate": lambda: separate}[form]()
    extra = {}
    if bias:
        extra["bias"] = rng.standard_normal(3 * n * h).astype(np.float32)
    if mask == "lengths":
        extra["mask"] = rng.integers(1, t + 1, b).astype(np.int32)
    elif mask in ("bt", "bst"):
        m = rng.integers(0, 2, (b, t) if mask == "bt" else (b, s, t)).astype(np.int32)
        m[..., 0] = 1  # no row masked whole
        extra["mask"] = m
    if attn_bias:
        extra["attn_bias"] = rng.standard_normal((1 if attn_bias == "1n" else b, n, s, t)).astype(np.float32)
    if past:
        extra["past_key"], extra["past_value"] = (rng.standard_normal((b, n, p, h)).astype(np.float32) for _ in "kv")
    attrs = {"num_heads": n, "unidirectional": int(causal)} | ({"scale": scale} if scale else {})
    model = _model({**packed, **extra}, attrs, opset, past, symbolic)
    reference = _model({**separate, **extra}, attrs, opset, past, False)
    return model, {**packed, **extra}, reference, {**separate, **extra}


def _model(arrays, attrs, opset, past, symbolic):
    order = ["query", "key", "value", "bias", "mask", "attn_bias", "past_key", "past_value"]
    names = [name if name in arrays else "" for name in order]
    while names[-1] == "":
        names.pop()
    outputs = ["y", "present_key", "present_value"] if past else ["y"]
    node = helper.make_node("MultiHeadAttention", names, outputs, domain=MS, **attrs)
    inputs = [_info(k, v) for k, v in arrays.items()]
    if symbolic:  # batch and lengths symbolic
        inputs = [helper.make_tensor_value_info(i.name, i.type.tensor_type.elem_type,
                                                ["B", "S"] + list(arrays[i.name].shape[2:]))
                  if i.name in ("query", "key", "value") else i for i in inputs]
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                                                     for o in outputs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)])
    model.ir_version = 8
    return model


@settings(max_examples=60, **SETTINGS)
@given(form=st.sampled_from(["separate", "qkv", "kv", "bnsh"]), bias=st.booleans(),
       mask=st.sampled_from(["none", "lengths", "bt", "bst"]), attn_bias=st.sampled_from([None, "1n", "bn"]),
       past=st.booleans(), causal=st.booleans(), scale=st.sampled_from([None, 0.3]),
       opset=st.sampled_from([13, 17, 21]), seed=st.integers(0, 2**16))
def test_mha_property(form, bias, mask, attn_bias, past, causal, scale, opset, seed):
    if form != "separate":
        bias = False  # the kernel takes a bias with separate Q, K, V
    if form in ("qkv", "kv", "bnsh"):
        past = False  # past with packed or 4-D keys is not a form the kernel takes
    rng = np.random.default_rng(seed)
    model, feeds, reference, reference_feeds = mha_case(rng, form, bias, mask, attn_bias, past, causal, scale, opset)
    rewritten, report = rewrite_model(model, only=["mha"])
    assert report.applied["mha"] == 1, report.skipped
    assert "MultiHeadAttention" not in op_types(rewritten)
    full_check(onnx.shape_inference.infer_shapes(rewritten))
    assert_close(run_ort(rewritten, feeds), run_ort(reference, reference_feeds), what=f"{form} mask={mask}")


def test_causal_on_symbolic_lengths_uses_trilu():
    rng = np.random.default_rng(5)
    model, feeds, _, _ = mha_case(rng, "separate", True, "bt", None, True, True, None, 17, symbolic=True)
    rewritten, report = rewrite_model(model, only=["mha"])
    assert report.applied["mha"] == 1 and "Trilu" in op_types(rewritten)
    assert_close(run_ort(rewritten, feeds), run_ort(model, feeds))


def test_qk_output_is_refused():
    rng = np.random.default_rng(6)
    model, *_ = mha_case(rng, "separate", False, "none", None, False, False, None, 17)
    model.graph.node[0].output.extend(["", "", "qk"])
    rewritten, report = rewrite_model(model, only=["mha"])
    assert report.total == 0 and "qk output" in report.skipped[0].message


def test_future_keys_get_the_lowest_float_whatever_mask_filter_value_says():
    """A small mask_filter_value (-3) leaves padded keys some weight in the kernel; a future key
    of a unidirectional MHA gets none (the rewrite added mask_filter_value there too)."""
    rng = np.random.default_rng(8)
    model, feeds, reference, reference_feeds = mha_case(rng, "separate", True, "bt", None, True, True, None, 17)
    for m in (model, reference):
        m.graph.node[0].attribute.append(helper.make_attribute("mask_filter_value", -3.0))
    rewritten, report = rewrite_model(model, only=["mha"])
    assert report.applied["mha"] == 1, report.skipped
    assert_close(run_ort(rewritten, feeds), run_ort(reference, reference_feeds))


@pytest.mark.parametrize("form", ["separate", "qkv", "bnsh"])
def test_float16_is_the_float32_rewrite_between_casts(form):
    """The CPU kernel computes float16 MHA in float32 and rounds each output once: the rewrite
    casts around its float32 graph (it left float16 MHA on the host). One float16 ulp."""
    rng = np.random.default_rng(12)
    past = form == "separate"
    (model, feeds), (reference, reference_feeds) = (to_half(*pair) for pair in _pairs(
        mha_case(rng, form, past, "bt", "bn", past, True, None, 17)))
    rewritten, report = rewrite_model(model, only=["mha"])
    assert report.applied["mha"] == 1, report.skipped
    got = run_ort(rewritten, feeds)
    assert all(y.dtype == np.float16 for y in got)
    assert_close(got, run_ort(reference, reference_feeds), rtol=2.0**-10, atol=1e-4)


def _pairs(case):
    model, feeds, reference, reference_feeds = case
    return (model, feeds), (reference, reference_feeds)
