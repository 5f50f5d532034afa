"""fuse_to_file writes the model in pieces (one body at a time): the file must parse as the
same fused model that fuse + save_model writes, and pass the full ONNX check."""

import onnx

from onnxmlu import api
from onnxmlu.schema import body_model, ensure_registered, is_fusion_block
from onnxmlu.tools.testing import synthetic_model


def test_streamed_file_equals_in_memory_model(tmp_path):
    ensure_registered()
    source = tmp_path / "m.onnx"
    onnx.save(synthetic_model(60, "residual"), source)
    result = api.fuse_to_file(source, tmp_path / "streamed.onnx", strategy="fixed-mp")
    streamed = onnx.load(tmp_path / "streamed.onnx")
    expected = api.fuse(source, strategy="fixed-mp").model
    assert streamed == expected
    onnx.checker.check_model(streamed, full_check=True)
    blocks = [n for n in streamed.graph.node if is_fusion_block(n)]
    assert len(blocks) == len(result.plan.blocks)
    assert all(body_model(n).graph.node for n in blocks)


# ---- weights held outside the protobuf tree (large_models.WeightStore) ---------------------
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from onnxmlu.ir import weights as large_models  # noqa: E402
from onnxmlu.tools.testing import zoo_model  # noqa: E402


def _streamed_and_expected(tmp_path, model, **options):
    source = tmp_path / "m.onnx"
    onnx.save(model, source)
    result = api.fuse_to_file(source, tmp_path / "streamed.onnx", **options)
    return result, onnx.load(tmp_path / "streamed.onnx"), api.fuse(source, **options).model


@pytest.mark.parametrize("name", ["alexnet", "lstm", "resnet18"])
def test_store_held_weights_stream_into_the_same_model(tmp_path, name):
    """alexnet's fc weights (Gemm transB=1, up to 151 MB) are held by the store and written
    transposed from a view; the file must equal what the in-memory pipeline gives."""
    _, streamed, expected = _streamed_and_expected(tmp_path, zoo_model(name), strategy="all-fusion")
    assert streamed == expected


def test_every_weight_in_the_store_subgraphs_included(tmp_path, monkeypatch):
    """With every constant of 64 bytes or more in the store: Gemm and LSTM rewrites inside If
    and Loop bodies (scaled weights created in subgraphs, outer weights read from them)."""
    monkeypatch.setattr(large_models, "STORE_MIN_TENSOR_BYTES", 64)
    _, streamed, expected = _streamed_and_expected(tmp_path, _subgraph_model(), strategy="all-fusion")
    assert streamed == expected
    tensors = list(large_models.all_tensors(streamed.graph))
    assert not any(large_models.is_marker(t) for t in tensors)


def _subgraph_model() -> onnx.ModelProto:
    """Gemm (transB) -> Relu on the accelerator, then an If whose branches run Gemms (alpha 2
    and -1, scaled weights made inside the branch) on an outer weight, and an LSTM."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    F = TensorProto.FLOAT  # noqa: N806 - reads like the ONNX type name

    def branch(tag, alpha):
        node = helper.make_node("Gemm", ["h", "gw"], [f"{tag}_y"], alpha=alpha, transB=1)
        return helper.make_graph([node], tag, [], [helper.make_tensor_value_info(f"{tag}_y", F, [1, 16])])

    weights = {"w1": rng.standard_normal((32, 16)), "b1": rng.standard_normal(32), "gw": rng.standard_normal((16, 32)),
               "W": rng.standard_normal((1, 32, 16)), "R": rng.standard_normal((1, 32, 8))}
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["g"], transB=1), helper.make_node("Relu", ["g"], ["h"]),
             helper.make_node("If", ["flag"], ["z"], then_branch=branch("then", 2.0), else_branch=branch("else", -1.0)),
             helper.make_node("Unsqueeze", ["z", "axis"], ["seq"]),
             helper.make_node("LSTM", ["seq", "W", "R"], ["", "hn"], hidden_size=8)]
    inits = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()]
    inits.append(numpy_helper.from_array(np.array([0], np.int64), "axis"))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [1, 16]),
                                           helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("hn", F, [1, 1, 8])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_every_weight_in_the_store_zoo(tmp_path, monkeypatch):
    monkeypatch.setattr(large_models, "STORE_MIN_TENSOR_BYTES", 64)
    for name in ("mobilenetv2", "lstm"):
        _, streamed, expected = _streamed_and_expected(tmp_path, zoo_model(name), strategy="dlfusion")
        assert streamed == expected, name


def test_weights_leave_the_store_after_their_last_block(tmp_path):
    """After streaming, the store holds nothing: each weight went into its block and was let go."""
    stores = []
    original = large_models.WeightStore.__init__

    def record(self, *args, **kwargs):
        original(self, *args, **kwargs)
        stores.append(self)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(large_models.WeightStore, "__init__", record)
        result, streamed, expected = _streamed_and_expected(tmp_path, zoo_model("alexnet"), strategy="dlfusion")
    assert stores and stores[0].nbytes == 0
    assert streamed == expected
    assert not any(large_models.is_marker(t) for t in large_models.all_tensors(result.model.graph))


def test_marker_without_its_store_is_a_clear_error():
    store = large_models.WeightStore()
    marker = store.put("w", np.ones((4, 4), np.float32))
    with pytest.raises(RuntimeError, match="weight store"):
        large_models.tensor_array(marker)
    np.testing.assert_array_equal(large_models.tensor_array(marker, store), np.ones((4, 4), np.float32))


def test_over_the_external_data_threshold_weights_come_back_from_the_store(tmp_path, monkeypatch):
    """The > 2 GB branch (collapse in memory, save with external data) fills every marker."""
    from onnxmlu.collapse import atomic

    monkeypatch.setattr(atomic, "EXTERNAL_DATA_THRESHOLD", 1 << 20)
    monkeypatch.setattr(large_models, "STORE_MIN_TENSOR_BYTES", 1024)
    _, streamed, expected = _streamed_and_expected(tmp_path, zoo_model("lstm"), strategy="dlfusion")
    assert (tmp_path / "streamed.onnx.data").exists()
    for tensor in large_models.all_tensors(streamed.graph):
        tensor.ClearField("data_location")  # onnx.load sets it (to DEFAULT) on the tensors it filled
    assert streamed == expected


def test_a_body_over_the_limit_is_refused_alike_in_memory_and_streamed(tmp_path, monkeypatch, chain_model):
    """Both body writers (in memory for ``fuse``, streamed for ``fuse_to_file``) refuse a body
    over protobuf's limit with the same line (collapse/blocks.py, ``_before_body``)."""
    from onnxmlu.collapse import blocks
    from onnxmlu.errors import OnnxMluError

    monkeypatch.setattr(blocks, "MAX_BODY_BYTES", 64)
    path = tmp_path / "m.onnx"
    onnx.save(chain_model, path)
    for fused in (lambda: api.fuse(path), lambda: api.fuse_to_file(path, tmp_path / "f.onnx")):
        with pytest.raises(OnnxMluError, match=r"block 0 serializes to \d+ bytes, over the 2 GB protobuf limit"):
            fused()
    assert not (tmp_path / "f.onnx").exists()
