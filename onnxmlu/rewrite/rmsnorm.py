"""RMSNormalization (opset 23) -> Pow, ReduceMean, Add, Sqrt, Div, Mul ([ONNX-ops]).

ONNX RMSNormalization (input ``X`` of rank r, ``axis`` in [-r, r), default -1)::

    RMS = sqrt(mean(X * X over axes [axis, ..., r-1]) + epsilon)      (keepdims)
    Y   = (X / RMS) * scale

with ``scale`` unidirectionally broadcastable to ``X`` and ``epsilon`` an attribute (1e-5
when absent). The first stage (up to ``X / RMS``) is computed in ``stash_type`` (default 1,
float32): ``X`` is cast to it and the quotient cast back to ``X``'s type before the multiply by
``scale``, as the operator's function body does. The rewrite emits exactly that chain::

    Xs = Cast(X, stash)?      m = ReduceMean(Pow(Xs, 2), axes, keepdims=1)
    N  = Div(Xs, Sqrt(Add(m, epsilon)))      Y = Mul(Cast(N, T)?, scale)

(the Casts only when ``X``'s type is not ``stash_type``). The square is a ``Pow`` by 2, which
is X * X exactly (as the reference's ``np.power(X, 2)``), because inside a block onnxruntime
recognizes Pow-ReduceMean-Add-Sqrt-Div-Mul as its own RMS kernel and runs one node for six.
``ReduceMean`` takes its axes as an input (the op exists from opset 23, after ReduceMean's change
at 18).

Left on the host, with the reason: an input of unknown rank (the axes need it), element types
numpy does not hold (bfloat16), a ``scale`` of another type than
``X``, and a ``stash_type`` that is not float16/float/double.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from onnxmlu.rewrite.base import FLOAT_DTYPES, RewriteContext, detach, tensor_dtype, tensor_shape

#: stash_type values (TensorProto element types) the rewrite computes in.
STASH_TYPES = {onnx.TensorProto.FLOAT16: np.float16, onnx.TensorProto.FLOAT: np.float32,
               onnx.TensorProto.DOUBLE: np.float64}


class RMSNormRewriter:
    name = "rmsnorm"
    op_types = ("RMSNormalization",)

    def __init__(self, **_: object) -> None:
        pass

    def check(self, node: gs.Node, ctx: RewriteContext) -> str | None:
        x, scale = node.inputs[0], node.inputs[1]
        for t in (x, scale):
            if tensor_dtype(t) not in FLOAT_DTYPES:
                return f"{t.name} has element type {tensor_dtype(t) or 'unknown'}, need float16/float/double"
        if tensor_dtype(scale) != tensor_dtype(x):
            return f"scale {scale.name} is {tensor_dtype(scale)}, X {tensor_dtype(x)}: mixed types are not rewritten"
        stash = int(node.attrs.get("stash_type", onnx.TensorProto.FLOAT))
        if stash not in STASH_TYPES:
            return f"stash_type {stash} is not float16/float/double"
        shape = tensor_shape(x)
        if shape is None:
            return f"input {x.name} has an unknown rank: the axes the mean runs over need it (try --input-shape)"
        axis = int(node.attrs.get("axis", -1))
        if not -len(shape) <= axis < len(shape):
            return f"axis {axis} is out of range for rank {len(shape)}"
        return None

    def apply(self, node: gs.Node, ctx: RewriteContext) -> None:
        x, scale = node.inputs[0], node.inputs[1]
        rank = len(tensor_shape(x))
        axis = int(node.attrs.get("axis", -1)) % rank
        dtype = tensor_dtype(x)
        stash = np.dtype(STASH_TYPES[int(node.attrs.get("stash_type", onnx.TensorProto.FLOAT))])
        bld = ctx.builder(node, stash)
        y = detach(node, ctx.graph)[0]
        xs = x if stash == dtype else bld.cast(x, stash, name="stash")
        square = bld.op("Pow", [xs, bld.scalar(2.0)], name="square")
        mean = bld.op("ReduceMean", [square, bld.int64(list(range(axis, rank)), "axes")], attrs={"keepdims": 1},
                      name="mean_square")
        rms = bld.unary("Sqrt", bld.add(mean, bld.scalar(float(node.attrs.get("epsilon", 1e-5))), name="eps"),
                        name="rms")
        normalized = bld.op("Div", [xs, rms], name="normalized")
        if stash != dtype:
            normalized = bld.cast(normalized, dtype, name="unstash")
        bld.finish(bld.mul(normalized, scale, name="scaled"), y)
