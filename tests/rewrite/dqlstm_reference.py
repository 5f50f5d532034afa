"""com.microsoft DynamicQuantizeLSTM in numpy with exact integer products (int64 sums): the
reference the INT8 cells are held to, on every host.

Per direction: X (all steps and rows at once) is quantized to u8 with one scale and zero point
(``min = min(0, min X)``, ``max = max(0, max X)``, ``s = (max - min) / 255`` or 1 when they are
equal, ``z = round_half_even(clip(-min / s, 0, 255))``, ``q = clip(round(x / s) + z, 0, 255)``);
each step's H is quantized the same way one batch row at a time when ``rows_apart`` (what
onnxruntime's kernel does when it spreads the batch over as many threads as rows), else over
the whole [batch, hidden] matrix. A product is ``float(sum (q - z)(w - z_w)) * (s * s_w)``.
Gates i, o, f, c; sigmoid, tanh, tanh; bias Wb + Rb; no peepholes, clip or sequence lengths.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F = TensorProto.FLOAT


def dq_lstm_model(rng, *, direction="forward", batch=1, seq=5, inp=4, hidden=3, per_channel=False,
                  signed=True, bias=True, initial=False, peep=False, clip=None, lens=None) -> onnx.ModelProto:
    ndir = 2 if direction == "bidirectional" else 1
    qtype = np.int8 if signed else np.uint8
    low, high = (-128, 128) if signed else (0, 256)
    scale_shape = (ndir, 4 * hidden) if per_channel else (ndir,)
    inits = {
        "W": rng.integers(low, high, (ndir, inp, 4 * hidden)).astype(qtype),
        "R": rng.integers(low, high, (ndir, hidden, 4 * hidden)).astype(qtype),
        "W_scale": rng.uniform(0.001, 0.01, scale_shape).astype(np.float32),
        # onnxruntime takes uint8 weights with one zero point across the channels only
        "W_zero": np.full(scale_shape, 0 if signed else rng.integers(100, 156), qtype),
        "R_scale": rng.uniform(0.001, 0.01, scale_shape).astype(np.float32),
        "R_zero": np.full(scale_shape, 0 if signed else 128, qtype),
    }
    names = ["x", "W", "R", "", "", "", "", "", "W_scale", "W_zero", "R_scale", "R_zero"]
    if bias:
        inits["B"], names[3] = rng.uniform(-0.5, 0.5, (ndir, 8 * hidden)).astype(np.float32), "B"
    if lens is not None:
        inits["lens"], names[4] = np.full(batch, lens, np.int32), "lens"
    if initial:
        inits["h0"], names[5] = rng.uniform(-1, 1, (ndir, batch, hidden)).astype(np.float32), "h0"
        inits["c0"], names[6] = rng.uniform(-1, 1, (ndir, batch, hidden)).astype(np.float32), "c0"
    if peep:
        inits["P"], names[7] = rng.uniform(-0.5, 0.5, (ndir, 3 * hidden)).astype(np.float32), "P"
    attrs = {"hidden_size": hidden, "direction": direction} | ({"clip": clip} if clip else {})
    node = helper.make_node("DynamicQuantizeLSTM", names, ["Y", "Y_h", "Y_c"], domain="com.microsoft",
                            name="dq", **attrs)
    graph = helper.make_graph(
        [node], "dq", [helper.make_tensor_value_info("x", F, [seq, batch, inp])],
        [helper.make_tensor_value_info(n, F, None) for n in ("Y", "Y_h", "Y_c")],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    return model


def _quantized(a: np.ndarray) -> tuple[np.ndarray, np.float32, int]:
    low, high = min(float(a.min()), 0.0), max(float(a.max()), 0.0)
    scale = np.float32((np.float32(high) - np.float32(low)) / np.float32(255)) if high != low else np.float32(1)
    zero = int(np.round(np.clip(np.float32(0) - np.float32(low) / scale, 0, 255)))
    return np.clip(np.round(a / scale) + zero, 0, 255).astype(np.int64), scale, zero


def _product(a: np.ndarray, w: np.ndarray, w_scale: np.ndarray, w_zero: np.ndarray) -> np.ndarray:
    q, scale, zero = _quantized(a)
    acc = (q - zero) @ (w.astype(np.int64) - w_zero.astype(np.int64))
    return acc.astype(np.float32) * (scale * w_scale).astype(np.float32)


def _sigmoid(v: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-v))


def _direction(x, w, r, bias, params, rows_apart: bool) -> np.ndarray:
    seq, batch, _ = x.shape
    hidden = r.shape[0]
    gx = _product(x.reshape(seq * batch, -1), w, *params[:2]).reshape(seq, batch, -1)
    h, c, ys = np.zeros((batch, hidden), np.float32), np.zeros((batch, hidden), np.float32), []
    for t in range(seq):
        gh = (np.concatenate([_product(h[k:k + 1], r, *params[2:]) for k in range(batch)]) if rows_apart
              else _product(h, r, *params[2:]))
        i, o, f, g = np.split(gx[t] + gh + bias, 4, axis=1)
        c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
        h = (_sigmoid(o) * np.tanh(c)).astype(np.float32)
        ys.append(h)
    return np.stack(ys)


def dq_lstm_reference(model, x: np.ndarray, rows_apart: bool) -> np.ndarray:
    """Y [seq, num_dir, batch, hidden] of the model's one DynamicQuantizeLSTM node."""
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    node = model.graph.node[0]
    w, r = inits[node.input[1]], inits[node.input[2]]
    direction = next((a.s.decode() for a in node.attribute if a.name == "direction"), "forward")
    hidden = r.shape[1]
    bias = inits[node.input[3]] if node.input[3] else np.zeros((w.shape[0], 8 * hidden), np.float32)
    ys = []
    for d in range(w.shape[0]):
        reverse = direction == "reverse" or d == 1
        params = [inits[node.input[k]][d] for k in (8, 9, 10, 11)]
        y = _direction(x[::-1] if reverse else x, w[d], r[d], bias[d, :4 * hidden] + bias[d, 4 * hidden:], params,
                       rows_apart)
        ys.append(y[::-1] if reverse else y)
    return np.stack(ys, 1)
