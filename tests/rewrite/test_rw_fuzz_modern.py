"""Today's transformer rewriters swept over the attribute space their operators allow.

Each rewriter's own module tests the forms it was written for; this one draws what other
exporters write as well, from the ONNX spec (opset 23's Attention, RMSNormalization,
RotaryEmbedding; blocked DequantizeLinear) and onnxruntime 1.32's contrib op schemas
(``get_all_operator_schema``; docs/ContribOperators.md). Every draw is one node built in code,
run through its rewriter and compared with onnxruntime's kernel on the original (graph
optimizations off) at float32 rtol = atol = 1e-4 (float16 draws: one float16 ulp, 2^-10
relative, where kernel and rewrite both compute in float32 and round once; equal where both
compute in float16; skip norms two ulps); opset 23's Attention also with
``onnx.reference``, which alone judges the valid forms onnxruntime's kernel rejects (a mask
that broadcasts over heads or queries, a 1-D mask, present outputs left out) and the one form
where the kernel departs from the operator: a causal single query on a past with several new
keys, which onnxruntime 1.32 lets see all of them (the operator: the keys up to its position,
the past length).

A draw may be refused only when it holds a form marked as not rewritten below; the reason must
be one readable line. Any other refusal fails the test: a common valid form left on the host
is a defect too. ``hypothesis.event`` counts the refusals (``--hypothesis-show-statistics``).

The space drawn, and what may be refused:

* Attention (opset 23): 3-D / 4-D, MHA / GQA / MQA heads, ``is_causal`` with or without a KV
  cache, no mask, bool or float masks of shapes [q, T], [B, H, q, T], [B, 1, q, T], [H, q, T],
  [B, 1, 1, T], [T], ``scale``, ``softcap``, ``qk_matmul_output_mode`` 0-3,
  ``softmax_precision``, outputs: all, Y only, Y + present, Y + qk. Nothing refused.
* RMSNormalization: ranks 1-4, every ``axis``, ``epsilon``, ``stash_type`` (none, float,
  double), scale of the normalized shape or its last dims, any of them 1. Nothing refused.
* RotaryEmbedding (opset 23): 3-D with ``num_heads``, 4-D with or without it, interleaved,
  partial ``rotary_embedding_dim``, ``position_ids`` or per-token caches. Nothing refused.
* com.microsoft RotaryEmbedding: 3-D / 4-D, ``position_ids`` [B, S] or [1] (the first
  position), interleaved, partial, ``num_heads``/``rotary_embedding_dim`` given or left out,
  float32 or float16.
  Refused: a partial cache without ``rotary_embedding_dim`` (the kernel rejects it too).
* GroupQueryAttention: first prompt (right-padded), decode on a shared buffer, a prompt
  continued on a past; query heads per kv head 1, 2, 4; ``causal`` 0 or 1, ``local_window_size``,
  ``scale``, ``softcap``, ``do_rotary``/``rotary_interleaved``, packed QKV, fixed or symbolic
  batch / sequence / buffer lengths, float32 or float16. Refused:
  ``sliding_window_cache=1``, a window with ``causal=0`` (the kernel rejects it too).
* MultiHeadAttention: separate / packed QKV / packed KV / 4-D key and value, bias, key padding
  masks ([B], [B, T], [B, S, T]), ``attention_bias`` [1|B, 1|N, S, T], past/present (not with
  packed QKV or 4-D keys; packed forms judged against the same attention with separate Q/K/V),
  ``unidirectional``, ``scale``, ``mask_filter_value``, float32 or float16. Refused: a bias with
  packed or 4-D inputs (a CUDA form the CPU kernel does not take).
* com.microsoft Attention: masks as above, past/present, ``unidirectional``, attention bias,
  ``scale``, ``qkv_hidden_sizes`` with a wider V, ``mask_filter_value``, fixed or symbolic
  batch and sequence, float32 or float16. Refused: ``do_rotary``,
  ``past_present_share_buffer``, a past with a wider V (invalid: one past holds K and V).
* SkipLayerNormalization / SkipSimplifiedLayerNormalization: 2-D and 3-D input, skip of the
  input's shape, [S, H] or [1, S, H], beta, bias, the sum output, ``epsilon``, float32 or float16;
  SimplifiedLayerNormalization: ``axis``, scale of the normalized shape. Nothing refused.
* FusedMatMul: ranks 2-4, ``transA``/``transB``/``transBatchA``/``transBatchB``, ``alpha``;
  transBatch with operands of one rank >= 3 only (the kernel rejects the others, and the
  rewriter refuses them). Nothing refused.
* MatMulNBits: ``bits`` 2/4/8, ``block_size`` 16-256, K not a multiple of the block, zero
  points absent / packed / float, ``accuracy_level`` 0-4, bias, A of rank 1-3 with fixed or
  symbolic leading dims, float32 or float16, of normal, float16-valued or integer values (short
  mantissas meet the int8 quantization's rounding boundaries and ties). Refused: 2-bit weights
  with integer zero points at level 4 (the kernel quantizes A for some block sizes only).
* DequantizeLinear (INT4/UINT4, blocked): ranks 1-3, every axis, a partial last block, zero
  point or not, float32 or float16 scales (float16: equal bit for bit, the kernel and the
  rewrite both compute in float32, where the product is exact, and round once). Nothing refused.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from onnx import helper
from onnx.reference import ReferenceEvaluator
from onnxruntime.capi.onnxruntime_pybind11_state import Fail, InvalidArgument
from rw_util import assert_close, run_ort, to_half

import test_rw_attention as std_attention
import test_rw_msattention as ms_attention
from test_rw_contrib import one_node_model
from test_rw_dq4 import dq_model
from test_rw_matmulnbits import nbits_model
from onnxmlu.rewrite import rewrite_model
from test_rw_gqa import gqa_case
from test_rw_mha import mha_case
from test_rw_msrotary import rotary_model as ms_rotary_model
from test_rw_rmsnorm import rms_model
from test_rw_rotary import rotary_model

MS = "com.microsoft"
ort.set_default_logger_severity(4)  # the kernels' rejections are expected here (event counts them)
SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)


# ------------------------------------------------------------------------------ harness


def assert_readable(reason: str) -> None:
    """One line of words, not an exception's text."""
    assert isinstance(reason, str) and reason == reason.strip() and "\n" not in reason, repr(reason)
    assert 10 <= len(reason) <= 200 and reason[0].isalnum(), repr(reason)
    assert "Traceback" not in reason and "Error" not in reason, reason


def rewritten_or_refused(model, rewriter: str, refusable: bool):
    """The rewritten model, or None after checking the refusal is allowed and readable."""
    rewritten, report = rewrite_model(model, only=[rewriter])
    if report.applied.get(rewriter):
        return rewritten
    reasons = [d.message for d in report.skipped if d.rule == rewriter]
    assert reasons, "neither rewritten nor refused"
    for reason in reasons:
        assert_readable(reason)
    event(f"{rewriter} refused: {reasons[0]}")
    assert refusable, f"{rewriter} refused a form it should rewrite: {reasons}"
    return None


def judge(model, feeds, rewriter, refusable=False, reference=None, reference_feeds=None, rows=None, tol=1e-4):
    """Rewrite and compare with onnxruntime on ``reference`` (default: the model itself);
    ``rows`` picks what of output 0 is defined (padding rows are the kernel's scratch memory)."""
    rewritten = rewritten_or_refused(model, rewriter, refusable)
    if rewritten is None:
        return
    got = run_ort(rewritten, feeds)
    expected = expected_outputs(reference or model, reference_feeds or feeds)
    if rows is not None:
        got[0], expected[0] = (np.where(rows, y, 0) for y in (got[0], expected[0]))
    assert_close(got, expected, rtol=tol, atol=tol, what=rewriter)


def expected_outputs(model, feeds):
    """onnxruntime's outputs; onnx.reference's for a standard-domain node the kernel rejects."""
    try:
        return run_ort(model, feeds)
    except (Fail, InvalidArgument):
        if model.graph.node[0].domain not in ("", "ai.onnx"):
            raise
    event(f"{model.graph.node[0].op_type}: onnxruntime rejects the form, judged by onnx.reference")
    return ReferenceEvaluator(model).run(None, feeds)


def set_attrs(model, **attrs):
    node = model.graph.node[0]
    kept = [a for a in node.attribute if a.name not in attrs]
    del node.attribute[:]
    node.attribute.extend(kept + [helper.make_attribute(k, v) for k, v in attrs.items() if v is not None])
    return model


def retype_input(model, name, value):
    for i, info in enumerate(model.graph.input):
        if info.name == name:
            model.graph.input[i].CopyFrom(helper.make_tensor_value_info(
                name, helper.np_dtype_to_tensor_dtype(value.dtype), value.shape))


def symbolic_dims(model, axes: dict[str, dict[int, str]]):
    """Name the dims ``axes[input][axis]`` of the graph inputs (one name: one run-time length, as
    exporters write batch and sequence dims)."""
    for info in model.graph.input:
        for axis, param in axes.get(info.name, {}).items():
            dim = info.type.tensor_type.shape.dim[axis]
            dim.ClearField("dim_value")
            dim.dim_param = param
    return model


def keep_outputs(model, outputs):
    """The node's outputs reduced to ``outputs`` ('' for left out), the graph's to those named."""
    node = model.graph.node[0]
    del node.output[:]
    node.output.extend(outputs)
    while node.output and not node.output[-1]:
        node.output.pop()
    kept = [o for o in model.graph.output if o.name in outputs]
    del model.graph.output[:]
    model.graph.output.extend(kept)


# ------------------------------------------------------------------------------ Attention (opset 23)

OUTPUTS = {"all": ["y", "pk_out", "pv_out", "qk"], "y": ["y"], "present": ["y", "pk_out", "pv_out"],
           "qk": ["y", "", "", "qk"]}
#: masks that broadcast over more axes than the rewriter's own test draws: [B, 1, 1, T], [T]
NARROW_MASKS = {"b11t": lambda m: m[:, :, :1], "t": lambda m: m[0, 0, 0]}


def _attention_case(rank, heads, causal, mask, past, softcap, mode, scale, precision, outputs, sizes, seed):
    """(model, feeds, reference feeds): a narrow mask's reference is the same model fed the mask
    broadcast to [B, 1|H, q, T] (the operator broadcasts it so; onnx.reference takes the query
    length of a causal mask from the mask's shape, and onnxruntime rejects such masks)."""
    base_mask = {"b11t": "float4", "t": "bool4"}.get(mask, mask)
    model, feeds = std_attention.attention_model(rank, *heads, causal=causal, mask=base_mask, past=past,
                                                 softcap=softcap, mode=mode, scale=scale, precision=precision,
                                                 sizes=sizes, seed=seed)
    keep_outputs(model, OUTPUTS[outputs] if past else [o for o in OUTPUTS[outputs] if o not in ("pk_out", "pv_out")])
    reference_feeds = dict(feeds)
    if mask in NARROW_MASKS:
        narrow = np.ascontiguousarray(NARROW_MASKS[mask](feeds["m"]))
        reference_feeds["m"] = np.ascontiguousarray(np.broadcast_to(narrow, feeds["m"].shape))
        reference = onnx.ModelProto()
        reference.CopyFrom(model)
        feeds["m"] = narrow
        retype_input(model, "m", narrow)
        return model, feeds, reference, reference_feeds
    return model, feeds, model, reference_feeds


def _attention_expected(model, feeds, mode, softcap, masked, kernel_deviates):
    """onnx.reference's outputs (qk dropped where it follows another reading: mode 0 with
    softcap) and onnxruntime's (qk dropped for mode 2 with masked keys: the kernel writes the
    lowest float where the operator says -inf), unless ``kernel_deviates``."""
    has_qk = model.graph.node[0].output[-1] == "qk"
    drop_ref = has_qk and mode == 0 and softcap > 0
    reference = ReferenceEvaluator(model).run(None, feeds)
    yield "reference", reference[:-1] if drop_ref else reference, drop_ref
    if kernel_deviates:
        event("attention: onnxruntime deviates (one causal query, several new keys, a past)")
        return
    try:
        ort_out = run_ort(model, feeds)
    except (Fail, InvalidArgument):  # a spec-valid form the kernel does not take (module docstring)
        event("attention: onnxruntime rejects the form, judged by onnx.reference alone")
        return
    drop_ort = has_qk and mode == 2 and masked
    yield "onnxruntime", ort_out[:-1] if drop_ort else ort_out, drop_ort


@settings(max_examples=60, **SETTINGS)
@given(rank=st.sampled_from([3, 4]), heads=st.sampled_from([(4, 4), (4, 2), (4, 1), (6, 3)]),
       causal=st.sampled_from([0, 1]), mask=st.sampled_from([None, "bool2", "bool4", "float4", "float3", "b11t", "t"]),
       past=st.sampled_from([0, 2]), softcap=st.sampled_from([0.0, 2.0]), mode=st.sampled_from([0, 1, 2, 3]),
       scale=st.sampled_from([None, 0.3]), precision=st.sampled_from([None, 1]),
       outputs=st.sampled_from(list(OUTPUTS)),
       sizes=st.tuples(st.integers(1, 2), st.integers(1, 3), st.integers(1, 4), st.sampled_from([4, 8]),
                       st.sampled_from([4, 6])), seed=st.integers(0, 2**16))
def test_attention_fuzz(rank, heads, causal, mask, past, softcap, mode, scale, precision, outputs, sizes, seed):
    model, feeds, reference, reference_feeds = _attention_case(rank, heads, causal, mask, past, softcap, mode, scale,
                                                               precision, outputs, sizes, seed)
    rewritten = rewritten_or_refused(model, "attention", refusable=False)
    got = run_ort(rewritten, feeds)
    # onnxruntime lets a single causal query on a past see every new key (offset T - 1, not the
    # operator's past length): the reference alone judges that form
    kernel_deviates = bool(causal and past and sizes[1] == 1 and sizes[2] > 1)
    for what, expected, drop_qk in _attention_expected(reference, reference_feeds, mode, softcap,
                                                       bool(causal or mask), kernel_deviates):
        assert_close(got[:-1] if drop_qk else got, expected, what=f"vs {what}")


# ------------------------------------------------------------------------------ RMSNormalization, RotaryEmbedding


@settings(max_examples=30, **SETTINGS)
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=4), data=st.data(),
       epsilon=st.sampled_from([None, 1e-6, 0.5]), stash=st.sampled_from([None, 1, 11]), seed=st.integers(0, 2**16))
def test_rmsnorm_fuzz(shape, data, epsilon, stash, seed):
    rank = len(shape)
    axis = data.draw(st.integers(-rank, rank - 1), label="axis")
    normalized = shape[axis % rank:]
    scale_shape = data.draw(st.lists(st.booleans(), min_size=len(normalized), max_size=len(normalized)),
                            label="ones")  # each scale dim the input's or 1 (broadcast)
    drop = data.draw(st.integers(0, len(normalized) - 1), label="leading dims dropped")
    model, feeds = rms_model(shape, axis, epsilon=epsilon, stash=stash, seed=seed)
    scale = np.random.default_rng(seed).uniform(0.5, 2, [1 if one else d for one, d in zip(scale_shape, normalized)])
    feeds["s"] = scale[(0,) * drop].astype(np.float32) if drop else scale.astype(np.float32)
    retype_input(model, "s", feeds["s"])
    judge(model, feeds, "rmsnorm")


@settings(max_examples=30, **SETTINGS)
@given(rank=st.sampled_from([3, 4]), batch=st.integers(1, 2), seq=st.integers(1, 4), heads=st.integers(1, 3),
       head=st.sampled_from([2, 4, 8]), interleaved=st.sampled_from([0, 1]), partial=st.booleans(),
       positions=st.booleans(), heads_attr_on_4d=st.booleans(), seed=st.integers(0, 2**16))
def test_rotary_fuzz(rank, batch, seq, heads, head, interleaved, partial, positions, heads_attr_on_4d, seed):
    rotary = head // 2 if partial and head >= 4 else 0
    model, feeds = rotary_model(rank, batch, seq, heads, head, interleaved=interleaved, rotary=rotary,
                                positions=positions, seed=seed)
    if rank == 4 and heads_attr_on_4d:  # allowed, and unused, on a 4-D input
        set_attrs(model, num_heads=heads)
    judge(model, feeds, "rotary")


@settings(max_examples=30, **SETTINGS)
@given(rank=st.sampled_from([3, 4]), first_position=st.booleans(), interleaved=st.booleans(), partial=st.booleans(),
       drop_attrs=st.booleans(), half=st.booleans(), seed=st.integers(0, 2**16))
def test_contrib_rotary_fuzz(rank, first_position, interleaved, partial, drop_attrs, half, seed):
    """com.microsoft RotaryEmbedding; ``drop_attrs`` leaves out num_heads/rotary_embedding_dim
    (3-D: the head size then comes from the cache's width), refused when the cache is partial."""
    model, feeds = ms_rotary_model(rank, first_position, interleaved, partial, np.random.default_rng(seed))
    if drop_attrs:
        set_attrs(model, num_heads=None, rotary_embedding_dim=None)
    if half:  # rotated in float16 by both: equal
        model, feeds = to_half(model, feeds)
    judge(model, feeds, "msrotary", refusable=drop_attrs and partial, tol=0.0 if half else 1e-4)


# ------------------------------------------------------------------------------ GroupQueryAttention


@settings(max_examples=50, **SETTINGS)
@given(phase=st.sampled_from(["prompt", "decode", "continue"]), groups=st.sampled_from([1, 2, 4]),
       causal=st.sampled_from([None, 1, 0]), window=st.sampled_from([0, 2]), scale=st.sampled_from([None, 0.3]),
       softcap=st.sampled_from([0.0, 3.0]), rotary=st.booleans(), interleaved=st.booleans(), packed=st.booleans(),
       window_cache=st.sampled_from([None, None, 1]), symbolic=st.booleans(), half=st.booleans(),
       seed=st.integers(0, 2**16))
def test_gqa_fuzz(phase, groups, causal, window, scale, softcap, rotary, interleaved, packed, window_cache, symbolic,
                  half, seed):
    """float32 at 1e-4, float16 at one float16 ulp (2^-10 relative; both compute in float32)."""
    rng = np.random.default_rng(seed)
    model, feeds = gqa_case(rng, phase, groups, window, softcap, rotary, interleaved, 17, packed)
    set_attrs(model, causal=causal, scale=scale, sliding_window_cache=window_cache)
    if symbolic:  # batch, sequence and past buffer lengths as an exporter leaves them
        new = {0: "batch", 1: "sequence"}
        symbolic_dims(model, {"q": new, "k": new, "v": new, "pk": {0: "batch", 2: "past"},
                              "pv": {0: "batch", 2: "past"}, "seqlens": {0: "batch"}})
    refusable = bool(window_cache) or (causal == 0 and window > 0)
    if half:
        model, feeds = to_half(model, feeds)
    rows = None
    if phase == "prompt":  # a padding query's output is the kernel's scratch memory
        rows = (np.arange(feeds["q"].shape[1])[None, :] <= feeds["seqlens"][:, None])[..., None]
    judge(model, feeds, "gqa", refusable, rows=rows, tol=2.0**-10 if half else 1e-4)


# ------------------------------------------------------------------------------ MultiHeadAttention, contrib Attention

BIAS_SHAPES = {"11st": lambda b: b[:1, :1], "b1st": lambda b: b[:, :1], "1nst": lambda b: b[:1], "bnst": lambda b: b}


@settings(max_examples=50, **SETTINGS)
@given(form=st.sampled_from(["separate", "qkv", "kv", "bnsh"]), bias=st.booleans(),
       mask=st.sampled_from(["none", "lengths", "bt", "bst"]), attn_bias=st.sampled_from([None, *BIAS_SHAPES]),
       past=st.booleans(), causal=st.booleans(), scale=st.sampled_from([None, 0.3]),
       filter_value=st.sampled_from([None, -1e4, -3.0]), half=st.booleans(), seed=st.integers(0, 2**16))
def test_mha_fuzz(form, bias, mask, attn_bias, past, causal, scale, filter_value, half, seed):
    """float32 at 1e-4, float16 at one float16 ulp (2^-10 relative; both compute in float32)."""
    rng = np.random.default_rng(seed)
    past = past and form in ("separate", "kv")  # the CPU kernel takes no past with packed QKV or 4-D keys
    model, feeds, reference, reference_feeds = mha_case(rng, form, bias, mask, attn_bias and "bn", past, causal,
                                                        scale, 17)
    if bias and form != "separate":  # a bias with packed or 4-D inputs: a CUDA form, refused
        assert rewritten_or_refused(model, "mha", refusable=True) is None
        return
    if attn_bias:
        narrow = np.ascontiguousarray(BIAS_SHAPES[attn_bias](feeds["attn_bias"]))
        feeds["attn_bias"] = reference_feeds["attn_bias"] = narrow
        retype_input(model, "attn_bias", narrow)
        retype_input(reference, "attn_bias", narrow)
    for m in (model, reference):
        set_attrs(m, mask_filter_value=filter_value)
    if half:
        (model, feeds), (reference, reference_feeds) = to_half(model, feeds), to_half(reference, reference_feeds)
    judge(model, feeds, "mha", reference=reference, reference_feeds=reference_feeds, tol=2.0**-10 if half else 1e-4)


@settings(max_examples=40, **SETTINGS)
@given(mask=st.sampled_from(["none", "lengths", "bt", "bst"]), past=st.booleans(), causal=st.booleans(),
       attn_bias=st.booleans(), scale=st.sampled_from([None, 0.25]), wide_v=st.booleans(),
       filter_value=st.sampled_from([None, -1e4, -3.0]), unsupported=st.sampled_from([None, None, "do_rotary",
                                                                                       "past_present_share_buffer"]),
       symbolic=st.booleans(), half=st.booleans(), seed=st.integers(0, 2**16))
def test_contrib_attention_fuzz(mask, past, causal, attn_bias, scale, wide_v, filter_value, unsupported, symbolic,
                                half, seed):
    """float32 at 1e-4, float16 at one float16 ulp (2^-10 relative; both compute in float32)."""
    rng = np.random.default_rng(seed)
    past = past and not attn_bias  # the kernel rejects a past with an attention bias
    model, feeds = ms_attention.attention_model(rng, mask, past, causal, attn_bias, scale, wide_v)
    if symbolic:  # batch and sequence named as an exporter names them; the mask's batch is the input's
        symbolic_dims(model, {"input": {0: "batch", 1: "sequence"}, "mask": {0: "batch"}, "past": {1: "batch"}})
    set_attrs(model, mask_filter_value=filter_value)
    if unsupported:
        set_attrs(model, **{unsupported: 1})
    if unsupported or (past and wide_v):  # a past with a wider V is invalid: one past holds K and V
        assert rewritten_or_refused(model, "msattention", refusable=True) is None
        return
    if half:
        model, feeds = to_half(model, feeds)
    judge(model, feeds, "msattention", tol=2.0**-10 if half else 1e-4)


# ------------------------------------------------------------------------------ norms, FusedMatMul, GELUs


@settings(max_examples=40, **SETTINGS)
@given(simplified=st.booleans(), rank=st.sampled_from([2, 3]), skip_kind=st.sampled_from(["full", "sh", "1sh"]),
       beta=st.booleans(), bias=st.booleans(), outputs=st.sampled_from([["y"], ["y", "", "", "sum"]]),
       epsilon=st.sampled_from([None, 1e-6, 0.1]), const=st.booleans(), half=st.booleans(),
       seed=st.integers(0, 2**16))
def test_skipnorm_fuzz(simplified, rank, skip_kind, beta, bias, outputs, epsilon, const, half, seed):
    """float32 at 1e-4; float16 at two float16 ulps (2^-9 relative: the kernel and the rewrite
    both compute in float32 and round once, their statistics in another order)."""
    rng = np.random.default_rng(seed)
    s, h = int(rng.integers(1, 5)), int(rng.integers(2, 12))
    x_shape = (2, s, h) if rank == 3 else (s, h)
    skip_shape = {"full": x_shape, "sh": (s, h), "1sh": (1, s, h)}[skip_kind if rank == 3 else "full"]
    arrays = {"x": rng.standard_normal(x_shape), "skip": rng.standard_normal(skip_shape),
              "gamma": rng.standard_normal(h), "beta": rng.standard_normal(h), "bias": rng.standard_normal(h)}
    names = ["x", "skip", "gamma"] + ([] if simplified else ["beta" if beta else ""]) + (["bias"] if bias else [])
    dtype = np.float16 if half else np.float32
    arrays = {k: v.astype(dtype) for k, v in arrays.items() if k in names}
    op = "SkipSimplifiedLayerNormalization" if simplified else "SkipLayerNormalization"
    node = helper.make_node(op, names, outputs, domain=MS, **({} if epsilon is None else {"epsilon": epsilon}))
    model, feeds = one_node_model(node, arrays, {"gamma", "beta", "bias"} if const else set(), 17,
                                  out_dtype=helper.np_dtype_to_tensor_dtype(np.dtype(dtype)),
                                  outputs=[o for o in outputs if o])
    judge(model, feeds, "skipnorm", tol=2.0**-9 if half else 1e-4)


@settings(max_examples=25, **SETTINGS)
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=4), data=st.data(),
       epsilon=st.sampled_from([None, 1e-6, 0.5]), seed=st.integers(0, 2**16))
def test_simplified_norm_fuzz(shape, data, epsilon, seed):
    rank = len(shape)
    axis = data.draw(st.integers(-rank, rank - 1), label="axis")
    rng = np.random.default_rng(seed)
    arrays = {"x": rng.standard_normal(shape).astype(np.float32),
              "scale": rng.standard_normal(shape[axis % rank:]).astype(np.float32)}
    node = helper.make_node("SimplifiedLayerNormalization", ["x", "scale"], ["y"], axis=axis,
                            **({} if epsilon is None else {"epsilon": epsilon}))
    model, feeds = one_node_model(node, arrays, {"scale"}, 17)
    judge(model, feeds, "simplifiednorm")


def _fused_operand(rng, rank, rows, cols, trans, trans_batch, batch):
    """A FusedMatMul operand: [batch..., rows, cols] (transposed: cols, rows; ``batch`` the
    last rank - 2 of the broadcast batch dims); transBatch moves them after the first matrix dim."""
    dims = list(batch) + ([cols, rows] if trans else [rows, cols])
    if trans_batch and rank >= 3:
        dims = [dims[-2], *dims[:-2], dims[-1]]
    return rng.standard_normal(dims).astype(np.float32)


@settings(max_examples=40, **SETTINGS)
@given(rank_a=st.integers(2, 4), rank_b=st.integers(2, 4), trans=st.tuples(st.booleans(), st.booleans()),
       trans_batch=st.tuples(st.booleans(), st.booleans()), alpha=st.sampled_from([1.0, 0.125, -2.0]),
       seed=st.integers(0, 2**16))
def test_fusedmatmul_fuzz(rank_a, rank_b, trans, trans_batch, alpha, seed):
    rng = np.random.default_rng(seed)
    m, k, n, batch = 3, 4, 2, (2, 3)
    if any(trans_batch):  # the kernel takes transBatch with operands of one rank >= 3 only
        rank_b = rank_a = max(rank_a, 3)
    arrays = {"a": _fused_operand(rng, rank_a, m, k, trans[0], trans_batch[0], batch[4 - rank_a:]),
              "b": _fused_operand(rng, rank_b, k, n, trans[1], trans_batch[1], batch[4 - rank_b:])}
    node = helper.make_node("FusedMatMul", ["a", "b"], ["y"], domain=MS, transA=int(trans[0]), transB=int(trans[1]),
                            transBatchA=int(trans_batch[0]), transBatchB=int(trans_batch[1]), alpha=alpha)
    model, feeds = one_node_model(node, arrays, set(), 17)
    judge(model, feeds, "fusedmatmul")


@settings(max_examples=25, **SETTINGS)
@given(op=st.sampled_from(["BiasGelu", "FastGelu", "FastGeluBias", "QuickGelu"]), rank=st.integers(1, 4),
       alpha=st.sampled_from([None, 1.702, -0.5]), seed=st.integers(0, 2**16))
def test_contrib_gelu_fuzz(op, rank, alpha, seed):
    rng = np.random.default_rng(seed)
    shape = [int(d) for d in rng.integers(1, 5, rank)]
    arrays = {"x": (rng.standard_normal(shape) * 3).astype(np.float32)}
    if op in ("BiasGelu", "FastGeluBias"):
        arrays["bias"] = rng.standard_normal(shape[-1:]).astype(np.float32)
    real_op = "FastGelu" if op == "FastGeluBias" else op
    attrs = {"alpha": alpha} if op == "QuickGelu" and alpha is not None else {}
    model, feeds = one_node_model(helper.make_node(real_op, list(arrays), ["y"], domain=MS, **attrs), arrays,
                                  {"bias"}, 17)
    judge(model, feeds, "contribgelu")


# ------------------------------------------------------------------------------ MatMulNBits, 4-bit DequantizeLinear


@settings(max_examples=40, **SETTINGS)
@given(k=st.integers(1, 300), n=st.integers(1, 9), bits=st.sampled_from([2, 4, 8]),
       block=st.sampled_from([16, 32, 64, 128, 256]), zp_kind=st.sampled_from(["none", "packed", "float"]),
       bias=st.booleans(), accuracy=st.integers(0, 4), a_rank=st.integers(1, 3), flat=st.booleans(),
       half=st.booleans(), symbolic=st.booleans(), values=st.sampled_from(["normal", "float16", "integer"]),
       seed=st.integers(0, 2**16))
def test_matmulnbits_fuzz(k, n, bits, block, zp_kind, bias, accuracy, a_rank, flat, half, symbolic, values, seed):
    """Exact against the kernel at the declared precision: float32 at 1e-4, the module's
    tolerance (tests/rewrite/test_rw_matmulnbits.py: only the sum over blocks rounds in another
    order); float16 at one float16 ulp (2^-10 relative: both compute in float32 and round once)."""
    rng = np.random.default_rng(seed)
    if bits == 8 and zp_kind == "float":  # the CPU kernel refuses this combination: nothing to judge by
        zp_kind = "packed"
    a_shape = [2, 3, 2][:a_rank - 1] + [k]
    model, feeds = nbits_model(k, n, bits, block, zp_kind, bias, accuracy, rng, a_shape, flat)
    refusable = bits == 2 and accuracy == 4 and zp_kind != "float"  # A's precision depends on the block size
    if values != "normal":  # short mantissas: A * 127 / max|A| meets rounding boundaries and ties at level 4
        a = feeds["A"]
        feeds["A"] = a.astype(np.float16).astype(np.float32) if values == "float16" else np.round(a * 2)
    if half:
        model, feeds = to_half(model, feeds)
    if symbolic:  # the batch and sequence dims of A
        symbolic_dims(model, {"A": {axis: f"a{axis}" for axis in range(a_rank - 1)}})
    judge(model, feeds, "matmulnbits", refusable, tol=2.0**-10 if half else 1e-4)


@settings(max_examples=30, **SETTINGS)
@given(shape=st.lists(st.integers(1, 9), min_size=1, max_size=3), data=st.data(), signed=st.booleans(),
       block=st.sampled_from([2, 4, 8]), zp=st.booleans(), half=st.booleans(), seed=st.integers(0, 2**16))
def test_blocked_dq4_fuzz(shape, data, signed, block, zp, half, seed):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1), label="axis")
    model, feeds = dq_model(shape, signed, "block", axis, block, zp, False, np.random.default_rng(seed),
                            dtype=np.float16 if half else np.float32)
    judge(model, feeds, "dq4", tol=0.0 if half else 1e-6)
