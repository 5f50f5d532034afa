"""Attention (opset 23/24) rewriter against onnxruntime's kernel and ONNX's reference evaluator.

Draws 3-D and 4-D inputs, MHA / GQA / MQA head counts, causal or not, no mask or a bool or float
mask of rank 2-4 (full length or shorter than the total, which the operator pads with -inf),
a KV cache (past_key/past_value in, present_key/present_value out), opset 24's external cache
(``nonpad_kv_seqlen``) or none, ``scale``, ``softcap``, every ``qk_matmul_output_mode``, fixed
or symbolic dims; float32 at rtol = atol = 1e-4. Each draw is compared with the reference evaluator, and with onnxruntime where its kernel
takes the input and agrees with the operator's definition:

* a mask shorter than the total length: onnxruntime refuses it (the reference pads it);
* ``qk_matmul_output`` mode 2 with masked positions: onnxruntime writes the lowest float where
  the bias (and the reference) say -inf;
* mode 0 with ``softcap``: the reference returns the softcapped scores, while the operator's
  function body and onnxruntime return the raw ``Q K^T`` (the rewrite follows the function body).

float16 against onnxruntime at 4e-3 (a few float16 ulps: the kernel and the primitives round
the scores in different places), float64 against the reference at 1e-10.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator
from rw_util import rewritten_once, assert_close, initializer_values, op_types, run_ort

from onnxmlu.rewrite import rewrite_model

F = TensorProto.FLOAT
MASKS = (None, "bool2", "bool4", "float4", "float3")


def attention_model(rank, q_heads, kv_heads, *, causal=0, mask=None, past=0, softcap=0.0, mode=0, scale=None,
                    precision=None, sizes=(2, 3, 3, 8, 6), short=0, symbolic=False, elem=F, seed=0, nonpad=None):
    """One Attention node and its feeds; ``sizes`` = (B, Sq, Skv, D, Dv), ``past`` the cache length
    (0: no cache), ``short`` how much shorter than the total the mask is, ``nonpad`` the valid
    lengths of an external cache (opset 24's nonpad_kv_seqlen)."""
    rng = np.random.default_rng(seed)
    batch, q_len, kv_len, head, v_head = sizes
    total = past + kv_len
    shapes = {"q": _layout(rank, batch, q_heads, q_len, head), "k": _layout(rank, batch, kv_heads, kv_len, head),
              "v": _layout(rank, batch, kv_heads, kv_len, v_head)}
    if mask is not None:
        shapes["m"] = {"bool2": (q_len, total - short), "bool4": (batch, q_heads, q_len, total - short),
                       "float4": (batch, 1, q_len, total - short), "float3": (q_heads, q_len, total - short)}[mask]
    if past:
        shapes["pk"], shapes["pv"] = (batch, kv_heads, past, head), (batch, kv_heads, past, v_head)
    attrs = {"is_causal": causal, "qk_matmul_output_mode": mode}
    attrs.update({k: v for k, v in (("softcap", softcap), ("scale", scale), ("softmax_precision", precision)) if v})
    if rank == 3:
        attrs.update(q_num_heads=q_heads, kv_num_heads=kv_heads)
    inputs = ["q", "k", "v", "m" if mask else "", "pk" if past else "", "pv" if past else ""]
    inputs += ["nonpad"] if nonpad is not None else []
    outputs = ["y", "pk_out" if past else "", "pv_out" if past else "", "qk"]
    node = helper.make_node("Attention", inputs, outputs, name="attn", **attrs)
    dtype = helper.tensor_dtype_to_np_dtype(elem)
    feeds = {n: rng.standard_normal(s).astype(dtype) for n, s in shapes.items()}
    if mask is not None and mask.startswith("bool"):
        feeds["m"] = rng.random(shapes["m"]) > 0.3
    graph_inputs = [helper.make_tensor_value_info(n, TensorProto.BOOL if feeds[n].dtype == np.bool_ else elem,
                                                  _dims(n, s, symbolic)) for n, s in shapes.items()]
    if nonpad is not None:
        feeds["nonpad"] = np.asarray(nonpad, np.int64)
        graph_inputs.append(helper.make_tensor_value_info("nonpad", TensorProto.INT64, ["B" if symbolic else batch]))
    graph_outputs = [helper.make_tensor_value_info(o, elem, [f"{o}_{i}" for i in range(rank if o == "y" else 4)])
                     for o in outputs if o]
    graph = helper.make_graph([node], "g", graph_inputs, graph_outputs)
    opset = 23 if nonpad is None else 24
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10), feeds


def _layout(rank, batch, heads, length, head):
    return (batch, heads, length, head) if rank == 4 else (batch, length, heads * head)


def _dims(name, shape, symbolic):
    """Symbolic batch and sequence dims (the head and feature dims stay numbers, as exporters write them)."""
    if not symbolic:
        return list(shape)
    seq_axes = {len(shape) - 1} if name == "m" else ({1} if len(shape) == 3 else {2})
    return [f"{name}{i}" if i == 0 or i in seq_axes else d for i, d in enumerate(shape)]


def _rewritten(model):
    return rewritten_once(model, "attention", "Attention")


def _without_debug(outputs, model):
    """The outputs other than qk_matmul_output (the last)."""
    return outputs[:-1] if model.graph.output[-1].name == "qk" else outputs


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(rank=st.sampled_from([3, 4]), heads=st.sampled_from([(4, 4), (4, 2), (6, 3), (4, 1), (2, 2)]),
       causal=st.sampled_from([0, 1]), mask=st.sampled_from(MASKS), past=st.sampled_from([0, 0, 1, 5]),
       softcap=st.sampled_from([0.0, 0.0, 1.5]), mode=st.sampled_from([0, 1, 2, 3]),
       scale=st.sampled_from([None, None, 0.3]), sizes=st.tuples(st.integers(1, 2), st.integers(1, 4),
                                                                 st.integers(1, 4), st.sampled_from([4, 8]),
                                                                 st.sampled_from([4, 6])),
       short=st.sampled_from([0, 0, 1]), symbolic=st.booleans(), seed=st.integers(0, 2**16))
def test_attention_property(rank, heads, causal, mask, past, softcap, mode, scale, sizes, short, symbolic, seed):
    short = short if mask is not None else 0
    model, feeds = attention_model(rank, *heads, causal=causal, mask=mask, past=past, softcap=softcap, mode=mode,
                                   scale=scale, sizes=sizes, short=short, symbolic=symbolic, seed=seed)
    got = run_ort(_rewritten(model), feeds)
    expected = ReferenceEvaluator(model).run(None, feeds)
    debug_deviates = mode == 0 and softcap > 0  # the reference softcaps mode 0 (module docstring)
    assert_close(got[:-1] if debug_deviates else got, expected[:-1] if debug_deviates else expected,
                 what="vs reference")
    if short == 0:
        reference_ort = run_ort(model, feeds)
        lowest_for_inf = mode == 2 and (causal or mask is not None)
        keep = (lambda outs: outs[:-1]) if lowest_for_inf else (lambda outs: outs)
        assert_close(keep(got), keep(reference_ort), what="vs onnxruntime")


@pytest.mark.parametrize("softcap", [0.0, 2.0])
def test_debug_output_mode0_is_the_raw_product(softcap):
    """Mode 0 is Q K^T before softcap, as the function body and onnxruntime define it."""
    model, feeds = attention_model(4, 4, 2, causal=1, softcap=softcap, mode=0, past=3)
    assert_close(run_ort(_rewritten(model), feeds), run_ort(model, feeds), what="mode 0")


@pytest.mark.parametrize("mask", ["bool2", "float4"])
def test_fully_masked_rows_are_zero(mask):
    """A query row whose every key is masked gives a zero row in Y and in the mode-3 output."""
    model, feeds = attention_model(4, 4, 2, mask=mask, mode=3, causal=1, past=2)
    feeds["m"][..., 1, :] = False if mask.startswith("bool") else -np.inf
    got = run_ort(_rewritten(model), feeds)
    assert not np.isnan(got[0]).any() and np.all(got[0][:, :, 1] == 0) and np.all(got[-1][:, :, 1] == 0)
    assert_close(got, ReferenceEvaluator(model).run(None, feeds), what="vs reference")
    assert_close(got, run_ort(model, feeds), what="vs onnxruntime")


@pytest.mark.parametrize("precision", [None, TensorProto.FLOAT, TensorProto.FLOAT16])
def test_float16_matches_onnxruntime(precision):
    model, feeds = attention_model(3, 4, 2, causal=1, mask="float4", past=3, mode=3, precision=precision,
                                   elem=TensorProto.FLOAT16)
    got = run_ort(_rewritten(model), feeds)
    assert_close(got, run_ort(model, feeds), rtol=4e-3, atol=4e-3, what="float16")


@pytest.mark.parametrize("precision", [None, TensorProto.DOUBLE])
def test_float64_matches_the_reference_evaluator(precision):
    model, feeds = attention_model(4, 6, 2, causal=1, mask="bool4", past=2, softcap=3.0, mode=3,
                                   precision=precision, elem=TensorProto.DOUBLE)
    got = run_ort(_rewritten(model), feeds)
    assert_close(got, ReferenceEvaluator(model).run(None, feeds), rtol=1e-10, atol=1e-10, what="float64")


@pytest.mark.parametrize("causal", [0, 1])
@pytest.mark.parametrize("mask", [None, "bool4", "float4"])
@pytest.mark.parametrize("symbolic", [False, True])
def test_external_cache_nonpad_kv_seqlen(causal, mask, symbolic):
    """Opset 24: K and V are the whole cache, keys past each sample's valid length are masked and
    the causal offset is that length minus Sq (a length shorter than Sq masks leading rows: zeros)."""
    model, feeds = attention_model(4, 4, 2, causal=causal, mask=mask, sizes=(3, 3, 7, 8, 6), mode=3,
                                   symbolic=symbolic, nonpad=[7, 4, 2])
    got = run_ort(_rewritten(model), feeds)
    assert_close(got, ReferenceEvaluator(model).run(None, feeds), what="vs reference")
    assert_close(got, run_ort(model, feeds), what="vs onnxruntime")


def test_grouped_heads_never_repeat_the_cache():
    """GQA lays the query heads of a group end to end instead of expanding K and V."""
    model, _ = attention_model(4, 8, 2, causal=1, past=4)
    ops = op_types(_rewritten(model))
    assert "Expand" not in ops and "Tile" not in ops and ops.count("MatMul") == 2


def test_symbolic_lengths_stay_computed():
    """The causal mask of a symbolic past/sequence length is computed from Shape, not baked in:
    the rewritten graph runs at two other lengths."""
    model, _ = attention_model(4, 4, 2, causal=1, past=3, symbolic=True)
    rewritten = _rewritten(model)
    assert {"Shape", "Trilu"} <= set(op_types(rewritten))
    for past, q_len in ((1, 1), (7, 2)):
        other, feeds = attention_model(4, 4, 2, causal=1, past=past, sizes=(2, q_len, q_len, 8, 6), seed=past)
        assert_close(run_ort(rewritten, feeds), run_ort(other, feeds), what=f"past {past}, length {q_len}")


def _refused(model: onnx.ModelProto) -> str:
    rewritten, report = rewrite_model(model, only=["attention"])
    assert report.total == 0 and op_types(rewritten) == ["Attention"]
    [diagnostic] = report.skipped
    assert (diagnostic.stage, diagnostic.rule) == ("rewrite", "attention")
    return diagnostic.message


def test_refusals_are_diagnostics():
    model, _ = attention_model(3, 4, 2)
    attrs = model.graph.node[0].attribute
    attrs.remove(next(a for a in attrs if a.name == "kv_num_heads"))
    assert "3-D inputs need both" in _refused(model)
    model, _ = attention_model(4, 4, 2, mask="float4")
    model.graph.input[3].type.tensor_type.elem_type = TensorProto.INT32
    assert "need bool or Q's" in _refused(model)
    model, _ = attention_model(4, 4, 2)
    model.graph.input[1].type.tensor_type.shape.dim[1].dim_param = "heads"
    assert "head counts" in _refused(model)
    model, _ = attention_model(4, 4, 2, past=2)
    model.graph.node[0].input[5] = ""
    assert "past_key and past_value" in _refused(model)
    model, _ = attention_model(4, 4, 2, past=2, nonpad=[5, 3])
    assert "forbids" in _refused(model)
    model, _ = attention_model(4, 4, 2)
    model.opset_import[0].version = 25
    model.graph.node[0].attribute.append(helper.make_attribute("left_window_size", 2))
    assert "sliding window" in _refused(model)


def test_structure_of_causal_attention_at_fixed_lengths():
    """At fixed lengths the causal mask is one constant and the node becomes exactly the
    definition's chain: Transpose, two Muls by sqrt(scale), MatMul, Add, Softmax, MatMul."""
    model, feeds = attention_model(4, 2, 2, causal=1, past=2, sizes=(1, 3, 3, 4, 4))
    model.graph.node[0].output[3] = ""  # no qk_matmul_output
    del model.graph.output[-1]
    rewritten = _rewritten(model)
    assert op_types(rewritten) == ["Concat", "Concat", "Transpose", "Mul", "Mul", "MatMul", "Add", "Softmax", "MatMul"]
    values = initializer_values(rewritten)
    [causal] = [v for v in values.values() if v.shape == (3, 5)]
    assert np.array_equal(np.isinf(causal), np.triu(np.ones((3, 5), bool), k=3)) and causal.max() == 0
    [root] = [v for v in values.values() if v.shape == () and v.dtype == np.float32]
    assert root == np.float32(np.sqrt(1 / np.sqrt(4)))
    assert_close(run_ort(rewritten, feeds), run_ort(model, feeds), what="structure case")
