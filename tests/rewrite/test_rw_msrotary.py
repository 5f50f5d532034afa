"""com.microsoft RotaryEmbedding rewritten, against onnxruntime 1.32's CPU kernel over random
shapes: 3-D and 4-D inputs, [B, S] and [1] position ids, interleaved or not, partial rotary.
Tolerance 1e-5 (the same four products and two sums per pair as the kernel).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from rw_util import assert_close, full_check, op_types, run_ort, to_half

from onnxmlu.rewrite import rewrite_model

MS = "com.microsoft"
SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)


def rotary_model(rank, first_position, interleaved, partial, rng, opset=17):
    b, s, n = 2, int(rng.integers(1, 6)), int(rng.integers(1, 4))
    head = 2 * int(rng.integers(2, 6))
    rotary = 2 * int(rng.integers(1, head // 2)) if partial else head
    max_pos = 16
    angles = rng.uniform(0, 6.3, (max_pos, rotary // 2))
    shape = (b, s, n * head) if rank == 3 else (b, n, s, head)
    attrs = {"interleaved": int(interleaved)}
    if partial or (rank == 3 and rng.integers(0, 2)):
        attrs |= {"num_heads": n, "rotary_embedding_dim": rotary}
    positions = (np.array([int(rng.integers(0, max_pos - s))], np.int64) if first_position
                 else rng.integers(0, max_pos, (b, s)).astype(np.int64))
    node = helper.make_node("RotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"], domain=MS, **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape),
                                            helper.make_tensor_value_info("pos", TensorProto.INT64, positions.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.cos(angles).astype(np.float32), "cos"),
                               numpy_helper.from_array(np.sin(angles).astype(np.float32), "sin")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)])
    model.ir_version = 8
    return model, {"x": rng.standard_normal(shape).astype(np.float32), "pos": positions}


@settings(max_examples=40, **SETTINGS)
@given(rank=st.sampled_from([3, 4]), first_position=st.booleans(), interleaved=st.booleans(), partial=st.booleans(),
       opset=st.sampled_from([11, 13, 17, 21]), seed=st.integers(0, 2**16))
def test_rotary_property(rank, first_position, interleaved, partial, opset, seed):
    rng = np.random.default_rng(seed)
    model, feeds = rotary_model(rank, first_position, interleaved, partial, rng, opset)
    rewritten, report = rewrite_model(model, only=["msrotary"])
    assert report.applied["msrotary"] == 1, report.skipped
    assert "RotaryEmbedding" not in op_types(rewritten)
    full_check(onnx.shape_inference.infer_shapes(rewritten))
    assert_close(run_ort(rewritten, feeds), run_ort(model, feeds), rtol=1e-5, atol=1e-5)


def test_packed_batching_is_refused():
    model, _ = rotary_model(3, False, False, False, np.random.default_rng(0))
    model.graph.node[0].attribute.append(helper.make_attribute("is_packed_batching", 1))
    rewritten, report = rewrite_model(model, only=["msrotary"])
    assert report.total == 0 and "is_packed_batching" in report.skipped[0].message


def _refusal_without_sizes(rank: int, seed: int) -> str:
    """The reason the rewriter gives a partial-rotary node stripped of rotary_embedding_dim and
    num_heads (it must refuse it)."""
    model, _ = rotary_model(rank, False, False, True, np.random.default_rng(seed))
    node = model.graph.node[0]
    kept = [a for a in node.attribute if a.name not in ("rotary_embedding_dim", "num_heads")]
    del node.attribute[:]
    node.attribute.extend(kept)
    _, report = rewrite_model(model, only=["msrotary"])
    assert report.total == 0
    return report.skipped[0].message


def test_a_cache_narrower_than_the_rotary_size_is_refused():
    """Partial caches without rotary_embedding_dim: the kernel rejects the node (cos_cache must be
    head_size / 2 wide); the rewrite rotated the whole head with them."""
    assert "cos_cache holds" in _refusal_without_sizes(4, 2)


def test_a_hidden_size_that_is_not_whole_heads_is_refused():
    """3-D input without num_heads: the head size is the cache's width * 2; a hidden size that is
    not a multiple of it is rejected by the kernel, and the rewrite's Reshape failed at load."""
    assert "not a multiple of the head size" in _refusal_without_sizes(3, 1)


@pytest.mark.parametrize(("rank", "interleaved"), [(3, False), (4, True)])
def test_float16_rotates_in_float16_as_the_kernel(rank, interleaved):
    """float16 was left on the host; the kernel rotates in float16, and so does the rewrite: equal."""
    model, feeds = to_half(*rotary_model(rank, False, interleaved, True, np.random.default_rng(5)))
    rewritten, report = rewrite_model(model, only=["msrotary"])
    assert report.applied["msrotary"] == 1, report.skipped
    got = run_ort(rewritten, feeds)
    assert got[0].dtype == np.float16
    np.testing.assert_array_equal(got[0], run_ort(model, feeds)[0])
