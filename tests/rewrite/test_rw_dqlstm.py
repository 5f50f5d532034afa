"""com.microsoft DynamicQuantizeLSTM -> INT8 cells, against onnxruntime running the contrib op.

Drawn: the direction, batch, per-tensor or per-channel weight scales, int8 or uint8 weights
(with zero points), the optional bias, initial states, peepholes and clip. The products are
integer arithmetic on the same quantized values onnxruntime computes, so the tolerance is the
float one (1e-4): only the order of float additions differs. onnxruntime's kernel quantizes H
per group of ``ceil(batch / threads)`` rows when it spreads the batch over its threads, so it is
run here with one thread per row (the cells quantize each row on its own); the cells are also
held to an exact integer reference in numpy (dqlstm_reference.py), which no host changes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto
from dqlstm_reference import dq_lstm_model, dq_lstm_reference
from rw_util import assert_close, op_types, run_ort

from onnxmlu import api
from onnxmlu.runtime import InferenceSession

from onnxmlu.rewrite import rewrite_model

F = TensorProto.FLOAT


def check(model, rng, seq=5, batch=1, inp=4):
    rewritten, report = rewrite_model(model)
    assert report.applied["dqlstm"] == 1, report.skipped
    assert "DynamicQuantizeLSTM" not in op_types(rewritten)
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= set(op_types(rewritten))
    x = {"x": rng.uniform(-2, 2, (seq, batch, inp)).astype(np.float32)}
    assert_close(run_ort(rewritten, x), run_ort(model, x, threads=batch), what="DynamicQuantizeLSTM")


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


@pytest.mark.parametrize("direction, batch, hidden", [("bidirectional", 2, 128), ("forward", 3, 300),
                                                      ("reverse", 6, 64), ("forward", 1, 64)])
def test_cells_match_the_exact_integer_reference(direction, batch, hidden, library):
    """Realistic sizes, s8 weights over the whole range (their u8 x s8 pair sums saturate 16 bits
    on x86 without VNNI): the rewritten and the fused model against numpy's integer products.
    H is quantized per row where onnxruntime spreads the batch over threads (batch > 4, or
    batch >= 2 with hidden <= 256), else over the batch."""
    rng = np.random.default_rng(hidden + batch)
    model = dq_lstm_model(rng, direction=direction, batch=batch, seq=6, inp=96, hidden=hidden)
    x = rng.uniform(-2, 2, (6, batch, 96)).astype(np.float32)
    exact = dq_lstm_reference(model, x, rows_apart=batch > 4 or (batch >= 2 and hidden <= 256))
    rewritten, _ = rewrite_model(model)
    np.testing.assert_allclose(run_ort(rewritten, {"x": x})[0], exact, rtol=0, atol=1e-4)
    fused = InferenceSession(api.fuse(model).model)
    np.testing.assert_allclose(fused.run(["Y"], {"x": x})[0], exact, rtol=0, atol=1e-4)
