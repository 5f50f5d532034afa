"""Optimum's merged decoder (``If(use_cache_branch)`` between two whole decoders) holds every
MatMul of both branches in blocks. Pins that the cache branch takes (a mask over past + new
tokens) are pins the other branch cannot take: inference loses the attention probabilities'
last dim there, and the context MatMul is sized by its other operand
(:func:`onnxmlu.analyze.optable.matmul_dims`). Both branches run and match the original."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxmlu import api
from onnxmlu.analyze.optable import matmul_dims, support_reason
from onnxmlu.ir import GraphIndex
from onnxmlu.runtime import reference_session
from onnxmlu.schema import is_fusion_block

sys.path.insert(0, str(Path(__file__).resolve().parent / "realworld"))
from built import optimum_merged_llama  # noqa: E402

RTOL = ATOL = 1e-4
LAYERS, KV, HEAD, VOCAB = 2, 2, 16, 96
CACHE = [f"past_key_values.{i}.{k}" for i in range(LAYERS) for k in ("key", "value")]
#: The cache branch's pins: 5 cached tokens, 3 new, a mask over all 8.
PINS = {"input_ids": [1, 3], "attention_mask": [1, 8], "position_ids": [1, 3], **{c: [1, KV, 5, HEAD] for c in CACHE}}


def _feeds(use_cache: bool, past: int, new: int, dtype, batch: int = 2) -> dict[str, np.ndarray]:
    """A step: ``new`` tokens after ``past`` cached ones (the first step reads no cache; it is fed
    one token's worth, as a caller passes a dummy)."""
    rng = np.random.default_rng(past + new)
    total = past + new if use_cache else new
    cache = {c: rng.uniform(-1, 1, (batch, KV, past, HEAD)).astype(dtype) for c in CACHE}
    mask = np.ones((batch, total), np.int64)
    mask[0, 0] = 0  # a padded first token
    return {"input_ids": rng.integers(0, VOCAB, (batch, new)), "attention_mask": mask,
            "position_ids": np.broadcast_to(np.arange(total - new, total), (batch, new)).copy(),
            **cache, "use_cache_branch": np.array([use_cache])}


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_every_matmul_of_both_branches_is_in_a_block_and_both_branches_match(library, tmp_path, dtype):
    """float16: the softmax between two Casts; outputs to one unit in the last place (the
    blocks' sessions fuse the float16 RMS norm into a float32 kernel: tests/realworld/test_realworld.py)."""
    src, out = tmp_path / "decoder.onnx", tmp_path / "fused.onnx"
    model = optimum_merged_llama(helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))
    rtol = RTOL if dtype == np.float32 else 2.0 ** -10
    onnx.save(model, src)
    result = api.fuse_to_file(src, out, input_shapes=PINS)
    assert result.coverage.heavy_on_host == [], result.coverage.heavy_on_host
    fused = onnx.load(out)
    branches = [a.g for a in fused.graph.node[0].attribute if a.type == onnx.AttributeProto.GRAPH]
    assert len(branches) == 2
    for branch in branches:
        assert [n.name for n in branch.node if n.op_type == "MatMul"] == [], branch.name
        assert sum(is_fusion_block(n) for n in branch.node) == 1, branch.name
    options = ort.SessionOptions()
    options.register_custom_ops_library(library)
    session, reference = ort.InferenceSession(str(out), options), reference_session(model)
    for use_cache, past, new in ((True, 5, 3), (True, 9, 1), (False, 1, 4), (False, 1, 7)):
        feeds = _feeds(use_cache, past, new, dtype)
        for want, got in zip(reference.run(None, feeds), session.run(None, feeds)):
            assert got.dtype == dtype
            np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=rtol, atol=ATOL,
                                       err_msg=f"cache {use_cache} past {past}")


def _matmul(a_dims, b_dims, y_dims, b_constant: bool = False):
    """A MatMul node and the index of a graph declaring these dims (None: unknown)."""
    node = helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")
    vi = lambda name, dims: helper.make_tensor_value_info(name, TensorProto.FLOAT, dims)  # noqa: E731
    inits = [numpy_helper.from_array(np.zeros(b_dims, np.float32), "b")] if b_constant else []
    inputs = [vi("a", a_dims)] + ([] if b_constant else [vi("b", b_dims)])
    graph = helper.make_graph([node], "g", inputs, [vi("y", y_dims)], inits)
    return node, GraphIndex.build(graph)


def test_a_matmul_is_sized_by_whichever_operand_knows_its_dims():
    """K from A's last dim or B's second to last; N from the output's last or B's last."""
    assert matmul_dims(*_matmul([2, 4, 3, None], [2, 4, 8, 16], [2, 4, 3, None])) == (8, 16)
    assert support_reason(*_matmul([2, 4, 3, None], [2, 4, 8, 16], [2, 4, 3, None])) is None
    assert matmul_dims(*_matmul([2, 3, None], [8], [2, 3]))[0] == 8  # a 1-D B: its only dim
    both_lost = support_reason(*_matmul([2, 3, None], [2, None, None], [2, 3, None]))
    assert both_lost is not None and "cannot size" in both_lost


def test_a_matmul_priced_from_its_other_operand_counts_its_work():
    """``2 M K N`` with K read from B when A's last dim is unknown (M = 3 x 4 rows, K = 8, N = 16)."""
    from onnxmlu.analyze.layers import describe_layer

    node, index = _matmul([1, 4, 3, None], [1, 4, 8, 16], [1, 4, 3, 16])
    assert describe_layer(node, index, 0, 0).ops == 2 * 4 * 3 * 8 * 16
