"""A weight several blocks (or blocks in several branches) read is stored once (onnxmlu/collapse/shared.py): it stays an
initializer of the outer graph, each block reads it as an input, and its body holds a
placeholder the custom-op library fills. The fused file is the original's size plus framing,
and it runs in plain onnxruntime with the library, as ``--portable`` functions, with external
data, and in onnx's reference evaluator."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxmlu import api
from onnxmlu.ir import iter_graphs
from onnxmlu.ir.weights import tensor_bytes
from onnxmlu.plan.plan import plan_from_ranges
from onnxmlu.reference import reference_evaluator
from onnxmlu.runtime import reference_session
from onnxmlu.runtime.merge import merge_consecutive_blocks
from onnxmlu.schema import (SHARED_ATTRIBUTE, SHARED_LOCATION, BodyFileReferenceError, add_body, body_model,
                            body_model_from_attribute, is_fusion_block, placeholder, shared_names)

sys.path.insert(0, str(Path(__file__).resolve().parent / "realworld"))
from built import encdec_merged_decoder, merged_if_decoder, siamese_tower  # noqa: E402

RTOL = ATOL = 1e-4
PINS = {"left": [1, 3, 32, 32], "right": [1, 3, 32, 32]}
#: Serialized framing of one block (its body's ModelProto, graph, value infos, attributes).
FRAMING_BYTES_PER_BLOCK = 8 << 10
TOWER_LAYERS = 8  # conv, relu, pool, conv, relu, pool, flatten, projection


def _tower_blocks():
    """One block per tower (the second also holds the distance): both read every tower weight."""
    model = siamese_tower()
    layers = len(api.inspect(model, input_shapes=PINS).layers)
    return model, plan_from_ranges([(0, TOWER_LAYERS, 1), (TOWER_LAYERS, layers, 1)])


def _feeds(batch: int = 2) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {name: rng.standard_normal((batch, 3, 32, 32)).astype(np.float32) for name in ("left", "right")}


def _plain_session(path: Path, library: str | None) -> ort.InferenceSession:
    options = ort.SessionOptions()
    if library is not None:
        options.register_custom_ops_library(library)
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _stored_weights(model: onnx.ModelProto) -> list[str]:
    """Names of the weights (>= 1 KiB) holding data, in every graph and body, one entry per copy."""
    graphs = list(iter_graphs(model.graph))
    names = [t.name for g in graphs for t in g.initializer if tensor_bytes(t) >= 1024]
    for node in (n for g in graphs for n in g.node):
        if is_fusion_block(node):
            body = body_model_from_attribute(next(a for a in node.attribute if a.name == "body"))
            names += [t.name for t in body.graph.initializer if t.HasField("raw_data") and tensor_bytes(t) >= 1024]
    return names


def test_a_tower_read_by_two_blocks_is_stored_once_and_runs_everywhere(library, tmp_path):
    model, plan = _tower_blocks()
    src, out = tmp_path / "siamese.onnx", tmp_path / "fused.onnx"
    onnx.save(model, src)
    api.fuse_to_file(src, out, plan=plan, input_shapes=PINS)
    fused = onnx.load(out)
    blocks = [n for n in fused.graph.node if is_fusion_block(n)]
    assert len(blocks) == 2 and all(list(n.input[-3:]) == ["w1", "w2", "fc"] for n in blocks)
    assert sorted(_stored_weights(fused)) == ["fc", "w1", "w2"]  # each once, in the outer graph
    assert out.stat().st_size <= 1.05 * src.stat().st_size + FRAMING_BYTES_PER_BLOCK * len(blocks)

    feeds = _feeds()
    want = reference_session(model).run(None, feeds)[0]
    np.testing.assert_allclose(_plain_session(out, library).run(None, feeds)[0], want, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(reference_evaluator(fused).run(None, feeds)[0], want, rtol=RTOL, atol=ATOL)

    portable = tmp_path / "portable.onnx"
    api.fuse_to_file(src, portable, plan=plan, input_shapes=PINS, portable=True)
    assert portable.stat().st_size <= 1.05 * src.stat().st_size + FRAMING_BYTES_PER_BLOCK * len(blocks)
    np.testing.assert_allclose(_plain_session(portable, None).run(None, feeds)[0], want, rtol=RTOL, atol=ATOL)

    external = tmp_path / "external.onnx"
    api.save_model(fused, external, external_data=True)
    np.testing.assert_allclose(_plain_session(external, library).run(None, feeds)[0], want, rtol=RTOL, atol=ATOL)


def test_weights_the_caller_may_override_are_not_shared(library, tmp_path):
    """An initializer also listed as a graph input (IR < 4 style) is a default the caller may
    replace, so no constant where a block runs: each block keeps its own copy, and runs."""
    model, plan = _tower_blocks()
    model.graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                             for t in model.graph.initializer)
    out = tmp_path / "fused.onnx"
    api.fuse_to_file(model, out, plan=plan, input_shapes=PINS)
    fused = onnx.load(out)
    assert not any(shared_names(n) for n in fused.graph.node if is_fusion_block(n))
    feeds = _feeds()
    want = reference_session(model).run(None, feeds)[0]
    np.testing.assert_allclose(_plain_session(out, library).run(None, feeds)[0], want, rtol=RTOL, atol=ATOL)


def test_consecutive_blocks_merged_at_load_keep_their_weights_shared(library, tmp_path):
    """The runtime's merge of consecutive blocks (onnxmlu/runtime/merge.py) passes the members'
    shared weights on as the merged node's, each once, so its inner session folds them too."""
    model, plan = _tower_blocks()
    fused = api.fuse(model, plan=plan, input_shapes=PINS).model
    assert merge_consecutive_blocks(fused) == 1
    node = fused.graph.node[0]
    assert shared_names(node) == ["w1", "w2", "fc"] and list(node.input[:2]) == ["left", "right"]
    path = tmp_path / "merged.onnx"
    onnx.save(fused, path)
    feeds = _feeds()
    want = reference_session(model).run(None, feeds)[0]
    np.testing.assert_allclose(_plain_session(path, library).run(None, feeds)[0], want, rtol=RTOL, atol=ATOL)


DECODER_PINS = {"input_ids": [1, 3], "past_key": [1, 2, 5, 16], "past_value": [1, 2, 5, 16]}


def _decoder_feeds(use_cache: bool, past: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(past)
    kv = lambda: rng.standard_normal((2, 2, past, 16)).astype(np.float32)  # noqa: E731
    return {"input_ids": rng.integers(0, 64, (2, 3)), "past_key": kv(), "past_value": kv(),
            "use_cache_branch": np.array([use_cache])}


def test_a_merged_decoder_holds_every_branch_matmul_in_blocks_reading_one_copy_of_the_weights(library, tmp_path):
    """Optimum's ``If(use_cache_branch)``: both branches read the outer weights. Each branch's
    block holds all of its MatMuls, and reads the weights as shared inputs of the outer graph:
    graphsurgeon's folder copies them into each branch, and they must move back first. Runs
    with the library, as ``--portable`` functions and with external data, at both branches."""
    model = merged_if_decoder()
    src, out = tmp_path / "decoder.onnx", tmp_path / "fused.onnx"
    onnx.save(model, src)
    api.fuse_to_file(src, out, input_shapes=DECODER_PINS)
    fused = onnx.load(out)
    branches = [a.g for a in fused.graph.node[0].attribute if a.type == onnx.AttributeProto.GRAPH]
    for branch in branches:
        assert [n.op_type for n in branch.node if n.op_type == "MatMul"] == [], branch.name
        blocks = [n for n in branch.node if is_fusion_block(n)]
        assert blocks and all("lm_head" in shared_names(n) for n in blocks)
    weights = ["embed", "lm_head", "w_down", "w_up", "wk", "wo", "wq", "wv"]
    assert sorted(_stored_weights(fused)) == weights
    assert out.stat().st_size <= 1.05 * src.stat().st_size + FRAMING_BYTES_PER_BLOCK * 2

    reference = reference_session(model)
    portable = tmp_path / "portable.onnx"
    api.fuse_to_file(src, portable, input_shapes=DECODER_PINS, portable=True)
    external = tmp_path / "external.onnx"
    api.save_model(fused, external, external_data=True)
    sessions = (_plain_session(out, library), _plain_session(portable, None), _plain_session(external, library))
    for use_cache, past in ((True, 5), (False, 1), (True, 11)):
        feeds = _decoder_feeds(use_cache, past)
        for want, *got in zip(reference.run(None, feeds), *(s.run(None, feeds) for s in sessions)):
            for value in got:
                np.testing.assert_allclose(value, want, rtol=RTOL, atol=ATOL, err_msg=f"cache {use_cache} past {past}")


def _lstm_in_both_branches() -> onnx.ModelProto:
    """``If(c)`` whose two branches each run an LSTM over the outer ``W``/``R`` (one keeps the
    state, the other squares its input first): the LSTM rewrite derives ``W^T`` and ``R^T`` in
    each branch."""
    rng = np.random.default_rng(9)
    hidden, feat = 32, 16

    def branch(tag: str, pre: str | None) -> onnx.GraphProto:
        x = f"{tag}_x"
        nodes = [helper.make_node(pre or "Identity", ["x"] if pre != "Mul" else ["x", "x"], [x]),
                 helper.make_node("LSTM", [x, "W", "R"], [f"{tag}_y"], hidden_size=hidden),
                 helper.make_node("Squeeze", [f"{tag}_y", "one"], [f"{tag}_out"])]
        return helper.make_graph(nodes, tag, [], [helper.make_tensor_value_info(f"{tag}_out", TensorProto.FLOAT, None)])

    node = helper.make_node("If", ["c"], ["y"], then_branch=branch("a", None), else_branch=branch("b", "Mul"))
    graph = helper.make_graph(
        [node], "lstm_branches", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6, 1, feat]),
                                  helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array((rng.standard_normal((1, 4 * hidden, feat)) * 0.2).astype(np.float32), "W"),
         numpy_helper.from_array((rng.standard_normal((1, 4 * hidden, hidden)) * 0.2).astype(np.float32), "R"),
         numpy_helper.from_array(np.array([1], np.int64), "one")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_weights_a_rewrite_derives_in_each_branch_are_stored_once(library, tmp_path):
    """Each branch's LSTM rewrite makes its own transposed copy of the one outer weight: the
    copies become one tensor of the graph enclosing both branches, read by both blocks."""
    model = _lstm_in_both_branches()
    src, out = tmp_path / "branches.onnx", tmp_path / "fused.onnx"
    onnx.save(model, src)
    api.fuse_to_file(src, out)
    fused = onnx.load(out)
    stored = _stored_weights(fused)
    assert len(stored) == len(set(stored)) == 2, stored  # W^T and R^T, once each (the unrolled steps add nodes)
    x = np.random.default_rng(2).standard_normal((6, 1, 16)).astype(np.float32)
    reference, session = reference_session(model), _plain_session(out, library)
    for c in (True, False):
        feeds = {"x": x, "c": np.array(c)}
        np.testing.assert_allclose(session.run(None, feeds)[0], reference.run(None, feeds)[0], rtol=RTOL, atol=ATOL)


def _block_reading_w(shared: bool, name: str = "W") -> onnx.ModelProto:
    """One block computing x @ W whose body holds a placeholder of ``name``; the node passes the
    outer initializer W as its shared input only when ``shared``."""
    w = np.arange(256, dtype=np.float32).reshape(16, 16) / 256
    inner = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "body",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])],
                              [placeholder(numpy_helper.from_array(w, name))])
    body = helper.make_model(inner, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    node = helper.make_node("MLUFusionBlock", ["x", "W"] if shared else ["x"], ["y"], domain="com.onnxmlu",
                            name="block_0", mp=1, **({SHARED_ATTRIBUTE: 1} if shared else {}))
    add_body(node, body.SerializeToString())
    graph = helper.make_graph([node], "outer", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])],
                              [numpy_helper.from_array(w, "W")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.onnxmlu", 1)],
                             ir_version=8)


def test_the_library_fills_a_placeholder_from_the_shared_input(library, tmp_path):
    path = tmp_path / "shared.onnx"
    onnx.save(_block_reading_w(shared=True), path)
    x = np.ones((1, 16), np.float32)
    w = np.arange(256, dtype=np.float32).reshape(16, 16) / 256
    np.testing.assert_allclose(_plain_session(path, library).run(None, {"x": x})[0], x @ w, rtol=RTOL)


@pytest.mark.parametrize("shared, name", [(False, "W"), (True, "other")], ids=["no-shared-input", "other-name"])
def test_a_placeholder_no_shared_input_names_is_a_file_reference_and_refused(library, tmp_path, shared, name):
    """Only the initializers the node's shared inputs name may refer to the placeholder location:
    any other is a reference to a file, which neither the library nor Python readers follow."""
    model = _block_reading_w(shared, name)
    path = tmp_path / "refused.onnx"
    onnx.save(model, path)
    with pytest.raises(Exception, match=f"refers to a file.*{SHARED_LOCATION}"):
        _plain_session(path, library)
    with pytest.raises(BodyFileReferenceError, match=SHARED_LOCATION):
        body_model(model.graph.node[0])


def _tied_lm_head(vocab: int = 1024, d: int = 64) -> onnx.ModelProto:
    """A tied embedding as Whisper, BART and T5 export it: ``Gather(embed, ids)`` in, the LM head
    ``MatMul(h, Transpose(embed))`` out; the embedding (256 KiB) well above what folding may write
    freely, so a folded transpose would be a second copy of it."""
    rng = np.random.default_rng(21)
    nodes = [helper.make_node("Gather", ["embed", "ids"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Transpose", ["embed"], ["lm_head"], perm=[1, 0]),
             helper.make_node("MatMul", ["r", "lm_head"], ["logits"])]
    graph = helper.make_graph(nodes, "tied", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["B", "S"])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["B", "S", vocab])],
                              [numpy_helper.from_array(rng.standard_normal((vocab, d)).astype(np.float32), "embed")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_tied_embedding_and_lm_head_are_stored_once(library, tmp_path):
    """Folding the LM head's Transpose would free nothing (the Gather still reads the
    embedding): it stays a node, the file holds the embedding once, and it runs."""
    model = _tied_lm_head()
    src, out = tmp_path / "tied.onnx", tmp_path / "fused.onnx"
    onnx.save(model, src)
    api.fuse_to_file(src, out, input_shapes={"ids": [1, 4]})
    assert _stored_weights(onnx.load(out)) == ["embed"]
    assert out.stat().st_size <= 1.05 * src.stat().st_size + FRAMING_BYTES_PER_BLOCK
    feeds = {"ids": np.random.default_rng(3).integers(0, 1024, (2, 5)).astype(np.int64)}
    want = reference_session(model).run(None, feeds)[0]
    np.testing.assert_allclose(_plain_session(out, library).run(None, feeds)[0], want, rtol=RTOL, atol=ATOL)


def test_a_tied_embedding_read_in_both_branches_of_a_merged_decoder_is_stored_once(library, tmp_path):
    """An encoder-decoder merged decoder (``If(use_cache_branch)``) with a tied LM head in each
    branch: the fold bound holds inside branches too (graphsurgeon's own recursion into
    subgraphs drops it), so neither branch writes a transposed copy of the embedding."""
    model = encdec_merged_decoder(vocab=1024, layers=1)
    src, out = tmp_path / "encdec.onnx", tmp_path / "fused.onnx"
    onnx.save(model, src)
    pins = {"input_ids": [1, 1], "encoder_hidden_states": [1, 6, 64],
            **{f"past_key_values.0.{s}.{k}": [1, 4, 5 if s == "decoder" else 6, 16]
               for s in ("decoder", "encoder") for k in ("key", "value")}}
    api.fuse_to_file(src, out, input_shapes=pins)
    stored = _stored_weights(onnx.load(out))
    assert stored.count("embed") == 1 and not [name for name in stored if "lm_head" in name], stored
    assert out.stat().st_size <= 1.05 * src.stat().st_size + FRAMING_BYTES_PER_BLOCK * 2
    rng = np.random.default_rng(4)
    feeds = {"input_ids": rng.integers(0, 1024, (1, 1)).astype(np.int64),
             "encoder_hidden_states": rng.standard_normal((1, 6, 64)).astype(np.float32),
             **{f"past_key_values.0.{s}.{k}": rng.standard_normal((1, 4, 5 if s == "decoder" else 6, 16)).astype(np.float32)
                for s in ("decoder", "encoder") for k in ("key", "value")}}
    session, reference = _plain_session(out, library), reference_session(model)
    for use_cache in (True, False):
        feeds["use_cache_branch"] = np.array([use_cache])
        for got, want in zip(session.run(None, feeds), reference.run(None, feeds)):
            np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL * max(1.0, float(np.abs(want).max())))
