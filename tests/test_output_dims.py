"""Output dims as functions of input dims (onnxmlu/collapse/dims.py, custom_ops/dim_expr.h): a
block whose output grows every step (a KV cache, ``present = Concat(past, new)``) is allocated
before its inner Run from the dims the body's metadata gives, so the inner session writes into
the node's outputs at every step, with no copy; a file without the metadata (older fuses) and a
file whose metadata is wrong still run exactly, on the copy path.

The model is built in code: a projection of the new tokens to 2 heads of 8, Concat with the
past along the sequence axis (``present``), and a Relu of it; fused once at past 4, then run
over a growing past (one token, then two, a step) against the original.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxmlu import api
from onnxmlu.collapse.dims import DIMS_KEY, output_dims_text
from onnxmlu.ir.graphs import copy_model
from onnxmlu.runtime import InferenceSession, copy_report, reference_session
from onnxmlu.runtime.merge import merge_consecutive_blocks
from onnxmlu.schema import DIGEST, body_model, fill_body_attribute, is_fusion_block, set_body_digest

RTOL = ATOL = 1e-4
HEADS, HEAD = 2, 8
WIDTH = 512  # the projection's weight (32 KB) is one the shape inference sees as a typed input only


def kv_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((WIDTH, HEADS * HEAD)).astype(np.float32) / 16, "wk"),
             numpy_helper.from_array(np.array([0, 0, HEADS, HEAD], np.int64), "split_heads")]
    nodes = [helper.make_node("MatMul", ["x", "wk"], ["k0"]),
             helper.make_node("Reshape", ["k0", "split_heads"], ["k1"]),
             helper.make_node("Transpose", ["k1"], ["k2"], perm=[0, 2, 1, 3]),
             helper.make_node("Concat", ["past", "k2"], ["present"], axis=2),
             helper.make_node("Relu", ["present"], ["y"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence", WIDTH]),
              helper.make_tensor_value_info("past", TensorProto.FLOAT, ["batch", HEADS, "past_sequence", HEAD])]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("present", "y")]
    graph = helper.make_graph(nodes, "kv", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def fused() -> onnx.ModelProto:
    return api.fuse(kv_model(), input_shapes={"x": [1, 1, WIDTH], "past": [1, HEADS, 4, HEAD]}).model


def _block(model: onnx.ModelProto) -> onnx.NodeProto:
    blocks = [n for n in model.graph.node if is_fusion_block(n)]
    assert len(blocks) == 1
    return blocks[0]


def _with_dims(model: onnx.ModelProto, dims: str | None) -> onnx.ModelProto:
    """``model`` with its block's dims metadata replaced by ``dims`` (None: removed, as in a
    file fused before the metadata existed)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    node = _block(out)
    body = body_model(node)
    kept = [p for p in body.metadata_props if p.key != DIMS_KEY]
    del body.metadata_props[:]
    body.metadata_props.extend(kept)
    if dims is not None:
        body.metadata_props.add(key=DIMS_KEY, value=dims)
    data = body.SerializeToString()
    attr = next(a for a in node.attribute if a.name == "body")
    fill_body_attribute(attr, data)
    set_body_digest(node, data)
    assert any(a.name == DIGEST for a in node.attribute)
    return out


def _steps():
    """(x, past) of a growing decode: the past grows by the new tokens of each step."""
    rng = np.random.default_rng(1)
    past = rng.standard_normal((1, HEADS, 4, HEAD)).astype(np.float32)
    for new in (1, 1, 2, 1, 2, 1):
        x = rng.standard_normal((1, new, WIDTH)).astype(np.float32)
        yield x, past
        past = np.concatenate([past, rng.standard_normal((1, HEADS, new, HEAD)).astype(np.float32)], axis=2)


def _run_growing(model: onnx.ModelProto):
    """Runs every step against the original; returns the copy report's change after the first."""
    ref, sess = reference_session(kv_model()), InferenceSession(model)
    before = None
    for step, (x, past) in enumerate(_steps()):
        feeds = {"x": x, "past": past}
        for want, got in zip(ref.run(None, feeds), sess.run(None, feeds)):
            np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=f"step {step}")
        if step == 0:
            before = copy_report()
    return copy_report() - before


def test_the_present_cache_dim_is_the_past_plus_the_new_tokens(fused):
    body = body_model(_block(fused))
    dims = {p.key: p.value for p in body.metadata_props}[DIMS_KEY]
    names = [vi.name for vi in body.graph.input]
    x, past = f"i{names.index('x')}", f"i{names.index('past')}"
    assert dims.split(";") == [f"{x}.0,{HEADS},{past}.2+{x}.1,{HEAD}"] * 2
    # a function of the body: the same text from the same body, and the fuse is byte-identical
    assert output_dims_text(body) == dims
    again = api.fuse(kv_model(), input_shapes={"x": [1, 1, WIDTH], "past": [1, HEADS, 4, HEAD]}).model
    assert again.SerializeToString() == fused.SerializeToString()


def test_a_growing_cache_is_written_in_place_at_every_step(library, fused):
    """After the first run (checked against the metadata on the copy path) no output is copied."""
    added = _run_growing(fused)
    assert added.copied_outputs == 0
    assert added.in_place_dynamic == 2 * 5
    assert added.dims_refusals == 0


def test_a_file_without_the_metadata_copies_as_before(library, fused):
    added = _run_growing(_with_dims(fused, None))
    assert added.copied_outputs == 2 * 5 and added.in_place_dynamic == 0


def test_metadata_wrong_at_the_first_run_is_refused_and_the_outputs_copied(library, fused):
    body = body_model(_block(fused))
    past = f"i{[vi.name for vi in body.graph.input].index('past')}"
    wrong = ";".join([f"1,{HEADS},{past}.2,{HEAD}"] * 2)  # the past alone: one token short
    before = copy_report()
    added = _run_growing(_with_dims(fused, wrong))
    assert added.copied_outputs == 2 * 5 and added.in_place_dynamic == 0
    assert (copy_report() - before).dims_refusals == 1


def test_metadata_wrong_only_later_fails_that_run_and_copies_after(library, fused):
    """Right at the first run (past 4 + 1 token = 5), wrong at the next: onnxruntime refuses the
    preallocated outputs, that run fails with a readable error (never wrong data), the next
    runs copy and match."""
    wrong = ";".join([f"1,{HEADS},5,{HEAD}"] * 2)
    ref, sess = reference_session(kv_model()), InferenceSession(_with_dims(fused, wrong))
    failed = []
    for step, (x, past) in enumerate(_steps()):
        feeds = {"x": x, "past": past}
        try:
            got = sess.run(None, feeds)
        except Exception as error:  # noqa: BLE001 - the failure is the subject of the test
            failed.append((step, str(error)))
            continue
        for want, value in zip(ref.run(None, feeds), got):
            np.testing.assert_allclose(value, want, rtol=RTOL, atol=ATOL, err_msg=f"step {step}")
    assert [step for step, _ in failed] == [1]
    assert "output dims metadata" in failed[0][1]


def test_consecutive_blocks_joined_at_load_keep_their_dims_composed(library):
    """A block per layer (strategy ``none``): ``onnxmlu.InferenceSession`` joins the five into one
    inner session, whose output dims are the members' composed over the joined inputs (the
    present cache's new tokens are axis 1 of ``x``, three blocks upstream): still no copy."""
    fused = api.fuse(kv_model(), input_shapes={"x": [1, 1, WIDTH], "past": [1, HEADS, 4, HEAD]}, strategy="none").model
    assert sum(is_fusion_block(n) for n in fused.graph.node) == 5
    merged = copy_model(fused)
    assert merge_consecutive_blocks(merged) == 4
    node = _block(merged)
    x, past = f"i{list(node.input).index('x')}", f"i{list(node.input).index('past')}"
    dims = {p.key: p.value for p in body_model(node).metadata_props}[DIMS_KEY]
    assert [d.replace("(", "").replace(")", "") for d in dims.split(";")] == [f"{past}.0,{HEADS},{past}.2+{x}.1,{HEAD}"] * 2
    added = _run_growing(fused)
    assert added.copied_outputs == 0 and added.in_place_dynamic == 2 * 5


def test_a_streamed_fuse_writes_the_same_dims(fused, tmp_path):
    """``fuse_to_file`` of a model file streams each body, its weights spliced into its bytes
    after the body is built: the inference still sees them, so the file's metadata is the
    in-memory fuse's."""
    source, path = tmp_path / "kv_in.onnx", tmp_path / "kv.onnx"
    onnx.save(kv_model(), str(source))
    api.fuse_to_file(str(source), path, input_shapes={"x": [1, 1, WIDTH], "past": [1, HEADS, 4, HEAD]})
    written = {p.key: p.value for p in body_model(_block(onnx.load(str(path)))).metadata_props}
    assert written[DIMS_KEY] == {p.key: p.value for p in body_model(_block(fused)).metadata_props}[DIMS_KEY]


def _resize_body(scales: list[float], opset: int = 13) -> onnx.ModelProto:
    """x [n, 3, h, w] -> Resize by ``scales`` -> y of undeclared shape."""
    graph = helper.make_graph(
        [helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="nearest")], "resize",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, "h", "w"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array(scales, np.float32), "scales")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("scales, want", [
    ([1, 1, 2, 2], "i0.0,3,2*i0.2,2*i0.3"),  # floor(h * 2) = 2h: the upsample of every FPN/U-Net
    ([1, 1, 3, 1], "i0.0,3,3*i0.2,i0.3"),
    ([1, 1, 1.5, 1.5], None),  # floor(1.5 h) is no polynomial: the outputs stay on the copy path
    ([1, 1, 0.5, 0.5], None)])
def test_a_resize_by_whole_scales_has_output_dims_in_the_input_dims(scales, want):
    """The spec's ``floor(d * s)`` is ``s * d`` for a whole ``s``; onnxruntime's own rule left
    it as ``floor(2.0*h)``, an output size no run could know before the inner session ran."""
    assert output_dims_text(_resize_body(scales)) == want


def test_a_dim_onnx_inference_carries_needs_no_symbolic_engine(monkeypatch):
    """An exporter's own name on an output (``unk__3``) that is really the input's ``n``:
    onnx's inference (milliseconds) finds it; onnxruntime's engine, which imports sympy (about
    0.3 s a process), is not started."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["unk__3", 8])])
    body = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])

    def engine(_model):
        raise AssertionError("the symbolic engine ran")

    monkeypatch.setattr("onnxmlu.collapse.dims.symbolic_infer", engine)
    assert output_dims_text(body) == "i0.0,8"
