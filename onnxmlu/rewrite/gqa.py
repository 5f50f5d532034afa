"""com.microsoft GroupQueryAttention -> the KV cache update and causal attention in primitives.

onnxruntime's definition (``docs/ContribOperators.md``; CPU kernel
``contrib_ops/cpu/bert/group_query_attention.cc``, ``gqa_attention_base.h``; checked case by
case against it, tests/rewrite/test_rw_gqa.py), for ``N`` query heads, ``Nkv`` key/value heads
(``G = N / Nkv`` query heads share one), head size ``H``, new tokens ``S``,
``seqlens_k[b] + 1`` the total length of sequence ``b`` and ``T`` = ``total_sequence_length``::

    first prompt:  S == T   ->  past_b = 0,   else  past_b = seqlens_k[b] + 1 - S
    present length Tp = max(P, T)   (P: the past buffers' length; T without them)
                      = max(P, S, T)  (the kernel refuses T < S, the new keys' length, for a
                                       non-sliding cache: S is written so that a tensor's
                                       value does not alone size the cache, see lengths())
    present[b, :, t] = new[b, :, t - past_b]   for past_b <= t < past_b + S
                     = past[b, :, t]          for t < past_b
                     = 0                       elsewhere
    query i of sequence b sits at pos = past_b + i and sees the keys t with
        t <= pos (causal=1, the default),  t < seqlens_k[b] + 1,
        and t > pos - local_window_size (when > 0)
    scores = scale Q K^T (K, V: each kv head repeated G times), softcap c > 0: c tanh(scores / c)
    Y = merge(softmax over the keys seen (scores) V)

``do_rotary`` first rotates Q and K (:mod:`onnxmlu.rewrite.msrotary`, ``rotary_interleaved``)
at the positions ``pos``, with ``cos_cache``/``sin_cache``.

Rewrite: every line above as nodes on run-time values -- ``Shape``/``Range``/``Cast`` for the
lengths and positions, ``GatherElements`` of the new keys at ``t - past_b`` (clamped) and
``Pad`` of the past to ``Tp``, ``Where`` to assemble the present, ``Unsqueeze``/``Expand``/
``Reshape`` to repeat the kv heads, ``MatMul``, ``Mul``, ``Tanh`` for the softcap, a boolean
mask from ``LessOrEqual``/``Less``/``Greater``/``And`` applied by ``Where`` (the lowest float:
an unseen key adds exactly nothing, as in the kernel, which leaves it out), ``Softmax``,
``MatMul``. A padding query of a right-padded prompt (i >= seqlens_k[b] + 1) may see no key at
all with a local window; the kernel's output there is whatever its scratch buffer held, the
rewrite's a finite average (never NaN, which the next layer's products would spread).

The query may hold Q, K and V packed (``[B, S, (N + 2 Nkv) H]``, key and value absent), split
along the last axis first.

``causal=0`` (bidirectional) drops the ``t <= pos`` condition; the kernel rejects a local
window with it, and so does ``check``.

float16 is computed in float32 between ``Cast`` nodes, as the kernel computes it (within one
float16 ulp), except the rotation: the kernel rotates in float16 (a float32 rotation rounded is
1e3 float16 ulps off), so ``do_rotary`` casts Q, K and the angles to float16 for it and back.

``smooth_softmax=1`` adds a logit of 0 to each row's softmax, ``head_sink`` [N] a logit per head
(the attention sinks of gpt-oss), whose share is dropped: ``softmax([scores, sink])[:-1]``; the
rewrite concatenates that column and slices it off.

Refused: ``position_ids``, ``attention_bias``, quantized or normalized caches and the other
inputs after ``sin_cache``, ``qk_output``, ``sliding_window_cache=1`` (window-sized buffers whose rows the kernel evicts
in blocks of ``C - W + 1``: another present layout), types other than float32 and float16,
opsets before 14 (Trilu-era ops, int64 Max/Min).
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from onnxmlu.rewrite.base import RewriteContext, detach, node_input, node_output
from onnxmlu.rewrite.builder import Builder
from onnxmlu.rewrite.floattype import float_dtype, is_float, widen_half
from onnxmlu.rewrite.mha import HALF_OR_FLOAT, _heads, static_dim
from onnxmlu.rewrite.msrotary import rotated

DOMAIN = "com.microsoft"
QUERY, KEY, VALUE, PAST_KEY, PAST_VALUE, SEQLENS, TOTAL, COS, SIN = range(9)
HEAD_SINK = 11
_I64 = np.int64
#: the inputs after sin_cache (onnxruntime 1.32's schema), none of them rewritten
LATER_INPUTS = ("position_ids", "attention_bias", "head_sink", "k_scale", "v_scale", "q_norm_weight", "k_norm_weight",
                "query_seqlens")


def refusal(node: gs.Node, opset: int) -> str | None:
    if opset < 14:
        return f"opset {opset} < 14"
    dtype = float_dtype(node.inputs[QUERY])
    if not is_float(dtype, HALF_OR_FLOAT):
        return f"query has element type {dtype or 'unknown'}; float32/float16 are rewritten"
    if (node_input(node, KEY) is None) != (node_input(node, VALUE) is None):
        return "key without value (or the reverse)"
    extra = [i for i in range(9, len(node.inputs)) if node_input(node, i) is not None and i != HEAD_SINK]
    if extra:
        name = LATER_INPUTS[extra[0] - 9] if extra[0] - 9 < len(LATER_INPUTS) else f"input {extra[0]}"
        return f"its {name} input is not rewritten"
    if int(node.attrs.get("qk_output", 0)):
        return "qk_output is not rewritten"
    if node_input(node, HEAD_SINK) is not None and static_dim(node.inputs[HEAD_SINK], 0) is None:
        return "head_sink of unknown length"
    reason = _cache_reason(node)
    if reason is not None:
        return reason
    if any(node_output(node, i) is not None for i in range(3, len(node.outputs))):
        return "the output_qk output is read"
    if (node_input(node, PAST_KEY) is None) != (node_input(node, PAST_VALUE) is None):
        return "past_key without past_value (or the reverse)"
    if static_dim(node.inputs[QUERY], 2) is None:
        return "the query's hidden size is not known"
    rotary = int(node.attrs.get("do_rotary", 0))
    if rotary and (node_input(node, COS) is None or static_dim(node.inputs[COS], 1) is None):
        return "do_rotary without a cos_cache of known width"
    return None


def _cache_reason(node: gs.Node) -> str | None:
    """The attributes that change which keys a query sees or how the cache is laid out."""
    causal = int(node.attrs.get("causal", 1))
    if causal not in (0, 1):
        return f"causal={causal} is not 0 or 1"
    if not causal and int(node.attrs.get("local_window_size", -1)) > 0:
        return "a local window without causal=1 (onnxruntime's kernel rejects it)"
    if int(node.attrs.get("sliding_window_cache", 0)):
        return "sliding_window_cache=1 (a window-sized cache that evicts rows in blocks) is not rewritten"
    for attr in ("k_quant_type", "v_quant_type"):
        if str(node.attrs.get(attr, "NONE")) != "NONE":
            return f"{attr}={node.attrs[attr]} (a quantized cache) is not rewritten"
    return None


def _dim(bld: Builder, x: gs.Tensor, axis: int, name: str) -> gs.Tensor:
    """Dim ``axis`` of ``x`` as int64 ``[1]``."""
    shape = bld.op("Shape", [x], name=f"{name}_shape", dtype=_I64)
    return bld.op("Gather", [shape, bld.int64([axis], f"{name}_axis")], attrs={"axis": 0}, name=name)


def lengths(bld: Builder, node: gs.Node) -> dict[str, gs.Tensor]:
    """Run-time lengths, with their shapes: S of [1], total per sequence of [B, 1], past_b of
    [B, 1], Tp of [1], t of shape Tp."""
    s = _dim(bld, node.inputs[QUERY], 1, "S")
    total = bld.op("Reshape", [bld.cast(node.inputs[TOTAL], _I64, name="T_int64"), bld.int64([1], "one")],
                   name="T")
    seq_total = bld.op("Add", [bld.unsqueeze(bld.cast(node.inputs[SEQLENS], _I64, name="seqlens64"), [1],
                                             name="seqlens_col"), bld.int64([1], "one_i")], name="seq_total")
    first = bld.op("Equal", [s, total], name="first_prompt", dtype=np.bool_)
    later = bld.op("Sub", [seq_total, s], name="past_later")
    past_b = bld.op("Where", [first, bld.int64([0], "zero_i"), later], name="past_b", dtype=_I64)
    # S changes no value: the kernel takes T >= S only (module docstring); it bounds Tp by a
    # shape where T is not known (a run on zeros, which prices the model, says T = 0)
    known = [s] + ([_dim(bld, node.inputs[PAST_KEY], 2, "P")] if node_input(node, PAST_KEY) is not None else [])
    present = bld.op("Max", [*known, total], name="Tp")
    scalar = bld.op("Squeeze", [present, bld.int64([0], "axis0")], name="Tp_scalar")
    t = bld.op("Range", [bld.scalar(0, _I64), scalar, bld.scalar(1, _I64)], name="t", dtype=_I64)
    return {"S": s, "seq_total": seq_total, "past_b": past_b, "Tp": present, "t": t}


def present_cache(bld: Builder, new: gs.Tensor, past: gs.Tensor | None, lens: dict, name: str) -> gs.Tensor:
    """The present key or value [B, Nkv, Tp, H] (module docstring)."""
    rel = bld.op("Sub", [bld.unsqueeze(lens["t"], [0], name=f"{name}_t_row"), lens["past_b"]], name=f"{name}_rel")
    last = bld.op("Sub", [lens["S"], bld.int64([1], f"{name}_one")], name=f"{name}_last")
    index = bld.op("Max", [bld.op("Min", [rel, last], name=f"{name}_clip_hi"), bld.int64([0], f"{name}_zero")],
                   name=f"{name}_index")
    shape = bld.op("Concat", [bld.op("Slice", [bld.op("Shape", [new], name=f"{name}_shape", dtype=_I64),
                                               bld.int64([0]), bld.int64([2]), bld.int64([0])], name=f"{name}_bn"),
                              lens["Tp"], _dim(bld, new, 3, f"{name}_H")], attrs={"axis": 0}, name=f"{name}_target")
    index4 = bld.op("Expand", [bld.unsqueeze(index, [1, 3], name=f"{name}_index4"), shape], name=f"{name}_indices")
    gathered = bld.op("GatherElements", [new, index4], attrs={"axis": 2}, name=f"{name}_gathered")
    in_new = bld.op("And", [bld.op("GreaterOrEqual", [rel, bld.int64([0], f"{name}_z")], name=f"{name}_after",
                                   dtype=np.bool_),
                            bld.op("Less", [rel, lens["S"]], name=f"{name}_before", dtype=np.bool_)],
                    name=f"{name}_is_new", dtype=np.bool_)
    in_new4 = bld.unsqueeze(in_new, [1, 3], name=f"{name}_is_new4")
    rest = bld.scalar(0.0)
    if past is not None:
        grow = bld.op("Sub", [lens["Tp"], _dim(bld, past, 2, f"{name}_P")], name=f"{name}_grow")
        pads = bld.op("Concat", [bld.int64([0] * 6, f"{name}_pads_lo"), grow, bld.int64([0], f"{name}_pads_hi")],
                      attrs={"axis": 0}, name=f"{name}_pads")
        padded = bld.op("Pad", [past, pads], name=f"{name}_past_padded")
        in_past = bld.unsqueeze(bld.op("Less", [rel, bld.int64([0], f"{name}_z2")], name=f"{name}_is_past",
                                       dtype=np.bool_), [1, 3], name=f"{name}_is_past4")
        rest = bld.op("Where", [in_past, padded, bld.scalar(0.0)], name=f"{name}_kept", dtype=np.float32)
    return bld.op("Where", [in_new4, gathered, rest], name=name, dtype=np.float32)


def _positions(bld: Builder, lens: dict) -> gs.Tensor:
    """pos [B, S]: past_b + i."""
    length = bld.op("Squeeze", [lens["S"], bld.int64([0], "s_axis")], name="S_scalar")
    steps = bld.op("Range", [bld.scalar(0, _I64), length, bld.scalar(1, _I64)], name="steps", dtype=_I64)
    return bld.op("Add", [lens["past_b"], bld.unsqueeze(steps, [0], name="steps_row")], name="pos")


def _seen(bld: Builder, node: gs.Node, lens: dict, pos: gs.Tensor) -> gs.Tensor:
    """The keys each query sees, bool [B, 1, S, Tp]."""
    t = bld.unsqueeze(lens["t"], [0, 1], name="t_grid")
    pos3 = bld.unsqueeze(pos, [2], name="pos3")
    seen = bld.op("Less", [t, bld.unsqueeze(lens["seq_total"], [2], name="total3")], name="valid", dtype=np.bool_)
    if int(node.attrs.get("causal", 1)):  # causal=0: bidirectional, every key of the sequence
        seen = bld.op("And", [bld.op("LessOrEqual", [t, pos3], name="causal", dtype=np.bool_), seen], name="seen",
                      dtype=np.bool_)
    window = int(node.attrs.get("local_window_size", -1))
    if window > 0:
        start = bld.op("Sub", [pos3, bld.int64([window], "window")], name="window_start")
        seen = bld.op("And", [seen, bld.op("Greater", [t, start], name="in_window", dtype=np.bool_)],
                      name="seen_window", dtype=np.bool_)
    return bld.unsqueeze(seen, [1], name="seen4")


def _rotate(bld: Builder, node: gs.Node, x: gs.Tensor, pos: gs.Tensor, head: int, name: str,
            in_half: bool = False) -> gs.Tensor:
    """``x`` rotated at ``pos``; ``in_half``: in float16, as the float16 kernel rotates (its
    float32 operands are float16 values widened: the casts to float16 are exact)."""
    half = static_dim(node.inputs[COS], 1)
    cos, sin = (bld.unsqueeze(bld.op("Gather", [node.inputs[i], pos], attrs={"axis": 0}, name=f"{name}_{n}"), [1],
                              name=f"{name}_{n}_heads") for i, n in ((COS, "cos"), (SIN, "sin")))
    if in_half:
        x, cos, sin = (bld.cast(t, np.float16, name=f"{name}_{n}_half")
                       for t, n in ((x, "x"), (cos, "cos"), (sin, "sin")))
    out = rotated(bld.child(name), x, cos, sin, head, 2 * half, bool(node.attrs.get("rotary_interleaved", 0)))
    return bld.cast(out, np.float32, name=f"{name}_float") if in_half else out


def _attention(bld: Builder, node: gs.Node, q, k, v, seen, head: int) -> gs.Tensor:
    heads, kv_heads = int(node.attrs["num_heads"]), int(node.attrs["kv_num_heads"])
    group = bld.int64([1, 1, heads // kv_heads, 1, 1], "group")
    k, v = (bld.reshape(bld.op("Expand", [bld.unsqueeze(x, [2], name=f"{n}_g"), group], name=f"{n}_groups"),
                        [0, heads, -1, head], name=f"{n}_repeated") for x, n in ((k, "K"), (v, "V")))
    scale = float(node.attrs["scale"]) if float(node.attrs.get("scale", 0.0)) else 1.0 / float(np.sqrt(head))
    scores = bld.op("Mul", [bld.op("MatMul", [q, bld.transpose(k, [0, 1, 3, 2], name="K_t")], name="QK"),
                            bld.scalar(scale)], name="scaled")
    softcap = float(node.attrs.get("softcap", 0.0))
    if softcap > 0:
        capped = bld.unary("Tanh", bld.op("Div", [scores, bld.scalar(softcap)], name="capped_in"), name="capped")
        scores = bld.op("Mul", [capped, bld.scalar(softcap)], name="softcapped")
    lowest = float(np.finfo(np.float32).min)  # not -inf: a padded query that sees no key stays finite
    scores = bld.op("Where", [seen, scores, bld.scalar(lowest)], name="masked", dtype=np.float32)
    probs = _softmax(bld, node, scores, heads)
    context = bld.op("MatMul", [probs, v], name="context")
    return bld.reshape(bld.transpose(context, [0, 2, 1, 3], name="bsnh"), [0, 0, -1], name="merged")


def _softmax(bld: Builder, node: gs.Node, scores: gs.Tensor, heads: int) -> gs.Tensor:
    """Softmax over the keys; with ``smooth_softmax`` or a ``head_sink``, over the keys and one
    more logit per head (0, or ``head_sink[n]``) whose probability is dropped: a column of it
    concatenated to the scores, then sliced off."""
    sink = node_input(node, HEAD_SINK)
    if sink is None and int(node.attrs.get("smooth_softmax", 0)) <= 0:
        return bld.op("Softmax", [scores], attrs={"axis": -1}, name="softmax")
    first = bld.op("Slice", [scores, bld.int64([0], "col0"), bld.int64([1], "col1"), bld.int64([-1], "last")],
                   name="first_column")
    sink = bld.reshape(sink, [1, heads, 1, 1], name="sink4") if sink is not None else bld.scalar(0.0)
    column = bld.op("Expand", [sink, bld.op("Shape", [first], name="column_shape", dtype=_I64)], name="sink_column")
    probs = bld.op("Softmax", [bld.concat([scores, column], -1, name="with_sink")], attrs={"axis": -1},
                   name="softmax")
    end = bld.int64([-1], "without_sink")
    return bld.op("Slice", [probs, bld.int64([0], "keys0"), end, bld.int64([-1], "keys_axis")], name="key_probs")


class GroupQueryAttentionRewriter:
    name = "gqa"
    domain = DOMAIN
    op_types = ("GroupQueryAttention",)

    def __init__(self, **_: object) -> None:
        pass

    def check(self, node: gs.Node, ctx: RewriteContext) -> str | None:
        return refusal(node, ctx.opset)

    def apply(self, node: gs.Node, ctx: RewriteContext) -> None:
        heads, kv_heads = int(node.attrs["num_heads"]), int(node.attrs["kv_num_heads"])
        packed = node_input(node, KEY) is None
        head = static_dim(node.inputs[QUERY], 2) // (heads + 2 * kv_heads if packed else heads)
        bld = ctx.builder(node, np.float32)
        in_half = float_dtype(node.inputs[QUERY]) == np.float16
        if in_half:  # computed in float32, each output rounded once (the rotation: module docstring)
            widen_half(node, bld)
        lens = lengths(bld, node)
        pos = _positions(bld, lens)
        inputs = (bld.split(node.inputs[QUERY], [heads * head, kv_heads * head, kv_heads * head], 2, name="qkv")
                  if packed else [node.inputs[i] for i in (QUERY, KEY, VALUE)])
        q, k, v = (_heads(bld, x, n, name) for x, n, name in zip(inputs, (heads, kv_heads, kv_heads), "QKV"))
        if int(node.attrs.get("do_rotary", 0)):
            q, k = (_rotate(bld, node, x, pos, head, f"{n}_rotary", in_half) for x, n in ((q, "Q"), (k, "K")))
        present_k = present_cache(bld, k, node_input(node, PAST_KEY), lens, "present_key")
        present_v = present_cache(bld, v, node_input(node, PAST_VALUE), lens, "present_value")
        y = _attention(bld, node, q, present_k, present_v, _seen(bld, node, lens, pos), head)
        outputs = detach(node, ctx.graph)
        bld.finish(y, outputs[0])
        for index, tensor in ((1, present_k), (2, present_v)):
            if index < len(outputs) and not outputs[index].is_empty():
                bld.finish(tensor, outputs[index])
