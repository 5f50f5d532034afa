"""onnxruntime's fused normalizations -> LayerNormalization or ReduceMean/Sqrt/Div arithmetic.

onnxruntime's transformer optimizer writes these (contrib-op definitions, onnxruntime
``docs/ContribOperators.md``; CPU kernels ``skip_layer_norm.cc``, ``layer_norm_impl.cc``):

* com.microsoft ``SkipLayerNormalization(input, skip, gamma, beta?, bias?)``, ``epsilon``
  (default 1e-12)::

      s = (input + skip) + bias                       (output 3, input_skip_bias_sum)
      y = (s - mean(s)) / sqrt(var(s) + epsilon) * gamma + beta

  with mean and population variance over the last axis;
* com.microsoft ``SkipSimplifiedLayerNormalization(input, skip, gamma, bias?)``: the same
  ``s``, then the RMS norm ``y = s / sqrt(mean(s^2) + epsilon) * gamma``;
* ``SimplifiedLayerNormalization(X, scale)`` (onnxruntime registers it in the standard domain),
  ``axis`` (default -1), ``epsilon`` (default 1e-5), ``stash_type`` 1: the RMS norm over the
  axes ``[axis, rank)``, computed in float32 whatever ``X``'s type (a float16 ``X`` is cast to
  float, normalized, cast back -- the kernel's ``stash_type`` 1).

For float16 the kernels sum and normalize in float32 and round each output once (a sum rounded
to float16 first loses the small parts of a row with a large common part: 0.5 off at 1000, tests/
rewrite/test_rw_contrib.py); the rewrite casts the inputs to float32, computes the same and casts
``y`` and ``s`` back (within two float16 ulps: the statistics round in another order).

Rewrite: ``Add`` nodes for ``s``; the LayerNormalization op from opset 17 (ONNX adopted it
there), before it ``ReduceMean``, ``Sub``, ``Mul``, ``ReduceMean``, ``Add``, ``Sqrt``,
``Div``, ``Mul``, ``Add``; the RMS norm as ``Mul``, ``ReduceMean``, ``Add``, ``Sqrt``, ``Div``,
``Mul`` (ONNX's RMSNormalization exists only from opset 23). ``ReduceMean`` takes its axes as an
attribute before opset 18 and as an input from 18.

* ``LayerNormalization(X, scale, B?)`` in a model whose standard opset is below 17: not ONNX's
  op (ONNX adopted it at 17) but onnxruntime's, registered in the standard domain, which its
  optimizer's LayerNorm fusion writes into opset-14 exports; ``axis`` (default -1), ``epsilon``
  (default 1e-5), ``stash_type`` 1: ``y = (x - mean) / sqrt(var + epsilon) * scale + B`` over
  the axes ``[axis, rank)``, float16 computed in float32 (what ONNX's op at 17 also defines).

Refused (host, with the reason): the ``mean`` and ``inv_std_var`` outputs when something reads
them (onnxruntime's CPU kernels do not define them for inference), non-float types, and an
``axis`` other than -1 on a tensor of unknown rank.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from onnxmlu.rewrite.base import FLOAT_DTYPES, RewriteContext, detach, node_input, node_output
from onnxmlu.rewrite.base import tensor_shape
from onnxmlu.rewrite.builder import Builder
from onnxmlu.rewrite.floattype import float_dtype, is_float

DOMAIN = "com.microsoft"
SKIP_EPSILON = 1e-12
SIMPLIFIED_EPSILON = 1e-5
_F16 = np.dtype(np.float16)


def reduce_mean(bld: Builder, x: gs.Tensor, axes: list[int], name: str) -> gs.Tensor:
    """``ReduceMean(x, axes, keepdims=1)`` in the model's opset (axes an input from 18)."""
    if bld.opset >= 18:
        return bld.op("ReduceMean", [x, bld.int64(axes, f"{name}_axes")], attrs={"keepdims": 1}, name=name)
    return bld.op("ReduceMean", [x], attrs={"axes": axes, "keepdims": 1}, name=name)


def rms_norm(bld: Builder, x: gs.Tensor, scale: gs.Tensor, epsilon: float, axes: list[int]) -> gs.Tensor:
    """``x / sqrt(mean(x^2 over axes) + epsilon) * scale``."""
    mean_square = reduce_mean(bld, bld.op("Mul", [x, x], name="square"), axes, "mean_square")
    root = bld.unary("Sqrt", bld.op("Add", [mean_square, bld.scalar(epsilon)], name="eps"), name="rms")
    return bld.op("Mul", [bld.op("Div", [x, root], name="normalized"), scale], name="scale")


def layer_norm(bld: Builder, x: gs.Tensor, gamma: gs.Tensor, beta: gs.Tensor | None, epsilon: float) -> gs.Tensor:
    """Layer normalization over the last axis: the ONNX op from opset 17, arithmetic before."""
    if bld.opset >= 17:
        inputs = [x, gamma] + ([beta] if beta is not None else [])
        return bld.op("LayerNormalization", inputs, attrs={"axis": -1, "epsilon": float(epsilon)}, name="layernorm")
    centred = bld.op("Sub", [x, reduce_mean(bld, x, [-1], "mean")], name="centred")
    variance = reduce_mean(bld, bld.op("Mul", [centred, centred], name="square"), [-1], "variance")
    root = bld.unary("Sqrt", bld.op("Add", [variance, bld.scalar(epsilon)], name="eps"), name="std")
    out = bld.op("Mul", [bld.op("Div", [centred, root], name="normalized"), gamma], name="scale")
    return out if beta is None else bld.op("Add", [out, beta], name="shift")


def _float_reason(node: gs.Node) -> str | None:
    dtype = float_dtype(node.inputs[0])
    if not is_float(dtype, FLOAT_DTYPES):
        return f"element type {dtype or 'unknown'} is not float16/float/double"
    return None


class SkipNormRewriter:
    name = "skipnorm"
    domain = DOMAIN
    op_types = ("SkipLayerNormalization", "SkipSimplifiedLayerNormalization")

    def __init__(self, **_: object) -> None:
        pass

    def check(self, node: gs.Node, ctx: RewriteContext) -> str | None:
        for index, what in ((1, "mean"), (2, "inv_std_var")):
            if ctx.is_used(node_output(node, index)):
                return f"its {what} output is read (onnxruntime's kernels leave it undefined in inference)"
        return _float_reason(node)

    def apply(self, node: gs.Node, ctx: RewriteContext) -> None:
        simplified = node.op == "SkipSimplifiedLayerNormalization"
        x, skip, gamma = node.inputs[0], node.inputs[1], node.inputs[2]
        beta = None if simplified else node_input(node, 3)
        bias = node_input(node, 3 if simplified else 4)
        epsilon = float(node.attrs.get("epsilon", SKIP_EPSILON))
        half = float_dtype(x) == _F16  # the kernel sums and normalizes in float32, rounds each output once
        bld = ctx.builder(node, np.float32 if half else float_dtype(x))
        if half:
            x, skip, gamma, beta, bias = (None if t is None else bld.cast(t, np.float32, name=f"{n}_float")
                                          for t, n in ((x, "x"), (skip, "skip"), (gamma, "gamma"), (beta, "beta"),
                                                       (bias, "bias")))
        outputs = detach(node, ctx.graph)
        total = bld.op("Add", [x, skip], name="skip")
        if bias is not None:
            total = bld.op("Add", [total, bias], name="bias")
        y = rms_norm(bld, total, gamma, epsilon, [-1]) if simplified else layer_norm(bld, total, gamma, beta, epsilon)
        bld.finish(bld.cast(y, np.float16, name="y_half") if half else y, outputs[0])
        if len(outputs) > 3 and not outputs[3].is_empty():
            bld.finish(bld.cast(total, np.float16, name="sum_half") if half else total, outputs[3])


class SimplifiedNormRewriter:
    name = "simplifiednorm"
    op_types = ("SimplifiedLayerNormalization",)

    def __init__(self, **_: object) -> None:
        pass

    def check(self, node: gs.Node, ctx: RewriteContext) -> str | None:
        if ctx.is_used(node_output(node, 1)):
            return "its inv_std_var output is read (a training output)"
        if int(node.attrs.get("axis", -1)) != -1 and tensor_shape(node.inputs[0]) is None:
            return f"axis {node.attrs['axis']} on an input of unknown rank"
        if int(node.attrs.get("stash_type", 1)) != 1:
            return "stash_type other than 1 (float32 computation) is not defined by the kernel"
        return _float_reason(node)

    def apply(self, node: gs.Node, ctx: RewriteContext) -> None:
        x, scale = node.inputs[0], node.inputs[1]
        axis = int(node.attrs.get("axis", -1))
        epsilon = float(node.attrs.get("epsilon", SIMPLIFIED_EPSILON))
        dtype = float_dtype(x)
        bld = ctx.builder(node, np.float32 if dtype == _F16 else dtype)
        y = detach(node, ctx.graph)[0]
        if axis == -1:
            axes = [-1]
        else:
            rank = len(tensor_shape(x))
            axes = list(range(axis % rank, rank))
        if dtype == _F16:  # stash_type 1: the kernel normalizes in float32
            x32 = bld.cast(x, np.float32, name="to_float")
            out = rms_norm(bld, x32, bld.cast(scale, np.float32, name="scale_float"), epsilon, axes)
            bld.finish(bld.cast(out, np.float16, name="to_half"), y)
            return
        bld.finish(rms_norm(bld, x, scale, epsilon, axes), y)


def _axes(x: gs.Tensor, axis: int) -> list[int]:
    """The normalized axes ``[axis, rank)`` (``[-1]`` for the last axis, whatever the rank)."""
    if axis == -1:
        return [-1]
    rank = len(tensor_shape(x))
    return list(range(axis % rank, rank))


class OrtLayerNormRewriter:
    """onnxruntime's LayerNormalization below opset 17 (module docstring) -> the arithmetic."""

    name = "ortlayernorm"
    op_types = ("LayerNormalization",)

    def __init__(self, **_: object) -> None:
        pass

    def check(self, node: gs.Node, ctx: RewriteContext) -> str | None:
        if ctx.opset >= 17:
            return "ONNX's own LayerNormalization (opset 17+): it runs in blocks as it is"
        for index, what in ((1, "mean"), (2, "inv_std_dev")):
            if ctx.is_used(node_output(node, index)):
                return f"its {what} output is read (a training output)"
        if int(node.attrs.get("axis", -1)) != -1 and tensor_shape(node.inputs[0]) is None:
            return f"axis {node.attrs['axis']} on an input of unknown rank"
        if int(node.attrs.get("stash_type", 1)) != 1:
            return "stash_type other than 1 (float32 statistics) is not defined by the kernel"
        return _float_reason(node)

    def apply(self, node: gs.Node, ctx: RewriteContext) -> None:
        x, scale, bias = node.inputs[0], node.inputs[1], node_input(node, 2)
        axes = _axes(x, int(node.attrs.get("axis", -1)))
        epsilon = float(node.attrs.get("epsilon", SIMPLIFIED_EPSILON))
        half = float_dtype(x) == _F16  # stash_type 1: statistics and normalization in float32
        bld = ctx.builder(node, np.float32 if half else float_dtype(x))
        if half:
            x, scale, bias = (None if t is None else bld.cast(t, np.float32, name=f"{n}_float")
                              for t, n in ((x, "x"), (scale, "scale"), (bias, "bias")))
        y = detach(node, ctx.graph)[0]
        centred = bld.op("Sub", [x, reduce_mean(bld, x, axes, "mean")], name="centred")
        variance = reduce_mean(bld, bld.op("Mul", [centred, centred], name="square"), axes, "variance")
        root = bld.unary("Sqrt", bld.op("Add", [variance, bld.scalar(epsilon)], name="eps"), name="std")
        out = bld.op("Mul", [bld.op("Div", [centred, root], name="normalized"), scale], name="scale")
        out = out if bias is None else bld.op("Add", [out, bias], name="shift")
        bld.finish(bld.cast(out, np.float16, name="y_half") if half else out, y)
