"""Models whose inputs are strings: the shape probe feeds strings (the empty string, as it feeds
zeros to numbers), ``check`` draws random strings, and a host reason advises ``--input-shape``
only where a pin could change what the probe sees."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from onnxmlu import api
from onnxmlu.frontend.feeds import random_inputs
from onnxmlu.frontend.shapes import sizing_hint
from onnxmlu.runtime import InferenceSession, reference_session
from onnxmlu.schema import body_model, is_fusion_block

sys.path.insert(0, str(Path(__file__).resolve().parent / "realworld"))
from built import grapheme_to_phoneme  # noqa: E402

RTOL = ATOL = 1e-4


def test_a_string_input_model_fuses_every_matmul_into_a_block_and_matches(library):
    """LabelEncoder-1's output has no type onnx can infer: only a run (the probe, fed empty
    strings at the pinned shape) sizes the five MatMuls after it."""
    model = grapheme_to_phoneme()
    result = api.fuse(model, input_shapes={"letters": [4, 8]})
    blocks = [n for n in result.model.graph.node if is_fusion_block(n)]
    in_blocks = [n.op_type for b in blocks for n in body_model(b).graph.node]
    assert in_blocks.count("MatMul") == 5, result.analysis.host_reasons
    assert result.coverage.heavy_share == 1.0
    feeds = random_inputs(model, seed=3, shapes={"letters": [3, 8]})
    assert feeds["letters"].dtype == object and all(len(s) == 1 for s in feeds["letters"].ravel())
    want = reference_session(model).run(None, feeds)
    got = InferenceSession(result.model).run(None, feeds)
    assert (got[0] == want[0]).all()
    np.testing.assert_allclose(got[1], want[1], rtol=RTOL, atol=ATOL)


def test_input_shape_is_advised_only_where_a_pin_changes_the_sizes():
    model = grapheme_to_phoneme()
    assert sizing_hint(model, None) == "try --input-shape for N"
    assert "cannot help" in sizing_hint(model, {"letters": [4, 8]})
    untyped = helper.make_graph([], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                                [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)])
    assert sizing_hint(helper.make_model(untyped), None) == "try --input-shape for x"


def test_a_string_model_that_cannot_be_sized_does_not_advise_a_pin_it_already_has():
    """A tensor after an op the probe cannot run (a domain onnxruntime lacks) stays unsized; the
    input is pinned, so the reason says a pin cannot help instead of asking for one."""
    model = grapheme_to_phoneme()
    encoder = model.graph.node[0]
    encoder.domain = "pkg.onnxmlu.unknown"
    model.opset_import.append(helper.make_opsetid("pkg.onnxmlu.unknown", 1))
    result = api.fuse(model, input_shapes={"letters": [4, 8]})
    reasons = [r for r in result.analysis.host_reasons.values() if "unknown rank" in r]
    assert reasons and all("cannot help" in r and "try --input-shape" not in r for r in reasons), reasons
    assert any(d.rule == "probe-failed" and "at letters:4" in d.message for d in result.diagnostics)
    onnx.checker.check_model(result.model)
