"""What a decode step dispatches: a one-token step of a decoder layer costs a few microseconds of
node dispatch per node, more than most of its arithmetic, so the rewrites emit no node the
step does not need -- the not-interleaved rotation in six nodes, the heads of a rotated 3-D
input read from the rotation's [B, S, H, D] result (no Reshape back and forth), the causal
mask's [Sq, T] from one Shape of the scores -- and stay bit for bit what they were."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from rw_util import rewritten_once, run_ort

from onnxmlu.rewrite import rewrite_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "realworld"))
from built import opset23_decoder_layer  # noqa: E402

HEADS, HEAD, POSITIONS = 4, 8, 16


def _rotary(interleaved: int) -> tuple[onnx.ModelProto, dict]:
    rng = np.random.default_rng(interleaved)
    angles = rng.uniform(0, 2 * np.pi, (POSITIONS, HEAD // 2))
    inits = [numpy_helper.from_array(np.cos(angles).astype(np.float32), "cos"),
             numpy_helper.from_array(np.sin(angles).astype(np.float32), "sin")]
    node = helper.make_node("RotaryEmbedding", ["x", "cos", "sin", "pos"], ["y"], name="rope", interleaved=interleaved)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, HEADS, 3, HEAD]),
                                            helper.make_tensor_value_info("pos", TensorProto.INT64, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, HEADS, 3, HEAD])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)], ir_version=10)
    feeds = {"x": rng.standard_normal((2, HEADS, 3, HEAD)).astype(np.float32), "pos": rng.integers(0, POSITIONS, (2, 3))}
    return model, feeds


def _definition(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """The operator's formula, not interleaved, in float32, in its own order."""
    x1, x2 = x[..., : HEAD // 2], x[..., HEAD // 2:]
    return np.concatenate([cos * x1 - sin * x2, sin * x1 + cos * x2], axis=-1)


def test_rotation_is_six_nodes_and_the_definition_bit_for_bit():
    model, feeds = _rotary(0)
    rewritten = rewritten_once(model, "rotary", "RotaryEmbedding")
    counts = Counter(n.op_type for n in rewritten.graph.node)
    assert counts == {"Gather": 2, "Unsqueeze": 2, "Split": 1, "Neg": 1, "Concat": 1, "Mul": 2, "Add": 1}, counts
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    cos, sin = (inits[n][feeds["pos"]][:, None] for n in ("cos", "sin"))  # [B, 1, S, D/2]
    np.testing.assert_array_equal(run_ort(rewritten, feeds)[0], _definition(feeds["x"], cos, sin))


def test_interleaved_rotation_keeps_its_form():
    counts = Counter(n.op_type for n in rewritten_once(_rotary(1)[0], "rotary", "RotaryEmbedding").graph.node)
    assert counts["Sub"] == 1 and counts["Mul"] == 4 and "Neg" not in counts


def _decoder_layer() -> onnx.ModelProto:
    return rewrite_model(opset23_decoder_layer(hidden=64, heads=8, kv_heads=2, ffn=128))[0]


def test_attention_reads_the_rotated_heads_without_reshaping_back_and_forth():
    """Q and K come out of the rotation as [B, S, H, D]: the Attention rewrite transposes that,
    where it used to flatten it to [B, S, H*D] and split it again."""
    graph = _decoder_layer().graph
    producer = {o: n for n in graph.node for o in n.output}
    chained = [n.name for n in graph.node if n.op_type == "Reshape" and
               getattr(producer.get(n.input[0]), "op_type", None) == "Reshape"]
    assert chained == []
    # Q and K into heads (the rotation), V, Q.K and P.V grouped and back (GQA), Y: eight
    assert Counter(n.op_type for n in graph.node)["Reshape"] == 8


def test_causal_mask_takes_its_shape_from_the_scores():
    graph = _decoder_layer().graph
    shapes = [n for n in graph.node if n.op_type == "Shape"]
    assert [dict((a.name, a.i) for a in n.attribute) for n in shapes] == [{"start": -2}, {"start": 2, "end": 3}]
