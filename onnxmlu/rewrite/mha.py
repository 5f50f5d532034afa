"""com.microsoft MultiHeadAttention -> Reshape/Transpose, MatMul, Softmax, MatMul.

onnxruntime's definition (``docs/ContribOperators.md``; CPU kernel
``contrib_ops/cpu/bert/multihead_attention.cc`` and ``attention_cpu_base.h``), for ``N`` heads
of size ``H`` (query hidden size ``D = N H``, value head size ``Hv``)::

    Q = heads(query + bias_q)                         [B, N, S, H]
    K = concat(past_key, heads(key + bias_k))         [B, N, T, H]    (present_key)
    V = concat(past_value, heads(value + bias_v))     [B, N, T, Hv]   (present_value)
    P = softmax(scale * Q K^T + mask + attention_bias)                  over T
    Y = merge(P V)                                    [B, S, N Hv]

``heads`` reshapes ``[B, L, N H]`` to ``[B, L, N, H]`` and transposes to ``[B, N, L, H]``;
``merge`` undoes it. ``scale`` defaults to ``1 / sqrt(H)``. The query may hold Q, K and V
packed (``[B, S, N, 3, H]``, key and value absent) and the key K and V packed
(``[B, L, N, 2, H]``, value absent); a 4-D key and value are already ``[B, N, L, H]`` (cross
attention reusing a computed key) and get neither bias nor reshape. ``mask`` is
``mask_filter_value`` (default -10000) where ``key_padding_mask`` is 0 (shape ``[B, T]`` or
``[B, S, T]``) or where the key position is at or beyond the key length it gives (shape
``[B]``), 0 elsewhere; with ``unidirectional`` the keys after ``i + T - S`` get the lowest
float for query ``i``, as in the CPU kernel -- not ``mask_filter_value``, which a model may set
small (-3: future keys would keep weight). ``attention_bias`` is ``[B or 1, N or 1, S, T]``.

Rewrite: those formulas node for node (``Add`` of the bias slices, ``Reshape``/``Transpose``,
``Concat`` with the past, ``MatMul``, ``Mul`` by ``scale``, ``Add`` of the masks, ``Softmax``
on the last axis, ``MatMul``, ``Transpose``/``Reshape``). The padding mask becomes the additive
mask through ``Cast``/``Where`` (or ``Less`` against a ``Range`` of key positions for key
lengths); the causal mask is a constant when S and T are known, else a ``Trilu`` of a
``ConstantOfShape`` (opset 14+).

float16 is computed in float32 between ``Cast`` nodes (:func:`onnxmlu.rewrite.floattype.widen_half`), as
the CPU kernel computes it: equal to it, float16 output for float16 output, in every form tried.

Refused (host, with the reason): types other than float32 and float16, the ``qk`` output, buffer sharing
(``past_sequence_length``), ``cache_indirection``, a bias with packed inputs, a
``key_padding_mask`` of the ``3 B + 2`` form, unknown ranks, and a causal mask on unknown
lengths before opset 14.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from onnxmlu.rewrite.base import RewriteContext, detach, node_input, node_output, tensor_dtype
from onnxmlu.rewrite.base import tensor_shape
from onnxmlu.rewrite.builder import Builder
from onnxmlu.rewrite.floattype import float_dtype, is_float, widen_half

DOMAIN = "com.microsoft"
#: query types rewritten: float16 is computed in float32 between casts, as the CPU kernel does
HALF_OR_FLOAT = (np.dtype(np.float32), np.dtype(np.float16))
MASK_FILTER = -10000.0
#: what the kernels put on a future key: the lowest float, whatever mask_filter_value says
CAUSAL_FILTER = float(np.finfo(np.float32).min)
QUERY, KEY, VALUE, BIAS, PADDING, ATTN_BIAS, PAST_KEY, PAST_VALUE, PAST_LEN, CACHE_INDIRECTION = range(10)


def static_dim(tensor: gs.Tensor, axis: int) -> int | None:
    """Dim ``axis`` of ``tensor`` when known and fixed, else None."""
    shape = tensor_shape(tensor)
    if shape is None or axis >= len(shape):
        return None
    dim = shape[axis]
    return int(dim) if isinstance(dim, (int, np.integer)) and int(dim) >= 0 else None


def same_dim(a: gs.Tensor, b: gs.Tensor) -> bool:
    """Whether the first dims of ``a`` and ``b`` are one known size or one named symbol (a
    ``[batch]`` mask, not ``[2 * batch]`` nor ``[3 * batch + 2]``)."""
    dims = [tensor_shape(t)[0] if tensor_shape(t) else None for t in (a, b)]
    return dims[0] is not None and dims[0] == dims[1]


def _rank(tensor: gs.Tensor | None) -> int | None:
    shape = tensor_shape(tensor)
    return None if shape is None else len(shape)


def _form(node: gs.Node) -> str:
    """``separate`` (3-D Q, K, V), ``qkv`` (packed in the query), ``kv`` (packed in the key),
    ``bnsh`` (4-D key and value)."""
    key, value = node_input(node, KEY), node_input(node, VALUE)
    if key is None:
        return "qkv"
    if value is None:
        return "kv"
    return "bnsh" if _rank(key) == 4 else "separate"


def refusal(node: gs.Node) -> str | None:
    """Why the node cannot be rewritten exactly (module docstring), or None."""
    if not is_float(float_dtype(node.inputs[QUERY]), HALF_OR_FLOAT):
        return f"query has element type {float_dtype(node.inputs[QUERY]) or 'unknown'}; float32/float16 are rewritten"
    if node_output(node, 3) is not None:
        return "its qk output is read"
    for index, what in ((PAST_LEN, "past_sequence_length (shared past/present buffers)"),
                        (CACHE_INDIRECTION, "cache_indirection (beam search)")):
        if node_input(node, index) is not None:
            return f"{what} is not rewritten"
    form = _form(node)
    ranks = {"separate": (3, 3, 3), "qkv": (5, None, None), "kv": (3, 5, None), "bnsh": (3, 4, 4)}[form]
    for index, rank in zip((QUERY, KEY, VALUE), ranks):
        if rank is not None and _rank(node.inputs[index]) != rank:
            return f"input {index} has rank {_rank(node.inputs[index])}, the {form} form needs {rank}"
    if node_input(node, BIAS) is not None and form != "separate":
        return f"a bias with the {form} form is not rewritten"
    if node_input(node, PADDING) is not None and _rank(node.inputs[PADDING]) not in (1, 2, 3):
        return "key_padding_mask of unknown rank"
    if node_input(node, PADDING) is not None and _rank(node.inputs[PADDING]) == 1 and \
            not same_dim(node.inputs[PADDING], node.inputs[QUERY]):
        return "a 1-D key_padding_mask that is not [batch] (the 3 * batch + 2 form)"
    if (node_input(node, PAST_KEY) is None) != (node_input(node, PAST_VALUE) is None):
        return "past_key without past_value (or the reverse)"
    if "scale" not in node.attrs and head_size(node) is None:
        return "the head size (for the default scale) is symbolic"
    return None


def _heads(bld: Builder, x: gs.Tensor, heads: int, name: str) -> gs.Tensor:
    """[B, L, N H] -> [B, N, L, H]."""
    split = bld.reshape(x, [0, 0, heads, -1], name=f"{name}_heads")
    return bld.transpose(split, [0, 2, 1, 3], name=f"{name}_bnsh")


def _packed(bld: Builder, x: gs.Tensor, index: int, name: str) -> gs.Tensor:
    """Slot ``index`` of a packed [B, L, N, n, H] tensor as [B, N, L, H]."""
    part = bld.op("Gather", [x, bld.scalar(index, np.int64)], attrs={"axis": 3}, name=name)
    return bld.transpose(part, [0, 2, 1, 3], name=f"{name}_bnsh")


def project(bld: Builder, node: gs.Node, heads: int) -> tuple[gs.Tensor, gs.Tensor, gs.Tensor]:
    """Q, K, V as [B, N, L, H] (before the past)."""
    query, key, value = node.inputs[QUERY], node_input(node, KEY), node_input(node, VALUE)
    form = _form(node)
    if form == "qkv":
        return tuple(_packed(bld, query, i, n) for i, n in enumerate("QKV"))
    if form == "kv":
        return _heads(bld, query, heads, "Q"), _packed(bld, key, 0, "K"), _packed(bld, key, 1, "V")
    bias = node_input(node, BIAS)
    if bias is not None:
        d, dv = tensor_shape(query)[-1], tensor_shape(value)[-1] if form == "separate" else None
        sizes = [d, d, dv] if isinstance(d, int) and isinstance(dv, int) else None
        bq, bk, bv = bld.split(bias, sizes or _bias_sizes(bias), 0, name="bias_split")
        query = bld.op("Add", [query, bq], name="Q_bias")
        key = bld.op("Add", [key, bk], name="K_bias")
        value = bld.op("Add", [value, bv], name="V_bias")
    if form == "bnsh":
        return _heads(bld, query, heads, "Q"), key, value
    return _heads(bld, query, heads, "Q"), _heads(bld, key, heads, "K"), _heads(bld, value, heads, "V")


def _bias_sizes(bias: gs.Tensor) -> list[int]:
    total = tensor_shape(bias)[0]
    return [total // 3] * 3


def padding_mask(bld: Builder, mask: gs.Tensor, keys: gs.Tensor, filter_value: float) -> gs.Tensor:
    """The additive mask of ``key_padding_mask``, broadcastable to [B, N, S, T]."""
    rank = _rank(mask)
    if rank == 1:  # key lengths: position t is kept when t < length[b]
        length = bld.op("Shape", [keys], attrs={"start": 2, "end": 3}, name="T", dtype=np.int64) \
            if bld.opset >= 15 else bld.op("Gather", [bld.op("Shape", [keys], name="kshape", dtype=np.int64),
                                                     bld.int64([2])], attrs={"axis": 0}, name="T")
        total = bld.op("Squeeze", [length, bld.int64([0])] if bld.opset >= 13 else [length],
                       attrs={} if bld.opset >= 13 else {"axes": [0]}, name="T_scalar")
        positions = bld.op("Range", [bld.scalar(0, np.int64), total, bld.scalar(1, np.int64)], name="positions",
                           dtype=np.int64)
        lengths = bld.unsqueeze(bld.cast(mask, np.int64, name="lengths"), [1], name="lengths_col")
        keep = bld.op("Less", [positions, lengths], name="keep", dtype=np.bool_)  # [B, T]
        axes = [1, 2]
    else:
        keep = bld.op("Greater", [mask, bld.scalar(0, tensor_dtype(mask) or np.int32)], name="keep", dtype=np.bool_)
        axes = [1, 2] if rank == 2 else [1]
    additive = bld.select(bld.unsqueeze(keep, axes, name="keep_bnst"), bld.scalar(0.0), bld.scalar(filter_value),
                          name="padding")
    return additive


def causal_mask(bld: Builder, q: gs.Tensor, k: gs.Tensor, sizes: tuple, filter_value: float) -> gs.Tensor:
    """``filter_value`` (:data:`CAUSAL_FILTER`) where key t > query s + T - S, as [S, T]
    (constant when sizes are known)."""
    s, t = sizes
    if isinstance(s, int) and isinstance(t, int):
        upper = np.triu(np.ones((s, t), np.float32), k=t - s + 1) * np.float32(filter_value)
        return bld.const(upper, "causal")
    shape_q = bld.op("Shape", [q], name="q_shape", dtype=np.int64)
    shape_k = bld.op("Shape", [k], name="k_shape", dtype=np.int64)
    s_dim = bld.op("Gather", [shape_q, bld.int64([2])], attrs={"axis": 0}, name="S")
    t_dim = bld.op("Gather", [shape_k, bld.int64([2])], attrs={"axis": 0}, name="T")
    st = bld.op("Concat", [s_dim, t_dim], attrs={"axis": 0}, name="ST")
    full = bld.op("Expand", [bld.const(np.full((1, 1), filter_value, np.float32), "filter"), st], name="filled")
    diagonal = bld.op("Add", [bld.op("Sub", [t_dim, s_dim], name="past"), bld.int64([1])], name="diagonal")
    diag_scalar = bld.op("Squeeze", [diagonal, bld.int64([0])], name="diagonal_scalar")
    return bld.op("Trilu", [full, diag_scalar], attrs={"upper": 1}, name="causal")


def head_size(node: gs.Node) -> int | None:
    """H, from the query's shape (None when symbolic)."""
    if _form(node) == "qkv":
        return static_dim(node.inputs[QUERY], 4)
    hidden = static_dim(node.inputs[QUERY], 2)
    return None if hidden is None else hidden // int(node.attrs["num_heads"])


def lengths(node: gs.Node) -> tuple[int | None, int | None]:
    """(S, T): query length and total key length (past included), None where symbolic."""
    s = static_dim(node.inputs[QUERY], 1)
    form = _form(node)
    new = s if form == "qkv" else static_dim(node.inputs[KEY], 2 if form == "bnsh" else 1)
    past_key = node_input(node, PAST_KEY)
    past = 0 if past_key is None else static_dim(past_key, 2)
    return s, None if new is None or past is None else new + past


@dataclass(frozen=True)
class Masks:
    """What is added to the scaled scores: a key padding mask (int32, [B], [B, T] or [B, S, T]),
    a causal mask on (S, T) (None: none; a length None: symbolic), an attention bias."""

    padding: gs.Tensor | None
    causal: tuple[int | None, int | None] | None
    bias: gs.Tensor | None


def attend(bld: Builder, q, k, v, scale: float, filter_value: float, masks: Masks) -> gs.Tensor:
    """merge(softmax(scale Q K^T + masks) V) of Q, K, V as [B, N, L, H]."""
    scores = bld.op("Mul", [bld.op("MatMul", [q, bld.transpose(k, [0, 1, 3, 2], name="K_t")], name="QK"),
                            bld.scalar(scale)], name="scaled")
    if masks.padding is not None:
        scores = bld.op("Add", [scores, padding_mask(bld, masks.padding, k, filter_value)], name="masked")
    if masks.causal is not None:
        scores = bld.op("Add", [scores, causal_mask(bld, q, k, masks.causal, CAUSAL_FILTER)], name="causal_masked")
    if masks.bias is not None:
        scores = bld.op("Add", [scores, masks.bias], name="attention_bias")
    probs = bld.op("Softmax", [scores], attrs={"axis": -1}, name="softmax")
    context = bld.op("MatMul", [probs, v], name="context")
    return bld.reshape(bld.transpose(context, [0, 2, 1, 3], name="bsnh"), [0, 0, -1], name="merged")


def node_scale(node: gs.Node, head: int | None) -> float:
    """The ``scale`` attribute, else ``1 / sqrt(head size)``."""
    return float(node.attrs["scale"]) if "scale" in node.attrs else 1.0 / float(np.sqrt(head))


class MultiHeadAttentionRewriter:
    name = "mha"
    domain = DOMAIN
    op_types = ("MultiHeadAttention",)

    def __init__(self, **_: object) -> None:
        pass

    def check(self, node: gs.Node, ctx: RewriteContext) -> str | None:
        reason = refusal(node)
        if reason is None and int(node.attrs.get("unidirectional", 0)) and None in lengths(node) and ctx.opset < 14:
            return "a causal mask on symbolic lengths needs Trilu (opset 14)"
        return reason

    def apply(self, node: gs.Node, ctx: RewriteContext) -> None:
        heads = int(node.attrs["num_heads"])
        bld = ctx.builder(node, np.float32)
        if float_dtype(node.inputs[QUERY]) == np.float16:
            widen_half(node, bld)
        q, k, v = project(bld, node, heads)
        past_key, past_value = node_input(node, PAST_KEY), node_input(node, PAST_VALUE)
        if past_key is not None:
            k = bld.op("Concat", [past_key, k], attrs={"axis": 2}, name="present_key")
            v = bld.op("Concat", [past_value, v], attrs={"axis": 2}, name="present_value")
        causal = lengths(node) if int(node.attrs.get("unidirectional", 0)) else None
        masks = Masks(node_input(node, PADDING), causal, node_input(node, ATTN_BIAS))
        y = attend(bld, q, k, v, node_scale(node, head_size(node)),
                   float(node.attrs.get("mask_filter_value", MASK_FILTER)), masks)
        outputs = detach(node, ctx.graph)
        bld.finish(y, outputs[0])
        for index, tensor in ((1, k), (2, v)):
            if index < len(outputs) and not outputs[index].is_empty():
                bld.finish(tensor, outputs[index])
