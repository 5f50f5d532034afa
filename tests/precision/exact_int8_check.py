"""Exact INT8 arithmetic, checked against an integer reference in numpy: run by
test_exact_int8.py in its own process and under ``qemu-x86_64 -cpu <CPU without VNNI>``.

Layers whose 8-bit products saturate 16-bit pair sums (activations near +-127 or 255 times
weights near +-127: ``2 * 255 * 127 > 32767``), each built from its own seed:

* ``qdq_conv``: a QDQ Conv (s8 activations, s8 weights per tensor, s8 output), fused into an
  INT8 block; reference ``y = clip(round(sum_k x_k w_k * s_x s_w / s_y)) * s_y`` with the sum
  in int64;
* ``matmul_integer``: MatMulInteger u8 x s8 (an imported QOperator layer), int32 output; its
  reference is the integer product itself;
* ``matmul_integer_in_if``: the same inside the branches of an If;
* ``qlinear_conv_s8``: QLinearConv s8 x s8, which onnxruntime cannot load with the exact entry;
* ``qlinear_matmul_u8``: QLinearMatMul u8 x s8 at opset 21, which onnxruntime's s8 -> u8 pass
  does not match (onnxmlu/rewrite/qlinearmatmul.py gives it u8 weights);
* ``qlinear_matmul_7bit``: the same with weights within +-64, which cannot saturate: kept s8;
* ``qdq_matmul``: a QDQ MatMul at opset 21, u8 activations by s8 weights;
* ``matmul_integer_to_float``, ``qgemm``: com.microsoft's u8 x s8 products with a float output
  (they stay on the host; the reference session must give them u8 weights itself);
* ``qlinear_matmul_shared``, ``matmul_integer_shared``: QOperator products sharing one s8
  weight, and ``qdq_matmul_weight_read_outside``: a dequantized weight a host node also reads
  (onnxruntime's s8 -> u8 pass fails on each unless the fuse gives every reader its own copy:
  onnxmlu.sessions.unshare_dequantized_weights);
* ``dq_lstm``: a DynamicQuantizeLSTM (s8 weights over the whole range, batch 1), rewritten into
  INT8 cells; reference tests/rewrite/dqlstm_reference.py, its float epilogue (gates) within
  1e-4.

* ``qlinear_conv_s8_in_if``: ``qlinear_conv_s8`` in an If's branches;
* ``s8_and_u8_products``: ``matmul_integer`` and ``qlinear_conv_s8`` in one block, which loads
  only without the exact entry;
* ``s8_conv_and_u8_qdq_conv``: ``qdq_conv`` with u8 activations and ``qlinear_conv_s8`` in one
  block: its QDQ layer must be exact without the entry too;
* ``qattention``: com.microsoft QAttention u8 x s8, its float attention within 1e-4.

Prints one JSON object: per layer the largest difference, in output quantization steps (the
LSTM and QAttention: in units of 1e-4), of the fused model, onnxmlu's reference session,
(``default``) plain onnxruntime at its default options, which shows whether the CPU the process
runs on saturates at all, (``options``) plain onnxruntime with the options the package's
evaluator and calibration sessions give the model (onnxmlu.sessions.new_options), (``timing``)
the plain session the demo, benchmarks and profiles time the original with
(onnxmlu.tools.timing.plain_session), (``whole``) onnxmlu.InferenceSession given the original
model itself and (``external``) given the original's file, its weights in an external file.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from onnxmlu import api
from onnxmlu.runtime import InferenceSession, reference_session
from onnxmlu.sessions import exact_loadable, new_options
from onnxmlu.tools.timing import plain_session

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "rewrite"))
from dqlstm_reference import dq_lstm_model, dq_lstm_reference  # noqa: E402 - a sibling folder's helper

C, K = 32, 16
SX, SW, SY = 0.05, 0.01, 40.0


def _signs(rng: np.random.Generator, shape) -> np.ndarray:
    return np.where(rng.random(shape) < 0.5, 1, -1)


def _model(nodes, inputs, outputs, inits, opset: int = 17, contrib: bool = False) -> onnx.ModelProto:
    opsets = [helper.make_opsetid("", opset)] + ([helper.make_opsetid("com.microsoft", 1)] if contrib else [])
    model = helper.make_model(helper.make_graph(nodes, "exact", inputs, outputs, inits), opset_imports=opsets)
    model.ir_version = 10 if opset >= 21 else 8
    return model


def _u8_by_s8(rng: np.random.Generator):
    """s8 weights near +-127 ([64, 8]) and u8 activations 240..255 ([4, 64]): every pair of
    products is past 16 bits."""
    w = (rng.integers(100, 128, (64, 8)) * _signs(rng, (64, 8))).astype(np.int8)
    return w, rng.integers(240, 256, (4, 64)).astype(np.uint8)


def qdq_conv(rng: np.random.Generator, activation_zero: np.integer | None = None):
    """The QDQ Conv, an input ``x`` that quantizes to +-(120..127) from ``activation_zero`` (the
    input's and output's zero point, s8 0 (None) or u8 128: the same exact output), and the exact output."""
    activation_zero = np.int8(0) if activation_zero is None else activation_zero
    w = (rng.integers(100, 128, (K, C, 3, 3)) * _signs(rng, (K, C, 3, 3))).astype(np.int8)
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.float32(SW), "sw"),
             numpy_helper.from_array(np.float32(SX), "sx"), numpy_helper.from_array(np.float32(SY), "sy"),
             numpy_helper.from_array(np.int8(0), "z"), numpy_helper.from_array(activation_zero, "za")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "sx", "za"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "sx", "za"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "sw", "z"], ["wd"]),
             helper.make_node("Conv", ["xd", "wd"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("QuantizeLinear", ["c", "sy", "za"], ["yq"]),
             helper.make_node("DequantizeLinear", ["yq", "sy", "za"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, C, 8, 8])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, K, 8, 8])], inits)
    xq = rng.integers(120, 128, (1, C, 8, 8)) * _signs(rng, (1, C, 8, 8))
    padded = np.pad(xq, ((0, 0), (0, 0), (1, 1), (1, 1)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3))  # [1, C, 8, 8, 3, 3]
    acc = np.einsum("nchwij,kcij->nkhw", windows.astype(np.int64), w.astype(np.int64))
    exact = np.clip(np.round(acc * (SX * SW / SY)), -128, 127) * SY
    return model, {"x": (xq * SX).astype(np.float32)}, exact, SY


def matmul_integer(rng: np.random.Generator):
    """MatMulInteger u8 x s8 with activations 240..255, and its exact int32 product."""
    w = (rng.integers(100, 128, (64, 8)) * _signs(rng, (64, 8))).astype(np.int8)
    model = _model([helper.make_node("MatMulInteger", ["a", "w"], ["y"])],
                   [helper.make_tensor_value_info("a", TensorProto.UINT8, [4, 64])],
                   [helper.make_tensor_value_info("y", TensorProto.INT32, [4, 8])],
                   [numpy_helper.from_array(w, "w")])
    a = rng.integers(240, 256, (4, 64)).astype(np.uint8)
    return model, {"a": a}, a.astype(np.int64) @ w.astype(np.int64), 1.0


def matmul_integer_in_if(rng: np.random.Generator):
    """``matmul_integer``'s product inside both branches of an If (the condition an input): a
    QOperator layer in a subgraph, which the reference must give u8 weights too."""
    model, feeds, exact, step = matmul_integer(rng)
    return _in_if(model, helper.make_tensor_value_info("y", TensorProto.INT32, [4, 8])), _with_cond(feeds), exact, step


def _in_if(model: onnx.ModelProto, output: onnx.ValueInfoProto, inits=()) -> onnx.ModelProto:
    """``model``'s one node moved into both branches of an If whose condition is a new input
    ``cond``; each branch writes ``output`` and holds ``inits`` as its own initializers."""
    branches = [helper.make_graph([model.graph.node[0]], name, [], [output], list(inits)) for name in ("then", "else")]
    del model.graph.node[:]
    model.graph.node.append(helper.make_node("If", ["cond"], ["y"], then_branch=branches[0], else_branch=branches[1]))
    model.graph.input.append(helper.make_tensor_value_info("cond", TensorProto.BOOL, []))
    return model


def _with_cond(feeds: dict) -> dict:
    return {**feeds, "cond": np.array(True)}


def qlinear_conv_s8(rng: np.random.Generator):
    """QLinearConv with s8 activations and s8 weights (imported QOperator): onnxruntime cannot
    load it with the exact entry on a CPU without VNNI; its s8 x s8 kernel is exact without."""
    w = (rng.integers(100, 128, (K, C, 3, 3)) * _signs(rng, (K, C, 3, 3))).astype(np.int8)
    one, zero = np.float32(1.0), np.int8(0)
    inits = [numpy_helper.from_array(v, n) for n, v in (("s", one), ("z", zero), ("w", w), ("sy", np.float32(4096.0)))]
    nodes = [helper.make_node("QLinearConv", ["a", "s", "z", "w", "s", "z", "sy", "z"], ["y"], pads=[1, 1, 1, 1])]
    model = _model(nodes, [helper.make_tensor_value_info("a", TensorProto.INT8, [1, C, 8, 8])],
                   [helper.make_tensor_value_info("y", TensorProto.INT8, [1, K, 8, 8])], inits)
    a = rng.integers(120, 128, (1, C, 8, 8)) * _signs(rng, (1, C, 8, 8))
    windows = np.lib.stride_tricks.sliding_window_view(np.pad(a, ((0, 0), (0, 0), (1, 1), (1, 1))), (3, 3), axis=(2, 3))
    acc = np.einsum("nchwij,kcij->nkhw", windows.astype(np.int64), w.astype(np.int64))
    return model, {"a": a.astype(np.int8)}, np.clip(np.round(acc / 4096.0), -128, 127), 1.0


def qlinear_matmul_u8(rng: np.random.Generator):
    """QLinearMatMul u8 x s8 at opset 21 (onnxruntime's s8 -> u8 pass matches only since-version
    10), requantized to u8 by 1/4096, and its exact output."""
    w, a = _u8_by_s8(rng)
    inits = [numpy_helper.from_array(v, n) for n, v in (("s", np.float32(1.0)), ("za", np.uint8(0)), ("w", w),
                                                        ("zw", np.int8(0)), ("sy", np.float32(4096.0)))]
    nodes = [helper.make_node("QLinearMatMul", ["a", "s", "za", "w", "s", "zw", "sy", "za"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("a", TensorProto.UINT8, [4, 64])],
                   [helper.make_tensor_value_info("y", TensorProto.UINT8, [4, 8])], inits, opset=21)
    return model, {"a": a}, np.clip(np.round(a.astype(np.int64) @ w.astype(np.int64) / 4096.0), 0, 255), 1.0


def qlinear_matmul_7bit(rng: np.random.Generator):
    """``qlinear_matmul_u8`` with weights +-(40..64): every u8 x s8 pair sum fits 16 bits
    (``2 * 255 * 64 = 32640``), so the fuse keeps the s8 weights and even plain onnxruntime's
    AVX2 kernels are exact (``default`` 0 under Skylake-Client is the proof of the bound)."""
    model, _, _, step = qlinear_matmul_u8(rng)
    w = (rng.integers(40, 65, (64, 8)) * _signs(rng, (64, 8))).astype(np.int8)
    a = rng.integers(240, 256, (4, 64)).astype(np.uint8)
    model.graph.initializer[2].CopyFrom(numpy_helper.from_array(w, "w"))
    model.graph.initializer[4].CopyFrom(numpy_helper.from_array(np.float32(2048.0), "sy"))
    exact = np.clip(np.round(a.astype(np.int64) @ w.astype(np.int64) / 2048.0), 0, 255)
    return model, {"a": a}, exact, step


def qdq_matmul(rng: np.random.Generator):
    """A QDQ MatMul at opset 21, u8 activations (zero point 128) by s8 weights, u8 output."""
    w, _ = _u8_by_s8(rng)
    inits = [numpy_helper.from_array(v, n) for n, v in (("w", w), ("sw", np.float32(SW)), ("sx", np.float32(SX)),
                                                        ("sy", np.float32(SY)), ("za", np.uint8(128)),
                                                        ("z", np.int8(0)))]
    nodes = [helper.make_node("QuantizeLinear", ["x", "sx", "za"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "sx", "za"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "sw", "z"], ["wd"]),
             helper.make_node("MatMul", ["xd", "wd"], ["c"]),
             helper.make_node("QuantizeLinear", ["c", "sy", "za"], ["yq"]),
             helper.make_node("DequantizeLinear", ["yq", "sy", "za"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])], inits, opset=21)
    q = rng.integers(120, 128, (4, 64)) * _signs(rng, (4, 64))  # x - 128 after quantization
    acc = q.astype(np.int64) @ w.astype(np.int64)
    exact = (np.clip(np.round(acc * (SX * SW / SY)) + 128, 0, 255) - 128) * SY
    return model, {"x": (q * SX).astype(np.float32)}, exact, SY


def qlinear_matmul_shared(rng: np.random.Generator):
    """Two QLinearMatMul u8 x s8 (opset 13, which onnxruntime's s8 -> u8 pass matches) reading
    one weight and zero point, their outputs concatenated: a QOperator weight shared inside a
    block that arrives quantized."""
    model, feeds, exact, step = qlinear_matmul_u8(rng)
    model.opset_import[0].version, model.ir_version = 13, 8
    second = onnx.NodeProto()
    second.CopyFrom(model.graph.node[0])
    second.input[0], second.output[0] = "a2", "y2"
    model.graph.node[0].output[0] = "y1"
    model.graph.node.extend([second, helper.make_node("Concat", ["y1", "y2"], ["y"], axis=0)])
    model.graph.input.append(helper.make_tensor_value_info("a2", TensorProto.UINT8, [4, 64]))
    model.graph.output[0].type.tensor_type.shape.dim[0].dim_value = 8
    return model, {**feeds, "a2": feeds["a"][::-1].copy()}, np.concatenate([exact, exact[::-1]]), step


def matmul_integer_shared(rng: np.random.Generator):
    """Two MatMulInteger u8 x s8 reading one weight (as a DynamicQuantizeLinear chain's do), the
    int32 products concatenated."""
    model, feeds, exact, step = matmul_integer(rng)
    model.graph.node[0].output[0] = "y1"
    model.graph.node.extend([helper.make_node("MatMulInteger", ["a2", "w"], ["y2"]),
                             helper.make_node("Concat", ["y1", "y2"], ["y"], axis=0)])
    model.graph.input.append(helper.make_tensor_value_info("a2", TensorProto.UINT8, [4, 64]))
    model.graph.output[0].type.tensor_type.shape.dim[0].dim_value = 8
    return model, {**feeds, "a2": feeds["a"][::-1].copy()}, np.concatenate([exact, exact[::-1]]), step


def qdq_matmul_weight_read_outside(rng: np.random.Generator):
    """``qdq_matmul`` whose dequantized weight a host node (TopK) also reads: the block's body
    returns it, so its DequantizeLinear has a reader outside the block."""
    model, feeds, exact, step = qdq_matmul(rng)
    model.graph.initializer.append(numpy_helper.from_array(np.array([2], np.int64), "k"))
    model.graph.node.append(helper.make_node("TopK", ["wd", "k"], ["top", "top_index"]))
    model.graph.output.append(helper.make_tensor_value_info("top", TensorProto.FLOAT, [64, 2]))
    return model, feeds, exact, step


def matmul_integer_to_float(rng: np.random.Generator):
    """com.microsoft MatMulIntegerToFloat u8 x s8 (scales 1: the float output is the int32
    product, exact in float32 at these sizes)."""
    w, a = _u8_by_s8(rng)
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.float32(1.0), "s")]
    nodes = [helper.make_node("MatMulIntegerToFloat", ["a", "w", "s", "s"], ["y"], domain="com.microsoft")]
    model = _model(nodes, [helper.make_tensor_value_info("a", TensorProto.UINT8, [4, 64])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])], inits, contrib=True)
    return model, {"a": a}, a.astype(np.int64) @ w.astype(np.int64), 1.0


def qgemm(rng: np.random.Generator):
    """com.microsoft QGemm u8 x s8 with a float output (no y_scale): the int32 product."""
    w, a = _u8_by_s8(rng)
    inits = [numpy_helper.from_array(v, n) for n, v in (("s", np.float32(1.0)), ("za", np.uint8(0)), ("w", w),
                                                        ("zw", np.int8(0)))]
    nodes = [helper.make_node("QGemm", ["a", "s", "za", "w", "s", "zw"], ["y"], domain="com.microsoft")]
    model = _model(nodes, [helper.make_tensor_value_info("a", TensorProto.UINT8, [4, 64])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])], inits, contrib=True)
    return model, {"a": a}, a.astype(np.int64) @ w.astype(np.int64), 1.0


def dq_lstm(rng: np.random.Generator):
    """A forward DynamicQuantizeLSTM, 64 inputs, hidden 64, 6 steps, batch 1, and its exact Y."""
    model = dq_lstm_model(rng, seq=6, inp=64, hidden=64)
    del model.graph.output[1:]  # Y only
    model.graph.node[0].output[1:] = []
    x = rng.uniform(-2, 2, (6, 1, 64)).astype(np.float32)
    return model, {"x": x}, dq_lstm_reference(model, x, rows_apart=False), 1e-4


def qlinear_conv_s8_in_if(rng: np.random.Generator):
    """``qlinear_conv_s8`` inside both branches of an If, each branch holding its own weights:
    onnxruntime's exact pass reaches into the branches, so a session given the exact entry
    cannot load it (onnxmlu.sessions.needs_default_kernels must look there)."""
    model, feeds, exact, step = qlinear_conv_s8(rng)
    inits = list(model.graph.initializer)
    del model.graph.initializer[:]
    return _in_if(model, model.graph.output[0], inits), _with_cond(feeds), exact, step


def s8_and_u8_products(rng: np.random.Generator):
    """``matmul_integer`` (u8 x s8) beside ``qlinear_conv_s8`` (s8 x s8) in one block: the block
    loads only without the exact entry, so its u8 x s8 product must be exact without it. The
    MatMulInteger's output is checked."""
    return _beside_s8_conv(rng, matmul_integer)


def s8_conv_and_u8_qdq_conv(rng: np.random.Generator):
    """``qdq_conv`` with u8 activations (zero point 128: ``x`` quantizes to 1..255) beside
    ``qlinear_conv_s8`` in one block: onnxruntime's QDQ fusion makes the QDQ layer a u8 x s8
    kernel, and the block loads only without the exact entry. The QDQ Conv's output is checked."""
    return _beside_s8_conv(rng, lambda r: qdq_conv(r, activation_zero=np.uint8(128)))


def _beside_s8_conv(rng: np.random.Generator, build):
    """``qlinear_conv_s8`` and ``build``'s layer (every name of it suffixed ``2``) in one model,
    ``build``'s output first (the one checked)."""
    model, feeds, _, _ = qlinear_conv_s8(rng)
    product, product_feeds, exact, step = build(rng)
    for node in product.graph.node:
        node.input[:] = [f"{name}2" if name else name for name in node.input]
        node.output[:] = [f"{name}2" for name in node.output]
    for value in [*product.graph.initializer, *product.graph.input, *product.graph.output]:
        value.name = f"{value.name}2"
    model.graph.node.extend(product.graph.node)
    model.graph.initializer.extend(product.graph.initializer)
    model.graph.input.extend(product.graph.input)
    model.graph.output.insert(0, product.graph.output[0])
    return model, {**feeds, **{f"{name}2": value for name, value in product_feeds.items()}}, exact, step


def qattention(rng: np.random.Generator):
    """com.microsoft QAttention (its contrib schema: input u8 [B, S, H], weight s8 [H, 3H], bias,
    input and weight scales, no mask, zero points; 2 heads), activations 240..255 by weights
    near +-127; reference: the exact int64 product scaled, then attention in float64. Its
    u8 x s8 product saturates like MatMulInteger's on CPUs without VNNI; in units of 1e-4."""
    batch, seq, hidden, heads = 1, 4, 16, 2
    w = (rng.integers(100, 128, (hidden, 3 * hidden)) * _signs(rng, (hidden, 3 * hidden))).astype(np.int8)
    a = rng.integers(240, 256, (batch, seq, hidden)).astype(np.uint8)
    scale = np.float32(1e-3)
    inits = [numpy_helper.from_array(v, n) for n, v in (("w", w), ("b", np.zeros(3 * hidden, np.float32)),
                                                        ("s", scale), ("za", np.uint8(0)), ("zw", np.int8(0)))]
    nodes = [helper.make_node("QAttention", ["a", "w", "b", "s", "s", "", "za", "zw"], ["y"], domain="com.microsoft",
                              num_heads=heads)]
    model = _model(nodes, [helper.make_tensor_value_info("a", TensorProto.UINT8, [batch, seq, hidden])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, seq, hidden])], inits, contrib=True)
    qkv = (a.astype(np.int64) @ w.astype(np.int64)) * (float(scale) * float(scale))
    q, k, v = (x.reshape(batch, seq, heads, -1).transpose(0, 2, 1, 3) for x in np.split(qkv, 3, axis=-1))
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hidden // heads)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    exact = ((p / p.sum(-1, keepdims=True)) @ v).transpose(0, 2, 1, 3).reshape(batch, seq, hidden)
    return model, {"a": a}, exact, 1e-4


def _steps(got: np.ndarray, exact: np.ndarray, step: float) -> float:
    return float(np.max(np.abs(got.astype(np.float64) - exact)) / step)


#: The layers checked, each built from its own seeded generator.
LAYERS = {"qdq_conv": qdq_conv, "matmul_integer": matmul_integer, "qlinear_conv_s8": qlinear_conv_s8,
          "qlinear_matmul_u8": qlinear_matmul_u8, "qdq_matmul": qdq_matmul,
          "matmul_integer_to_float": matmul_integer_to_float, "qgemm": qgemm, "dq_lstm": dq_lstm,
          "matmul_integer_in_if": matmul_integer_in_if, "qlinear_matmul_shared": qlinear_matmul_shared,
          "matmul_integer_shared": matmul_integer_shared,
          "qdq_matmul_weight_read_outside": qdq_matmul_weight_read_outside,
          "qlinear_conv_s8_in_if": qlinear_conv_s8_in_if, "qattention": qattention,
          "s8_and_u8_products": s8_and_u8_products, "qlinear_matmul_7bit": qlinear_matmul_7bit,
          "s8_conv_and_u8_qdq_conv": s8_conv_and_u8_qdq_conv}


def _with_package_options(model: onnx.ModelProto) -> ort.InferenceSession:
    """Plain onnxruntime as the package's evaluator and calibration load a model (its options and
    bytes: onnxmlu.sessions)."""
    return ort.InferenceSession(exact_loadable(model), new_options("all", model=model),
                                providers=["CPUExecutionProvider"])


def _external(model: onnx.ModelProto, folder: str, name: str) -> str:
    """``model`` saved in ``folder`` with its weights (every tensor of 64 bytes or more) in an
    external file; the model file's path."""
    path = str(Path(folder) / f"{name}.onnx")
    onnx.save(model, path, save_as_external_data=True, location=f"{name}.data", size_threshold=64)
    return path


def check() -> dict[str, dict[str, float]]:
    with tempfile.TemporaryDirectory() as folder:
        return _check_in(folder)


def _check_in(folder: str) -> dict[str, dict[str, float]]:
    result = {}
    for seed, (name, build) in enumerate(LAYERS.items()):
        model, feeds, exact, step = build(np.random.default_rng(seed))
        fused = api.fuse(model, precision="int8").model
        default = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        result[name] = {
            "fused": _steps(InferenceSession(fused).run(None, feeds)[0], exact, step),
            "reference": _steps(reference_session(model).run(None, feeds)[0], exact, step),
            "default": _steps(default.run(None, feeds)[0], exact, step),
            "options": _steps(_with_package_options(model).run(None, feeds)[0], exact, step),
            "timing": _steps(plain_session(model, 1).run(None, feeds)[0], exact, step),
            "whole": _steps(InferenceSession(model).run(None, feeds)[0], exact, step),
            "external": _steps(InferenceSession(_external(model, folder, name)).run(None, feeds)[0], exact, step),
        }
    return result


def third_party_file() -> float:
    """``qlinear_matmul_shared`` fused as if by a tool that leaves the weight shared (the fuse's
    unsharing switched off), run twice by one session: the library retries its block without the
    exact entry and (on a CPU without VNNI) warns once, not per run. Returns the fused model's steps from exact."""
    from unittest import mock

    model, feeds, exact, step = qlinear_matmul_shared(np.random.default_rng(0))
    with mock.patch("onnxmlu.collapse.own.unshare_dequantized_weights", lambda graph: 0):
        fused = api.fuse(model, precision="int8").model
    session = InferenceSession(fused)
    runs = [session.run(None, feeds)[0] for _ in range(2)]
    return max(_steps(got, exact, step) for got in runs)


if __name__ == "__main__":
    print(json.dumps(third_party_file() if sys.argv[1:] == ["third-party"] else check()))
