"""Issue 2's acceptance: every zoo model x strategy fuses into a model that passes the full
ONNX checker, runs in plain onnxruntime with only the library registered and in
onnxmlu.InferenceSession, and matches the original (onnxruntime, optimizations off) within
atol = rtol = 1e-4 on several seeds, with a symbolic batch run at batch 1 and batch 3."""

from __future__ import annotations

import functools

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from onnxmlu import InferenceSession, api, custom_ops_library
from onnxmlu.runtime import reference_session
from onnxmlu.schema import ensure_registered, is_fusion_block
from onnxmlu.tools.verify import random_inputs
from onnxmlu.tools.testing import zoo_model
from onnxmlu.tools.zoo import ZOO_NAMES

TOL = dict(atol=1e-4, rtol=1e-4)
CASES = [({"N": 1}, 0), ({"N": 1}, 1), ({"N": 3}, 2)]


@functools.lru_cache(maxsize=None)
def _reference(name: str):
    """Feeds and reference outputs per case, computed once per model (not per strategy)."""
    model = zoo_model(name, "N")
    sess = reference_session(model)
    results = []
    for dims, seed in CASES:
        feeds = random_inputs(model, seed, dims)
        results.append((feeds, sess.run(None, feeds)))
    return results


def _plain_session(data: bytes) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.register_custom_ops_library(custom_ops_library())
    return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])


# VGG-19 (548 MB of weights) peaks near 10 GB here: `heavy` runs it alone, after the rest.
ZOO_PARAMS = [pytest.param(n, marks=pytest.mark.heavy) if n == "vgg19" else n for n in ZOO_NAMES]


@pytest.mark.parametrize("strategy", ["none", "all-fusion"])
@pytest.mark.parametrize("name", ZOO_PARAMS)
def test_zoo_model_fuses_and_matches(name, strategy):
    fused = api.fuse(zoo_model(name, "N"), strategy=strategy).model
    ensure_registered()
    onnx.checker.check_model(fused, full_check=True)
    assert any(is_fusion_block(n) for n in fused.graph.node)
    data = fused.SerializeToString()
    del fused
    for make_session in (_plain_session, InferenceSession):
        session = make_session(data)  # one session alive at a time keeps the peak memory down
        for feeds, expected in _reference(name):
            got = session.run(None, feeds)
            for g, e in zip(got, expected):
                np.testing.assert_allclose(g, e, **TOL)


def test_fused_blocks_carry_the_documented_attributes():
    fused = api.fuse(zoo_model("resnet18"), strategy="all-fusion").model
    blocks = [n for n in fused.graph.node if is_fusion_block(n)]
    node = max(blocks, key=lambda n: len(n.input) + len(n.output) + len(n.doc_string))
    attrs = {a.name: a for a in node.attribute}
    assert set(attrs) >= {"mp", "body", "layers", "op_types", "gops", "sim_latency_us"}
    assert attrs["body"].type == onnx.AttributeProto.TENSOR
    assert attrs["body"].t.data_type == onnx.TensorProto.UINT8
    assert node.name.startswith("block_") and f"(mp={attrs['mp'].i})" in node.name
    assert "layers" in node.doc_string and "GOPs" in node.doc_string
    assert len(attrs["layers"].strings) == len(attrs["op_types"].strings) > 1
    outputs = {o for n in fused.graph.node if is_fusion_block(n) for o in n.output}
    typed = {v.name for v in list(fused.graph.value_info) + list(fused.graph.output)}
    assert outputs <= typed


def test_fusion_keeps_the_interface(chain_model):
    result = api.fuse(chain_model, strategy="all-fusion")
    assert [i.name for i in result.model.graph.input] == ["x"]
    assert [o.name for o in result.model.graph.output] == ["pooled", "idx1"]
    # two segments around the TopK host node, so two blocks with mixed dtypes around it
    assert len(result.plan.blocks) == 2
    assert [n.op_type for n in result.model.graph.node] == ["MLUFusionBlock", "TopK", "MLUFusionBlock"]
    feeds = random_inputs(chain_model, 0)
    expected = reference_session(chain_model).run(None, feeds)
    got = InferenceSession(result.model).run(None, feeds)
    np.testing.assert_allclose(got[0], expected[0], **TOL)
    np.testing.assert_array_equal(got[1], expected[1])


def test_refuses_already_fused_models(chain_model):
    fused = api.fuse(chain_model, strategy="all-fusion").model
    with pytest.raises(api.OnnxMluError, match="already fused"):
        api.fuse(fused)
