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
@pytest.mark.parametrize("sink", ["smooth_softmax", "head_sink"])
def test_a_sink_logit_takes_its_share_of_each_softmax(phase, sink):
    """smooth_softmax=1 (a logit of 0 in every row) and head_sink (one per head, gpt-oss's
    attention sinks): softmax over the seen keys and the sink, the sink's share dropped."""
    rng = np.random.default_rng(23)
    model, feeds = gqa_case(rng, phase, 2, 2, 0.0, True, False)
    if sink == "smooth_softmax":
        model = _with_attrs(model, smooth_softmax=1)
    else:
        heads = next(a.i for a in model.graph.node[0].attribute if a.name == "num_heads")
        model.graph.node[0].input.extend(["", "", "sink"])  # after cos, sin: position_ids, attention_bias
        model.graph.input.append(helper.make_tensor_value_info("sink", TensorProto.FLOAT, [heads]))
        feeds["sink"] = rng.uniform(-1, 2, heads).astype(np.float32)
    feeds["seqlens"][:] = feeds["total"][0] - 1 if phase == "prompt" else feeds["seqlens"]
    rewritten, report = rewrite_model(model, only=["gqa"])
    assert report.applied["gqa"] == 1, report.skipped
    assert_close(run_ort(rewritten, feeds), run_ort(model, feeds), what=f"{sink} {phase}")


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


def genai_step(dtype, buffer=None, d=64, heads=4, kv=2, max_pos=64, seed=3):
    """One attention layer of a decode step as onnxruntime-genai exports it: packed QKV MatMul,
    GroupQueryAttention with rotary and KV cache buffers, ``seqlens_k`` [batch] and a scalar
    ``total_sequence_length`` (run-time values, graph inputs), then the output projection. The
    cache is of a symbolic past length (batch and sequence symbolic too), or, with ``buffer``,
    the static form (batch 1, one token, past and present sharing a buffer of that length)."""
    rng = np.random.default_rng(seed)
    head = d // heads
    angles = np.arange(max_pos)[:, None] / (10000 ** (np.arange(0, head, 2) / head))[None, :]
    weights = {"w_qkv": rng.standard_normal((d, (heads + 2 * kv) * head)) / np.sqrt(d),
               "w_o": rng.standard_normal((d, d)) / np.sqrt(d), "cos": np.cos(angles), "sin": np.sin(angles)}
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    nodes = [helper.make_node("MatMul", ["x", "w_qkv"], ["qkv"], name="qkv_proj"),
             helper.make_node("GroupQueryAttention", ["qkv", "", "", "past_key", "past_value", "seqlens_k",
                                                      "total_sequence_length", "cos", "sin"],
                              ["attn", "present_key", "present_value"], domain=MS, num_heads=heads, kv_num_heads=kv,
                              do_rotary=1),
             helper.make_node("MatMul", ["attn", "w_o"], ["y"], name="o_proj")]
    batch, seq, cache = ("batch", "sequence_length", "past_sequence_length") if buffer is None else (1, 1, buffer)
    cache_dims = [batch, kv, cache, head]
    graph = helper.make_graph(
        nodes, "genai_step",
        [helper.make_tensor_value_info("x", elem, [batch, seq, d]),
         helper.make_tensor_value_info("past_key", elem, cache_dims),
         helper.make_tensor_value_info("past_value", elem, cache_dims),
         helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [batch]),
         helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, [])],
        [helper.make_tensor_value_info(o, elem, None) for o in ("y", "present_key", "present_value")],
        [numpy_helper.from_array(v.astype(dtype), k) for k, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    model.ir_version = 8
    return model


def genai_feeds(dtype, past, buffer=None, batch=2, d=64, kv=2, head=16, seed=0):
    """A step after ``past`` tokens of every sequence (no padding): total = past + 1; the cache
    ``past`` long, or ``buffer`` long (shared) holding them."""
    rng = np.random.default_rng(seed)
    batch = batch if buffer is None else 1
    cache = (batch, kv, buffer or past, head)
    return {"x": rng.standard_normal((batch, 1, d)).astype(dtype),
            "past_key": rng.standard_normal(cache).astype(dtype), "past_value": rng.standard_normal(cache).astype(dtype),
            "seqlens_k": np.full(batch, past, np.int32), "total_sequence_length": np.array(past + 1, np.int32)}


@pytest.mark.parametrize("buffer", [None, 16])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_genai_decode_step_fuses_every_matmul_and_matches_at_two_past_lengths(dtype, buffer):
    """The KV cache's length is max(P, S, total_sequence_length), a run-time value: in the
    static form (every input fixed) the two attention MatMuls stayed on the host ("cannot size
    it"). Fused, every MatMul is in one block, equal to onnxruntime's at the pinned past length
    and another (float16: within one float16 ulp of the largest output, the MatMuls summing in
    another order)."""
    from onnxmlu import api
    from onnxmlu.runtime import InferenceSession

    model = genai_step(dtype, buffer)
    pinned = genai_feeds(dtype, 6, buffer)
    result = api.fuse(model, input_shapes=None if buffer else {k: list(v.shape) for k, v in pinned.items()})
    assert [n.op_type for n in result.model.graph.node] == ["MLUFusionBlock"], \
        [d.message for d in result.diagnostics if "size" in d.message]
    session = InferenceSession(result.model)
    for past in (6, 11):
        feeds = genai_feeds(dtype, past, buffer, seed=past)
        got, expected = session.run(None, feeds), run_ort(model, feeds)
        for g, e in zip(got, expected):
            tol = 2.0**-10 * float(np.abs(e).max()) if dtype == np.float16 else 1e-4
            np.testing.assert_allclose(g.astype(np.float32), e.astype(np.float32), rtol=tol, atol=tol,
                                       err_msg=f"past {past}")


@pytest.mark.parametrize("phase", ["prompt", "decode", "continue"])
@pytest.mark.parametrize("symbolic", [False, True])
@pytest.mark.parametrize("half", [False, True])
def test_run_time_total_sizes_the_attention_matmuls(phase, symbolic, half):
    """A one-node GQA whose total_sequence_length is an input: with every input fixed the
    attention MatMuls were not sized (the cache's length comes from a value); with symbolic dims,
    a first prompt's cache was priced at the probe's total of 0. Both are sized now, so the node
    fuses into one block."""
    from onnxmlu import api

    model, feeds = gqa_case(np.random.default_rng(3), phase, 2, 0, 0.0, False, False)
    if half:
        model, feeds = to_half(model, feeds)
    if symbolic:
        new = {0: "batch", 1: "sequence"}
        axes = {"q": new, "k": new, "v": new, "pk": {0: "batch", 2: "past"}, "pv": {0: "batch", 2: "past"},
                "seqlens": {0: "batch"}}
        for info in model.graph.input:
            for axis, param in axes.get(info.name, {}).items():
                info.type.tensor_type.shape.dim[axis].dim_param = param
    result = api.fuse(model, input_shapes={k: list(v.shape) for k, v in feeds.items()})
    assert [n.op_type for n in result.model.graph.node] == ["MLUFusionBlock"], \
        [d.message for d in result.diagnostics if "size" in d.message]
