"""Block labels that mean what the body computes: the one rule every stage applies.

A block's ``precision`` says what its body computes, and its price follows the label. Given
the layers of a block and the precision asked for it (a strategy's FP32, ``--precision``, a
plan file, ``auto``'s choice), :func:`honest_precision` gives the precision it is labelled,
priced and written at, first rule that applies:

1. **INT8 when it holds quantized arithmetic** (``Layer.int8_arithmetic``): a quantized
   operator (QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, QLinearConv,
   QLinearMatMul, ConvInteger, MatMulInteger) or a layer reading INT8 weights through a weight
   dequantization carried into the block (a ``DequantizeLinear``, or a ``Cast`` of a stored
   8-bit integer constant to float). Whatever was asked: the model computes it in INT8 with
   its own parameters, and a block runs at one precision.
2. **FP32 when it holds other layers arriving quantized and no quantized arithmetic**
   (``Layer.quantized`` alone: a QDQ unit's float operator whose DequantizeLinear and
   QuantizeLinear a plan put in other blocks, a ``MaxPool`` or ``Flatten`` on 8-bit values
   between quantized operators left elsewhere). Its body computes them as the model wrote
   them, in float or on integers, with nothing quantized: FP32, label and price. onnxmlu never
   re-quantizes the model's own values nor rounds them to FP16.
3. **INT8 asked, nothing the quantizer quantizes: FP32.** onnxruntime's static quantizer puts
   a QuantizeLinear/DequantizeLinear pair on the float inputs of the operators of
   :data:`~onnxmlu.precision.INT8_ANCHOR_OPS` whatever precedes them; every other operator
   it quantizes only after one of those (``Reshape``, ``MaxPool``, ``Relu``...) or not at all
   (``Sin``). A block holding no such operator with a float input (FP32 bytes, or sizes
   unknown) would come out of the quantizer unchanged: it is FP32.
4. **FP16 asked, no FP32 tensor: FP32.** The FP16 body rounds FP32 values; a block whose
   layers have none (integer shape arithmetic) would hold no FP16 value.
5. Otherwise the precision asked.

So an INT8 label always comes with a quantized operator or an INT8 weight cast to float in
the body, and an FP16 label with FP16 values -- what the custom-op library checks when a
session is created (docs/precision.md, "Labels say what the body computes"). Collapse checks
the bodies it writes against the same rule (:func:`onnxmlu.schema.label_mismatch`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from onnxmlu.plan.perf.layers import Layer
from onnxmlu.plan.plan import Plan
from onnxmlu.precisions import DEFAULT_PRECISION, INT8_ANCHOR_OPS, record


def holds_int8_arithmetic(layers: Sequence[Layer]) -> bool:
    """Rule 1: whether a block of ``layers`` holds quantized arithmetic (its body is the model's
    own INT8, kept as it is, never re-quantized)."""
    return any(layer.int8_arithmetic for layer in layers)


def honest_precision(layers: Sequence[Layer], asked: str) -> str:
    """The precision a block of ``layers`` asked at ``asked`` is labelled, priced and written at
    (the module docstring's rules)."""
    if holds_int8_arithmetic(layers):
        return "int8"
    if any(layer.quantized for layer in layers):
        return DEFAULT_PRECISION
    wanted = record(asked)
    if wanted.quantizes and not any(anchors_int8(layer) for layer in layers):
        return DEFAULT_PRECISION
    if wanted.rounds_floats and not any(has_fp32(layer) for layer in layers):
        return DEFAULT_PRECISION
    return asked


def honest_labels(plan: Plan, layers: Sequence[Layer]) -> Plan:
    """``plan`` with every block at :func:`honest_precision`; ``plan`` itself when nothing
    changes. ``layers`` are the analysed ones."""
    blocks = tuple(replace(b, precision=p) if (p := honest_precision(b.layers(layers), b.precision)) != b.precision
                   else b for b in plan.blocks)
    if blocks == plan.blocks:
        return plan
    return Plan(blocks, plan.strategy, plan.hardware, dict(plan.notes))


def anchors_int8(layer: Layer) -> bool:
    """Rule 3: an operator the quantizer quantizes on a float input, with one."""
    return layer.op_type in INT8_ANCHOR_OPS and (layer.input_bytes == 0 or layer.input_bytes > layer.fixed_bytes[0])


def has_fp32(layer: Layer) -> bool:
    """Rule 4: a layer with an FP32 tensor (or sizes unknown, zero bytes: assumed float)."""
    total = layer.input_bytes + layer.output_bytes + layer.weight_bytes
    return total == 0 or total > sum(layer.fixed_bytes)
