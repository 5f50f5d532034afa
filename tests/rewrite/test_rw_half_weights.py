"""A float16 attention's weights stay float16 in the rewritten model (onnxmlu/rewrite/floattype.py,
``widen_half``): widened by a Cast in the block, not stored again as float32 -- folding the cast
kept a float32 copy of every attention weight, so an optimizer-saved float16 BERT's fused file grew
by the weights' size. The result still matches onnxruntime's kernel (it computes in float32)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from rw_util import run_ort

from onnxmlu.rewrite import rewrite_model
from onnxmlu.rewrite.floattype import WIDEN_FOLD_BYTES


def test_float16_attention_weights_are_not_stored_again_as_float32():
    rng = np.random.default_rng(5)
    d, heads = 64, 4
    weights = (rng.standard_normal((d, 3 * d)) * 0.2).astype(np.float16)
    assert weights.nbytes > WIDEN_FOLD_BYTES
    node = helper.make_node("Attention", ["x", "w", "b"], ["y"], domain="com.microsoft", num_heads=heads)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [2, 5, d])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [2, 5, d])],
        [numpy_helper.from_array(weights, "w"), numpy_helper.from_array((rng.standard_normal(3 * d) * 0.1)
                                                                        .astype(np.float16), "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    rewritten, report = rewrite_model(model, only=["msattention"])
    assert report.applied["msattention"] == 1
    wide = [t.name for t in rewritten.graph.initializer if t.data_type == TensorProto.FLOAT and np.prod(t.dims) >= weights.size]
    assert wide == [], wide
    assert sum(t.data_type == TensorProto.FLOAT16 and np.prod(t.dims) == weights.size
               for t in rewritten.graph.initializer) == 1
    feeds = {"x": rng.standard_normal((2, 5, d)).astype(np.float16)}
    got, want = run_ort(rewritten, feeds)[0], run_ort(model, feeds)[0]
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2.0**-9, atol=4e-3)
    onnx.checker.check_model(rewritten)
