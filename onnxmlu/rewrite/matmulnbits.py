"""com.microsoft MatMulNBits -> the packed weights dequantized in the body, then MatMul (+ Add).

onnxruntime's definition (``docs/ContribOperators.md``; CPU kernel ``matmul_nbits.cc``)::

    W[n, k] = (q[n, k] - zp[n, k // block_size]) * scale[n, k // block_size]     (W: [N, K])
    Y = A @ W^T (+ bias)

``q`` is stored bit-packed along K, block by block: ``B`` is uint8 ``[N, k_blocks, blob]`` with
``k_blocks = ceil(K / block_size)``, ``blob = block_size * bits / 8``, and the j-th value of a byte
(j = 0 first) in its bits ``[j * bits, (j + 1) * bits)`` (for 4 bits: the low nibble first). The
last block is padded; only the first K values count. ``scales`` is ``[N, k_blocks]`` (or flat
``N * k_blocks``). ``zero_points`` is absent (then ``2^(bits-1)``: 8 for 4 bits, 128 for 8),
packed like ``B`` (uint8 ``[N, ceil(k_blocks * bits / 8)]``), or float ``[N, k_blocks]``.

Rewrite, every step a node so the stored integers stay what the file holds (a 4-bit weight
unpacked at compile time to float would be 8x larger; :mod:`onnxmlu.frontend.fold` never folds
such an up-cast)::

    p      = Cast(B, float)                                        exact: integers < 256
    digit_j = p_j - 2^bits * Floor(p_j / 2^bits),  p_{j+1} = Floor(p_j / 2^bits)    (bits < 8)
    q      = Reshape(Concat_j(digit_j), [N, k_blocks, block_size])
    W      = Transpose(Slice(Reshape((q - zp) * scale, [N, k_blocks * block_size]), K), [1, 0])
    Y      = MatMul(A, W) (+ bias)

All of it is exact in float32 (integers below 2^8, divisions by powers of two), so ``W`` is the
kernel's dequantized weight bit for bit, whatever order the kernel multiplies in. A packed zero
point is unpacked the same way in the body; a float one and the scales are reshaped constants
of their own size. The ``Cast`` of a stored 8-bit integer constant starts a weight
dequantization: analysis carries the whole expression into the block of the MatMul that reads it,
which is then quantized arithmetic and the block INT8 (:mod:`onnxmlu.analyze.quantized`,
:mod:`onnxmlu.plan.labels`); its weight bytes are the packed bytes the model stores.

``accuracy_level`` is the *minimum* accuracy the kernel may compute A at (4: A may be quantized
to int8 per block); the rewrite computes A @ W in float, which every level allows. onnxruntime
at level 4 rounds A to 8 bits, so it differs from the exact product by about 1e-2 relative;
tests/rewrite/test_rw_matmulnbits.py compares with the kernel at level 0 to 1e-4 and at level 4
to that rounding.

Refused (host, with the reason): ``B``, ``scales`` or ``zero_points`` computed at run time, bits
other than 2, 4 and 8, a ``g_idx`` other than the plain ``k // block_size``, a prepacked
``B`` (``weight_prepacked``), and an ``A`` that is not float32 (float16 and bfloat16 kernels
accumulate in their own precision, which this rewrite does not match).
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from onnxmlu.rewrite.base import RewriteContext, constant_value, detach, node_input, tensor_dtype
from onnxmlu.rewrite.builder import Builder

DOMAIN = "com.microsoft"
BITS = (2, 4, 8)
#: Inputs of MatMulNBits.
A, B, SCALES, ZERO_POINTS, G_IDX, BIAS = range(6)


def unpack_bits(bld: Builder, packed: gs.Tensor, shape: tuple[int, ...], bits: int, name: str) -> gs.Tensor:
    """Float values of the ``bits``-wide integers packed in uint8 ``packed`` (of ``shape``), the
    low bits of a byte first: shape ``shape[:-1] + [shape[-1] * 8 // bits]``. Every step is a
    node (module docstring)."""
    value = bld.op("Cast", [packed], attrs={"to": 1}, name=f"{name}_float", dtype=np.float32)
    if bits == 8:
        return value
    per_byte, radix = 8 // bits, float(2 ** bits)
    rest = bld.op("Reshape", [value, bld.int64(list(shape) + [1], f"{name}_bytes")], name=f"{name}_bytes")
    digits = []
    for j in range(per_byte):
        if j == per_byte - 1:  # what is left is the top digit
            digits.append(rest)
            break
        high = bld.op("Floor", [bld.op("Mul", [rest, bld.scalar(1.0 / radix)], name=f"{name}_shift{j}")],
                      name=f"{name}_high{j}")
        low = bld.op("Mul", [high, bld.scalar(radix)], name=f"{name}_back{j}")
        digits.append(bld.op("Sub", [rest, low], name=f"{name}_digit{j}"))
        rest = high
    stacked = bld.op("Concat", digits, attrs={"axis": -1}, name=f"{name}_digits")
    out_shape = list(shape[:-1]) + [shape[-1] * per_byte]
    return bld.op("Reshape", [stacked, bld.int64(out_shape, f"{name}_shape")], name=f"{name}_unpacked")


def _attrs(node: gs.Node) -> tuple[int, int, int, int]:
    return (int(node.attrs["K"]), int(node.attrs["N"]), int(node.attrs.get("bits", 4)), int(node.attrs["block_size"]))


def _refusal(node: gs.Node) -> str | None:
    """Why the node cannot be rewritten exactly (module docstring), or None."""
    if any(key not in node.attrs for key in ("K", "N", "block_size")):
        return "attribute K, N or block_size missing"
    k, n, bits, block = _attrs(node)
    if bits not in BITS:
        return f"bits={bits}: only {', '.join(map(str, BITS))} are rewritten"
    if int(node.attrs.get("weight_prepacked", 0)):
        return "B is prepacked in an execution provider's layout"
    if tensor_dtype(node.inputs[A]) != np.dtype(np.float32):
        return f"A has element type {tensor_dtype(node.inputs[A]) or 'unknown'}; only float32 is rewritten exactly"
    blocks = -(-k // block)
    for index, what in ((B, "B"), (SCALES, "scales"), (ZERO_POINTS, "zero_points"), (G_IDX, "g_idx")):
        tensor = node_input(node, index)
        if tensor is not None and constant_value(tensor) is None:
            return f"{what} is computed at run time"
    packed = constant_value(node.inputs[B])
    if packed.dtype != np.uint8 or packed.size != n * blocks * (block * bits // 8):
        return f"B holds {packed.size} {packed.dtype} values, not uint8 [N={n}, {blocks}, {block * bits // 8}]"
    g_idx = node_input(node, G_IDX)
    if g_idx is not None and not np.array_equal(constant_value(g_idx).reshape(-1), np.arange(k) // block):
        return "g_idx reorders the blocks (a deprecated input)"
    return None


def _zero_point(bld: Builder, node: gs.Node, n: int, blocks: int, bits: int) -> gs.Tensor:
    """The zero points as float ``[N, k_blocks, 1]`` (a scalar for the default)."""
    zp = node_input(node, ZERO_POINTS)
    if zp is None:
        return bld.scalar(float(2 ** (bits - 1)), np.float32)
    value = constant_value(zp)
    if value.dtype != np.uint8:  # float zero points: a constant of their own size
        return bld.const(value.astype(np.float32).reshape(n, blocks, 1), "zero_point")
    packed = bld.reshape(zp, [n, value.size // n], name="zero_point_packed")
    unpacked = unpack_bits(bld, packed, (n, value.size // n), bits, "zero_point")
    if (value.size // n) * (8 // bits) != blocks:  # the last byte's padding
        unpacked = bld.op("Slice", [unpacked, bld.int64([0]), bld.int64([blocks]), bld.int64([1])], name="zp_blocks")
    return bld.op("Reshape", [unpacked, bld.int64([n, blocks, 1], "zp_shape")], name="zero_point")


def dequantized_weight(bld: Builder, node: gs.Node) -> gs.Tensor:
    """W^T, ``[K, N]`` float32, computed in the body from the packed B (module docstring)."""
    k, n, bits, block = _attrs(node)
    blocks = -(-k // block)
    packed = bld.reshape(node.inputs[B], [n, blocks, block * bits // 8], name="B_packed")
    q = unpack_bits(bld, packed, (n, blocks, block * bits // 8), bits, "B")
    zp = _zero_point(bld, node, n, blocks, bits)
    scale = bld.const(constant_value(node.inputs[SCALES]).astype(np.float32).reshape(n, blocks, 1), "scale")
    w = bld.op("Mul", [bld.op("Sub", [q, zp], name="centred"), scale], name="dequantized")
    w = bld.op("Reshape", [w, bld.int64([n, blocks * block], "W_shape")], name="W_rows")
    if blocks * block != k:
        w = bld.op("Slice", [w, bld.int64([0]), bld.int64([k]), bld.int64([1])], name="W_unpadded")
    return bld.op("Transpose", [w], attrs={"perm": [1, 0]}, name="W")


class MatMulNBitsRewriter:
    name = "matmulnbits"
    domain = DOMAIN
    op_types = ("MatMulNBits",)

    def __init__(self, **_: object) -> None:
        pass

    def check(self, node: gs.Node, ctx: RewriteContext) -> str | None:
        return _refusal(node)

    def apply(self, node: gs.Node, ctx: RewriteContext) -> None:
        bias = node_input(node, BIAS)
        bld = ctx.builder(node, np.float32)
        w = dequantized_weight(bld, node)
        a = node.inputs[A]
        y = detach(node, ctx.graph)[0]
        out = bld.op("MatMul", [a, w], name="matmul")
        if bias is not None:
            out = bld.op("Add", [out, bias], name="bias")
        bld.finish(out, y)
