"""``--precision auto``'s evaluation of a small INT8-sensitive model, printed as one JSON object:
run by test_auto_same_plan.py natively and under ``qemu-x86_64 -cpu Skylake-Client`` (AVX2, no
VNNI), whose results must agree: the same plan from the same data on every host.

The model makes onnxruntime's u8 x s8 kernels saturate where they can: its convolutions read
activations that all quantize near the top of their range (``1 + 0.05 |x|``: 106..127 as
symmetric INT8, 234..255 once onnxruntime shifts them to u8) and weights of one magnitude (every
per-channel INT8 weight +-127), so every pair of products sums past 16 bits
(``2 * 255 * 127 > 32767``). With exact kernels (onnxmlu/sessions.py) the INT8 trials compute
the same integers on every CPU; without them the accuracy auto measures, and so its plan,
depend on the CPU.

Printed: ``exact``, the evaluation as the package runs it, and ``inexact``, the same with the
package's sessions made as if this CPU's default kernels were exact (no
``session.x64quantprecision``, the state before that option): the test's proof that the
comparison can fail on the emulated CPU. One process for both: onnxruntime's start under
emulation costs seconds.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnxmlu import api, sessions

C, K, HW = 16, 16, 8


def _signed_ones(rng: np.random.Generator, shape) -> np.ndarray:
    return (np.where(rng.random(shape) < 0.5, 1.0, -1.0) * 0.05).astype(np.float32)


def sensitive_model() -> onnx.ModelProto:
    """x -> 1 + 0.05|x| -> Conv(16->16, 3x3) -> Relu -> + 1 -> Conv(16->16, 3x3) -> y."""
    rng = np.random.default_rng(7)
    inits = [numpy_helper.from_array(np.float32(0.05), "k"), numpy_helper.from_array(np.float32(1.0), "one"),
             numpy_helper.from_array(_signed_ones(rng, (K, C, 3, 3)), "w1"),
             numpy_helper.from_array(_signed_ones(rng, (K, K, 3, 3)), "w2")]
    nodes = [helper.make_node("Abs", ["x"], ["ax"]), helper.make_node("Mul", ["ax", "k"], ["sx"]),
             helper.make_node("Add", ["sx", "one"], ["px"]),
             helper.make_node("Conv", ["px", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Relu", ["c1"], ["r1"]), helper.make_node("Add", ["r1", "one"], ["p1"]),
             helper.make_node("Conv", ["p1", "w2"], ["y"], pads=[1, 1, 1, 1], name="conv2")]
    graph = helper.make_graph(nodes, "sensitive", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, C, HW, HW])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, K, HW, HW])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def evaluation() -> dict:
    """The chosen plan, and every accuracy auto measured, in the order it measured them."""
    result = api.fuse(sensitive_model(), precision="auto", accuracy="cosine>=0.999").auto
    return {"plan": [[b.start, b.stop, b.mp, b.precision] for b in result.plan.blocks],
            "chosen": result.chosen.measured.to_dict(),
            "units": [u.to_dict() for u in result.units],
            "candidates": [c.measured.to_dict() for c in result.candidates if c.measured is not None]}


def both() -> dict:
    exact = evaluation()
    kept = sessions.default_kernels_exact
    sessions.default_kernels_exact = lambda: True
    try:
        return {"exact": exact, "inexact": evaluation()}
    finally:
        sessions.default_kernels_exact = kept


if __name__ == "__main__":
    print(json.dumps(both()))
