"""QLinearMatMul (opset 21+) with u8 activations and constant s8 weights -> the same node with u8 weights.

ONNX QLinearMatMul::

    y = saturate(round((a - a_zero) @ (b - b_zero) * a_scale * b_scale / y_scale) + y_zero)

with the product accumulated in 32 bits. The integers the product needs are ``b - b_zero``.
Rewrite: ``b' = b ^ 0x80`` and ``b_zero' = b_zero ^ 0x80`` as uint8 (``b + 128``, ``b_zero +
128``), so every ``b' - b_zero'`` equals ``b - b_zero`` and ``y`` is unchanged, bit for bit.

Why. On x86 CPUs without VNNI onnxruntime's u8 x s8 kernels add pairs of 8-bit products in
16 bits and saturate (:mod:`onnxmlu.sessions`); its ``session.x64quantprecision`` pass rewrites
s8 weights to u8 for the u8 x u8 kernels, which accumulate exactly, but it matches
QLinearMatMul only at since-version 10 (onnxruntime 1.32), so a QLinearMatMul of opset 21 or
later kept its s8 weight and saturated (35 output steps off under ``qemu-x86_64 -cpu
Skylake-Client``: tests/precision/exact_int8_check.py). Done in the model, the fused file runs
the exact kernels on every host, whether its sessions set that entry or not; on VNNI hosts the
u8 x u8 kernel is slower than the u8 x s8 one it replaces (the cost scripts/int8_exact_cost.py
measures for the entry). A weight several nodes share stays one tensor.

Weights that cannot saturate keep s8, so VNNI hosts keep their faster u8 x s8 kernel: the
u8 x u8 one took 2.41x as long on a [64, 768] x [768, 768] product and 2.17x on [128, 256] x
[256, 256] (1 thread; ``python scripts/int8_exact_cost.py --qlinearmatmul 64 768 768``; commit
fa7cc6f, 2-core AMD EPYC with AVX-512 VNNI, load: other jobs running), kept s8 weights
0.99-1.01x. Weights quantized to 7 bits (onnxruntime's ``reduce_range``) are such weights. The bound: the
16-bit pair sum is ``a1 * w1 + a2 * w2`` of the stored values, ``a`` in [0, 255] (the zero points
are applied after, on 32-bit sums), so with every ``|w| <= 64`` it is at most ``2 * 255 * 64 =
32640 <= 32767`` in magnitude, and no x86 kernel saturates (:data:`SATURATION_FREE`; checked
under Skylake-Client by tests/precision/exact_int8_check.py's ``qlinear_matmul_7bit``). At 65,
``2 * 255 * 65 = 33150`` can.

Only that form is the rewriter's (``wants``): s8 activations (s8 x s8 kernels widen before
multiplying: exact everywhere), weights computed at run time, and opsets before 21 (onnxruntime's
own pass covers them) run as they are, with no refusal recorded.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from onnxmlu.rewrite.base import RewriteContext, constant_value

#: The first opset whose QLinearMatMul onnxruntime's s8 -> u8 pass does not match.
FIRST_UNMATCHED_OPSET = 21
_ZERO_A, _WEIGHT, _ZERO_B = 2, 3, 5
#: The largest ``|w|`` of an s8 weight whose u8 x s8 pair sums fit 16 bits (module docstring).
SATURATION_FREE = 64


def as_u8(values: np.ndarray) -> np.ndarray:
    """s8 -> u8: ``v + 128``, the bits of ``v ^ 0x80`` (module docstring)."""
    return (np.asarray(values, dtype=np.int8).astype(np.int16) + 128).astype(np.uint8)


def cannot_saturate(weight: np.ndarray) -> bool:
    """Whether every u8 x s8 pair sum with this s8 weight fits 16 bits (``|w| <= 64``)."""
    return int(np.abs(np.asarray(weight, dtype=np.int16)).max(initial=0)) <= SATURATION_FREE


def _dtype(tensor: gs.Tensor) -> np.dtype | None:
    value = constant_value(tensor)
    return None if value is None else value.dtype


class QLinearMatMulWeightRewriter:
    name = "qlinearmatmul"
    op_types = ("QLinearMatMul",)

    def __init__(self, **_: object) -> None:
        pass

    def wants(self, node: gs.Node, ctx: RewriteContext) -> bool:
        if ctx.opset < FIRST_UNMATCHED_OPSET or len(node.inputs) <= _ZERO_B:
            return False
        return (_dtype(node.inputs[_ZERO_A]) == np.uint8 and _dtype(node.inputs[_WEIGHT]) == np.int8
                and _dtype(node.inputs[_ZERO_B]) == np.int8
                and not cannot_saturate(constant_value(node.inputs[_WEIGHT])))

    @staticmethod
    def may_want(node: onnx.NodeProto, graph: onnx.GraphProto) -> bool:
        """Before the graph is imported: a weight that is an s8 initializer of this graph or
        not one of its initializers (a Constant node, an outer-scope name)."""
        found = next((t for t in graph.initializer if len(node.input) > _WEIGHT and t.name == node.input[_WEIGHT]),
                     None)
        return found is None or found.data_type == onnx.TensorProto.INT8

    def check(self, node: gs.Node, ctx: RewriteContext) -> str | None:
        return None  # every form ``wants`` takes is rewritten

    def apply(self, node: gs.Node, ctx: RewriteContext) -> None:
        bld = ctx.builder(node, np.uint8)
        for index, what in ((_WEIGHT, "b_u8"), (_ZERO_B, "b_zero_point_u8")):
            node.inputs[index] = bld.derived(node.inputs[index], ("s8_to_u8",), as_u8, what)
