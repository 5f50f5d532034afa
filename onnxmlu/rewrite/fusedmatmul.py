"""com.microsoft FusedMatMul -> (Transpose) MatMul (Mul), alpha folded into a constant operand.

onnxruntime's definition (``docs/ContribOperators.md``, CPU kernel ``matmul.cc`` with
``FusedMatMul``'s attributes)::

    Y = alpha * op(A) @ op(B)

where, for an operand X of rank r >= 3 with ``transBatchX`` set, X is first permuted by
``[1, ..., r-2, 0, r-1]`` (its first dim moves behind the other batch dims, next to the last
one), then, with ``transX`` set, its last two dims are swapped; ``@`` is ONNX MatMul
(numpy broadcasting of the batch dims). The kernel takes ``transBatchA``/``transBatchB`` only when
both operands have one rank >= 3 (``matmul_helper.h``). (Checked against onnxruntime 1.32's
kernel: tests/rewrite/test_rw_contrib.py.)

Rewrite: one ``Transpose`` per permuted operand with the composed permutation (a constant
operand is permuted at compile time), ``MatMul``; ``alpha != 1`` is folded into a constant
``B`` (else a constant ``A``) as ``alpha * B`` in float64 stored in B's type, or becomes a
``Mul`` after the MatMul when both operands are computed.

Refused: non-float types, a transposed operand of unknown or too small rank (the
permutation depends on it), and ``transBatch`` with ranks the kernel rejects.
"""

from __future__ import annotations

import onnx_graphsurgeon as gs

from onnxmlu.rewrite.base import FLOAT_DTYPES, RewriteContext, detach, tensor_shape
from onnxmlu.rewrite.floattype import float_dtype, is_float
from onnxmlu.rewrite.gemm import scaled_matmul

DOMAIN = "com.microsoft"


def operand_perm(rank: int, trans: bool, trans_batch: bool) -> list[int] | None:
    """The permutation FusedMatMul applies to an operand of ``rank``; None for the identity."""
    perm = list(range(rank))
    if trans_batch and rank >= 3:
        perm = perm[1:rank - 1] + [0, rank - 1]
    if trans:
        perm[-2], perm[-1] = perm[-1], perm[-2]
    return None if perm == list(range(rank)) else perm


def _flags(node: gs.Node, which: str) -> tuple[bool, bool]:
    return bool(node.attrs.get(f"trans{which}", 0)), bool(node.attrs.get(f"transBatch{which}", 0))


class FusedMatMulRewriter:
    name = "fusedmatmul"
    domain = DOMAIN
    op_types = ("FusedMatMul",)

    def __init__(self, **_: object) -> None:
        pass

    def check(self, node: gs.Node, ctx: RewriteContext) -> str | None:
        dtype = float_dtype(node.inputs[0]) or float_dtype(node.inputs[1])
        if not is_float(dtype, FLOAT_DTYPES):
            return f"element type {dtype or 'unknown'} is not float16/float/double"
        for operand, which in zip(node.inputs[:2], "AB"):
            trans, trans_batch = _flags(node, which)
            if not (trans or trans_batch):
                continue
            shape = tensor_shape(operand)
            if shape is None:
                return f"operand {which} is transposed and its rank is unknown"
            if len(shape) < 2:
                return f"operand {which} is transposed and has rank {len(shape)}"
        return _batch_reason(node)

    def apply(self, node: gs.Node, ctx: RewriteContext) -> None:
        a, b = node.inputs[0], node.inputs[1]
        alpha = float(node.attrs.get("alpha", 1.0))
        bld = ctx.builder(node, float_dtype(a) or float_dtype(b))
        y = detach(node, ctx.graph)[0]
        operands = []
        for operand, which in ((a, "A"), (b, "B")):
            perm = None
            if any(_flags(node, which)):
                perm = operand_perm(len(tensor_shape(operand)), *_flags(node, which))
            operands.append(operand if perm is None else bld.transpose(operand, perm, name=f"trans{which}"))
        bld.finish(scaled_matmul(bld, *operands, alpha), y)


def _batch_reason(node: gs.Node) -> str | None:
    if not (_flags(node, "A")[1] or _flags(node, "B")[1]):
        return None
    shapes = [tensor_shape(t) for t in node.inputs[:2]]
    if any(s is None for s in shapes) or len(shapes[0]) != len(shapes[1]) or len(shapes[0]) < 3:
        return "transBatchA/transBatchB need two operands of one known rank >= 3 (onnxruntime's kernel)"
    return None

