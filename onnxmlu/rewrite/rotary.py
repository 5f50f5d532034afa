"""RotaryEmbedding (opset 23) -> Gather, Unsqueeze, Split/Slice, Mul, Sub, Add, Concat ([ONNX-ops]).

ONNX RotaryEmbedding rotates the first ``r`` features of every head (``r`` =
``rotary_embedding_dim``, or the head size D when it is 0) by a position-dependent angle and
passes the other ``D - r`` through. With ``x1``, ``x2`` the two halves of the rotated part
(``interleaved=0``: its first and second half; ``interleaved=1``: its even and odd features)
and ``cos``, ``sin`` of shape [B, S, r/2] (the caches indexed by ``position_ids``,
``cache[position_ids]``, when given; else the caches themselves)::

    real = cos * x1 - sin * x2          imag = sin * x1 + cos * x2
    rotated = [real, imag]               (interleaved=0: concatenated)
    rotated = [real0, imag0, real1, ...] (interleaved=1: interleaved)
    Y = [rotated, x[..., r:]]

Layouts: a 4-D input is [B, H, S, D], and cos/sin get a head axis ([B, 1, S, r/2]) so that
no transpose is needed (nodes that read the same caches at the same positions in the same layout
share them: Q and K of every layer); a 3-D input [B, S, H*D] (``num_heads`` = H) is reshaped to
[B, S, H, D] (Reshape [0, 0, H, -1]: the batch and sequence stay symbolic), cos/sin become
[B, S, 1, r/2], and the result is reshaped back ([0, 0, -1]). The halves come from Split, the
even/odd features from Slice with step 2, and the interleaved result from stacking ``real``
and ``imag`` on a new last axis and a Reshape to [0, 0, 0, r]. The products are those of the
operator's definition, in the input's type.

Not interleaved, the two halves are computed at once, in six nodes instead of eight (a decode
step runs a few microseconds of node dispatch per rotation, more than its arithmetic)::

    rotated = x * [cos, cos] + [-x2, x1] * [sin, sin]

bit for bit the definition's: ``x1 cos + (-x2) sin`` is ``cos x1 - sin x2`` (IEEE subtraction is
addition of the negation, products commute) and ``x2 cos + x1 sin`` is ``sin x1 + cos x2``
(sums commute). ``[cos, cos]`` is the cache concatenated with itself before the Gather (folded
when the cache is a constant: the stored table doubles, a few kB per layer model).

Left on the host, with the reason: an input of unknown rank or a rank other than 3 and 4, a
3-D input without ``num_heads``, a head size that is not a fixed number (the halves need it),
an odd or too large ``rotary_embedding_dim``, and element types other than float16/float.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from onnxmlu.rewrite.base import RewriteContext, detach, node_input, static_dim, tensor_dtype, tensor_shape

_TYPES = (np.dtype(np.float16), np.dtype(np.float32))


class RotaryEmbeddingRewriter:
    name = "rotary"
    op_types = ("RotaryEmbedding",)

    def __init__(self, **_: object) -> None:
        # (graph, cos, sin, position_ids, head axis) -> the gathered, unsqueezed cos and sin:
        # Q and K of a layer (and every layer of a decoder) read the same caches at the same
        # positions, so they share one Gather and Unsqueeze each
        self._angles: dict[tuple, tuple[gs.Tensor, gs.Tensor]] = {}

    def check(self, node: gs.Node, ctx: RewriteContext) -> str | None:
        x, cos, sin = node.inputs[:3]
        for t in (x, cos, sin):
            if tensor_dtype(t) not in _TYPES:
                return f"{t.name} has element type {tensor_dtype(t) or 'unknown'}, need float16/float"
        shape = tensor_shape(x)
        if shape is None or len(shape) not in (3, 4):
            rank = "an unknown rank" if shape is None else f"rank {len(shape)}"
            return f"input {x.name} has {rank}, RotaryEmbedding takes rank 3 or 4"
        if len(shape) == 3 and int(node.attrs.get("num_heads", 0)) <= 0:
            return "a 3-D input needs the num_heads attribute"
        head = _head_size(node)
        if head is None:
            return f"input {x.name} has dims {shape}: the head size must be a fixed number (the halves need it)"
        rotary = int(node.attrs.get("rotary_embedding_dim", 0)) or head
        if rotary % 2 or rotary > head:
            return f"rotary_embedding_dim {rotary} must be even and at most the head size {head}"
        return None

    def apply(self, node: gs.Node, ctx: RewriteContext) -> None:
        x, cos, sin = node.inputs[:3]
        positions = node_input(node, 3)
        heads = int(node.attrs.get("num_heads", 0))
        head = _head_size(node)
        rotary = int(node.attrs.get("rotary_embedding_dim", 0)) or head
        bld = ctx.builder(node, tensor_dtype(x))
        three_d = len(tensor_shape(x)) == 3
        y = detach(node, ctx.graph)[0]
        head_axis = 2 if three_d else 1  # [B, S, 1, r/2] against [B, S, H, D]; [B, 1, S, r/2] against [B, H, S, D]
        interleaved = bool(node.attrs.get("interleaved", 0))
        key = (id(ctx.graph), id(cos), id(sin), id(positions), head_axis, interleaved)
        if key not in self._angles:
            self._angles[key] = _angles(bld, cos, sin, positions, head_axis, doubled=not interleaved)
        cos, sin = self._angles[key]
        xh = bld.reshape(x, [0, 0, heads, -1], name="heads") if three_d else x
        parts = bld.split(xh, [rotary, head - rotary], axis=3, name="partial") if rotary < head else [xh]
        rotated = _rotate(bld, parts[0], cos, sin, rotary, interleaved)
        out = bld.concat([rotated, *parts[1:]], axis=3, name="joined")
        if three_d:  # [B, S, H, D] typed: an Attention rewrite reads its heads from it (attention._unflattened)
            if isinstance(out, gs.Variable):
                out.shape = [*tensor_shape(x)[:2], heads, head]
            out = bld.reshape(out, [0, 0, -1], name="hidden")
        bld.finish(out, y)


def _angles(bld, cos: gs.Tensor, sin: gs.Tensor, positions: gs.Tensor | None, head_axis: int, doubled: bool):
    """cos and sin per token (``cache[position_ids]`` when positions are given: [B, S, r/2]; with
    ``doubled``, [cos, cos] and [sin, sin]: [B, S, r]), with a head axis of size 1 at ``head_axis``."""
    if doubled:
        cos = bld.concat([cos, cos], axis=-1, name="cos_cos")
        sin = bld.concat([sin, sin], axis=-1, name="sin_sin")
    if positions is not None:
        cos = bld.op("Gather", [cos, positions], attrs={"axis": 0}, name="cos")
        sin = bld.op("Gather", [sin, positions], attrs={"axis": 0}, name="sin")
    return bld.unsqueeze(cos, [head_axis], name="cos_heads"), bld.unsqueeze(sin, [head_axis], name="sin_heads")


def _head_size(node: gs.Node) -> int | None:
    shape = tensor_shape(node.inputs[0])
    if len(shape) == 4:
        return static_dim(shape[3])
    hidden, heads = static_dim(shape[2]), int(node.attrs.get("num_heads", 0))
    return hidden // heads if hidden is not None and heads > 0 and hidden % heads == 0 else None


def _rotate(bld, x: gs.Tensor, cos: gs.Tensor, sin: gs.Tensor, rotary: int, interleaved: bool) -> gs.Tensor:
    """The rotated part [..., r] from ``x`` [..., r] (rank 4) and cos/sin: [..., r/2] when
    ``interleaved``, else [..., r] ([cos, cos], [sin, sin]: the module docstring's six nodes)."""
    half = rotary // 2
    if not interleaved:
        x1, x2 = bld.split(x, [half, half], axis=3, name="halves")
        swapped = bld.concat([bld.unary("Neg", x2, name="minus_x2"), x1], axis=3, name="swapped")
        return bld.add(bld.mul(x, cos, name="x_cos"), bld.mul(swapped, sin, name="swapped_sin"), name="rotated")
    x1 = _strided(bld, x, 0, rotary, "even")
    x2 = _strided(bld, x, 1, rotary, "odd")
    real = bld.sub(bld.mul(cos, x1, name="cos_x1"), bld.mul(sin, x2, name="sin_x2"), name="real")
    imag = bld.add(bld.mul(sin, x1, name="sin_x1"), bld.mul(cos, x2, name="cos_x2"), name="imag")
    pairs = bld.concat([bld.unsqueeze(real, [4], name="real_pair"), bld.unsqueeze(imag, [4], name="imag_pair")],
                       axis=4, name="pairs")
    return bld.reshape(pairs, [0, 0, 0, rotary], name="rotated")


def _strided(bld, x: gs.Tensor, start: int, stop: int, name: str) -> gs.Tensor:
    """``x[..., start:stop:2]`` on the last of 4 axes."""
    return bld.op("Slice", [x, bld.int64([start], f"{name}_start"), bld.int64([stop], f"{name}_stop"),
                            bld.int64([3], f"{name}_axis"), bld.int64([2], f"{name}_step")], name=name)
