"""Gemm -> MatMul (+ Add), with transposes and scalars folded into constants.

ONNX Gemm (opset 7+)::

    Y = alpha * A' @ B' + beta * C,   A' = transA ? A^T : A,   B' = transB ? B^T : B

with ``A'`` of shape [M, K], ``B'`` [K, N] and ``C`` optional (required before opset 11) and
unidirectionally broadcastable to [M, N] (scalar, [N], [1, N], [M, 1], [M, N]). Since the
MatMul result already has shape [M, N], numpy-style broadcasting in ``Add`` gives exactly
Gemm's unidirectional broadcast.

Rewrite: ``Y = MatMul(A'', B'') [* alpha] [+ C'']`` where

* a constant ``B`` becomes the initializer ``alpha * B'`` (transpose and alpha folded); else a
  constant ``A`` takes ``alpha``; when both are dynamic they get ``Transpose`` nodes as needed
  and ``alpha != 1`` becomes a ``Mul`` after the MatMul;
* a constant ``C`` becomes ``beta * C``; a dynamic one gets a ``Mul(beta)`` when ``beta != 1``;
  ``beta == 0`` or no ``C`` means no ``Add`` (Gemm ignores C then; this also avoids 0 * inf).

Only floating-point Gemms are rewritten (integer Gemm with float ``alpha`` has no exact
MatMul form); opsets before 7 (``broadcast`` attribute) are refused.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from onnxmlu.rewrite.base import FLOAT_DTYPES, RewriteContext, constant_value, detach, node_input, tensor_dtype
from onnxmlu.rewrite.base import tensor_shape


class GemmRewriter:
    name = "gemm"
    op_types = ("Gemm",)

    def __init__(self, **_: object) -> None:
        pass

    def check(self, node: gs.Node, ctx: RewriteContext) -> str | None:
        if ctx.opset < 7:
            return f"opset {ctx.opset} < 7 (Gemm with 'broadcast' attribute) is not supported"
        a, b = node.inputs[0], node.inputs[1]
        dtype = tensor_dtype(a) or tensor_dtype(b)
        if dtype not in FLOAT_DTYPES:
            return f"element type {dtype or 'unknown'} is not float16/float/double"
        for t in (a, b):
            shape = tensor_shape(t)
            if shape is not None and len(shape) != 2:
                return f"operand {t.name} has rank {len(shape)}, Gemm needs rank 2"
        return None

    def apply(self, node: gs.Node, ctx: RewriteContext) -> None:
        a, b_in = node.inputs[0], node.inputs[1]
        c = node_input(node, 2)
        alpha = float(node.attrs.get("alpha", 1.0))
        beta = float(node.attrs.get("beta", 1.0))
        trans_a = int(node.attrs.get("transA", 0))
        trans_b = int(node.attrs.get("transB", 0))
        dtype = tensor_dtype(a) or tensor_dtype(b_in)
        bld = ctx.builder(node, dtype)
        y = detach(node, ctx.graph)[0]

        lhs = bld.transpose(a, [1, 0], name="transA") if trans_a else a
        rhs = bld.transpose(b_in, [1, 0], name="transB") if trans_b else b_in
        out = scaled_matmul(bld, lhs, rhs, alpha)
        if c is not None and beta != 0.0:
            if constant_value(c) is not None and beta != 1.0:
                bias = _scaled(bld, c, beta, "bias")
            else:
                bias = c if beta == 1.0 else bld.mul(c, beta, name="beta")
            out = bld.add(out, bias, name="bias")
        bld.finish(out, y)


def scaled_matmul(bld, lhs: gs.Tensor, rhs: gs.Tensor, alpha: float) -> gs.Tensor:
    """``alpha·(lhs @ rhs)``: ``alpha`` folded into a constant operand (the weight first), else
    a ``Mul`` after the product (Gemm's and FusedMatMul's ``alpha``)."""
    post_alpha = False
    if alpha != 1.0:
        if constant_value(rhs) is not None:
            rhs = _scaled(bld, rhs, alpha, "weight")
        elif constant_value(lhs) is not None:
            lhs = _scaled(bld, lhs, alpha, "lhs")
        else:
            post_alpha = True
    out = bld.matmul(lhs, rhs, name="matmul")
    return bld.mul(out, alpha, name="alpha") if post_alpha else out


def _scaled(bld, tensor: gs.Tensor, factor: float, name: str) -> gs.Constant:
    """Constant ``factor * tensor`` computed in float64 and stored in the tensor's own type
    (one copy per weight and factor, see :meth:`Builder.derived`)."""
    return bld.derived(tensor, ("scaled", factor), lambda v: (v.astype(np.float64) * factor).astype(v.dtype), name)
