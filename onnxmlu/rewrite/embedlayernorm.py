"""onnxruntime's EmbedLayerNormalization -> Gather, Add and a LayerNorm, the mask index a ReduceSum.

onnxruntime's transformer optimizer fuses a BERT's embeddings (and GPT-2's word + position
embeddings with its first LayerNorm) into com.microsoft ``EmbedLayerNormalization``
(onnxruntime ``docs/ContribOperators.md``; CPU kernel ``embed_layer_norm.cc``)::

    inputs   input_ids [B, S] int32, segment_ids? [B, S], word_embedding [V, D],
             position_embedding [P, D], segment_embedding? [G, D], gamma [D], beta? [D],
             mask? [B, S] int32, position_ids? [B, S] or [1, S] int32
    s          = word_embedding[input_ids] + position_embedding[p] (+ segment_embedding[segment_ids])
                 with p = position_ids, or 0 .. S-1 when absent        (output 2, embedding_sum)
    output     = (s - mean(s)) / sqrt(var(s) + epsilon) * gamma + beta  (over D; epsilon 1e-12)
    mask_index = per batch row, the count of mask entries equal to 1 (int32 [B]); 0 without mask

The attention that reads ``mask_index`` (com.microsoft ``Attention``, rewritten by
:mod:`onnxmlu.rewrite.attention_ms`) treats it as the number of leading keys attended to.

Float16 tables: the rows are gathered exactly, then summed and normalized in float32 and each
output rounded once, as the kernel computes (a sum rounded to float16 first moves outputs by an ulp).

Rewrite: ``Gather`` per table (the positions without ids a ``Slice`` of the first S rows), ``Add``,
the LayerNorm of :func:`onnxmlu.rewrite.skipnorm.layer_norm`; the mask index ``Equal(mask, 1)``,
``Cast`` to int32, ``ReduceSum`` over the sequence. Refused (host, with the reason): ids that are
not int32 (the spec's type) and tables that are not float16/float.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from onnxmlu.rewrite.base import RewriteContext, detach, node_input
from onnxmlu.rewrite.builder import Builder
from onnxmlu.rewrite.floattype import float_dtype
from onnxmlu.rewrite.skipnorm import layer_norm

DOMAIN = "com.microsoft"
EPSILON = 1e-12
_F16, _F32 = np.dtype(np.float16), np.dtype(np.float32)


class EmbedLayerNormRewriter:
    name = "embedlayernorm"
    domain = DOMAIN
    op_types = ("EmbedLayerNormalization",)

    def __init__(self, **_: object) -> None:
        pass

    def check(self, node: gs.Node, ctx: RewriteContext) -> str | None:
        for index, what in ((0, "input_ids"), (1, "segment_ids"), (7, "mask"), (8, "position_ids")):
            ids = node_input(node, index)
            if ids is not None and ids.dtype is not None and np.dtype(ids.dtype) != np.int32:
                return f"{what} of type {np.dtype(ids.dtype)} (the op takes int32)"
        if (node_input(node, 1) is None) != (node_input(node, 4) is None):
            return "segment ids without a segment table (or a table without ids)"
        dtype = float_dtype(node.inputs[2])
        if dtype not in (_F16, _F32):
            return f"embedding tables of type {dtype or 'unknown'} (the kernel takes float16/float)"
        return None

    def apply(self, node: gs.Node, ctx: RewriteContext) -> None:
        half = float_dtype(node.inputs[2]) == _F16  # gathered exactly, summed and normalized in float32
        bld = ctx.builder(node, _F32)
        ids = node.inputs[0]
        mask, epsilon = node_input(node, 7), float(node.attrs.get("epsilon", EPSILON))
        total = _embedding_sum(bld, node, half)
        gamma, beta = (None if t is None else (bld.cast(t, _F32, name=f"{n}_float") if half else t)
                       for t, n in ((node.inputs[5], "gamma"), (node_input(node, 6), "beta")))
        outputs = detach(node, ctx.graph)
        y = layer_norm(bld, total, gamma, beta, epsilon)
        bld.finish(bld.cast(y, _F16, name="y_half") if half else y, outputs[0])
        if len(outputs) > 1 and ctx.is_used(outputs[1]):
            bld.finish(_mask_index(bld, ids, mask), outputs[1])
        if len(outputs) > 2 and ctx.is_used(outputs[2]):
            bld.finish(bld.cast(total, _F16, name="sum_half") if half else total, outputs[2])


def _embedding_sum(bld: Builder, node: gs.Node, half: bool) -> gs.Tensor:
    """word[ids] + position[p] (+ segment[segment ids]), in the kernel's order, in float32."""
    def rows(table: gs.Tensor, index: gs.Tensor, name: str) -> gs.Tensor:
        gathered = bld.op("Gather", [table, index], attrs={"axis": 0}, name=name)
        return bld.cast(gathered, _F32, name=f"{name}_float") if half else gathered

    ids, positions = node.inputs[0], node_input(node, 8)
    words = rows(node.inputs[2], ids, "words")
    if positions is not None:
        position = rows(node.inputs[3], positions, "positions")
    else:  # rows 0 .. S-1 of the table, broadcast over the batch
        length = bld.op("Slice", [bld.op("Shape", [ids], name="ids_shape", dtype=np.int64), bld.int64([1], "one"),
                                  bld.int64([2], "two")], name="length", dtype=np.int64)
        table = bld.op("Slice", [node.inputs[3], bld.int64([0], "zero"), length, bld.int64([0], "axis0")],
                       name="positions")
        position = bld.cast(table, _F32, name="positions_float") if half else table
    total = bld.op("Add", [words, position], name="word_position")
    segments = node_input(node, 1)
    if segments is not None:
        total = bld.op("Add", [total, rows(node.inputs[4], segments, "segments")], name="segment")
    return total


def _mask_index(bld: Builder, ids: gs.Tensor, mask: gs.Tensor | None) -> gs.Tensor:
    """Per row the count of mask entries equal to 1 (the kernel counts ones, not the sum), or zeros."""
    if mask is None:
        batch = bld.op("Slice", [bld.op("Shape", [ids], name="batch_shape", dtype=np.int64), bld.int64([0], "b0"),
                                 bld.int64([1], "b1")], name="batch", dtype=np.int64)
        zero = onnx.numpy_helper.from_array(np.zeros(1, np.int32))
        return bld.op("ConstantOfShape", [batch], attrs={"value": zero}, name="no_mask", dtype=np.int32)
    one = bld.const(np.int32(1), "mask_one", dtype=np.int32)
    ones = bld.cast(bld.op("Equal", [mask, one], name="is_one", dtype=np.bool_), np.int32, name="ones")
    if bld.opset >= 13:
        return bld.op("ReduceSum", [ones, bld.int64([1], "seq_axis")], attrs={"keepdims": 0}, name="mask_index")
    return bld.op("ReduceSum", [ones], attrs={"axes": [1], "keepdims": 0}, name="mask_index")
