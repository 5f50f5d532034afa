"""com.microsoft DynamicQuantizeLSTM -> LSTM cells whose two matrix products are INT8, unrolled
for a static sequence length or the body of a Scan over time for a symbolic one.

onnxruntime's dynamic quantization of an LSTM keeps the weights as 8-bit integers with a scale
and zero point per direction (or per gate column) and quantizes the activations at run time.
Its kernel is the LSTM of :mod:`onnxmlu.rewrite.rnn` (same inputs 0-7, attributes and gate
order i, o, f, c) except for the two products, each computed as onnxruntime's quantized GEMM
does (``rnn_helpers.h``, ``ComputeGemm`` with quantized weights):

* ``A`` (float) is quantized to uint8 with one scale and zero point over the whole matrix,
  ``min = min(0, min A)``, ``max = max(0, max A)``, ``s_A = (max - min) / 255``,
  ``z_A = round_half_even(clamp(-min / s_A, 0, 255))`` -- exactly ``DynamicQuantizeLinear``;
* ``A W = float(sum_k (A_q - z_A)(W_q - z_W)) * (s_A * s_W)`` -- ``MatMulInteger`` of the
  integers, ``Cast`` to float, ``Mul`` by the product of the scales (per column when the
  weight scale is per channel).

The input product covers all time steps at once (``A`` = X, [seq, batch, input]); the
recurrent product runs per step (``A`` = H_{t-1}, [batch, hidden]), inside the Scan's body when
the length is symbolic (the input product stays before it, over every step at once). Weights arrive transposed
against the ONNX LSTM: W [num_dir, input, 4*hidden], R [num_dir, hidden, 4*hidden].

onnxruntime's kernel spreads the batch over its threads when ``batch > 4`` or ``batch >= 2``
with ``hidden <= 256``, and each thread quantizes *its* rows of H_{t-1} on their own: with as
many threads as rows (its default on a host with that many cores) every row has its own scale
and zero point; with fewer, groups of ``ceil(batch / threads)`` rows share one (measured,
onnxruntime 1.32: 0.02 apart on Y at batch 2, hidden 128, one thread against two), so the
original's answer depends on the host. The cells take one row per group wherever onnxruntime
spreads the batch (a symbolic batch too), one group otherwise: a row-wise quantization whose
product is ``q (W - z_W) - z * sum_k (W_k - z_W)`` in int32 (``MatMulInteger`` takes one zero
point for its left operand), the same integers. The reference is tests/rewrite/dqlstm_reference.py,
exact integer products in numpy.

Constant s8 weights are written as u8 (``w ^ 0x80``, zero point ``^ 0x80``: every ``w - z_w``
unchanged): u8 x u8 products accumulate exactly in 32 bits on every x86 CPU, where u8 x s8
kernels without VNNI saturate pairs of products in 16 bits (:mod:`onnxmlu.sessions`).

What is refused (left on the host with the reason): a ``sequence_lens`` input unless it is
constant and every length is the full sequence (onnxruntime quantizes only the first
``max(sequence_lens)`` steps of X, a range that depends on the lengths), weights that are not
8-bit, and everything the float LSTM rewrite refuses. The cells, the masks and the output
assembly are :mod:`onnxmlu.rewrite.rnn`'s, called with a builder whose ``matmul`` does the
quantized product when its right operand is a :class:`QuantizedWeight`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from onnxmlu.rewrite.base import RewriteContext, node_input, tensor_dtype
from onnxmlu.rewrite.base import tensor_shape
from onnxmlu.rewrite.builder import Builder
from onnxmlu.rewrite.rnn import (
    DIRECTIONS,
    FAMILIES,
    Plan,
    Refusal,
    Weights,
    _constant_lens,
    RecurrentRewriter,
    _seq_len,
    lower,
    parse_activations,
)

DOMAIN = "com.microsoft"
_INT8 = (np.dtype(np.int8), np.dtype(np.uint8))
#: Inputs after the LSTM's eight: the quantization parameters of W and R.
W_SCALE, W_ZERO, R_SCALE, R_ZERO = 8, 9, 10, 11


@dataclass
class QuantizedWeight:
    """One direction's 8-bit weight [K, N] with its scale and zero point ([] or [N])."""

    values: gs.Tensor
    scale: gs.Tensor
    zero_point: gs.Tensor
    #: int32 [N] column sums ``sum_k (w_kn - z_w)`` when the left operand is quantized one row
    #: at a time (the recurrent product, see the module docstring); None: one scale per matrix.
    column_sums: gs.Tensor | None = None


class QuantizedBuilder(Builder):
    """A builder whose ``matmul`` by a :class:`QuantizedWeight` is onnxruntime's dynamically
    quantized product (module docstring); every other node is the plain builder's."""

    def matmul(self, a, b, name: str | None = None) -> gs.Tensor:
        if not isinstance(b, QuantizedWeight):
            return super().matmul(a, b, name)
        tag = name or "matmul"
        if b.column_sums is not None:
            return self._matmul_by_rows(a, b, tag)
        a_q, a_scale, a_zero = self.op("DynamicQuantizeLinear", [a], outputs=3, name=f"{tag}_quant")
        a_q.dtype, a_scale.dtype, a_zero.dtype = np.uint8, np.float32, np.uint8
        acc = self.op("MatMulInteger", [a_q, b.values, a_zero, b.zero_point], name=f"{tag}_int", dtype=np.int32)
        scale = self.mul(a_scale, b.scale, name=f"{tag}_scale")
        return self.mul(self.cast(acc, np.float32, name=f"{tag}_float"), scale, name=tag)


    def _matmul_by_rows(self, a, b: QuantizedWeight, tag: str) -> gs.Tensor:
        """``a`` [M, K] quantized per row (the module docstring's formulas, row-wise), times
        ``b``: ``(q - z) (W - z_W) = q (W - z_W) - z * column_sums``, all in int32."""
        low = self.op("Min", [self._reduce("ReduceMin", a, f"{tag}_min"), self.scalar(0.0)], name=f"{tag}_low")
        high = self.op("Max", [self._reduce("ReduceMax", a, f"{tag}_max"), self.scalar(0.0)], name=f"{tag}_high")
        span = self.sub(high, low, name=f"{tag}_span")
        flat = self.op("Equal", [span, self.scalar(0.0)], name=f"{tag}_flat", dtype=np.bool_)
        scale = self.op("Where", [flat, self.scalar(1.0), self.mul(span, self.scalar(1 / 255), name=f"{tag}_step")],
                        name=f"{tag}_scale_a", dtype=np.float32)  # onnxruntime: max == min gives scale 1
        zero = self._clip_round(self.sub(self.scalar(0.0), self.op("Div", [low, scale], name=f"{tag}_lz"),
                                         name=f"{tag}_nz"), f"{tag}_zero_a", before=False)
        q = self._clip_round(self.add(self.op("Round", [self.op("Div", [a, scale], name=f"{tag}_div")],
                                              name=f"{tag}_round"), zero, name=f"{tag}_shift"), f"{tag}_q")
        q_u8 = self.cast(q, np.uint8, name=f"{tag}_u8")
        acc = self.op("MatMulInteger", [q_u8, b.values, gs.Variable.empty(), b.zero_point], name=f"{tag}_int",
                      dtype=np.int32)
        offset = self.mul(self.cast(zero, np.int32, name=f"{tag}_zero_i32"), b.column_sums, name=f"{tag}_offset")
        exact = self.sub(acc, offset, name=f"{tag}_exact")
        return self.mul(self.cast(exact, np.float32, name=f"{tag}_float"),
                        self.mul(scale, b.scale, name=f"{tag}_scale"), name=tag)

    def _reduce(self, op_type: str, a, name: str) -> gs.Tensor:
        """``op_type`` over axis 1, kept ([M, 1]); axes an input from opset 18."""
        if self.opset >= 18:
            return self.op(op_type, [a, self.int64([1])], attrs={"keepdims": 1}, name=name)
        return self.op(op_type, [a], attrs={"axes": [1], "keepdims": 1}, name=name)

    def _clip_round(self, x, name: str, before: bool = True) -> gs.Tensor:
        """``clip(x, 0, 255)``, rounded half to even after (``before``: x is rounded already)."""
        clipped = self.op("Clip", [x, self.scalar(0.0), self.scalar(255.0)], name=f"{name}_clip")
        return clipped if before else self.op("Round", [clipped], name=name)


def make_plan(node: gs.Node, ctx: RewriteContext) -> Plan:
    """:class:`~onnxmlu.rewrite.rnn.Plan` of a DynamicQuantizeLSTM (raises :class:`Refusal`)."""
    direction = node.attrs.get("direction", "forward")
    if direction not in DIRECTIONS:
        raise Refusal(f"unknown direction {direction!r}")
    x = node.inputs[0]
    if tensor_dtype(x) != np.dtype(np.float32):
        raise Refusal(f"input X has element type {x.dtype}, need float")
    seq_len = _seq_len(x, 0)  # None: symbolic, a Scan over time (X is quantized once, before it)
    lens = _constant_lens(node, seq_len)
    if node_input(node, 4) is not None and (lens is None or seq_len is None or np.any(lens != seq_len)):
        raise Refusal("sequence_lens shorter than the sequence: onnxruntime quantizes only the first "
                      "max(sequence_lens) steps of X")
    for index, what in ((1, "W"), (2, "R")):
        weight = node_input(node, index)
        if tensor_dtype(weight) not in _INT8 or tensor_shape(weight) is None:
            raise Refusal(f"{what} is not an 8-bit tensor of known shape")
    if any(node_input(node, i) is None for i in (W_SCALE, W_ZERO, R_SCALE, R_ZERO)):
        raise Refusal("W/R scale or zero point missing")
    hidden = int(node.attrs.get("hidden_size", tensor_shape(node.inputs[2])[1]))
    clip = node.attrs.get("clip")
    family = FAMILIES["LSTM"]
    directions = DIRECTIONS[direction]
    return Plan(op="LSTM", family=family, hidden=hidden, directions=directions, layout=0, seq_len=seq_len,
                dtype=np.dtype(np.float32), acts=parse_activations(node, family.default_acts, len(directions)),
                clip=None if clip is None else float(clip), input_forget=bool(node.attrs.get("input_forget", 0)),
                linear_before_reset=False, lens=lens)


def _quantized_weight(b: Builder, node: gs.Node, index: int, d: int, what: str,
                      by_rows: bool = False) -> QuantizedWeight:
    """Direction ``d`` of W (``index`` 1) or R (2) with its scale and zero point ([num_dir] ->
    [], [num_dir, N] -> [N]); ``by_rows``: with the column sums of a row-wise product."""
    scale, zero = (W_SCALE, W_ZERO) if index == 1 else (R_SCALE, R_ZERO)
    values, zeros = b.value(node.inputs[index]), b.value(node.inputs[zero])
    if values is not None and zeros is not None:
        w, z = np.take(values, d, 0), np.take(zeros, d, 0)
        sums = (w.astype(np.int32) - z.astype(np.int32)).sum(axis=0, dtype=np.int32)
        if w.dtype == np.int8:
            w, z = _as_u8(w), _as_u8(z)
        return QuantizedWeight(b.const(w, what, dtype=w.dtype), b.gather(node.inputs[scale], d, name=f"{what}_scale"),
                               b.const(z, f"{what}_zero", dtype=z.dtype),
                               b.const(sums, f"{what}_column_sums", dtype=np.int32) if by_rows else None)
    return QuantizedWeight(b.gather(node.inputs[index], d, name=what),
                           b.gather(node.inputs[scale], d, name=f"{what}_scale"),
                           b.gather(node.inputs[zero], d, name=f"{what}_zero"))


def _as_u8(values: np.ndarray) -> np.ndarray:
    """s8 -> u8 by ``^ 0x80`` (module docstring). Done here, not left to onnxruntime's own
    s8 -> u8 pass (session.x64quantprecision), which fails on a weight that several nodes share
    ("Attempt to replace the existing tensor": every step of an unrolled cell reads R)."""
    return np.ascontiguousarray(values).view(np.uint8) ^ np.uint8(0x80)


def _rows_apart(node: gs.Node, plan: Plan) -> bool:
    """Whether onnxruntime's kernel quantizes H one batch row at a time at its default threads:
    it parallelizes over the batch when ``batch > 4 or (batch >= 2 and hidden <= 256)``, each
    thread quantizing its ``ceil(batch / threads)`` rows on their own (one row each on a host
    with as many threads as rows). A symbolic batch: by rows (as it is for batch 1 or > 4)."""
    shape = tensor_shape(node.inputs[0])
    batch = shape[1] if shape is not None and len(shape) == 3 and isinstance(shape[1], int) else None
    return batch is None or batch > 4 or (batch >= 2 and plan.hidden <= 256)


def prepare_weights(b: Builder, plan: Plan, node: gs.Node, d: int) -> Weights:
    """The quantized W^T and R^T of direction ``d`` (already [K, 4*hidden]), the summed bias,
    the peepholes (as :func:`onnxmlu.rewrite.rnn.prepare_weights` for the float LSTM)."""
    hid = plan.hidden
    w, r = _quantized_weight(b, node, 1, d, "W"), _quantized_weight(b, node, 2, d, "R", _rows_apart(node, plan))
    weights = Weights(w, r, None)  # type: ignore[arg-type] - QuantizedBuilder.matmul reads them
    bias_in = node_input(node, 3)
    if bias_in is not None:
        wb, rb = b.split(b.gather(bias_in, d, name="B"), [4 * hid] * 2, 0, name="B_split")
        weights.bias = b.add(wb, rb, name="bias")
    peep_in = node_input(node, 7)
    if peep_in is not None:
        weights.peep = b.split(b.gather(peep_in, d, name="P"), [hid] * 3, 0, name="P_split")
    return weights


def lower_quantized(node: gs.Node, ctx: RewriteContext, plan: Plan) -> None:
    """:func:`onnxmlu.rewrite.rnn.lower` with the quantized products and weights."""
    base = ctx.builder(node, plan.dtype)
    b = QuantizedBuilder(base.graph, base.opset, base.names, base.prefix, base.dtype, base._cache, base.weights)
    lower(node, ctx, plan, b, prepare_weights)


class DynamicQuantizeLSTMRewriter(RecurrentRewriter):
    name = "dqlstm"
    domain = DOMAIN
    op_types = ("DynamicQuantizeLSTM",)
    plan = staticmethod(make_plan)
    lower = staticmethod(lower_quantized)
