"""Weighted BatchNormalization (inference form) -> normalization + scale layer, or folded.

ONNX inference BatchNormalization over channel axis 1::

    y = (x - mean) / sqrt(var + epsilon) * scale + B

Modes:

* ``substitute`` (default; the substitution of [Paleozoic] Eq. 1-2): keep a normalization-only BN
  (scale = 1, B = 0; same mean, var, epsilon) and add a scale layer ``Mul(scale)`` then
  ``Add(B)``, with the parameters reshaped to ``[C, 1, ..., 1]`` so they broadcast on axis 1 of
  a rank-r input (``spatial=0`` of opset 7 already has per-element ``[C, D1, ..., Dn]`` shapes,
  which broadcast as they are). A BN that already has scale = 1 and B = 0 is left alone.
* ``fold``: with ``a = scale / sqrt(var + epsilon)`` and ``b = B - mean * a`` the BN is the
  affine map ``y = a * x + b`` per channel. When the producer is a Conv / ConvTranspose / Gemm /
  MatMul with constant weights whose output feeds only this BN (and is no graph output), ``a``
  is folded into the weights' output-channel axis and ``b`` into the bias:

  - Conv ``W[C_out, C_in/g, k...]``: row ``o`` scaled by ``a[o]`` (grouped / depthwise alike);
  - ConvTranspose ``W[C_in, C_out/g, k...]``: output channel ``o = g_idx * C_out/g + j`` sits
    in row block ``g_idx`` and column ``j``, so ``W`` viewed as ``[g, C_in/g, C_out/g, k...]``
    is scaled by ``a`` viewed as ``[g, 1, C_out/g, 1...]``;
  - Gemm ``alpha * A' B' + beta * C``: columns of ``B'`` scaled, ``C := beta * C * a + b`` and
    ``beta := 1``; MatMul ``A @ W`` (rank-2 output): columns of ``W`` scaled, then ``Add(b)``.

  Otherwise it becomes ``Mul(a)`` + ``Add(b)``.

Parameters that are not compile-time constants (computed by nodes that folding left, such as
the ``ConstantOfShape`` weights of caffe2 exports) give the affine form in both modes, with
``a`` and ``b`` computed by nodes (float arithmetic in the model's type rather than float64).

The node is left on the host, with the reason, when it runs in training mode
(``training_mode=1``), when a training output (running / saved mean and variance) is consumed,
when non-constant parameters have another element type than the input, or when the input rank
(needed for the broadcast shape) is unknown.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from onnxmlu.errors import OnnxMluError
from onnxmlu.ir import is_default_domain
from onnxmlu.rewrite.base import FLOAT_DTYPES, RewriteContext, constant_value, detach, node_input
from onnxmlu.rewrite.base import tensor_dtype, tensor_shape

#: The BatchNormalization rewrites (``--bn``); the first is the default.
BN_MODES = ("substitute", "fold")
PARAM_NAMES = ("scale", "B", "mean", "var")


class BatchNormRewriter:
    name = "bn"
    op_types = ("BatchNormalization",)

    def __init__(self, bn_mode: str = "substitute", **_: object) -> None:
        if bn_mode not in BN_MODES:
            raise OnnxMluError(f"bn_mode must be one of {', '.join(BN_MODES)}, got {bn_mode!r}")
        self.mode = bn_mode

    # ------------------------------------------------------------------ check

    def check(self, node: gs.Node, ctx: RewriteContext) -> str | None:
        if ctx.opset < 7:
            return f"opset {ctx.opset} < 7 (is_test/consumed_inputs forms) is not supported"
        if node.attrs.get("training_mode", 0):
            return "training_mode=1: statistics are computed from the batch at run time (training)"
        extra = [t.name for t in node.outputs[1:] if ctx.is_used(t)]
        if extra:
            return f"training outputs are used ({', '.join(extra)}); only the inference form is rewritten"
        x = node.inputs[0]
        if tensor_dtype(x) not in FLOAT_DTYPES:
            return f"input {x.name} has element type {x.dtype}, need float16/float/double"
        params = [node_input(node, i) for i in range(1, 5)]
        dynamic = [n for n, t in zip(PARAM_NAMES, params) if constant_value(t) is None]
        mixed = [n for n, t in zip(PARAM_NAMES, params) if tensor_dtype(t) != tensor_dtype(x)]
        if dynamic and mixed:
            return (f"non-constant {'/'.join(dynamic)} and {'/'.join(mixed)} of another element type than "
                    f"{x.name}: the affine form would need casts")
        shape = tensor_shape(x)
        if shape is None:
            return f"rank of input {x.name} is unknown (shape inference gave no shape)"
        if len(shape) < 2:
            return f"input {x.name} has rank {len(shape)} < 2"
        if not dynamic and self.mode == "substitute" and _is_trivial(params):
            return "already normalization-only (scale=1, B=0)"
        return None

    # ------------------------------------------------------------------ apply

    def apply(self, node: gs.Node, ctx: RewriteContext) -> None:
        x = node.inputs[0]
        dtype = tensor_dtype(x)
        if any(constant_value(node_input(node, i)) is None for i in range(1, 5)):
            self._affine_nodes(node, ctx, ctx.builder(node, dtype))
            return
        scale, bias, mean, var = (
            constant_value(node_input(node, i)).astype(np.float64) for i in range(1, 5)
        )
        spatial = int(node.attrs.get("spatial", 1))
        rank = len(tensor_shape(x))
        # per-channel params broadcast on axis 1; spatial=0 params are [C, D1..Dn] already
        pshape = list(scale.shape) if not spatial else [scale.shape[0]] + [1] * (rank - 2)
        b = ctx.builder(node, dtype)
        if self.mode == "substitute":
            param_dtype = constant_value(node_input(node, 1)).dtype
            self._substitute(node, ctx, b, (scale, bias), pshape, param_dtype)
            return
        eps = float(node.attrs.get("epsilon", 1e-5))
        a = scale / np.sqrt(var + eps)
        shift = bias - mean * a
        if spatial and self._fold_into_producer(node, ctx, b, a, shift):
            return
        y = detach(node, ctx.graph)[0]
        scaled = b.mul(x, b.const(a.reshape(pshape), "scale"), name="scale")
        b.finish(b.add(scaled, b.const(shift.reshape(pshape), "shift"), name="shift"), y)

    @staticmethod
    def _affine_nodes(node, ctx, b) -> None:
        """Parameters that are not constants (computed by nodes: ``ConstantOfShape`` weights
        folding left, a weight chain): ``a`` and ``b`` of the affine form are computed by nodes
        too. Their inputs are constant or host work, which the node order places before the
        layers (:func:`onnxmlu.analyze.layers.hoisted_host_nodes`), so ``x * a + b`` stays in the
        block of its neighbours."""
        x = node.inputs[0]
        scale, bias, mean, var = (node_input(node, i) for i in range(1, 5))
        eps = float(node.attrs.get("epsilon", 1e-5))
        a = b.op("Div", [scale, b.unary("Sqrt", b.add(var, b.scalar(eps), name="var_eps"), name="std")], name="a")
        shift = b.sub(bias, b.mul(mean, a, name="mean_a"), name="shift")
        if int(node.attrs.get("spatial", 1)):  # per-channel [C] -> [C, 1, ..., 1]
            trailing = [1] * (len(tensor_shape(x)) - 2)
            a, shift = b.reshape(a, [-1, *trailing], name="a_c"), b.reshape(shift, [-1, *trailing], name="shift_c")
        y = detach(node, ctx.graph)[0]
        b.finish(b.add(b.mul(x, a, name="scale"), shift, name="shift_add"), y)

    @staticmethod
    def _substitute(node, ctx, b, params, pshape, param_dtype) -> None:
        scale, bias = params
        x, mean_t, var_t = node.inputs[0], node.inputs[3], node.inputs[4]
        attrs = {k: v for k, v in node.attrs.items() if k != "training_mode"}
        y = detach(node, ctx.graph)[0]
        # scale/B keep their own element type (T1 may differ from T since opset 15)
        ones = b.const(np.ones(scale.shape), "ones", dtype=param_dtype)
        zeros = b.const(np.zeros(scale.shape), "zeros", dtype=param_dtype)
        out = b.op("BatchNormalization", [x, ones, zeros, mean_t, var_t], attrs=attrs, name="norm")
        if not np.all(scale == 1.0):
            out = b.mul(out, b.const(scale.reshape(pshape), "scale"), name="scale")
        if not np.all(bias == 0.0):
            out = b.add(out, b.const(bias.reshape(pshape), "bias"), name="bias")
        b.finish(out, y)

    # ------------------------------------------------------------------ folding

    def _fold_into_producer(self, node, ctx, b, a, shift) -> bool:
        x = node.inputs[0]
        if len(x.inputs) != 1 or len(x.outputs) != 1 or x in ctx.graph.outputs:
            return False
        producer = x.inputs[0]
        in_graph = any(n is producer for n in ctx.graph.nodes)  # not an outer-scope producer
        if not is_default_domain(producer.domain) or not in_graph:
            return False
        if producer.outputs[0] is not x:
            return False
        fold = {
            "Conv": self._fold_conv,
            "ConvTranspose": self._fold_conv,
            "Gemm": self._fold_gemm,
            "MatMul": self._fold_matmul,
        }.get(producer.op)
        return bool(fold and fold(node, producer, ctx, b, a, shift))

    @staticmethod
    def _fold_conv(node, conv, ctx, b, a, shift) -> bool:
        w = constant_value(node_input(conv, 1))
        bias_t = node_input(conv, 2)
        bias = constant_value(bias_t) if bias_t is not None else np.zeros(a.shape)
        if w is None or bias is None or w.ndim < 3:
            return False
        group = int(conv.attrs.get("group", 1))
        c = a.shape[0]
        if conv.op == "Conv":
            if w.shape[0] != c:
                return False
            new_w = w * a.reshape([c] + [1] * (w.ndim - 1))
        else:
            per_group = w.shape[1]
            if per_group * group != c or w.shape[0] % group:
                return False
            grouped = w.reshape([group, w.shape[0] // group, per_group] + list(w.shape[2:]))
            factor = a.reshape([group, 1, per_group] + [1] * (w.ndim - 2))
            new_w = (grouped * factor).reshape(w.shape)
        new_bias = bias.astype(np.float64) * a + shift
        return _take_folded(node, conv, ctx, b, new_w.astype(w.dtype), new_bias.astype(w.dtype))

    @staticmethod
    def _fold_gemm(node, gemm, ctx, b, a, shift) -> bool:
        w = constant_value(node_input(gemm, 1))
        c_t = node_input(gemm, 2)
        c = constant_value(c_t) if c_t is not None else np.zeros(())
        if w is None or c is None or w.ndim != 2:
            return False
        trans_b = int(gemm.attrs.get("transB", 0))
        n = w.shape[0] if trans_b else w.shape[1]
        if n != a.shape[0]:
            return False
        new_w = w * (a[:, None] if trans_b else a[None, :])
        beta = float(gemm.attrs.get("beta", 1.0))
        new_c = beta * c.astype(np.float64) * a + shift
        gemm.attrs["beta"] = 1.0
        return _take_folded(node, gemm, ctx, b, new_w.astype(w.dtype), new_c.astype(w.dtype))

    @staticmethod
    def _fold_matmul(node, matmul, ctx, b, a, shift) -> bool:
        w = constant_value(matmul.inputs[1])
        x_shape = tensor_shape(node.inputs[0])
        if w is None or w.ndim != 2 or w.shape[1] != a.shape[0] or len(x_shape) != 2:
            return False
        y = detach(node, ctx.graph)[0]
        matmul.inputs[1] = b.const((w * a[None, :]).astype(w.dtype), "weight")
        b.finish(b.add(matmul.outputs[0], b.const(shift, "bias"), name="bias"), y)
        return True


def _take_folded(node: gs.Node, producer: gs.Node, ctx: RewriteContext, b, weight: np.ndarray,
                 bias: np.ndarray) -> bool:
    """``producer`` (a Conv, ConvTranspose or Gemm) takes the folded weight and bias (its input
    1 and 2) and the BN's output tensor: it computes the BN output directly."""
    y = detach(node, ctx.graph)[0]
    producer.inputs[1] = b.const(weight, "weight")
    bias_const = b.const(bias, "bias")
    if len(producer.inputs) > 2:
        producer.inputs[2] = bias_const
    else:
        producer.inputs.append(bias_const)
    producer.outputs[0] = y
    return True


def _is_trivial(params) -> bool:
    scale, bias = (constant_value(t) for t in params[:2])
    return bool(np.all(scale == 1.0) and np.all(bias == 0.0))
