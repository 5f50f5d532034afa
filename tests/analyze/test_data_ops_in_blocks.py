"""Element tests and index moves that exporters put between a layer's MatMuls run in its block.

IsNaN (torch's masked softmax: ``Where(IsNaN(p), 0, p)`` after a fully masked row), GatherND and
ScatterND (a detector head's in-place box updates, a BERT pooler's gather) and opset 24's
TensorScatter (the KV cache written in place, read by Attention through ``nonpad_kv_seqlen``)
were missing from the accelerator's op table: each stayed on the host and cut the layer around
it into blocks (a six-layer int8 MiniLM made 8 blocks of what is now 2). Each case fuses into
one block with no host node and matches the original (onnxruntime, optimizations off) at 1e-4.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxmlu import api
from onnxmlu.analyze.optable import support_reason
from onnxmlu.ir import GraphIndex
from onnxmlu.runtime import InferenceSession, reference_session
from onnxmlu.schema import is_fusion_block

FLOAT = TensorProto.FLOAT
D, HEADS, HEAD, CACHE = 16, 2, 8, 12


def _weights(rng, *names: str) -> list[onnx.TensorProto]:
    return [numpy_helper.from_array((0.3 * rng.standard_normal((D, D))).astype(np.float32), n) for n in names]


def _masked_attention() -> onnx.ModelProto:
    """x -> Q, K, V MatMuls -> softmax(Q K^T + mask) with NaN rows zeroed -> V -> output MatMul."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", w], [o]) for w, o in (("wq", "q"), ("wk", "k"), ("wv", "v"))]
    nodes += [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
              helper.make_node("MatMul", ["q", "kt"], ["scores"]),
              helper.make_node("Add", ["scores", "mask"], ["masked"]),
              helper.make_node("Softmax", ["masked"], ["p"], axis=-1),
              helper.make_node("IsNaN", ["p"], ["nan"]),
              helper.make_node("Where", ["nan", "zero", "p"], ["probs"]),
              helper.make_node("MatMul", ["probs", "v"], ["ctx"]),
              helper.make_node("MatMul", ["ctx", "wo"], ["y"])]
    inputs = [helper.make_tensor_value_info("x", FLOAT, ["B", "S", D]),
              helper.make_tensor_value_info("mask", FLOAT, ["B", "S", "S"])]
    graph = helper.make_graph(nodes, "masked_attention", inputs, [helper.make_tensor_value_info("y", FLOAT, None)],
                              _weights(rng, "wq", "wk", "wv", "wo") + [numpy_helper.from_array(np.float32(0), "zero")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _external_cache_layer() -> onnx.ModelProto:
    """Opset 24: K, V written into the caches at ``write_indices`` by TensorScatter, attended
    through ``nonpad_kv_seqlen``, the caches' new contents returned."""
    rng = np.random.default_rng(1)
    nodes = [helper.make_node("MatMul", ["x", w], [o]) for w, o in (("wq", "q"), ("wk", "k"), ("wv", "v"))]
    nodes += [helper.make_node("Reshape", [t, "heads"], [f"{t}4"]) for t in ("q", "k", "v")]
    nodes += [helper.make_node("Transpose", [f"{t}4"], [f"{t}h"], perm=[0, 2, 1, 3]) for t in ("q", "k", "v")]
    nodes += [helper.make_node("TensorScatter", [f"{t}_cache", f"{t}h", "write_indices"], [f"{t}_present"], axis=-2)
              for t in ("k", "v")]
    nodes += [helper.make_node("Attention", ["qh", "k_present", "v_present", "", "", "", "nonpad_kv_seqlen"],
                               ["ctx4"], is_causal=1),
              helper.make_node("Transpose", ["ctx4"], ["ctx_t"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["ctx_t", "merged"], ["ctx"]),
              helper.make_node("MatMul", ["ctx", "wo"], ["y"])]
    caches = [helper.make_tensor_value_info(f"{t}_cache", FLOAT, ["B", HEADS, CACHE, HEAD]) for t in ("k", "v")]
    inputs = [helper.make_tensor_value_info("x", FLOAT, ["B", "S", D]), *caches,
              helper.make_tensor_value_info("write_indices", TensorProto.INT64, ["B"]),
              helper.make_tensor_value_info("nonpad_kv_seqlen", TensorProto.INT64, ["B"])]
    outputs = [helper.make_tensor_value_info(n, FLOAT, None) for n in ("y", "k_present", "v_present")]
    shapes = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in (("heads", [0, 0, HEADS, HEAD]),
                                                                             ("merged", [0, 0, D]))]
    graph = helper.make_graph(nodes, "external_cache", inputs, outputs, _weights(rng, "wq", "wk", "wv", "wo") + shapes)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 24)])
    model.ir_version = 11
    return model


def _feeds(model: onnx.ModelProto, batch: int, seq: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(batch * 7 + seq)
    names = {i.name for i in model.graph.input}
    feeds = {"x": rng.standard_normal((batch, seq, D)).astype(np.float32)}
    if "mask" in names:  # the last query row of the first sample sees no key: its softmax is NaN
        mask = np.where(rng.random((batch, seq, seq)) < 0.2, -np.inf, 0).astype(np.float32)
        mask[0, -1, :] = -np.inf
        feeds["mask"] = mask
    else:  # each sample has `past` cached tokens and writes its `seq` new ones after them
        past = np.array([3, 5, 2][:batch], np.int64)
        for t in ("k", "v"):
            feeds[f"{t}_cache"] = rng.standard_normal((batch, HEADS, CACHE, HEAD)).astype(np.float32)
        feeds["write_indices"] = past
        feeds["nonpad_kv_seqlen"] = past + seq
    return feeds


@pytest.mark.parametrize("op, opset", [("IsNaN", 17), ("IsInf", 17), ("GatherND", 17), ("ScatterND", 17),
                                       ("TensorScatter", 24)])
def test_the_ops_are_in_the_accelerators_table(op, opset):
    node = helper.make_node(op, ["a", "b"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, FLOAT, [2]) for n in "ab"],
                              [helper.make_tensor_value_info("y", FLOAT, [2])])
    assert support_reason(node, GraphIndex.build(graph), opset) is None


@pytest.mark.parametrize("build, pins", [
    (_masked_attention, {"x": [1, 4, D], "mask": [1, 4, 4]}),
    (_external_cache_layer, {"x": [1, 2, D], "k_cache": [1, HEADS, CACHE, HEAD], "v_cache": [1, HEADS, CACHE, HEAD],
                             "write_indices": [1], "nonpad_kv_seqlen": [1]}),
], ids=["isnan_masked_softmax", "tensorscatter_cache"])
def test_the_layer_is_one_block_and_matches(build, pins):
    original = build()
    fused = api.fuse(original, input_shapes=pins).model
    assert sum(is_fusion_block(n) for n in fused.graph.node) == len(fused.graph.node) == 1
    reference, session = reference_session(original), InferenceSession(fused)
    for batch, seq in ((1, pins["x"][1]), (2, 3), (3, 1)):
        feeds = _feeds(original, batch, seq)
        for want, got in zip(reference.run(None, feeds), session.run(None, feeds)):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
