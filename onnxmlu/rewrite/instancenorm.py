"""InstanceNormalization -> ReduceMean, Sub, Mul, Sqrt, Div, Mul, Add ([ONNX-ops]).

ONNX InstanceNormalization (opset 6+; input ``x`` of rank r >= 3, [N, C, D1, ..., Dk])::

    y = scale * (x - mean) / sqrt(var + epsilon) + B

with ``mean`` and ``var`` (the population variance) taken per sample and per channel over the
spatial axes 2..r-1, ``scale`` and ``B`` of shape [C] and ``epsilon`` an attribute (1e-5 when
absent). Rewrite, with ``axes = [2, ..., r-1]`` kept as size-1 dims so every product broadcasts::

    mean = ReduceMean(x, axes)            d   = x - mean
    var  = ReduceMean(d * d, axes)        k   = scale' / Sqrt(var + epsilon)
    y    = d * k + B'

where ``scale'`` and ``B'`` are ``scale`` and ``B`` reshaped to [C, 1, ..., 1] (r - 1 dims;
constants are reshaped here, a computed parameter gets a Reshape node). Dividing the per-channel
``scale'`` rather than the whole map keeps the full-size work to Sub, two Muls and an Add; it
changes the rounding of one product only. The arithmetic is in the input's own float type.
``ReduceMean`` takes ``axes`` as an attribute before opset 18 and as an input from 18.

The node is left on the host, with the reason, before opset 7 (the legacy ``consumed_inputs``
form, as for the other rewriters), for a non-float input, and when the input's rank is unknown
(the axes the statistics run over need it).
"""

from __future__ import annotations

from typing import Any

import onnx_graphsurgeon as gs

from onnxmlu.rewrite.base import FLOAT_DTYPES, RewriteContext, detach, tensor_dtype, tensor_shape


class InstanceNormRewriter:
    name = "instancenorm"
    op_types = ("InstanceNormalization",)

    def __init__(self, **_: object) -> None:
        pass

    def check(self, node: gs.Node, ctx: RewriteContext) -> str | None:
        if ctx.opset < 7:
            return f"opset {ctx.opset} < 7 (consumed_inputs form) is not supported"
        x = node.inputs[0]
        if tensor_dtype(x) not in FLOAT_DTYPES:
            return f"input {x.name} has element type {tensor_dtype(x) or 'unknown'}, need float16/float/double"
        shape = tensor_shape(x)
        if shape is None or len(shape) < 3:
            return (f"input {x.name} has {'an unknown rank' if shape is None else f'rank {len(shape)}'}: "
                    "the spatial axes the mean runs over need rank >= 3 (try --input-shape)")
        return None

    def apply(self, node: gs.Node, ctx: RewriteContext) -> None:
        x, scale, bias = node.inputs[:3]
        rank = len(tensor_shape(x))
        bld = ctx.builder(node, tensor_dtype(x))
        axes = _axes(bld, rank)
        y = detach(node, ctx.graph)[0]
        per_channel = [-1] + [1] * (rank - 2)  # [C, 1, ..., 1]: broadcasts against [N, C, D1, ...]
        mean = _reduce_mean(bld, x, axes, "mean")
        centred = bld.sub(x, mean, name="centred")
        var = _reduce_mean(bld, bld.mul(centred, centred, name="square"), axes, "var")
        std = bld.unary("Sqrt", bld.add(var, float(node.attrs.get("epsilon", 1e-5)), name="var_eps"), name="std")
        factor = bld.op("Div", [bld.reshape(scale, per_channel, name="scale"), std], name="factor")
        out = bld.add(bld.mul(centred, factor, name="scaled"), bld.reshape(bias, per_channel, name="bias"),
                      name="shifted")
        bld.finish(out, y)


def _axes(bld: Any, rank: int) -> list[int] | gs.Constant:
    """The spatial axes 2..rank-1: an attribute value before opset 18, one shared input from 18."""
    axes = list(range(2, rank))
    return bld.int64(axes, "axes") if bld.opset >= 18 else axes


def _reduce_mean(bld: Any, x: gs.Tensor, axes: list[int] | gs.Constant, name: str) -> gs.Tensor:
    """ReduceMean over ``axes`` keeping them as size-1 dims."""
    if isinstance(axes, gs.Constant):
        return bld.op("ReduceMean", [x, axes], attrs={"keepdims": 1}, name=name)
    return bld.op("ReduceMean", [x], attrs={"axes": axes, "keepdims": 1}, name=name)
