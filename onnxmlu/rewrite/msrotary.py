"""com.microsoft RotaryEmbedding -> Gather of the cos/sin caches, Split, Mul/Sub/Add, Concat.

onnxruntime's definition (``docs/ContribOperators.md``; CPU kernel
``contrib_ops/cpu/bert/rotary_embedding.cc``): for every head vector ``x`` (size ``H``) at
position ``p``, with ``r = rotary_embedding_dim`` (default ``H``) and ``c = cos_cache[p]``,
``s = sin_cache[p]`` (each ``r / 2`` long)::

    not interleaved:  x1 = x[:r/2], x2 = x[r/2:r]
                      y[:r/2] = x1 c - x2 s,   y[r/2:r] = x2 c + x1 s
    interleaved:      y[2i] = x[2i] c_i - x[2i+1] s_i,   y[2i+1] = x[2i+1] c_i + x[2i] s_i
    y[r:] = x[r:]                                                   (partial rotary)

The input is ``[B, S, N H]`` (heads from ``num_heads``, else ``H = 2 * cos_cache.shape[1]``) or
``[B, N, S, H]``; ``position_ids`` is ``[B, S]``, or ``[1]`` holding the first position (then
position ``p0 + j`` for token ``j``).

Rewrite: ``Gather`` of both caches by the positions (``Range`` from ``p0`` for the ``[1]``
form), ``Unsqueeze`` to broadcast over the heads, ``Reshape`` of a 3-D input into heads, the
halves (or the even/odd pairs, through a ``Reshape`` to ``[..., r/2, 2]``) by ``Split``, the
four products with ``Sub``/``Add`` in the kernel's order, ``Concat`` and ``Reshape`` back.

float16 is rotated in float16, as the kernel rotates it (equal, output for output, in every form
tried: the same products and sums, each rounded to float16).

Refused: ``is_packed_batching``, a ``scale`` other than 1, types other than float32 and float16, unknown
ranks or head sizes, a 3-D hidden size that is not a multiple of the head size, caches whose
width is not ``r / 2`` (the kernel rejects them: the rewrite
would rotate by angles of another width), and opsets before 11.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from onnxmlu.rewrite.base import RewriteContext, detach, tensor_shape
from onnxmlu.rewrite.builder import Builder
from onnxmlu.rewrite.floattype import float_dtype, is_float
from onnxmlu.rewrite.mha import static_dim
from onnxmlu.wording import plural

DOMAIN = "com.microsoft"


def geometry(node: gs.Node) -> tuple[int, int, int] | None:
    """(rank of the input, head size H, rotary size r), or None when not known."""
    x, cos = node.inputs[0], node.inputs[2]
    shape = tensor_shape(x)
    if shape is None or len(shape) not in (3, 4):
        return None
    heads = int(node.attrs.get("num_heads", 0))
    if len(shape) == 4:
        head = static_dim(x, 3)
    elif heads:
        hidden = static_dim(x, 2)
        head = None if hidden is None else hidden // heads
    else:
        half = static_dim(cos, 1)
        head = None if half is None else 2 * half
    rotary = int(node.attrs.get("rotary_embedding_dim", 0)) or head
    return None if head is None or rotary is None else (len(shape), head, rotary)


def _angles(bld: Builder, node: gs.Node, rank: int) -> tuple[gs.Tensor, gs.Tensor]:
    """cos and sin at every token's position, broadcastable to the head layout [.., r/2]."""
    x, positions = node.inputs[0], node.inputs[1]
    seq_axis = 1 if rank == 3 else 2
    if tensor_shape(positions) is not None and len(tensor_shape(positions)) == 1:  # [1]: the first position
        shape = bld.op("Shape", [x], name="x_shape", dtype=np.int64)
        length = bld.op("Gather", [shape, bld.scalar(seq_axis, np.int64)], attrs={"axis": 0}, name="S")
        start = bld.op("Gather", [positions, bld.scalar(0, np.int64)], attrs={"axis": 0}, name="p0")
        end = bld.op("Add", [start, length], name="p_end")
        positions = bld.op("Range", [start, end, bld.scalar(1, np.int64)], name="positions", dtype=np.int64)
        axes = [1] if rank == 3 else []  # [S, r/2] -> [S, 1, r/2] against [B, S, N, r/2]
    else:
        axes = [2] if rank == 3 else [1]  # [B, S, r/2] -> against [B, S, N, ..] or [B, N, S, ..]
    out = []
    for index, name in ((2, "cos"), (3, "sin")):
        table = bld.op("Gather", [node.inputs[index], positions], attrs={"axis": 0}, name=name)
        out.append(bld.unsqueeze(table, axes, name=f"{name}_heads") if axes else table)
    return out[0], out[1]


def _rotate(bld: Builder, x1, x2, cos, sin) -> tuple[gs.Tensor, gs.Tensor]:
    """(x1 c - x2 s, x2 c + x1 s)."""
    first = bld.op("Sub", [bld.op("Mul", [x1, cos], name="x1_cos"), bld.op("Mul", [x2, sin], name="x2_sin")],
                   name="first")
    second = bld.op("Add", [bld.op("Mul", [x2, cos], name="x2_cos"), bld.op("Mul", [x1, sin], name="x1_sin")],
                    name="second")
    return first, second


def rotated(bld: Builder, x4: gs.Tensor, cos, sin, head: int, rotary: int, interleaved: bool) -> gs.Tensor:
    """The rotary embedding of ``x4`` (4-D, heads last)."""
    parts = bld.split(x4, [rotary, head - rotary] if rotary < head else [head], 3, name="rotary_part")
    rot = parts[0]
    if interleaved:
        pairs = bld.reshape(rot, [0, 0, 0, rotary // 2, 2], name="pairs")
        even, odd = bld.split(pairs, [1, 1], 4, name="even_odd")
        cos, sin = (bld.unsqueeze(t, [-1], name=f"{n}_pairs") for t, n in ((cos, "cos"), (sin, "sin")))
        first, second = _rotate(bld, even, odd, cos, sin)
        rot = bld.reshape(bld.concat([first, second], 4, name="rotated_pairs"), [0, 0, 0, rotary], name="rotated")
    else:
        x1, x2 = bld.split(rot, [rotary // 2, rotary // 2], 3, name="halves")
        rot = bld.concat(list(_rotate(bld, x1, x2, cos, sin)), 3, name="rotated")
    return bld.concat([rot] + parts[1:], 3, name="with_rest")


class ContribRotaryRewriter:
    name = "msrotary"
    domain = DOMAIN
    op_types = ("RotaryEmbedding",)

    def __init__(self, **_: object) -> None:
        pass

    def check(self, node: gs.Node, ctx: RewriteContext) -> str | None:
        if ctx.opset < 11:
            return f"opset {ctx.opset} < 11 (Range)"
        if int(node.attrs.get("is_packed_batching", 0)):
            return "is_packed_batching (ragged batches) is not rewritten"
        if float(node.attrs.get("scale", 1.0)) != 1.0:
            return "a scale other than 1 (the kernel's use of it is not defined)"
        if not is_float(float_dtype(node.inputs[0]), (np.dtype(np.float32), np.dtype(np.float16))):
            return f"input has element type {float_dtype(node.inputs[0]) or 'unknown'}; float32/float16 are rewritten"
        geo = geometry(node)
        if geo is None:
            return "the input's rank or head size is not known"
        if geo[2] % 2 or geo[2] > geo[1]:
            return f"rotary_embedding_dim {geo[2]} is odd or larger than the head size {geo[1]}"
        hidden = static_dim(node.inputs[0], 2) if geo[0] == 3 else None
        if hidden is not None and hidden % geo[1]:
            return f"hidden size {hidden} is not a multiple of the head size {geo[1]} (the kernel rejects it)"
        half = static_dim(node.inputs[2], 1)
        if half is not None and 2 * half != geo[2]:
            return (f"cos_cache holds {plural(half, 'angle')} a position, not rotary size {geo[2]} / 2 "
                    "(the kernel rejects it)")
        return None

    def apply(self, node: gs.Node, ctx: RewriteContext) -> None:
        rank, head, rotary = geometry(node)
        bld = ctx.builder(node, float_dtype(node.inputs[0]))
        x = node.inputs[0]
        cos, sin = _angles(bld, node, rank)
        x4 = bld.reshape(x, [0, 0, -1, head], name="heads") if rank == 3 else x
        out = rotated(bld, x4, cos, sin, head, rotary, bool(node.attrs.get("interleaved", 0)))
        if rank == 3:
            out = bld.reshape(out, [0, 0, -1], name="merged")
        bld.finish(out, detach(node, ctx.graph)[0])
