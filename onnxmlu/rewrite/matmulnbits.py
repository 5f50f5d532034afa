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
:mod:`onnxmlu.plan.labels`); the MatMul's weight traffic is what the file stores -- the packed
values at ``bits / 8`` bytes each, the per-block scales and zero points its expression reads
(:func:`onnxmlu.analyze.quantized.stored_weight_bytes`) -- and its operations run at the INT8 rate.

``accuracy_level`` is the minimum accuracy the kernel may compute A at. At 0-3 onnxruntime's
CPU kernel multiplies float A by W, and so does the rewrite. At 4 (int8) with 4- or 8-bit
weights and integer zero points it quantizes A per block of
``block_size`` along K (MLAS ``QuantizeARow_CompInt8``; float zero points keep the float path)
and the rewrite computes exactly that, on the accelerator's INT8 arithmetic::

    s_A = max|A_blk| / 127,   a = round_half_even(A_blk * (s_A > 0 ? 127 / max|A_blk| : 0))   int8
    Y   = sum_blk (s_A s_B) (a . (q - zp)_blk)

``Pad`` completes A's last block with zeros, ``Reshape`` makes A ``[..., k_blocks, 1, block]``,
``Abs``/``ReduceMax``/``Div``/``Where``/``Mul``/``Round`` quantize it, one batched
``MatMul`` against ``(q - zp)`` ``[k_blocks, block, N]`` gives every block's dot product (sums of
integer products below 2^24: exact in float32, as in int32), ``Mul`` by the two scales and
``ReduceSum`` over the blocks finish. Only that last sum rounds in another order than the
kernel's (tests/rewrite/test_rw_matmulnbits.py: 1e-4 against the kernel at every level).

Refused (host, with the reason): ``B``, ``scales`` or ``zero_points`` computed at run time, bits
other than 2, 4 and 8, accuracy_level 4 on an A of unknown rank or with 2-bit weights and integer
zero points (the kernel quantizes A there for block sizes 32-128 only), opsets before 11, a ``g_idx``
other than the plain ``k // block_size``, a prepacked ``B`` (``weight_prepacked``), and an ``A``
that is neither float32 nor float16. A float16 ``A`` (with float16 scales, zero points and
bias) is widened to float32 (``Cast``; the constants at compile time, exactly), computed as
above and rounded to float16 once at the end, as onnxruntime 1.32's CPU kernel computes it: the
float32 results agree as above, so the float16 ones agree to one rounding -- one float16 ulp
where the float32 sums straddle a rounding boundary (tests/rewrite/test_rw_matmulnbits.py).
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from onnxmlu.rewrite.base import RewriteContext, constant_value, detach, node_input, tensor_shape
from onnxmlu.rewrite.builder import Builder
from onnxmlu.rewrite.floattype import float_dtype, is_float

DOMAIN = "com.microsoft"
BITS = (2, 4, 8)
#: accuracy_level at which onnxruntime's CPU kernel quantizes A to int8 per block.
INT8_LEVEL = 4
#: the weight widths it always does so for (2-bit weights: for some block sizes only, refused)
INT8_BITS = (4, 8)
#: A's types: float16 is computed in float32 between two Casts, as the CPU kernel does.
A_TYPES = (np.dtype(np.float32), np.dtype(np.float16))
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
    if not is_float(float_dtype(node.inputs[A]), A_TYPES):
        return f"A has element type {float_dtype(node.inputs[A]) or 'unknown'}; float32 and float16 are rewritten"
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


def centred_weight(bld: Builder, node: gs.Node) -> gs.Tensor:
    """``q - zp`` as float ``[N, k_blocks, block_size]``, computed in the body from the packed B."""
    k, n, bits, block = _attrs(node)
    blocks = -(-k // block)
    packed = bld.reshape(node.inputs[B], [n, blocks, block * bits // 8], name="B_packed")
    q = unpack_bits(bld, packed, (n, blocks, block * bits // 8), bits, "B")
    return bld.op("Sub", [q, _zero_point(bld, node, n, blocks, bits)], name="centred")


def _scales(node: gs.Node) -> np.ndarray:
    k, n, _, block = _attrs(node)
    return constant_value(node.inputs[SCALES]).astype(np.float32).reshape(n, -(-k // block))


def dequantized_weight(bld: Builder, node: gs.Node) -> gs.Tensor:
    """W^T, ``[K, N]`` float32 (module docstring)."""
    k, n, bits, block = _attrs(node)
    blocks = -(-k // block)
    scale = bld.const(_scales(node)[:, :, None], "scale")
    w = bld.op("Mul", [centred_weight(bld, node), scale], name="dequantized")
    w = bld.op("Reshape", [w, bld.int64([n, blocks * block], "W_shape")], name="W_rows")
    if blocks * block != k:
        w = bld.op("Slice", [w, bld.int64([0]), bld.int64([k]), bld.int64([1])], name="W_unpadded")
    return bld.op("Transpose", [w], attrs={"perm": [1, 0]}, name="W")


def _reduce(bld: Builder, op: str, x: gs.Tensor, axes: list[int], keepdims: int, name: str) -> gs.Tensor:
    """``op`` over ``axes``: an attribute before opset 18 (13 for ReduceSum), an input after."""
    if bld.opset >= (13 if op == "ReduceSum" else 18):
        return bld.op(op, [x, bld.int64(axes, f"{name}_axes")], attrs={"keepdims": keepdims}, name=name)
    return bld.op(op, [x], attrs={"axes": axes, "keepdims": keepdims}, name=name)


def quantized_activation(bld: Builder, a: gs.Tensor, rank: int, k: int, block: int) -> tuple[gs.Tensor, gs.Tensor]:
    """A in blocks of ``block`` along K, ``[..., k_blocks, 1, block]``, quantized to int8
    symmetrically per block: (the integers as float, their scale ``[..., k_blocks, 1, 1]``)."""
    blocks = -(-k // block)
    if blocks * block != k:  # zeros complete the last block (they change no maximum nor sum)
        pads = [0] * (2 * rank - 1) + [blocks * block - k]
        a = bld.op("Pad", [a, bld.int64(pads, "pads")] if bld.opset >= 11 else [a], name="A_padded",
                   attrs={} if bld.opset >= 11 else {"pads": pads})
    a = bld.op("Reshape", [a, bld.int64([0] * (rank - 1) + [blocks, 1, block], "A_blocks")], name="A_blocks")
    amax = _reduce(bld, "ReduceMax", bld.unary("Abs", a, name="A_abs"), [-1], 1, "A_amax")
    scale = bld.op("Div", [amax, bld.scalar(127.0)], name="A_scale")
    # 127 / max|A|, as the kernel computes it: 1 / (max|A| / 127) is an ulp off for some maxima,
    # which moves A * inverse across a rounding boundary (1e-2 in Y, float16-valued A at K = 257)
    inverse = bld.select(bld.greater(amax, bld.scalar(0.0), name="A_nonzero"),
                         bld.op("Div", [bld.scalar(127.0), amax], name="A_inverse"), None, name="A_inverse_or_zero")
    return bld.unary("Round", bld.op("Mul", [a, inverse], name="A_scaled"), name="A_int8"), scale


def int8_product(bld: Builder, node: gs.Node, a: gs.Tensor, rank: int) -> gs.Tensor:
    """accuracy_level 4: sum over blocks of ``s_A s_B (qa . (q - zp))``, the dot products of
    integers, exact in float32 (module docstring)."""
    k, n, _, block = _attrs(node)
    qa, a_scale = quantized_activation(bld, a, rank, k, block)
    qb = bld.op("Transpose", [centred_weight(bld, node)], attrs={"perm": [1, 2, 0]}, name="B_int")  # [blocks, bs, N]
    dots = bld.op("MatMul", [qa, qb], name="matmul")  # [..., blocks, 1, N]
    b_scale = bld.const(_scales(node).T[:, None, :], "B_scale")  # [blocks, 1, N]
    scales = bld.op("Mul", [a_scale, b_scale], name="scales")
    total = _reduce(bld, "ReduceSum", bld.op("Mul", [dots, scales], name="scaled"), [-3], 0, "block_sum")
    if bld.opset >= 13:
        return bld.op("Squeeze", [total, bld.int64([-2], "row_axis")], name="rows")
    return bld.op("Squeeze", [total], attrs={"axes": [-2]}, name="rows")


def int8_activation(node: gs.Node, opset: int) -> bool:
    """Whether A is quantized to int8 (:func:`_kernel_int8`), with a known rank of A for the
    rewrite; else A is float."""
    return _kernel_int8(node) and tensor_shape(node.inputs[A]) is not None and opset >= 11


def _kernel_int8(node: gs.Node) -> bool:
    """Whether the kernel quantizes A: accuracy_level 4, integer zero points (float ones keep the
    float path) and 4 or 8 bits (2-bit weights: see ``check``)."""
    return _level(node) == INT8_LEVEL and not _float_zero_points(node) and _attrs(node)[2] in INT8_BITS


def kernel_int8(node: gs.Node) -> bool:
    """Whether onnxruntime's kernel rounds ``node``'s A to int8 at run time (:func:`_kernel_int8`),
    for any MatMulNBits, rewritten or kept on the host (one missing K, N or block_size: no, the
    kernel refuses it): ``check`` judges the outputs downstream of such nodes by their own rule
    (:mod:`onnxmlu.tools.verify`)."""
    return all(key in node.attrs for key in ("K", "N", "block_size")) and _kernel_int8(node)


def _undecided_int8(node: gs.Node) -> bool:
    """2-bit weights with integer zero points at accuracy_level 4: onnxruntime 1.32 quantizes A
    for block sizes 32-128 and keeps it float for 16 and 256 (which MLAS kernels exist, on the
    machine it runs on), so no one rewrite matches the kernel."""
    return _level(node) == INT8_LEVEL and not _float_zero_points(node) and _attrs(node)[2] not in INT8_BITS


def _level(node: gs.Node) -> int:
    return int(node.attrs.get("accuracy_level", 0))


def _float_zero_points(node: gs.Node) -> bool:
    zp = node_input(node, ZERO_POINTS)
    if zp is None:
        return False
    value = constant_value(zp)  # computed at run time (refused by the rewrite): its declared type
    dtype = value.dtype if value is not None else zp.dtype
    return dtype is not None and np.dtype(dtype) != np.uint8


class MatMulNBitsRewriter:
    name = "matmulnbits"
    domain = DOMAIN
    op_types = ("MatMulNBits",)

    def __init__(self, **_: object) -> None:
        pass

    def check(self, node: gs.Node, ctx: RewriteContext) -> str | None:
        if ctx.opset < 11:
            return f"opset {ctx.opset} < 11 (Slice, Pad and Round take their operands as inputs from 10-11)"
        reason = _refusal(node)
        if reason is None and _undecided_int8(node):
            return "2-bit weights at accuracy_level 4: onnxruntime quantizes A for some block sizes only"
        if reason is None and _kernel_int8(node) and not int8_activation(node, ctx.opset):
            return "accuracy_level 4 (A quantized to int8) needs A's rank"
        return reason

    def apply(self, node: gs.Node, ctx: RewriteContext) -> None:
        bias, a = node_input(node, BIAS), node.inputs[A]
        rank = len(tensor_shape(a) or ())
        bld = ctx.builder(node, np.float32)
        half = float_dtype(a) == np.float16  # widened, computed in float32, rounded once at the end
        if half:
            a = bld.cast(a, np.float32, name="A_float")
            bias = None if bias is None else bld.cast(bias, np.float32, name="bias_float")
        if int8_activation(node, ctx.opset):
            out = int8_product(bld, node, a, rank)
        else:
            out = bld.op("MatMul", [a, dequantized_weight(bld, node)], name="matmul")
        y = detach(node, ctx.graph)[0]
        if bias is not None:
            out = bld.op("Add", [out, bias], name="bias")
        bld.finish(bld.cast(out, np.float16, name="Y_half") if half else out, y)
