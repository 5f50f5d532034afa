"""Block-quantized weights are priced at the bytes the file stores (``bits / 8`` a value plus the
per-block scales and zero points), computed on the INT8 path; weights quantized per tensor or
per axis keep their one byte a value (onnxmlu.analyze.quantized, "Block-quantized weights")."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxmlu import api
from onnxmlu.plan.perf.hardware import load_hardware
from onnxmlu.plan.perf.model import layer_estimates

K, N, BLOCK, ROWS = 128, 64, 32, 8
BLOCKS = K // BLOCK


def _model(nodes, inits, opsets) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [ROWS, K])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [ROWS, N])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()])
    model.ir_version = 10
    return model


def _pack(q: np.ndarray, bits: int) -> np.ndarray:
    """``bits``-wide values along the last axis packed into bytes, the low bits first."""
    per = 8 // bits
    q = q.astype(np.uint8).reshape(*q.shape[:-1], -1, per)
    return sum(q[..., j] << (j * bits) for j in range(per)).astype(np.uint8)


def nbits_model(bits: int, level: int) -> tuple[onnx.ModelProto, dict[str, int]]:
    """One MatMulNBits (zero points packed) and the bytes of its B, scales and zero points."""
    rng = np.random.default_rng(bits)
    q = rng.integers(0, 2 ** bits, (N, BLOCKS, BLOCK))
    zp = _pack(rng.integers(0, 2 ** bits, (N, BLOCKS)), bits)
    b, s = _pack(q, bits), rng.uniform(0.01, 0.02, (N, BLOCKS)).astype(np.float32)
    node = helper.make_node("MatMulNBits", ["a", "B", "s", "zp"], ["y"], domain="com.microsoft", K=K, N=N,
                            bits=bits, block_size=BLOCK, accuracy_level=level, name="linear")
    inits = [numpy_helper.from_array(v, n) for v, n in ((b, "B"), (s, "s"), (zp, "zp"))]
    return _model([node], inits, {"": 21, "com.microsoft": 1}), {"B": b.nbytes, "s": s.nbytes, "zp": zp.nbytes}


def dq_model(elem: int, block: int) -> onnx.ModelProto:
    """``MatMul(a, DequantizeLinear(w))`` with ``w`` [K, N] of ``elem`` (INT8 or INT4),
    blocked along K when ``block``, per output column otherwise; float32 scales."""
    rng = np.random.default_rng(elem)
    scale_shape = (K // block, N) if block else (N,)
    values = rng.integers(-8, 8, (K, N))
    w = helper.make_tensor("w", elem, [K, N], values.reshape(-1).tolist())
    zero = helper.make_tensor("zp", elem, list(scale_shape), [0] * int(np.prod(scale_shape)))
    scale = numpy_helper.from_array(rng.uniform(0.01, 0.02, scale_shape).astype(np.float32), "s")
    attrs = {"axis": 0, "block_size": block} if block else {"axis": 1}
    nodes = [helper.make_node("DequantizeLinear", ["w", "s", "zp"], ["wf"], **attrs),
             helper.make_node("MatMul", ["a", "wf"], ["y"], name="linear")]
    return _model(nodes, [w, zero, scale], {"": 21})


def _matmul(model: onnx.ModelProto):
    layers = [layer for layer in api.inspect(model, rewrite=True).layers if layer.op_type == "MatMul"]
    assert len(layers) == 1, [layer.name for layer in layers]
    return layers[0]


@pytest.mark.parametrize("bits", [4, 8])
def test_matmulnbits_weight_is_priced_at_its_packed_size(bits):
    """Float A (accuracy_level 0): the body dequantizes B with its scales and zero points, all
    of which the MatMul reads: ``K N bits / 8`` bytes of values, ``4`` a block of scales and
    ``bits / 8`` a block of zero points; the layer computes at INT8."""
    model, stored = nbits_model(bits, 0)
    layer = _matmul(model)
    assert stored["B"] == K * N * bits // 8
    assert layer.weight_bytes == stored["B"] + stored["s"] + stored["zp"]
    assert layer.precision == "int8" and layer.int8_arithmetic
    assert layer.at_precision("fp16") is layer  # the stored bytes and the INT8 rate at every precision


def test_four_bits_weigh_half_of_eight_plus_the_same_scales():
    four, eight = (_matmul(nbits_model(bits, 0)[0]) for bits in (4, 8))
    scales = BLOCKS * N * 4
    assert eight.weight_bytes - four.weight_bytes == K * N // 2 + BLOCKS * N // 2
    assert four.weight_bytes == K * N // 2 + scales + BLOCKS * N // 2
    assert four.ops == eight.ops


def test_int8_activation_path_reads_packed_values_and_zero_points():
    """accuracy_level 4: the scales multiply the block sums after the MatMul (a layer of their
    own), so the MatMul's weights are the packed values and zero points."""
    model, stored = nbits_model(4, 4)
    assert _matmul(model).weight_bytes == stored["B"] + stored["zp"]


def test_simulated_memory_traffic_carries_the_packed_weight():
    """One layer at MP 1 (one tile, one channel group): its DRAM bytes are its input, its output
    and its weights read once, the weights at the packed size; compute runs at the INT8 peak."""
    hw = load_hardware("mlu100")
    (model4, stored4), (model8, stored8) = nbits_model(4, 0), nbits_model(8, 0)
    four, eight = _matmul(model4), _matmul(model8)
    est4, est8 = (layer_estimates([layer], 1, hw)[0] for layer in (four, eight))
    moved = four.input_bytes + four.output_bytes  # INT8 maps, one byte a value
    assert moved == ROWS * (K + N)
    assert est4.dram_bytes == pytest.approx(moved + sum(stored4.values()))
    assert est8.dram_bytes == pytest.approx(moved + sum(stored8.values()))
    assert est4.precision == "int8" and est4.compute_us == pytest.approx(est8.compute_us)


def test_blocked_dequantize_linear_counts_its_scales():
    """Opset 21 DequantizeLinear with block_size: INT8 values at one byte, INT4 at half (the
    dq4 rewrite unpacks them in the body), and a float scale and a zero point per block."""
    params = (K // BLOCK) * N
    assert _matmul(dq_model(TensorProto.INT8, BLOCK)).weight_bytes == K * N + params * 4 + params
    assert _matmul(dq_model(TensorProto.INT4, BLOCK)).weight_bytes == K * N // 2 + params * 4 + params // 2


def test_per_axis_int8_weight_keeps_one_byte_a_value():
    """A weight quantized per output column is not block-quantized: one byte a value, as before
    (its N scales and zero points are what a per-channel layer has always left out)."""
    assert _matmul(dq_model(TensorProto.INT8, 0)).weight_bytes == K * N


def test_inspect_reports_the_packed_weight(tmp_path):
    """``onnxmlu inspect --json``: the MatMul's weight bytes are the packed ones."""
    import json

    from typer.testing import CliRunner

    from onnxmlu.cli import app

    model, stored = nbits_model(4, 0)
    src, report = tmp_path / "m.onnx", tmp_path / "inspect.json"
    onnx.save(model, src)
    result = CliRunner().invoke(app, ["inspect", str(src), "--json", str(report)])
    assert result.exit_code == 0, result.output
    (row,) = [r for r in json.loads(report.read_text())["layers"] if r["op_type"] == "MatMul"]
    assert row["weight_bytes"] == sum(stored.values())
