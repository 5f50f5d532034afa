"""QLinearMatMul (opset 21+, u8 activations, s8 weights) gets u8 weights (``w ^ 0x80``, zero point
``^ 0x80``): the same integers ``w - z``, so the output is bit-identical, and onnxruntime's
exact u8 x u8 kernels run on CPUs without VNNI. What the rewrite buys on those CPUs is checked
under emulation by tests/precision/test_exact_int8.py; here: which forms it takes, that the
outputs are the same bytes, and that a shared weight stays one tensor.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from rw_util import full_check, initializer_values, run_ort

from onnxmlu.rewrite import rewrite_model


def qlinear_matmul_model(opset: int, activation: str = "u8", nodes: int = 1, zero_w: int = 3):
    """``nodes`` QLinearMatMul reading one weight [16, 4] (u8 or s8 activations [2, 16])."""
    rng = np.random.default_rng(opset + nodes)
    a_type, a_zero = (TensorProto.UINT8, np.uint8(7)) if activation == "u8" else (TensorProto.INT8, np.int8(-3))
    inits = [numpy_helper.from_array(v, n) for n, v in (
        ("w", rng.integers(-128, 128, (16, 4)).astype(np.int8)), ("zw", np.int8(zero_w)), ("za", a_zero),
        ("sa", np.float32(0.02)), ("sw", np.float32(0.05)), ("sy", np.float32(1.5)))]
    made = [helper.make_node("QLinearMatMul", ["a", "sa", "za", "w", "sw", "zw", "sy", "za"], [f"y{i}"])
            for i in range(nodes)]
    graph = helper.make_graph(made, "g", [helper.make_tensor_value_info("a", a_type, [2, 16])],
                              [helper.make_tensor_value_info(f"y{i}", a_type, [2, 4]) for i in range(nodes)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10 if opset >= 21 else 8
    low, high = (0, 256) if activation == "u8" else (-128, 128)
    feeds = {"a": rng.integers(low, high, (2, 16)).astype(np.uint8 if activation == "u8" else np.int8)}
    return model, feeds


@pytest.mark.parametrize("zero_w", [0, 3, -128])
def test_weights_become_u8_and_outputs_stay_bit_identical(zero_w):
    model, feeds = qlinear_matmul_model(21, zero_w=zero_w)
    rewritten, report = rewrite_model(model, only=["qlinearmatmul"])
    full_check(rewritten)
    assert report.applied["qlinearmatmul"] == 1 and not report.skipped
    node = rewritten.graph.node[0]
    values = initializer_values(rewritten)
    assert values[node.input[3]].dtype == np.uint8 and values[node.input[5]].dtype == np.uint8
    w, z = values[node.input[3]].astype(np.int32), values[node.input[5]].astype(np.int32)
    original = initializer_values(model)
    assert np.array_equal(w - z, original["w"].astype(np.int32) - zero_w)
    for got, expected in zip(run_ort(rewritten, feeds), run_ort(model, feeds)):
        assert got.dtype == expected.dtype and np.array_equal(got, expected)


def test_a_shared_weight_stays_one_tensor():
    model, _ = qlinear_matmul_model(21, nodes=3)
    rewritten, report = rewrite_model(model, only=["qlinearmatmul"])
    assert report.applied["qlinearmatmul"] == 3
    assert len({n.input[3] for n in rewritten.graph.node}) == 1
    assert sum(t.data_type == TensorProto.UINT8 and len(t.dims) == 2 for t in rewritten.graph.initializer) == 1


@pytest.mark.parametrize("opset, activation", [(20, "u8"), (21, "s8")])
def test_forms_onnxruntime_covers_are_left_without_a_refusal(opset, activation):
    """Before opset 21 onnxruntime's own s8 -> u8 pass matches the node; s8 x s8 is exact."""
    model, _ = qlinear_matmul_model(opset, activation)
    rewritten, report = rewrite_model(model, only=["qlinearmatmul"])
    assert report.applied["qlinearmatmul"] == 0 and not report.skipped
    assert rewritten.graph.node[0].input[3] == "w"
