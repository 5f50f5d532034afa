"""What the planner knows about one accelerator layer (one supported ONNX node).

A :class:`Layer` is produced by :mod:`onnxmlu.analyze` from a graph and consumed by the
performance model and the strategies. It carries no onnx objects.

Operation counts follow [DLFusion] Eq. 1-2 (two operations per multiply-accumulate):

* Conv:  ``ops = 2 * H_out * W_out * K_h * K_w * (C_in / groups) * C_out * N``
* FC / MatMul: ``ops = 2 * M * K * N`` (batch dimensions folded into M)
* other layers: a documented small count per output element (see ``analyze``).

Precision: a layer as analysed describes the model's FP32 computation (``precision`` =
``"fp32"``). :meth:`Layer.at_precision` gives the same layer run at FP16 or INT8: its
floating-point feature maps and weights shrink to that precision's element size (the bytes in
``fixed_bytes`` -- integer indices, masks -- keep theirs), and the performance model runs its
operations at that precision's peak.

A layer that *arrives quantized* (:attr:`Layer.quantized`: the model itself fixes its numerics
-- a ``QLinearConv``, a ``QuantizeLinear``, the float operator of a QDQ unit, a layer reading
INT8 weights through a ``DequantizeLinear``; see :mod:`onnxmlu.analyze.layers`) is analysed at
``precision="int8"``, its bytes what the model stores. One that *is* quantized arithmetic
(:attr:`Layer.int8_arithmetic`: a quantized operator, or a reader of INT8 weights whose
dequantization is carried into its block) always runs INT8: :meth:`Layer.at_precision` returns
it unchanged. The others (a QDQ unit's float operator, a ``MaxPool`` on 8-bit values) run INT8
only in an INT8 block; in an FP32 block -- one holding no quantized arithmetic
(:mod:`onnxmlu.plan.labels`) -- they are the float or integer operators the body computes, and
are priced as analysed in FP32.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal, Sequence

from onnxmlu.precisions import DEFAULT_PRECISION, ELEMENT_BYTES, check_precision, runs_at

LayerKind = Literal["conv", "fc", "eltwise", "pool", "global_pool", "norm", "softmax", "data"]

#: Kinds whose consumer needs the whole feature map: fusing across them admits no spatial tiling.
WHOLE_MAP_KINDS: frozenset[str] = frozenset({"fc", "global_pool", "softmax"})


@dataclass(frozen=True)
class Layer:
    """One accelerator layer in topological order.

    ``segment`` numbers the maximal runs of supported nodes between host nodes; a block never
    spans two segments (that could make the collapsed graph cyclic).
    """

    index: int
    name: str
    op_type: str
    kind: LayerKind
    ops: float
    in_channels: int = 1
    out_channels: int = 1
    out_height: int = 1
    out_width: int = 1
    kernel: tuple[int, int] = (1, 1)
    stride: tuple[int, int] = (1, 1)
    groups: int = 1
    input_bytes: int = 0
    output_bytes: int = 0
    weight_bytes: int = 0
    segment: int = 0
    #: Bytes of (input, output, weight) tensors that are not FP32 (integer indices, masks, the
    #: stored bytes of a block-quantized weight -- packed 4-bit values with their per-block
    #: scales and zero points, :func:`onnxmlu.analyze.quantized.stored_weight_bytes`): they keep
    #: their size at every precision. All-FP32 layers leave it (0, 0, 0).
    fixed_bytes: tuple[int, int, int] = (0, 0, 0)
    #: The precision the layer is priced at (its bytes are already at that element size).
    precision: str = DEFAULT_PRECISION
    #: The layer arrives quantized: the model fixes its numerics with its own quantization
    #: parameters (analysed at INT8; onnxmlu never re-quantizes nor rounds it to FP16).
    quantized: bool = False
    #: The layer is quantized arithmetic itself: its node is a quantized operator, or it reads
    #: INT8 weights through a weight dequantization carried into its block. A block holding one
    #: is INT8 (:func:`onnxmlu.plan.labels.honest_precision`); implies ``quantized``.
    int8_arithmetic: bool = False
    #: The layer is an epilogue of the layer before it (:mod:`onnxmlu.analyze.epilogues`): a
    #: CPU runtime fuses it into that layer's kernel unless a block boundary falls between them.
    epilogue: bool = False

    @property
    def gops(self) -> float:
        """Operation count in GOPs (10^9 operations)."""
        return self.ops / 1e9

    def at_precision(self, precision: str) -> "Layer":
        """This layer run at ``precision``: FP32 tensor bytes scaled to its element size.
        Only an FP32 layer (as analysed) converts; the same precision returns ``self``, and so
        does every precision for quantized arithmetic (it always runs INT8). Another layer that
        arrives quantized runs INT8 in an INT8 block and FP32 in any other (never FP16)."""
        check_precision(precision)
        if precision == self.precision or self.int8_arithmetic:
            return self
        if self.quantized:
            return self if precision == "int8" else self._as_fp32()
        if self.precision != DEFAULT_PRECISION:
            raise ValueError(f"layer {self.name!r} is priced at {self.precision}; convert the FP32 layer instead")
        size = ELEMENT_BYTES[precision]
        fi, fo, fw = self.fixed_bytes

        def scaled(total: int, fixed: int) -> int:
            return fixed + (max(total - fixed, 0) * size) // ELEMENT_BYTES[DEFAULT_PRECISION]

        return replace(self, input_bytes=scaled(self.input_bytes, fi), output_bytes=scaled(self.output_bytes, fo),
                       weight_bytes=scaled(self.weight_bytes, fw), precision=precision)

    def _as_fp32(self) -> "Layer":
        """The INT8-analysed layer (one byte a float element) with its float tensors at FP32
        again: exact, the INT8 bytes being element counts."""
        fi, fo, fw = self.fixed_bytes
        size = ELEMENT_BYTES[DEFAULT_PRECISION]
        return replace(self, input_bytes=fi + max(self.input_bytes - fi, 0) * size,
                       output_bytes=fo + max(self.output_bytes - fo, 0) * size,
                       weight_bytes=fw + max(self.weight_bytes - fw, 0) * size, precision=DEFAULT_PRECISION)


def layers_at_precision(layers: Sequence[Layer], precision: str) -> list[Layer]:
    """Every layer of ``layers`` as it runs in a block at ``precision`` (see
    :meth:`Layer.at_precision`): quantized arithmetic stays INT8, so a mixed layer table
    converts at every precision, and in an INT8 block an operator INT8 has no form for stays
    FP32 (:func:`~onnxmlu.precision.runs_at`: the body computes it in FP32, so it is priced so)."""
    return [layer.at_precision(precision if layer.quantized else runs_at(layer.op_type, precision))
            for layer in layers]
