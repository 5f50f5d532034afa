"""4-bit DequantizeLinear (INT4/UINT4 weights, opset 21+) -> the packed bytes dequantized in the body.

ONNX DequantizeLinear (opset 21+)::

    y = (x - x_zero_point) * x_scale

per tensor (scalar scale), per axis (``x_scale`` 1-D along ``axis``), or blocked (``block_size``
> 0: ``x_scale`` has ``x``'s shape with ``ceil(D / block_size)`` along ``axis``, each scale
covering ``block_size`` consecutive elements there; the last block covers what is left).
``x_zero_point`` has the scale's shape
and ``x``'s type (0 when absent). onnxruntime's quantizer writes INT4/UINT4 weights so
(``MatMul4BitsQuantizer`` in its QDQ format: blocked along K, then a MatMul).

The accelerator's quantized units are 8-bit: a 4-bit DequantizeLinear stays on the host
(:mod:`onnxmlu.analyze.optable`), which would send its float result -- 8x the stored bytes --
into the block. Rewrite: the constant's bytes, which ONNX packs as MatMulNBits does (element i
in byte i // 2, the low nibble first), become a uint8 constant of the same size, unpacked in the
body as :mod:`onnxmlu.rewrite.matmulnbits` does (``Cast``, ``Floor``-based nibble arithmetic,
exact in float32); INT4 takes the sign ``v = u - 16 * Floor(u / 8)``; the zero point the same
way; then ``Reshape`` into blocks along ``axis`` (a partial last block first ``Pad``-ed with
zeros to a whole one), ``Sub``, ``Mul`` by the scale (reshaped at compile time to broadcast),
``Reshape`` back (and ``Slice`` off the padding). The ``Cast`` of the stored 8-bit constant makes it
a weight dequantization that analysis carries into the block of its reader (INT8).

A float16 scale (and so a float16 ``y``) stays stored as float16 -- the file keeps its bytes --
and is widened in the body, ``Cast(to=FLOAT)``, exactly; the dequantization runs in float32 as
above and ``y`` is rounded to float16 once, ``Cast(to=FLOAT16)``. That is onnxruntime's CPU
kernel bit for bit: ``x - x_zero_point`` is an integer of at most 5 bits and a float16 scale has
an 11-bit significand, so their product is exact in float32 and the one rounding is the
kernel's own. (Widening the scales at compile time would store them at twice their bytes; a
float16 ``Mul`` is one ulp off the kernel.) Analysis carries the widening ``Cast`` with the
weight expression it feeds (:func:`onnxmlu.analyze.quantized.weight_expressions`), so the
pricing reads the float16 scales at their stored bytes.

Only 4-bit DequantizeLinear nodes are this rewriter's (``wants``); 8-bit ones run as they are.
Refused: a computed ``x``, scale or zero point, a scale other than float32 or float16, an
``output_dtype`` other than the scale's type, and a blocked scale whose shape is not ``x``'s
in blocks.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from onnxmlu.rewrite.base import RewriteContext, constant_value, detach, node_input
from onnxmlu.rewrite.builder import Builder
from onnxmlu.rewrite.matmulnbits import unpack_bits

_FOUR_BIT = ("int4", "uint4")
#: The scale types rewritten, with the ``output_dtype`` values that agree with them (0: the scale's).
_SCALE_TYPES = {np.dtype(np.float32): (0, onnx.TensorProto.FLOAT), np.dtype(np.float16): (0, onnx.TensorProto.FLOAT16)}


def _four_bit(tensor: gs.Tensor | None) -> bool:
    dtype = getattr(tensor, "dtype", None) if tensor is not None else None
    return dtype is not None and getattr(dtype, "name", str(dtype)) in _FOUR_BIT


def packed_bytes(values: np.ndarray) -> np.ndarray:
    """ONNX's packing of 4-bit ``values``: element i in byte i // 2, the low nibble first."""
    nibbles = values.reshape(-1).astype(np.int8).astype(np.uint8) & 0xF
    if nibbles.size % 2:
        nibbles = np.concatenate([nibbles, np.zeros(1, np.uint8)])
    return (nibbles[0::2] | (nibbles[1::2] << 4)).astype(np.uint8)


def unpacked(bld: Builder, values: np.ndarray, name: str) -> gs.Tensor:
    """The 4-bit constant ``values`` as float of its shape, unpacked in the body from its bytes."""
    data = packed_bytes(values)
    flat = unpack_bits(bld, bld.const(data, f"{name}_packed", dtype=np.uint8), (data.size,), 4, name)
    if data.size * 2 != values.size:  # the last byte's padding
        flat = bld.op("Slice", [flat, bld.int64([0]), bld.int64([values.size]), bld.int64([0])], name=f"{name}_trim")
    if values.dtype.name == "int4":  # two's complement: 8..15 are -8..-1
        sign = bld.op("Floor", [bld.op("Mul", [flat, bld.scalar(0.125)], name=f"{name}_top")], name=f"{name}_sign")
        wrap = bld.op("Mul", [sign, bld.scalar(16.0)], name=f"{name}_wrap")
        flat = bld.op("Sub", [flat, wrap], name=f"{name}_signed")
    return flat


def _block_shape(shape: tuple[int, ...], axis: int, block: int) -> list[int]:
    """``shape`` with ``axis`` split into (blocks, block)."""
    return list(shape[:axis]) + [shape[axis] // block, block] + list(shape[axis + 1:])


def _padded(shape: tuple[int, ...], axis: int, block: int) -> list[int]:
    """``shape`` with ``axis`` rounded up to whole blocks (the last block may be partial)."""
    return [-(-d // block) * block if i == axis else d for i, d in enumerate(shape)]


def _broadcast(param: np.ndarray, shape: tuple[int, ...], axis: int, block: int) -> np.ndarray:
    """A scale or zero point reshaped to broadcast against ``x`` (in blocks when ``block``)."""
    if param.size == 1:
        return param.reshape(())
    if block:
        return param.reshape(list(shape[:axis]) + [shape[axis] // block, 1] + list(shape[axis + 1:]))
    return param.reshape([shape[axis]] + [1] * (len(shape) - axis - 1))


class FourBitDequantizeRewriter:
    name = "dq4"
    op_types = ("DequantizeLinear",)

    def __init__(self, **_: object) -> None:
        pass

    def wants(self, node: gs.Node, ctx: RewriteContext) -> bool:
        return _four_bit(node.inputs[0])

    @staticmethod
    def may_want(node: onnx.NodeProto, graph: onnx.GraphProto) -> bool:
        """Before the graph is imported: an initializer of 4 bits, or an ``x`` that is not one of
        this graph's initializers (a Constant node, an outer-scope name: looked at after import)."""
        found = next((t for t in graph.initializer if t.name == node.input[0]), None)
        return found is None or found.data_type in (onnx.TensorProto.INT4, onnx.TensorProto.UINT4)

    def check(self, node: gs.Node, ctx: RewriteContext) -> str | None:
        for index, what in ((0, "x"), (1, "x_scale"), (2, "x_zero_point")):
            tensor = node_input(node, index)
            if tensor is not None and constant_value(tensor) is None:
                return f"{what} is computed at run time"
        scale = constant_value(node.inputs[1])
        if scale.dtype not in _SCALE_TYPES:
            return f"x_scale of {scale.dtype}: float32 and float16 are rewritten"
        if int(node.attrs.get("output_dtype", 0)) not in _SCALE_TYPES[scale.dtype]:
            return "output_dtype other than the scale's type"
        shape = constant_value(node.inputs[0]).shape
        axis, block = int(node.attrs.get("axis", 1)) % max(len(shape), 1), int(node.attrs.get("block_size", 0))
        if block and -(-shape[axis] // block) != (scale.shape[axis] if scale.ndim == len(shape) else -1):
            return (f"x_scale {list(scale.shape)} does not fit x's shape ({list(shape)}) "
                    f"in blocks of {block} along axis {axis}")
        return None

    def apply(self, node: gs.Node, ctx: RewriteContext) -> None:
        values, scale = constant_value(node.inputs[0]), constant_value(node.inputs[1])
        zp = node_input(node, 2)
        shape = values.shape
        axis, block = int(node.attrs.get("axis", 1)) % max(len(shape), 1), int(node.attrs.get("block_size", 0))
        bld = ctx.builder(node, np.float32)
        x = unpacked(bld, values, "x")
        full = _padded(shape, axis, block) if block and scale.size > 1 else list(shape)
        if full != list(shape):  # a partial last block: zeros after it, sliced off at the end
            pads = [0] * len(shape) + [f - d for f, d in zip(full, shape)]
            x = bld.op("Pad", [bld.op("Reshape", [x, bld.int64(list(shape), "x_whole")], name="x_unpadded"),
                               bld.int64(pads, "x_pads")], name="x_padded")
        work_shape = _block_shape(tuple(full), axis, block) if block and scale.size > 1 else list(shape)
        x = bld.op("Reshape", [x, bld.int64(work_shape, "x_shape")], name="x_blocks")
        if zp is not None:
            zero = bld.op("Reshape", [unpacked(bld, constant_value(zp), "zero_point"),
                                      bld.int64(list(_broadcast(np.empty(scale.shape), tuple(full), axis, block).shape),
                                                "zero_point_shape")], name="zero_point")
            x = bld.op("Sub", [x, zero], name="centred")
        y_value = bld.op("Mul", [x, _widened_scale(bld, _broadcast(scale, tuple(full), axis, block))],
                         name="dequantized")
        y = detach(node, ctx.graph)[0]
        if full != work_shape:
            y_value = bld.op("Reshape", [y_value, bld.int64(full, "y_shape")], name="unblocked")
        if full != list(shape):
            y_value = bld.op("Slice", [y_value, bld.int64([0], "y_start"), bld.int64([shape[axis]], "y_end"),
                                       bld.int64([axis], "y_axis")], name="unpadded")
        if scale.dtype == np.float16:  # the one rounding, as the kernel's
            y_value = bld.op("Cast", [y_value], attrs={"to": onnx.TensorProto.FLOAT16}, name="y_half",
                             dtype=np.float16)
        bld.finish(y_value, y)


def _widened_scale(bld: Builder, scale: np.ndarray) -> gs.Tensor:
    """The scale as float32: a float16 one stored as it is and widened in the body (exact; the
    ``Builder.cast`` of a constant would widen it at compile time, storing twice the bytes)."""
    if scale.dtype == np.float32:
        return bld.const(scale, "scale")
    return bld.op("Cast", [bld.const(scale, "scale_half", dtype=np.float16)], attrs={"to": onnx.TensorProto.FLOAT},
                  name="scale", dtype=np.float32)
