"""com.microsoft Attention (packed Q/K/V projection, what onnxruntime's BERT/GPT-2 optimizer writes)
-> MatMul, Add, Split, then the attention of :mod:`onnxmlu.rewrite.mha`.

onnxruntime's definition (``docs/ContribOperators.md``; CPU kernel
``contrib_ops/cpu/bert/attention.cc``), hidden sizes ``(D, D, Dv) = qkv_hidden_sizes`` (default
three equal thirds of the weights' columns), ``N`` heads::

    [q, k, v] = split(input @ weights + bias, [D, D, Dv])          input [B, S, Din]
    K = concat(past[0], heads(k)),  V = concat(past[1], heads(v))   past [2, B, N, P, H]
    present = stack(K, V)                                           [2, B, N, P + S, H]
    Y = merge(softmax(scale heads(q) K^T + mask + attention_bias) V)

with the masks of MultiHeadAttention: ``mask_index`` [B] (key lengths), [B, T] or [B, S, T]
(0: masked with ``mask_filter_value``), ``unidirectional`` (key t > i + P gets the lowest float
for query i, whatever ``mask_filter_value`` is),
``attention_bias`` [B or 1, N or 1, S, T]; ``scale`` defaults to ``1 / sqrt(H)``.

Rewrite: ``MatMul`` (+ ``Add``) of the projection, ``Split``, :func:`onnxmlu.rewrite.mha.attend`,
``Gather`` of the past halves and ``Concat``/``Unsqueeze`` for the present.

float16 is computed in float32 between ``Cast`` nodes, as the CPU kernel computes it (equal
in every form tried).

Refused: float types other than float32 and float16, ``mask_index`` of the left-padding ([2 B]),
``3 B + 2`` or 4-D forms, ``past_present_share_buffer``/``past_sequence_length``, ``do_rotary``,
a past with an attention bias (the kernel rejects the pair), a past with a V hidden size other
than K's (one past holds both; the kernel rejects it),
and sizes that are not known (the split and the default scale need them).
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from onnxmlu.rewrite.base import RewriteContext, detach, node_input, node_output, tensor_shape
from onnxmlu.rewrite.builder import Builder
from onnxmlu.rewrite.floattype import float_dtype, is_float, widen_half
from onnxmlu.rewrite.mha import HALF_OR_FLOAT, MASK_FILTER, Masks, _heads, attend, node_scale, same_dim, static_dim

DOMAIN = "com.microsoft"
INPUT, WEIGHTS, BIAS, MASK, PAST, ATTN_BIAS, PAST_LEN = range(7)


def hidden_sizes(node: gs.Node) -> list[int] | None:
    """(D, D, Dv), from ``qkv_hidden_sizes`` or the weights' columns; None when unknown."""
    if "qkv_hidden_sizes" in node.attrs:
        return [int(v) for v in node.attrs["qkv_hidden_sizes"]]
    columns = static_dim(node.inputs[WEIGHTS], 1)
    return None if columns is None or columns % 3 else [columns // 3] * 3


def refusal(node: gs.Node) -> str | None:
    if not is_float(float_dtype(node.inputs[INPUT]), HALF_OR_FLOAT):
        return f"input has element type {float_dtype(node.inputs[INPUT]) or 'unknown'}; float32/float16 are rewritten"
    if tensor_shape(node.inputs[INPUT]) is None or len(tensor_shape(node.inputs[INPUT])) != 3:
        return "input is not [B, S, input_hidden_size]"
    for attr, what in (("do_rotary", "do_rotary"), ("past_present_share_buffer", "a shared past/present buffer")):
        if int(node.attrs.get(attr, 0)):
            return f"{what} is not rewritten"
    if node_input(node, PAST_LEN) is not None:
        return "past_sequence_length (a shared past/present buffer) is not rewritten"
    sizes = hidden_sizes(node)
    heads = int(node.attrs["num_heads"])
    if sizes is None or sizes[0] % heads or sizes[2] % heads:
        return "the Q/K/V hidden sizes are not known multiples of num_heads"
    mask = node_input(node, MASK)
    if mask is not None:
        shape = tensor_shape(mask)
        if shape is None or len(shape) not in (1, 2, 3):
            return "mask_index of unknown rank or 4-D"
        if len(shape) == 1 and not same_dim(mask, node.inputs[INPUT]):
            return "a 1-D mask_index that is not [batch] (left padding or the 3 * batch + 2 form)"
    past = node_input(node, PAST)
    if past is not None and (tensor_shape(past) is None or len(tensor_shape(past)) != 5):
        return "past is not [2, B, N, P, H]"
    if past is not None and node_input(node, ATTN_BIAS) is not None:
        return "past with attention_bias (onnxruntime's kernel rejects it)"
    if past is not None and sizes[1] != sizes[2]:
        return f"past with V hidden size {sizes[2]} != K's {sizes[1]} (one past holds both; the kernel rejects it)"
    return None


def _past_half(bld: Builder, past: gs.Tensor, index: int, name: str) -> gs.Tensor:
    return bld.op("Gather", [past, bld.scalar(index, np.int64)], attrs={"axis": 0}, name=name)


class ContribAttentionRewriter:
    name = "msattention"
    domain = DOMAIN
    op_types = ("Attention",)

    def __init__(self, **_: object) -> None:
        pass

    def check(self, node: gs.Node, ctx: RewriteContext) -> str | None:
        return refusal(node)

    def apply(self, node: gs.Node, ctx: RewriteContext) -> None:
        heads, sizes = int(node.attrs["num_heads"]), hidden_sizes(node)
        bld = ctx.builder(node, np.float32)
        if float_dtype(node.inputs[INPUT]) == np.float16:
            widen_half(node, bld)
        qkv = bld.op("MatMul", [node.inputs[INPUT], node.inputs[WEIGHTS]], name="qkv")
        if node_input(node, BIAS) is not None:
            qkv = bld.op("Add", [qkv, node.inputs[BIAS]], name="qkv_bias")
        q, k, v = (_heads(bld, t, heads, n) for t, n in zip(bld.split(qkv, sizes, 2, name="qkv_split"), "QKV"))
        past = node_input(node, PAST)
        if past is not None:
            k = bld.op("Concat", [_past_half(bld, past, 0, "past_key"), k], attrs={"axis": 2}, name="key")
            v = bld.op("Concat", [_past_half(bld, past, 1, "past_value"), v], attrs={"axis": 2}, name="value")
        s = static_dim(node.inputs[INPUT], 1)
        p = 0 if past is None else static_dim(past, 3)
        causal = (s, None if s is None or p is None else s + p) if int(node.attrs.get("unidirectional", 0)) else None
        masks = Masks(node_input(node, MASK), causal, node_input(node, ATTN_BIAS))
        y = attend(bld, q, k, v, node_scale(node, sizes[0] // heads),
                   float(node.attrs.get("mask_filter_value", MASK_FILTER)), masks)
        present = node_output(node, 1)
        outputs = detach(node, ctx.graph)
        bld.finish(y, outputs[0])
        if present is not None:
            stacked = [bld.unsqueeze(t, [0], name=f"{n}_stacked") for t, n in ((k, "key"), (v, "value"))]
            bld.finish(bld.concat(stacked, 0, name="present"), present)
