"""fuse_to_file writes the model in pieces (one body at a time): the file must parse as the
same fused model that fuse + save_model writes, and pass the full ONNX check."""

import onnx

from onnxmlu import api
from onnxmlu.schema import body_model, ensure_registered, is_fusion_block
from onnxmlu.testing import synthetic_model


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
