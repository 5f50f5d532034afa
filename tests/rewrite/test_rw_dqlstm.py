"""com.microsoft DynamicQuantizeLSTM -> INT8 cells, against onnxruntime running the contrib op.

Drawn: the direction, batch, per-tensor or per-channel weight scales, int8 or uint8 weights
(with zero points), the optional bias, initial states, peepholes and clip. The products are
integer arithmetic on the same quantized values onnxruntime computes, so the tolerance is the
float one (1e-4): only the order of float additions differs."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from rw_util import assert_close, op_types, run_ort

from onnxmlu.rewrite import rewrite_model

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


def check(model, rng, seq=5, batch=1, inp=4):
    rewritten, report = rewrite_model(model)
    assert report.applied["dqlstm"] == 1, report.skipped
    assert "DynamicQuantizeLSTM" not in op_types(rewritten)
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= set(op_types(rewritten))
    x = {"x": rng.uniform(-2, 2, (seq, batch, inp)).astype(np.float32)}
    assert_close(run_ort(rewritten, x), run_ort(model, x), what="DynamicQuantizeLSTM")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(direction=st.sampled_from(["forward", "reverse", "bidirectional"]), batch=st.sampled_from([1, 2]),
       per_channel=st.booleans(), signed=st.booleans(), bias=st.booleans(), initial=st.booleans(),
       peep=st.booleans(), clip=st.sampled_from([None, 0.8]), seed=st.integers(0, 2**16))
def test_matches_onnxruntime(direction, batch, per_channel, signed, bias, initial, peep, clip, seed):
    rng = np.random.default_rng(seed)
    model = dq_lstm_model(rng, direction=direction, batch=batch, per_channel=per_channel, signed=signed,
                          bias=bias, initial=initial, peep=peep, clip=clip)
    check(model, rng, batch=batch)


def test_full_constant_lengths_are_fine_and_shorter_ones_are_refused():
    rng = np.random.default_rng(1)
    check(dq_lstm_model(rng, lens=5), rng)
    _, report = rewrite_model(dq_lstm_model(rng, lens=3))
    assert report.applied["dqlstm"] == 0 and "max(sequence_lens)" in report.skipped[0].message


@pytest.mark.parametrize("steps", [64])
def test_long_bidirectional(steps):
    rng = np.random.default_rng(2)
    check(dq_lstm_model(rng, direction="bidirectional", seq=steps, bias=True), rng, seq=steps)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(direction=st.sampled_from(["forward", "reverse", "bidirectional"]), per_channel=st.booleans(),
       peep=st.booleans(), seed=st.integers(0, 2**16))
def test_a_symbolic_length_loops_over_time_and_matches_at_every_length(direction, per_channel, peep, seed):
    """X [T, 1, 4] with T symbolic: one Scan per direction (X quantized once before it, H per
    step inside), run at several lengths against onnxruntime's kernel."""
    rng = np.random.default_rng(seed)
    model = dq_lstm_model(rng, direction=direction, per_channel=per_channel, peep=peep)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "T"
    rewritten, report = rewrite_model(model)
    assert report.applied["dqlstm"] == 1, report.skipped
    assert "Scan" in op_types(rewritten)
    for seq in (1, 4, 9):
        x = {"x": rng.uniform(-2, 2, (seq, 1, 4)).astype(np.float32)}
        assert_close(run_ort(rewritten, x), run_ort(model, x), what=f"DynamicQuantizeLSTM at T={seq}")
