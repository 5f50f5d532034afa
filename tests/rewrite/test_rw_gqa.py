"""com.microsoft GroupQueryAttention rewritten, against onnxruntime 1.32's CPU kernel over random
shapes and run-time lengths: first prompts (right-padded sequences), token generation with past
buffers longer than the total (the shared-buffer layout), prompts continued on a past (batch 1:
the kernel's limit), groups of query heads per kv head, packed QKV, local windows, softcap and
rotary.
Tolerance 1e-4 (float32).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from rw_util import assert_close, op_types, run_ort, to_half

from onnxmlu.rewrite import rewrite_model

MS = "com.microsoft"
SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)


def gqa_case(rng, phase, groups, window, softcap, rotary, interleaved, opset=17, packed=False):
    kv, h = int(rng.integers(1, 3)), (16 if rotary else 8) * int(rng.integers(1, 3))  # the kernel's head sizes
    n = kv * groups
    if phase == "prompt":  # S == total: past_b = 0, sequences right-padded
        b, s, p = 2, int(rng.integers(1, 6)), 0
        total = s
        seqlens = rng.integers(0, s, b)
        seqlens[0] = s - 1
    elif phase == "decode":  # one new token per sequence, buffers of P >= each total
        b, s, p = 2, 1, int(rng.integers(2, 8))
        seqlens = rng.integers(0, p, b)
        total = int(seqlens.max()) + 1
    else:  # a prompt continued on a past (the kernel takes batch 1 only)
        b, s = 1, int(rng.integers(2, 4))
        p = int(rng.integers(1, 5))
        total = p + s
        seqlens = np.array([total - 1])
    arrays = {"q": rng.standard_normal((b, s, n * h)), "k": rng.standard_normal((b, s, kv * h)),
              "v": rng.standard_normal((b, s, kv * h))}
    names = ["q", "k", "v"]
    if p:
        arrays |= {"pk": rng.standard_normal((b, kv, p, h)), "pv": rng.standard_normal((b, kv, p, h))}
        names += ["pk", "pv"]
    else:
        names += ["", ""]
    if packed:  # one [B, S, (N + 2 Nkv) H] query, key and value absent
        arrays = {"q": np.concatenate([arrays.pop("q"), arrays.pop("k"), arrays.pop("v")], axis=-1), **arrays}
        names[1:3] = ["", ""]
    arrays = {k_: v_.astype(np.float32) for k_, v_ in arrays.items()}
    arrays |= {"seqlens": seqlens.astype(np.int32), "total": np.array([total], np.int32)}
    names += ["seqlens", "total"]
    inits = []
    attrs = {"num_heads": n, "kv_num_heads": kv}
    if window:
        attrs["local_window_size"] = window
    if softcap:
        attrs["softcap"] = softcap
    if rotary:
        angles = rng.uniform(0, 6.3, (16, h // 2))
        inits = [numpy_helper.from_array(np.cos(angles).astype(np.float32), "cos"),
                 numpy_helper.from_array(np.sin(angles).astype(np.float32), "sin")]
        names += ["cos", "sin"]
        attrs |= {"do_rotary": 1, "rotary_interleaved": int(interleaved)}
    node = helper.make_node("GroupQueryAttention", names, ["y", "present_k", "present_v"], domain=MS, **attrs)
    inputs = [helper.make_tensor_value_info(k_, helper.np_dtype_to_tensor_dtype(v_.dtype), v_.shape)
              for k_, v_ in arrays.items()]
    outputs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, [f"{o}{i}" for i in range(rank)])
               for o, rank in (("y", 3), ("present_k", 4), ("present_v", 4))]
    graph = helper.make_graph([node], "g", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)])
    model.ir_version = 8
    return model, arrays


@settings(max_examples=50, **SETTINGS)
@given(phase=st.sampled_from(["prompt", "decode", "continue"]), groups=st.sampled_from([1, 2, 4]),
       window=st.sampled_from([0, 2]), softcap=st.sampled_from([0.0, 3.0]), rotary=st.booleans(),
       interleaved=st.booleans(), packed=st.booleans(), opset=st.sampled_from([14, 17, 21]),
       seed=st.integers(0, 2**16))
def test_gqa_property(phase, groups, window, softcap, rotary, interleaved, packed, opset, seed):
    rng = np.random.default_rng(seed)
    model, feeds = gqa_case(rng, phase, groups, window, softcap, rotary, interleaved, opset, packed)
    rewritten, report = rewrite_model(model, only=["gqa"])
    assert report.applied["gqa"] == 1, report.skipped
    assert "GroupQueryAttention" not in op_types(rewritten)
    checked = onnx.ModelProto()
    checked.CopyFrom(rewritten)
    del checked.graph.value_info[:]  # typed, shapeless entries of run-time-sized tensors
    onnx.checker.check_model(checked, full_check=True)
    got, expected = run_ort(rewritten, feeds), run_ort(model, feeds)
    if phase == "prompt":  # a padding query's output is the kernel's scratch memory: compare real tokens
        real = np.arange(got[0].shape[1])[None, :] <= feeds["seqlens"][:, None]
        got[0], expected[0] = (np.where(real[..., None], y, 0) for y in (got[0], expected[0]))
    assert_close(got, expected, what=phase)


def test_position_ids_are_refused():
    model, _ = gqa_case(np.random.default_rng(0), "decode", 2, 0, 0.0, False, False)
    model.graph.node[0].input.extend(["", "", "pos"])
    model.graph.input.append(helper.make_tensor_value_info("pos", TensorProto.INT64, [2, 1]))
    rewritten, report = rewrite_model(model, only=["gqa"])
    assert report.total == 0 and "position_ids" in report.skipped[0].message


def _with_attrs(model, **attrs):
    node = model.graph.node[0]
    node.attribute.extend(helper.make_attribute(k, v) for k, v in attrs.items())
    return model


@pytest.mark.parametrize("phase", ["prompt", "continue"])
def test_bidirectional_gqa_sees_every_key_of_its_sequence(phase):
    """causal=0 (an encoder's GQA): no query is limited to the keys before it."""
    model, feeds = gqa_case(np.random.default_rng(1), phase, 2, 0, 0.0, False, False)
    feeds["seqlens"][:] = feeds["total"][0] - 1  # no padding: every query is compared
    rewritten, report = rewrite_model(_with_attrs(model, causal=0), only=["gqa"])
    assert report.applied["gqa"] == 1, report.skipped
    assert_close(run_ort(rewritten, feeds), run_ort(model, feeds), what="causal=0")


@pytest.mark.parametrize(("attrs", "reason"), [
    ({"sliding_window_cache": 1, "local_window_size": 2}, "sliding_window_cache=1"),
    ({"causal": 0, "local_window_size": 2}, "local window without causal=1"),
    ({"k_quant_type": "PER_TENSOR"}, "k_quant_type=PER_TENSOR")])
def test_other_cache_layouts_are_refused(attrs, reason):
    model, _ = gqa_case(np.random.default_rng(0), "decode", 2, 0, 0.0, False, False)
    rewritten, report = rewrite_model(_with_attrs(model, **attrs), only=["gqa"])
    assert report.total == 0 and reason in report.skipped[0].message


def test_a_later_input_is_named_in_the_reason():
    model, _ = gqa_case(np.random.default_rng(0), "decode", 2, 0, 0.0, False, False)
    model.graph.node[0].input.extend([""] * 9 + ["qlens"])  # after cos, sin and seven others
    model.graph.input.append(helper.make_tensor_value_info("qlens", TensorProto.INT32, [2]))
    rewritten, report = rewrite_model(model, only=["gqa"])
    assert report.total == 0 and report.skipped[0].message == "its query_seqlens input is not rewritten"


@pytest.mark.parametrize("phase", ["prompt", "decode", "continue"])
@pytest.mark.parametrize("rotary", [False, True])
def test_float16_is_the_float32_rewrite_between_casts(phase, rotary):
    """The CPU kernel computes float16 GQA in float32 and rounds each output once (one float16 ulp
    apart at most), the rotation in float16; float16 GQA was left on the host."""
    model, feeds = to_half(*gqa_case(np.random.default_rng(14), phase, 2, 2, 0.0, rotary, rotary))
    feeds["seqlens"][:] = feeds["total"][0] - 1 if phase == "prompt" else feeds["seqlens"]
    rewritten, report = rewrite_model(model, only=["gqa"])
    assert report.applied["gqa"] == 1, report.skipped
    got = run_ort(rewritten, feeds)
    assert all(y.dtype == np.float16 for y in got)
    assert_close(got, run_ort(model, feeds), rtol=2.0**-10, atol=1e-4)
