"""onnxruntime's fused activations (com.microsoft) -> element-wise primitives.

Definitions (onnxruntime ``docs/ContribOperators.md``; CPU kernels ``bias_gelu.cc``,
``fast_gelu.cc``, ``quick_gelu.h``, ``bias_add``)::

    Gelu(X)            = 0.5 x (1 + erf(x / sqrt(2)))                       x = X
    BiasGelu(A, B)     = Gelu(A + B)                                         (B: the bias, [C])
    FastGelu(X, bias?) = 0.5 x (1 + tanh(x (c + c g x^2))),  x = X (+ bias), c = sqrt(2/pi), g = 0.044715
    QuickGelu(X)       = x * sigmoid(alpha x),  alpha default 1.702
    BiasAdd(X, b, s)   = (X + b) + s

Rewrite: ``Add`` for the bias; from opset 20 ONNX's ``Gelu`` (``approximate="none"`` is the
erf form, ``"tanh"`` the tanh form with the same constants), before it the arithmetic:
``Div``/``Erf``/``Add``/``Mul`` for the erf form, ``Mul``/``Add``/``Tanh`` for the tanh form
(written as FastGelu's kernel computes it, ``x * (c + c g x^2)``); QuickGelu as
``Mul``/``Sigmoid``/``Mul`` (the ``alpha x`` product left out when alpha is 1).
Only floating-point inputs are rewritten.
"""

from __future__ import annotations

import math

import onnx_graphsurgeon as gs

from onnxmlu.rewrite.base import FLOAT_DTYPES, RewriteContext, detach, node_input
from onnxmlu.rewrite.builder import Builder
from onnxmlu.rewrite.floattype import float_dtype, is_float

DOMAIN = "com.microsoft"
QUICK_GELU_ALPHA = 1.702
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_TANH_CUBIC = 0.044715


def gelu_erf(bld: Builder, x: gs.Tensor) -> gs.Tensor:
    """``0.5 x (1 + erf(x / sqrt 2))``."""
    if bld.opset >= 20:
        return bld.op("Gelu", [x], name="gelu")
    erf = bld.unary("Erf", bld.op("Div", [x, bld.scalar(math.sqrt(2.0))], name="scaled"), name="erf")
    half_x = bld.op("Mul", [x, bld.scalar(0.5)], name="half")
    return bld.op("Mul", [half_x, bld.op("Add", [erf, bld.scalar(1.0)], name="one_plus")], name="gelu")


def gelu_tanh(bld: Builder, x: gs.Tensor) -> gs.Tensor:
    """``0.5 x (1 + tanh(x (c + c g x^2)))``."""
    if bld.opset >= 20:
        return bld.op("Gelu", [x], attrs={"approximate": "tanh"}, name="gelu")
    square = bld.op("Mul", [x, x], name="square")
    inner = bld.op("Add", [bld.op("Mul", [square, bld.scalar(_SQRT_2_OVER_PI * _TANH_CUBIC)], name="cubic"),
                           bld.scalar(_SQRT_2_OVER_PI)], name="inner")
    tanh = bld.unary("Tanh", bld.op("Mul", [x, inner], name="arg"), name="tanh")
    half_x = bld.op("Mul", [x, bld.scalar(0.5)], name="half")
    return bld.op("Mul", [half_x, bld.op("Add", [tanh, bld.scalar(1.0)], name="one_plus")], name="gelu")


def quick_gelu(bld: Builder, x: gs.Tensor, alpha: float) -> gs.Tensor:
    arg = x if alpha == 1.0 else bld.op("Mul", [x, bld.scalar(alpha)], name="alpha")
    return bld.op("Mul", [x, bld.unary("Sigmoid", arg, name="sigmoid")], name="gate")


class ContribGeluRewriter:
    name = "contribgelu"
    domain = DOMAIN
    op_types = ("Gelu", "BiasGelu", "FastGelu", "QuickGelu", "BiasAdd")

    def __init__(self, **_: object) -> None:
        pass

    def check(self, node: gs.Node, ctx: RewriteContext) -> str | None:
        dtype = float_dtype(node.inputs[0])
        if not is_float(dtype, FLOAT_DTYPES):
            return f"element type {dtype or 'unknown'} is not float16/float/double"
        return None

    def apply(self, node: gs.Node, ctx: RewriteContext) -> None:
        x = node.inputs[0]
        bias, skip = node_input(node, 1), node_input(node, 2)
        bld = ctx.builder(node, float_dtype(x))
        y = detach(node, ctx.graph)[0]
        if bias is not None:
            x = bld.op("Add", [x, bias], name="bias")
        if node.op == "BiasAdd":
            out = bld.op("Add", [x, skip], name="skip")
        elif node.op in ("Gelu", "BiasGelu"):
            out = gelu_erf(bld, x)
        elif node.op == "FastGelu":
            out = gelu_tanh(bld, x)
        else:
            out = quick_gelu(bld, x, float(node.attrs.get("alpha", QUICK_GELU_ALPHA)))
        bld.finish(out, y)
